"""Edges of the worker loop: auth pauses without spinning, stop during a claim, a reader that
raises, redirects never followed."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from vidpoll.errors import ConfigError
from vidpoll.models import ClaimMode, HttpAnswer
from vidpoll.policy import PollPolicy
from vidpoll.providers.sume.client import SumeClient
from vidpoll.providers.sume.rules import RULES as SUME
from vidpoll.store import PgStore
from vidpoll.worker import Worker, WorkerConfig

from ..conftest import API_KEY, FAST_POLICY, hold_reads, observe_sleeps, run_until

LONG_PAUSES = PollPolicy(min_poll_s=0.05, backoff_base_s=10.0, backoff_max_s=20.0)
PAUSED_FOR_MINUTES = PollPolicy(min_poll_s=0.05, backoff_base_s=600.0, backoff_max_s=600.0,
                                auth_backoff_max_s=600.0)


async def test_auth_pause_sleeps_instead_of_spinning(store, fake, fake_url, make_worker):
    for i in range(3):
        fake.add_job(f"p{i}", script=[{"http": 401, "code": "unauthorized"}])
        await store.add_job(f"p{i}", delay_s=0)
    # paused for 5-10 minutes: far longer than this test, however slow the machine
    worker = make_worker(policy=PAUSED_FOR_MINUTES, concurrency=3, batch_size=3)
    sleeps = observe_sleeps(worker)
    task = asyncio.create_task(worker.run())
    try:
        # paused, and the loop asleep for the pause (nothing else sleeps minutes here)
        await worker.signals.wait_for(
            lambda: worker.stats.errors.get("auth", 0) == 1 and worker._inflight == 0
            and sleeps.asleep and sleeps.asked[-1] > 240, 10)
        async with asyncio.timeout(10):  # every claimed row given back by the writer
            while any([(await store.get_job(f"p{i}"))["claim_token"]  # noqa: ASYNC110
                       for i in range(3)]):
                await asyncio.sleep(0.02)
        claims, reads, turns = (worker.stats.claims, sum(fake.reads.values()),
                                worker.stats.loop_turns)
        first = len(sleeps.asked) - 1  # the sleep in progress (a wake may have ended it)
        # whatever wakes it (a NOTIFY, a finished task, here the test) costs one turn that
        # goes straight back to sleeping out the pause: no claim, no read, no short sleep
        for _ in range(5):
            n = len(sleeps.asked)
            worker._wake.set()
            await worker.signals.wait_for(lambda n=n: len(sleeps.asked) > n, 10)
        assert worker.stats.loop_turns - turns == len(sleeps.asked) - 1 - first  # one each
        assert all(seconds > 240 for seconds in sleeps.asked[first:]), sleeps.asked
        assert worker.stats.claims == claims and sum(fake.reads.values()) == reads
    finally:
        worker.stop()
        await task
    assert sum(fake.reads.values()) <= 3


class GatedClaims:
    """The real store, with each claim held until the test opens the gate."""

    def __init__(self, inner: PgStore) -> None:
        self.inner = inner
        self.claimed = asyncio.Event()
        self.gate = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        jobs = await self.inner.claim(*args, **kwargs)
        self.claimed.set()
        await self.gate.wait()
        return jobs


async def test_stop_during_a_claim_gives_the_rows_back_unread(store, fake, fake_url, client):
    for i in range(3):
        fake.add_job(f"g{i}")
        await store.add_job(f"g{i}", delay_s=-5)
    before = {i: (await store.get_job(f"g{i}"))["next_poll_at"] for i in range(3)}
    gated = GatedClaims(store)
    worker = Worker(gated, client, WorkerConfig(lease_s=30, listen=False))  # type: ignore[arg-type]
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(gated.claimed.wait(), 10)
    worker.stop()
    gated.gate.set()
    await asyncio.wait_for(task, 10)
    assert sum(fake.reads.values()) == 0
    for i in range(3):
        row = await store.get_job(f"g{i}")
        assert row["claim_token"] is None and row["next_poll_at"] == before[i]


class RaisingReader:
    """A reader that breaks its promise to return answers."""

    rules = SUME

    async def read_status(self, job_id: str) -> HttpAnswer:
        raise RuntimeError("boom")


async def test_a_raising_reader_backs_off_instead_of_re_reading_at_once(store):
    await store.add_job("r", delay_s=0)
    worker = Worker(store, RaisingReader(), WorkerConfig(policy=LONG_PAUSES, listen=False))
    await run_until(worker, lambda: worker.stats.recorded == 1)
    row = await store.get_job("r")
    assert row["state"] == "pending" and row["consecutive_errors"] == 1
    assert (row["next_poll_at"] - row["last_polled_at"]).total_seconds() >= 5.0
    assert worker.stats.reads == 1


async def test_redirects_are_not_followed_and_their_urls_not_recorded(store, fake, fake_url,
                                                                      make_worker, caplog):
    secret = "sig=SECRET-SIGNATURE"
    fake.add_job("moved", script=[{"http": 302, "headers": {
        "Location": f"http://127.0.0.1:9/media/moved.mp4?{secret}"}}])
    await store.add_job("moved", delay_s=0)
    worker = make_worker(policy=LONG_PAUSES)
    await run_until(worker, lambda: worker.stats.recorded == 1)
    row = await store.get_job("moved")
    assert row["last_http_status"] == 302 and row["last_error_class"] == "client_error"
    assert secret not in (row["last_error"] or "") and secret not in caplog.text


async def test_rows_claimed_ahead_of_free_slots_are_read_once_and_given_back_on_stop(
        store, fake, fake_url, make_worker):
    # lease mode claims up to half its concurrency (or batch) more than its free slots, so
    # a slot never waits for a claim; those rows are read as slots free, never twice, and a
    # stop gives back the ones not read yet (no counter moves, their old due time back)
    from .test_process import wait_for

    for i in range(12):
        fake.add_job(f"j{i}", script=[{"sume_status": "completed", "terminal": True}])
        await store.add_job(f"j{i}", delay_s=0)
    gate = hold_reads(fake)  # every read waits at the fake until the test opens the gate
    async with SumeClient(fake_url, API_KEY, timeout_s=60.0) as patient:
        worker = Worker(store, patient, WorkerConfig(policy=FAST_POLICY, lease_s=120,
                                                     concurrency=4, batch_size=8))
        assert worker._prefetch == 2
        task = asyncio.create_task(worker.run())
        try:
            # four reads in flight, two rows claimed ahead: stable while the gate is shut
            await wait_for(lambda: sum(fake.in_flight.values()) == 4 and len(worker._ready) == 2,
                           30, "four reads in flight and two rows ready")
            ahead = [job.job_id for job in worker._ready]
        finally:
            worker.stop()
            gate.set()  # the four reads in flight end, are recorded; the two ahead go back
            await asyncio.wait_for(task, 30)
    for job_id in ahead:  # given back unread
        row = await store.get_job(job_id)
        assert row["claim_token"] is None and row["polls"] == 0 and row["errors_total"] == 0
        assert fake.reads[job_id] == 0
    worker = make_worker(concurrency=4, batch_size=8, drain=True)
    await asyncio.wait_for(worker.run(), 20)
    assert await store.counts() == {"completed": 12} and fake.overlaps == 0
    assert all(fake.reads[job_id] == 1 for job_id in ahead)  # read once, by the second


class StalledClaims(GatedClaims):
    """The real store, with the first claim's answer held back (a worker that fell behind)."""

    def __init__(self, inner: PgStore, stall_s: float) -> None:
        super().__init__(inner)
        self.stall_s = stall_s
        self.stalls = 0
        self.claims: list[tuple[Any, Any]] = []
        """(claimed_at, lease end) of each claim of the row "late", by the database's clock."""
        self.released: list[str] = []

    async def release(self, jobs: Any) -> Any:
        self.released += [j.job_id for j in jobs]
        return await self.inner.release(jobs)

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        jobs = await self.inner.claim(*args, **kwargs)
        if any(j.job_id == "late" for j in jobs):
            row = await self.inner.get_job("late")
            self.claims.append((row["claimed_at"], row["next_poll_at"]))
        if jobs and not self.stalls:
            self.stalls += 1
            await asyncio.sleep(self.stall_s)  # a pause, GC or CPU starvation
        return jobs


async def test_a_row_whose_lease_is_too_short_for_one_read_is_left_unread(
        store, fake, client, caplog):
    # lease 3 s, read timeout 1 s (+ 0.5 s for the write), and the claim's answer arrives 2 s
    # late: a read started now could end after the lease, when another worker may already
    # read the row. (The next claim has 1.5 s of slack for its read: room for a slow machine.)
    fake.add_job("late", script=[{"sume_status": "completed", "terminal": True}])
    await store.add_job("late", delay_s=-5)
    stalled = StalledClaims(store, stall_s=2.0)
    worker = Worker(stalled, client, WorkerConfig(  # type: ignore[arg-type]
        lease_s=3, read_timeout_s=1, listen=False, idle_max_s=0.2))
    await run_until(worker, lambda: worker.stats.finished == 1, within_s=15)
    assert worker.stats.too_late_to_read == 1
    assert "too little lease left for one read" in caplog.text  # said, not silent
    assert fake.reads["late"] == 1  # read once: on the second claim, not the stalled one
    assert (await store.get_job("late"))["state"] == "completed"
    # left to its lease, not released (a release makes it due at once: a spin if every
    # claim arrives late): claimed again only once the first lease had ended (both times by
    # the database's clock, so no scheduling delay of this process enters the comparison)
    assert stalled.released == []
    (_, first_lease_end), (second_claimed_at, _) = stalled.claims[:2]
    assert second_claimed_at >= first_lease_end


def test_a_lease_shorter_than_one_read_is_refused():
    with pytest.raises(ConfigError, match="longer than the HTTP timeout"):
        WorkerConfig(lease_s=10, read_timeout_s=15)
    with pytest.raises(ConfigError):  # lock mode still leases its result fetches
        WorkerConfig(lease_s=10, read_timeout_s=15, claim_mode=ClaimMode.LOCK)
    WorkerConfig(lease_s=10, read_timeout_s=15, claim_mode=ClaimMode.LOCK, fetch_results=False)
    WorkerConfig(lease_s=16, read_timeout_s=15)
