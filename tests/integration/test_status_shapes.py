"""Status answers as Sume's CLI reads them (issue 15, item 0), end to end: the real worker and
client, the fake Sume over loopback answering in the enveloped shape (no `terminal` flag, the
word in any case, other words), real PostgreSQL. Every job reaches its terminal state, and a
job that ended with a success word has its result fetched and its delivery made."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

import pytest

from vidpoll.deliver import Deliverer, DeliveryConfig
from vidpoll.download import Downloader
from vidpoll.fetch_guard import FetchPolicy
from vidpoll.models import Job
from vidpoll.providers.sume.fake import STATUS_SHAPES, FakeSume
from vidpoll.providers.sume.rules import SUCCESS_STATUSES as SUCCESS_STATES
from vidpoll.store import PgStore

from ..conftest import FAST_POLICY, run_until

# the fake's own outcome -> the word it sends for it, and the state vidpoll must record
ENDINGS = {
    "succeeded": ("completed", "succeeded", "succeeded"),
    "upper": ("completed", "COMPLETED", "completed"),
    "success": ("completed", "Success", "success"),
    "cancelled": ("canceled", "cancelled", "cancelled"),
    "error": ("failed", "ERROR", "error"),
    "errored": ("failed", "errored", "errored"),
    "expired": ("expired", "Expired", "expired"),
}


async def drain(worker_factory, **kwargs) -> None:
    worker = worker_factory(drain=True, fetch_results=True, **kwargs)
    await asyncio.wait_for(worker.run(), 30)


@pytest.mark.parametrize("shape", [s for s in STATUS_SHAPES if s != "seed"])
async def test_jobs_answered_in_an_envelope_without_a_flag_reach_their_terminal_states(
        store: PgStore, fake: FakeSume, make_worker, shape: str) -> None:
    fake.config.status_shape = shape
    fake.config.next_poll_after_s = 0.05
    for name, (outcome, word, _) in ENDINGS.items():
        # queued, then running, then the ending: a few reads in progress before it ends
        fake.add_job(name, outcome=outcome, queued_s=0.1, render_s=0.2,
                     words={outcome: word, "running": "RUNNING"})
        await store.add_job(name, delay_s=0)
    await drain(make_worker)
    for name, (_, word, state) in ENDINGS.items():
        row = await store.get_job(name)
        assert row is not None
        assert row["state"] == state, (name, row["state"], row["last_error"])
        assert row["provider_status"] == word.lower()
        assert row["last_error_class"] is None
        assert row["finished_at"] is not None
        # the envelope is kept as Sume sent it
        assert row["last_response"] is not None and "terminal" not in str(row["last_response"])
        if state in SUCCESS_STATES:  # each success word gets its result fetched
            assert row["result_state"] == "fetched", name
            assert row["result"]["job_id"] == name
        else:
            assert row["result_state"] is None, name
    assert fake.overlaps == 0


async def test_a_fake_answering_in_random_case_and_shapes_per_job_ends_every_job(
        store: PgStore, fake: FakeSume, make_worker) -> None:
    fake.config.status_case = "random"
    fake.config.next_poll_after_s = 0.05
    shapes = list(STATUS_SHAPES)
    for i in range(30):
        fake.add_job(f"j{i}", outcome="completed", queued_s=0.05, render_s=0.1,
                     shape=shapes[i % len(shapes)],
                     words={"completed": ("completed", "succeeded", "success")[i % 3]})
        await store.add_job(f"j{i}", delay_s=0)
    await drain(make_worker)
    assert await store.counts() == {"completed": 10, "succeeded": 10, "success": 10}
    for i in range(30):
        row = await store.get_job(f"j{i}")
        assert row is not None and row["result_state"] == "fetched"


async def test_an_unknown_in_progress_word_keeps_polling_and_is_logged_once(
        store: PgStore, fake: FakeSume, make_worker, caplog) -> None:
    fake.config.status_shape = "data"
    fake.config.next_poll_after_s = 0.05
    fake.add_job("u1", outcome="completed", queued_s=0, render_s=0.4,
                 words={"running": "rendering", "completed": "succeeded"})
    await store.add_job("u1", delay_s=0)
    with caplog.at_level(logging.WARNING, logger="vidpoll.worker"):
        await drain(make_worker)
    row = await store.get_job("u1")
    assert row is not None and row["state"] == "succeeded" and row["polls"] >= 3
    assert row["errors_total"] == 0  # an unknown word is not an error
    warned = [r for r in caplog.records if "rendering" in r.getMessage()]
    assert len(warned) == 1


async def test_a_job_that_ended_with_a_success_word_is_downloaded_and_its_hook_sees_it(
        store: PgStore, fake: FakeSume, make_worker, fake_url: str, tmp_path: Path) -> None:
    fake.config.status_shape = "data.job"
    seen: list[Job] = []
    async with Downloader(tmp_path / "videos", read_timeout_s=5,
                          policy=FetchPolicy.for_origin(fake_url)) as downloader:
        deliverer = Deliverer(store, DeliveryConfig(hooks={"app:done": seen.append},
                                                    policy=FAST_POLICY, lease_s=3.0),
                              downloader)
        task = asyncio.create_task(deliverer.run())
        await deliverer.signals.wait_for(lambda: deliverer.idle or task.done(), 10)
        fake.add_job("s1", outcome="completed", words={"completed": "SUCCEEDED"})
        await store.add_job("s1", delay_s=0)
        worker = make_worker(fetch_results=True)
        await run_until(worker, lambda: worker.stats.results_fetched == 1, within_s=15)
        await deliverer.signals.wait_for(lambda: len(seen) == 1, 15)
        deliverer.stop()
        await asyncio.wait_for(task, 10)
    [job] = seen
    assert job.state == "succeeded" and job.provider_status == "succeeded" and job.succeeded
    assert [f.size for f in job.files] == [fake.config.media_bytes]
    deliveries = {d["consumer"]: d["state"] for d in await store.job_deliveries("s1")}
    assert deliveries == {"download": "done", "hook:app:done": "done"}
