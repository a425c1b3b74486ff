"""Claiming: several workers, both modes, fencing, lease expiry, the claim's query plan."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from vidpoll.models import ClaimMode, Outcome
from vidpoll.providers.sume.client import SumeClient
from vidpoll.store import PgStore
from vidpoll.worker import Worker, WorkerConfig

from ..conftest import API_KEY, FAST_POLICY


@pytest.mark.parametrize("mode", [ClaimMode.LEASE, ClaimMode.LOCK])
async def test_concurrent_workers_never_double_read(db_url, fake, fake_url, mode):
    n_jobs, n_workers = 300, 4
    fake.config.latency_s = 0.02
    fake.config.latency_jitter = 0.5
    stores = [await PgStore.open(db_url, max_size=4) for _ in range(n_workers)]
    try:
        for i in range(n_jobs):
            # every job answers "running" twice (1 s hint shortened below), then terminal
            fake.add_job(f"c{i}", script=[
                {"sume_status": "running", "terminal": False, "next_poll_after_seconds": 0},
                {"sume_status": "processing", "terminal": False, "next_poll_after_seconds": 0},
                {"sume_status": "completed", "terminal": True}])
        async with stores[0]._pool.connection() as conn:
            await conn.execute(
                "INSERT INTO video_jobs (job_id, next_poll_at) "
                "SELECT 'c' || g, now() FROM generate_series(0, %s) g", (n_jobs - 1,))
        async with SumeClient(fake_url, API_KEY, timeout_s=2) as client:
            workers = [Worker(s, client, WorkerConfig(
                claim_mode=mode, concurrency=25, batch_size=10, drain=True, lease_s=5,
                policy=FAST_POLICY, lock_lanes=3)) for s in stores]
            await asyncio.wait_for(asyncio.gather(*(w.run() for w in workers)), 60)
        counts = await stores[0].counts()
        assert counts == {"completed": n_jobs}
        # each row terminal exactly once, across all workers
        assert sum(w.stats.finished for w in workers) == n_jobs
        assert sum(w.stats.fenced_out for w in workers) == 0
        # the fake saw no read of a job while another read of it was in flight
        assert fake.overlaps == 0
        assert Counter(fake.reads.values()) == Counter({3: n_jobs})
        # the work was actually shared
        assert sum(1 for w in workers if w.stats.reads > 0) >= 2
    finally:
        for s in stores:
            await s.close()


async def test_stale_writer_is_fenced_out(store: PgStore):
    await store.add_job("f", delay_s=0)
    t0 = datetime.now(UTC) + timedelta(seconds=1)
    [first] = await store.claim(10, lease_s=5, worker_id="slow", now=t0)
    # nobody can claim it while the lease runs ...
    assert await store.claim(10, lease_s=5, worker_id="x", now=t0 + timedelta(seconds=4)) == []
    # ... and it is due again after the lease, under a new token
    [second] = await store.claim(10, lease_s=5, worker_id="fast", now=t0 + timedelta(seconds=6))
    assert second.claim_token != first.claim_token
    assert second.due_at == t0 + timedelta(seconds=5)
    late = Outcome("f", first.claim_token, "failed", 0, True, 200, provider_status="failed")
    assert await store.record([late]) == set()
    fresh = Outcome("f", second.claim_token, "completed", 0, True, 200,
                    provider_status="completed")
    assert await store.record([fresh]) == {"f"}
    # a duplicate write of the same claim is dropped too: terminal exactly once
    assert await store.record([fresh]) == set()
    row = await store.get_job("f")
    assert row["state"] == "completed" and row["polls"] == 1


async def test_lock_mode_rows_are_skipped_while_locked(store: PgStore):
    for i in range(3):
        await store.add_job(f"l{i}", delay_s=0)
    await asyncio.sleep(0.01)
    async with store.lock_batch(2, "locker") as batch:
        assert len(batch.jobs) == 2
        other = await store.claim(10, lease_s=5, worker_id="leaser")
        assert [j.job_id for j in other] == sorted({"l0", "l1", "l2"} -
                                                   {j.job_id for j in batch.jobs})
    # the lock mode claim did not move next_poll_at: the rows are due again at once
    again = await store.claim(10, lease_s=5, worker_id="leaser")
    assert {j.job_id for j in again} == {j.job_id for j in batch.jobs}


async def test_claim_order_is_most_overdue_first(store: PgStore):
    now = datetime.now(UTC)
    for i, age in enumerate([5, 50, 20]):
        await store.add_job(f"o{i}", delay_s=-age)
    jobs = await store.claim(3, lease_s=5, worker_id="w", now=now + timedelta(seconds=1))
    assert [j.job_id for j in jobs] == ["o1", "o2", "o0"]


async def test_release_gives_rows_back_unread(store: PgStore):
    await store.add_job("r", delay_s=-10)
    [job] = await store.claim(1, lease_s=30, worker_id="w")
    assert await store.release([job]) == {"r"}
    row = await store.get_job("r")
    assert row["next_poll_at"] == job.due_at and row["claim_token"] is None
    assert await store.release([job]) == set()  # fenced: the token is gone


def test_claim_uses_the_partial_index(db_url):
    from vidpoll.sql import QUERIES

    with psycopg.connect(db_url, autocommit=True) as conn:
        # 2 % pending, and nine in ten of those in another account: a claim for `default`
        # must go straight to its own due rows, not step over acme's
        conn.execute("INSERT INTO video_jobs (job_id, state, next_poll_at, account) "
                     "SELECT 'x' || g, CASE WHEN g % 50 = 0 THEN 'pending' ELSE 'completed' END, "
                     "now() - (g || ' seconds')::interval, "
                     "CASE WHEN g % 500 = 0 THEN 'default' ELSE 'acme' END "
                     "FROM generate_series(1, 20000) g")
        conn.execute("ANALYZE video_jobs")
        plan = "\n".join(r[0] for r in conn.execute(
            "EXPLAIN " + QUERIES["claim_due"],
            {"limit": 100, "lease_s": 25.0, "worker_id": "w", "now": None,
             "account": "default"}).fetchall())
    assert "video_jobs_account_due_idx" in plan, plan
    assert "Seq Scan" not in plan, plan


async def test_odd_job_ids_round_trip(store, fake, fake_url, make_worker):
    from ..conftest import run_until

    odd = ["a/../b", "x?y=1", "..", ".", "#frag", "100%", "spaces and\ttabs", "ünïcødé-🎬",
           "' OR 1=1 --", "a" * 1024]
    for job_id in odd:
        fake.add_job(job_id, script=[{"sume_status": "completed", "terminal": True}])
        assert await store.add_job(job_id, delay_s=0)
        assert not await store.add_job(job_id, delay_s=0)  # already tracked: kept as is
    worker = make_worker()
    await run_until(worker, lambda: worker.stats.finished == len(odd))
    for job_id in odd:
        assert (await store.get_job(job_id))["state"] == "completed"
        assert fake.reads[job_id] == 1
    assert all(p.count("/") == 4 for p in fake.raw_paths), fake.raw_paths


@pytest.mark.parametrize("bad", ["", "nul\x00byte", "a" * 1025])
async def test_unstorable_job_ids_are_refused_clearly(store: PgStore, bad):
    from vidpoll.errors import InvalidJobId

    with pytest.raises(InvalidJobId):
        await store.add_job(bad)
    assert await store.counts() == {}




async def test_a_drain_ends_when_another_workers_last_row_ends_not_its_lease(
        store: PgStore, fake_url):
    """Rows another worker holds end without a notification; a draining worker must look
    again soon, not sleep until their lease (here 60 s) or its 30 s idle cap runs out."""
    await store.add_job("held", delay_s=0)
    [held] = await store.claim(1, lease_s=60, worker_id="other")
    async with SumeClient(fake_url, API_KEY, timeout_s=2) as client:
        # listen=False: no notification could wake it either way (a row that ends sends
        # none that a poller listens to), so the test does not race the LISTEN's start
        worker = Worker(store, client, WorkerConfig(drain=True, policy=FAST_POLICY,
                                                    fetch_results=False, listen=False))
        run = asyncio.create_task(worker.run())
        # it has looked (nothing it may claim) and goes to sleep
        await worker.signals.wait_for(lambda: worker.idle or run.done(), 10)
        assert not run.done()  # the held row is still pending
        done = Outcome("held", held.claim_token, "completed", 0, True, 200,
                       provider_status="completed")
        assert await store.record([done]) == {"held"}
        await asyncio.wait_for(run, 15)  # before the cap: ~30 s (the idle cap)
    assert worker.stats.reads == 0
