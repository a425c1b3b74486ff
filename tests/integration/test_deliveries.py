"""Deliveries after the terminal state: completion hooks and media downloads, at least once,
tracked in the database; real PostgreSQL, real HTTP to the fake's result and media links."""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from vidpoll.deliver import Deliverer, DeliveryConfig, hook_consumer
from vidpoll.download import Downloader
from vidpoll.errors import DiskError
from vidpoll.models import Job
from vidpoll.store import PgStore

from ..conftest import FAST_POLICY, run_until

DONE = [{"sume_status": "completed", "terminal": True}]
FAILED = [{"sume_status": "failed", "terminal": True}]


def make_deliverer(store: PgStore, hooks: dict[str, Any] | None = None,
                   downloader: Downloader | None = None, **kwargs: Any) -> Deliverer:
    kwargs.setdefault("policy", FAST_POLICY)
    kwargs.setdefault("lease_s", 3.0)
    return Deliverer(store, DeliveryConfig(hooks=hooks or {}, **kwargs), downloader)


async def started(deliverer: Deliverer) -> asyncio.Task[None]:
    """Run `deliverer` in the background once its consumers are registered (a job ending
    before that gets no delivery, by design)."""
    task = asyncio.create_task(deliverer.run())
    await deliverer.signals.wait_for(lambda: deliverer.idle or task.done(), 10)
    return task


async def stopped(deliverer: Deliverer, task: asyncio.Task[None]) -> None:
    deliverer.stop()
    await asyncio.wait_for(task, 10)


@pytest.fixture
async def downloader(tmp_path: Path, fake_url: str) -> AsyncIterator[Downloader]:
    async with Downloader(tmp_path / "videos", read_timeout_s=5) as d:
        yield d


def media_sha(fake: Any, job_id: str) -> str:
    return hashlib.sha256(fake.media_content(job_id, fake.config.media_bytes)).hexdigest()


async def until(deliverer: Deliverer, predicate: Callable[[], bool], within_s: float = 10
                ) -> None:
    await deliverer.signals.wait_for(predicate, within_s)


async def test_a_hook_runs_for_each_finished_job_after_its_result(store, fake, make_worker):
    seen: list[Job] = []
    hooks = {"app:done": seen.append}
    deliverer = make_deliverer(store, hooks)
    task = await started(deliverer)
    fake.add_job("c1", script=DONE)
    fake.add_job("f1", script=FAILED)
    await store.add_job("c1", delay_s=0)
    await store.add_job("f1", delay_s=0)
    worker = make_worker(drain=True)
    await asyncio.wait_for(worker.run(), 10)
    await until(deliverer, lambda: len(seen) == 2)
    await stopped(deliverer, task)
    by_id = {j.job_id: j for j in seen}
    assert by_id["c1"].state == "completed" and by_id["c1"].result_state == "fetched"
    assert by_id["c1"].result is not None and by_id["c1"].result["job_id"] == "c1"
    assert by_id["f1"].state == "failed" and by_id["f1"].result is None
    for job_id in ("c1", "f1"):
        [d] = await store.job_deliveries(job_id)
        assert d["consumer"] == "hook:app:done" and d["state"] == "done" and d["attempts"] == 1


async def test_a_job_that_ended_before_the_hook_existed_gets_no_delivery(store, fake,
                                                                        make_worker):
    fake.add_job("old", script=FAILED)
    await store.add_job("old", delay_s=0)
    await asyncio.wait_for(make_worker(drain=True).run(), 10)
    ran: list[str] = []
    deliverer = make_deliverer(store, {"app:done": lambda job: ran.append(job.job_id)},
                               drain=True)
    deliverer.producers_done.set()
    await asyncio.wait_for(deliverer.run(), 10)
    assert ran == [] and await store.job_deliveries("old") == []


async def test_a_hook_that_raises_is_retried_with_backoff_and_eventually_runs(
        store, fake, make_worker):
    calls: list[str] = []

    async def flaky(job: Job) -> None:
        calls.append(job.job_id)
        if len(calls) < 3:
            raise RuntimeError("the CRM is down")

    deliverer = make_deliverer(store, {"app:flaky": flaky})
    task = await started(deliverer)
    fake.add_job("j1", script=FAILED)
    await store.add_job("j1", delay_s=0)
    await asyncio.wait_for(make_worker(drain=True).run(), 10)
    await until(deliverer, lambda: deliverer.stats.deliveries_done == 1)
    await stopped(deliverer, task)
    assert calls == ["j1", "j1", "j1"]
    [d] = await store.job_deliveries("j1")
    assert d["state"] == "done" and d["attempts"] == 3 and d["last_error"] is None


async def test_a_hook_that_keeps_failing_is_marked_failed_visibly_and_can_be_retried(
        store, fake, make_worker):
    def broken(job: Job) -> None:
        raise ValueError(f"cannot publish https://cdn.example/v.mp4?sig=SECRET for {job.job_id}")

    deliverer = make_deliverer(store, {"app:broken": broken}, max_attempts=2)
    task = await started(deliverer)
    fake.add_job("j1", script=FAILED)
    await store.add_job("j1", delay_s=0)
    await asyncio.wait_for(make_worker(drain=True).run(), 10)
    await until(deliverer, lambda: deliverer.stats.deliveries_failed == 1)
    await stopped(deliverer, task)
    assert deliverer.stats.delivery_retries == 1
    [d] = await store.job_deliveries("j1")
    assert d["state"] == "failed" and d["attempts"] == 2
    assert "gave up after 2 tries: ValueError: cannot publish" in d["last_error"]
    assert "SECRET" not in d["last_error"]  # a signed URL in an exception is shown bare
    assert [p["job_id"] for p in await store.failed_deliveries()] == ["j1"]
    assert (await store.delivery_counts())[0]["failed"] == 1
    assert [r["job_id"] for r in await store.retry_deliveries(job_id="j1")] == ["j1"]
    [d] = await store.job_deliveries("j1")
    assert d["state"] == "pending" and d["attempts"] == 0
