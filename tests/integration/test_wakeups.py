"""Wake-ups: sleep until the next due time, NOTIFY as a hint, no busy polling when idle."""

from __future__ import annotations

import asyncio
import time

from ..conftest import run_until


async def test_notify_wakes_an_idle_worker_long_before_its_idle_cap(store, fake, fake_url,
                                                                    make_worker):
    worker = make_worker(idle_max_s=30.0, listen=True)
    task = asyncio.create_task(worker.run())
    try:
        await worker.signals.wait_for(lambda: worker.idle and worker.listening, 10)
        fake.add_job("n1", script=[{"sume_status": "completed", "terminal": True}])
        started = time.monotonic()
        await store.add_job("n1", delay_s=0)
        await worker.signals.wait_for(lambda: worker.stats.finished == 1, 10)
        assert time.monotonic() - started < 5.0  # the idle cap is 30 s
    finally:
        worker.stop()
        await task


async def test_without_listen_the_worker_sleeps_until_the_next_due_time(store, fake, fake_url,
                                                                       make_worker):
    fake.add_job("d1", script=[{"sume_status": "completed", "terminal": True}])
    await store.add_job("d1", delay_s=1.5)
    worker = make_worker(idle_max_s=30.0, listen=False)
    started = time.monotonic()
    await run_until(worker, lambda: worker.stats.finished == 1, within_s=10)
    waited = time.monotonic() - started
    assert 1.0 <= waited < 5.0
    assert worker.stats.claims <= 3  # one empty claim, one wake at the due time (+ slack)


async def test_idle_worker_does_not_poll_the_table_in_a_loop(store, make_worker):
    worker = make_worker(idle_max_s=30.0, listen=False)
    task = asyncio.create_task(worker.run())
    await asyncio.sleep(2.0)
    worker.stop()
    await task
    assert 1 <= worker.stats.claims <= 2


async def test_rows_locked_by_others_do_not_cause_a_hot_loop(store, make_worker):
    from vidpoll.models import ClaimMode

    await store.add_job("held", delay_s=0)
    await asyncio.sleep(0.01)
    async with store.lock_batch(1, "other") as batch:
        assert len(batch.jobs) == 1
        worker = make_worker(claim_mode=ClaimMode.LEASE, listen=False)
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(1.0)
        worker.stop()
        await task
    # due but locked: retried every BUSY_RETRY_S (0.25 s), not thousands of times a second
    assert worker.stats.claims <= 6 and worker.stats.reads == 0
