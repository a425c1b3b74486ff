"""procrastinate as the poller (scenario 3 of bench/peers.py): every poll is a job; when it runs
it reads its Sume job's status once and defers its successor `next_poll_after_seconds` later
(`configure(schedule_in=...)`), unless the answer is terminal.

    python bench/peer_procrastinate.py load JOBS       # apply the schema, defer b1..bJOBS now
    python bench/peer_procrastinate.py work SETTINGS   # the worker (SETTINGS: JSON), until SIGTERM

DATABASE_URL, SUME_BASE_URL and SUME_API_KEY come from the environment.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import aiohttp
import psycopg
from peer_http import open_session, read_status
from procrastinate import App, PsycopgConnector

HTTP: list[aiohttp.ClientSession] = []  # the worker's one session, opened in `work`


def make_app(pool_size: int) -> App:
    app = App(connector=PsycopgConnector(conninfo=os.environ["DATABASE_URL"],
                                         min_size=pool_size, max_size=pool_size))

    @app.task(name="poll")
    async def poll(job_id: str) -> None:
        delay = await read_status(HTTP[0], job_id)
        if delay is not None:
            await poll.configure(schedule_in={"seconds": delay}).defer_async(job_id=job_id)

    return app


async def load(jobs: int) -> None:
    """Apply procrastinate's schema once (`procrastinate schema --apply`), empty the jobs, and
    defer the backlog in one `batch_defer_async`, all due now."""
    url = os.environ["DATABASE_URL"]
    with psycopg.connect(url, autocommit=True) as conn:
        installed = conn.execute("SELECT to_regclass('procrastinate_jobs')").fetchone()
    app = make_app(2)
    async with app.open_async():
        if not installed or installed[0] is None:
            await app.schema_manager.apply_schema_async()
        await app.connector.execute_query_async(
            "TRUNCATE procrastinate_jobs, procrastinate_events, procrastinate_periodic_defers")
        await app.tasks["poll"].batch_defer_async(
            *({"job_id": f"b{n}"} for n in range(1, jobs + 1)))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE procrastinate_jobs")


async def work(settings: dict[str, Any]) -> None:
    app = make_app(settings["pool_size"])
    async with open_session(settings["concurrency"]) as http, app.open_async():
        HTTP.append(http)
        # SIGINT/SIGTERM: the worker stops fetching and lets running jobs finish
        await app.run_worker_async(
            concurrency=settings["concurrency"], listen_notify=settings["listen_notify"],
            fetch_job_polling_interval=settings["fetch_job_polling_interval_s"],
            delete_jobs=settings["delete_jobs"])


def main() -> None:
    if sys.argv[1] == "load":
        asyncio.run(load(int(sys.argv[2])))
    else:
        asyncio.run(work(json.loads(sys.argv[2])))


if __name__ == "__main__":
    main()
