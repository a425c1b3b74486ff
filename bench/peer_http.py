"""The one status read every peer worker (bench/peer_*.py) makes per job: the same GET vidpoll
makes, from one shared aiohttp session whose connector allows `concurrency` connections."""

from __future__ import annotations

import os

import aiohttp

DEFAULT_DELAY_S = 15.0  # vidpoll's fallback when the answer carries no hint


def open_session(concurrency: int) -> aiohttp.ClientSession:
    """The worker's only HTTP session (SUME_API_KEY in the Authorization header)."""
    connector = aiohttp.TCPConnector(limit=concurrency, limit_per_host=concurrency)
    headers = {"Authorization": f"Bearer {os.environ['SUME_API_KEY']}",
               "Accept": "application/json"}
    return aiohttp.ClientSession(connector=connector, headers=headers,
                                 timeout=aiohttp.ClientTimeout(total=15))


async def read_status(http: aiohttp.ClientSession, job_id: str) -> float | None:
    """GET the job's status once: seconds until the next read, or None once it is terminal."""
    async with http.get(f"{os.environ['SUME_BASE_URL']}/v1/jobs/{job_id}/status") as resp:
        resp.raise_for_status()
        body = await resp.json()
    if body.get("terminal"):
        return None
    delay = body.get("next_poll_after_seconds")
    return float(delay) if isinstance(delay, int | float) and delay >= 0 else DEFAULT_DELAY_S
