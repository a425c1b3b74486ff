"""Edges of one claim: resume of a row in flight, the hint counted from the answer in lock mode,
the lease a read must leave for its write, a refused key in lock mode, lateness at the read.

Issue 15, items 1, 2, 5, 6 and 8; each test failed on the code before its fix.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from vidpoll.models import ClaimedJob, ClaimMode, Outcome
from vidpoll.policy import PollPolicy
from vidpoll.providers.sume.client import SumeClient
from vidpoll.providers.sume.fake import FakeConfig, FakeSume, start_fake
from vidpoll.worker import WRITE_MARGIN_S, Worker, WorkerConfig

from ..conftest import API_KEY, FAST_POLICY, run_until

SLOW_BACKOFF = PollPolicy(min_poll_s=0.05, backoff_base_s=10.0, backoff_max_s=20.0)
RUNNING = {"sume_status": "running", "terminal": False, "next_poll_after_seconds": 2}


# -- item 1: resume of a pending row ------------------------------------------------------
async def test_resume_of_a_row_being_read_marks_it_instead_of_a_second_read(store):
    await store.add_job("busy", delay_s=0)
    [held] = await store.claim(10, 30.0, "worker-a")
    assert await store.resume("busy") == "marked"
    row = await store.get_job("busy")
    assert row["claim_token"] == held.claim_token  # the first worker still owns it
    # nobody else may read it while worker-a does
    assert await store.claim(10, 30.0, "worker-b") == []
    # worker-a's record lands (its fence held) and the mark makes the row due at once
    applied = await store.record([Outcome("busy", held.claim_token, "pending", 600.0,
                                          read_ok=True, provider_status="running")])
    assert applied == {"busy"}
    [again] = await store.claim(10, 30.0, "worker-b")
    assert again.job_id == "busy"


async def test_resume_of_an_idle_pending_row_makes_it_due_and_keeps_its_counters(store,
                                                                                 db_url):
    await store.add_job("idle", delay_s=3600)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE video_jobs SET consecutive_errors = 4 WHERE job_id = 'idle'")
    assert await store.resume("idle") == "made_due"
    row = await store.get_job("idle")
    assert row["state"] == "pending" and row["consecutive_errors"] == 4
    assert [j.job_id for j in await store.claim(10, 30.0, "w")] == ["idle"]


async def test_resume_of_a_local_terminal_state_resets_it(store, db_url):
    await store.add_job("gone", delay_s=0)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("UPDATE video_jobs SET state = 'gave_up', finished_at = now(), "
                     "consecutive_errors = 7, polling_since = now() - interval '3 days'")
    assert await store.resume("gone") == "resumed"
    row = await store.get_job("gone")
    assert row["state"] == "pending" and row["consecutive_errors"] == 0
    assert row["finished_at"] is None and row["claim_token"] is None


# -- item 2: the hint counts from the answer, in both modes ----------------------------------
@pytest.mark.parametrize("mode", [ClaimMode.LEASE, ClaimMode.LOCK])
async def test_the_hint_counts_from_the_answer_not_the_claim(store, db_url, mode):
    latency = 0.6
    fake = FakeSume(FakeConfig(api_key=API_KEY, latency_s=latency, seed=1))
    runner, url = await start_fake(fake)
    try:
        fake.add_job("slow-answer", script=[RUNNING])
        await store.add_job("slow-answer", delay_s=0)
        async with SumeClient(url, API_KEY, timeout_s=5.0) as client:
            worker = Worker(store, client, WorkerConfig(claim_mode=mode, policy=SLOW_BACKOFF,
                                                        lease_s=10.0, concurrency=4))
            await run_until(worker, lambda: worker.stats.recorded >= 1)
    finally:
        await runner.cleanup()
    row = await store.get_job("slow-answer")
    # the answer came at least `latency` after the claim; the hint (2 s) counts from it
    assert row["last_polled_at"] - row["claimed_at"] >= timedelta(seconds=latency * 0.95)
    assert (row["next_poll_at"] - row["claimed_at"]
            >= timedelta(seconds=2 + latency * 0.95))
    assert row["next_poll_at"] - row["last_polled_at"] >= timedelta(seconds=1.99)


# -- item 5: a read leaves room for its write in the lease -----------------------------------
def _claimed(sent_mono: float) -> ClaimedJob:
    now = datetime.now(UTC)
    return ClaimedJob("edge", uuid.uuid4(), now, now, 0, 0, 0, sent_mono=sent_mono,
                      claimed_mono=sent_mono)


async def test_a_read_needs_the_timeout_and_the_write_margin_left_in_its_lease(make_worker):
    worker = make_worker(lease_s=3.0, read_timeout_s=1.0)
    # 1.25 s of lease left: a whole read (1 s) fits, its write (up to 20 ms + the database)
    # may not; before the fix this row was read
    edge = _claimed(time.monotonic() - (3.0 - 1.0 - WRITE_MARGIN_S / 2))
    assert not worker._lease_fits_a_read(edge)
    assert worker.stats.too_late_to_read == 1
    fresh = _claimed(time.monotonic())
    assert worker._lease_fits_a_read(fresh)


async def test_a_row_claimed_too_close_to_its_lease_end_is_left_unread(store, fake, fake_url,
                                                                      client, db_url):
    fake.add_job("late-claim", script=[RUNNING])
    await store.add_job("late-claim", delay_s=0)
    worker = Worker(store, client, WorkerConfig(policy=SLOW_BACKOFF, lease_s=3.0,
                                                read_timeout_s=1.0, concurrency=1))
    [job] = await store.claim(1, 3.0, "someone")
    # as if the claim had left 1.75 s ago: the lease has 1.25 s left
    late = dataclasses.replace(job, sent_mono=time.monotonic() - 1.75)
    assert not worker._lease_fits_a_read(late)
    await worker._read_leased(late)  # what the dispatcher does with it (inflight is its own)
    assert fake.reads.get("late-claim", 0) == 0


# -- item 6: lock mode and a refused key -----------------------------------------------------
async def test_lock_mode_with_a_refused_key_leaves_no_claim_behind(store, fake, fake_url):
    fake.add_job("refused", script=[RUNNING])
    await store.add_job("refused", delay_s=0)
    async with SumeClient(fake_url, "sk-wrong-key", timeout_s=1.0) as wrong:
        worker = Worker(store, wrong, WorkerConfig(claim_mode=ClaimMode.LOCK,
                                                   policy=FAST_POLICY, lease_s=5.0))
        await run_until(worker, lambda: worker.stats.errors.get("auth", 0) >= 1)
    row = await store.get_job("refused")
    assert row["state"] == "pending" and row["polls"] == 0
    assert row["claim_token"] is None  # before the fix: a "claim in flight" nobody held
    # and so poll-now makes it due, instead of waiting for a record that never comes
    assert await store.poll_now("refused") is True


# -- item 8: lateness at the read's start --------------------------------------------------
async def test_lateness_counts_the_wait_for_a_slot_after_the_claim(store, db_url):
    latency = 0.5
    fake = FakeSume(FakeConfig(api_key=API_KEY, latency_s=latency, seed=1))
    runner, url = await start_fake(fake)
    try:
        for i in range(3):
            fake.add_job(f"q{i}", script=[{"sume_status": "completed", "terminal": True}])
            await store.add_job(f"q{i}", delay_s=0)
        async with SumeClient(url, API_KEY, timeout_s=5.0) as client:
            # two slots and one row claimed ahead: the third row waits for a slot
            worker = Worker(store, client, WorkerConfig(policy=SLOW_BACKOFF, lease_s=10.0,
                                                        concurrency=2, batch_size=4,
                                                        fetch_results=False))
            await run_until(worker, lambda: worker.stats.finished >= 3)
    finally:
        await runner.cleanup()
    with psycopg.connect(db_url, autocommit=True) as conn:
        # all three came in one claim (one statement: one now()), so the third row's wait
        # was in the worker, which the claim's own lateness cannot see
        claims = conn.execute("SELECT count(DISTINCT claimed_at) FROM video_jobs").fetchone()
        assert claims[0] == 1
    assert worker.stats.max_late_s >= latency * 0.95
    with psycopg.connect(db_url, autocommit=True) as conn:
        late_max = conn.execute("SELECT max(late_max_s) FROM vidpoll_minutes "
                                "WHERE kind = 'poll'").fetchone()[0]
    assert late_max >= latency * 0.95  # what the dashboard and /metrics report
