"""The fake Replicate's per-model render times and its per-prediction read counts (the
options bench/schedule.py measures poll schedules with), over real HTTP on loopback."""

from __future__ import annotations

import asyncio
import math
import random
import statistics
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import aiohttp
import pytest

from vidpoll.providers.replicate.fake import (
    DEFAULT_MODEL,
    DEFAULT_TOKEN,
    FakeReplicate,
    RenderTimes,
    ReplicateFakeConfig,
    start_fake_replicate,
)

AUTH = {"Authorization": f"Bearer {DEFAULT_TOKEN}"}
SLOW = "acme/slow-video"
SLOW_VERSION = "b" * 64


def seconds(iso_text: str) -> float:
    return datetime.fromisoformat(iso_text.replace("Z", "+00:00")).timestamp()


@pytest.fixture
async def api() -> AsyncIterator[tuple[FakeReplicate, aiohttp.ClientSession, str]]:
    fake = FakeReplicate(ReplicateFakeConfig(
        starting_s=0.05, processing_s=0.1, seed=3,
        render_times={SLOW: RenderTimes(median_s=0.4, sigma=0.0)}))
    fake.add_model(SLOW, [SLOW_VERSION])
    runner, base = await start_fake_replicate(fake)
    async with aiohttp.ClientSession(headers=AUTH) as session:
        yield fake, session, base
    await runner.cleanup()


async def create(session: aiohttp.ClientSession, base: str, model: str) -> dict[str, Any]:
    async with session.post(f"{base}/v1/models/{model}/predictions",
                            json={"input": {"prompt": "x"}}) as resp:
        assert resp.status == 201
        body: dict[str, Any] = await resp.json()
        return body


async def read(session: aiohttp.ClientSession, base: str, pid: str) -> dict[str, Any]:
    async with session.get(f"{base}/v1/predictions/{pid}") as resp:
        assert resp.status == 200
        body: dict[str, Any] = await resp.json()
        return body


async def until_ended(session: aiohttp.ClientSession, base: str, pid: str) -> dict[str, Any]:
    async def loop() -> dict[str, Any]:
        while True:
            body = await read(session, base, pid)
            if body["completed_at"] is not None:
                return body
            await asyncio.sleep(0.02)
    return await asyncio.wait_for(loop(), 15.0)


async def test_a_model_with_render_times_ends_when_its_draw_says_and_reads_are_counted(
        api: tuple[FakeReplicate, aiohttp.ClientSession, str]) -> None:
    fake, session, base = api
    slow = await create(session, base, SLOW)
    plain = await create(session, base, DEFAULT_MODEL)
    slow_end = await until_ended(session, base, slow["id"])
    plain_end = await until_ended(session, base, plain["id"])
    # create to end: the drawn 0.4 s (sigma 0) for the model named, starting_s +
    # processing_s for the one not named (the default behaviour)
    assert seconds(slow_end["completed_at"]) - seconds(slow_end["created_at"]) == \
        pytest.approx(0.4, abs=1e-3)
    assert seconds(plain_end["completed_at"]) - seconds(plain_end["created_at"]) == \
        pytest.approx(0.15, abs=1e-3)
    assert slow_end["status"] == "succeeded"
    assert slow_end["metrics"]["predict_time"] == pytest.approx(0.35, abs=1e-3)

    before = {row["id"]: row["reads"] for row in fake.render_log()}
    for _ in range(3):
        await read(session, base, slow["id"])
    log = {row["id"]: row for row in fake.render_log()}
    assert log[slow["id"]]["reads"] == before[slow["id"]] + 3
    assert log[plain["id"]]["reads"] == before[plain["id"]]
    assert log[slow["id"]]["model"] == SLOW and log[slow["id"]]["status"] == "succeeded"
    assert log[slow["id"]]["ended"] == pytest.approx(seconds(slow_end["completed_at"]),
                                                     abs=1e-5)
    # an unknown id is not a read of anything
    async with session.get(f"{base}/v1/predictions/{'z' * 26}") as resp:
        assert resp.status == 404
    assert sum(row["reads"] for row in fake.render_log()) == sum(before.values()) + 3


def test_render_times_are_log_normal_around_their_median_and_seeded() -> None:
    times = RenderTimes(median_s=90.0, sigma=0.3, min_s=1.0)
    draws = [times.draw(random.Random(5)) for _ in range(2)]
    assert draws[0] == draws[1]
    rng = random.Random(6)
    many = [times.draw(rng) for _ in range(4000)]
    assert statistics.median(many) == pytest.approx(90.0, rel=0.05)
    logs = [math.log(x) for x in many]
    assert statistics.stdev(logs) == pytest.approx(0.3, rel=0.1)
    assert min(RenderTimes(median_s=0.5, sigma=3.0, min_s=0.2).draw(random.Random(i))
               for i in range(200)) >= 0.2
