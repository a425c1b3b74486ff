"""Wake-ups: sleep until the next due time, NOTIFY as a hint, no busy polling when idle.

Each test watches the sleeps the loop asks for (observe_sleeps) and what ended them, not a
stopwatch: how long a turn takes on a loaded machine says nothing about these rules.
"""

from __future__ import annotations

import asyncio

from vidpoll.worker import BUSY_RETRY_S

from ..conftest import observe_sleeps, run_until


async def test_notify_wakes_an_idle_worker_long_before_its_idle_cap(store, fake, fake_url,
                                                                    make_worker):
    worker = make_worker(idle_max_s=30.0, listen=True)
    sleeps = observe_sleeps(worker, note=lambda: worker.listening)
    task = asyncio.create_task(worker.run())
    try:
        # idle, asleep for the whole idle cap, in a sleep begun once the listener was up
        await worker.signals.wait_for(
            lambda: worker.idle and sleeps.asleep and sleeps.asked[-1] == 30.0
            and sleeps.notes[-1] is True and not worker._wake.is_set(), 10)
        idle_sleep = len(sleeps.asked) - 1
        fake.add_job("n1", script=[{"sume_status": "completed", "terminal": True}])
        await store.add_job("n1", delay_s=0)
        # a third of the idle cap, for a wake-up that takes milliseconds
        await worker.signals.wait_for(lambda: worker.stats.finished == 1, 10)
        assert sleeps.ended[idle_sleep] == "woken"  # the NOTIFY cut the 30 s sleep short
    finally:
        worker.stop()
        await task


async def test_without_listen_the_worker_sleeps_until_the_next_due_time(store, fake, fake_url,
                                                                       make_worker):
    fake.add_job("d1", script=[{"sume_status": "completed", "terminal": True}])
    await store.add_job("d1", delay_s=2.0)  # time enough for the first claim to find nothing
    due_at = (await store.get_job("d1"))["next_poll_at"]
    worker = make_worker(idle_max_s=30.0, listen=False)
    sleeps = observe_sleeps(worker, note=lambda: worker.stats.claims)
    await run_until(worker, lambda: worker.stats.finished == 1, within_s=10)
    # one empty claim, then a sleep until the row is due (not the 30 s idle cap), which
    # nothing cut short, then the claim that took the row
    assert sleeps.notes[0] == 1 and 0 < sleeps.asked[0] <= 2.0 + 0.01, sleeps.asked
    assert sleeps.ended[0] == "timeout" and sleeps.notes[1] == 2
    row = await store.get_job("d1")
    assert row["state"] == "completed" and row["claimed_at"] >= due_at  # not read early


async def test_idle_worker_does_not_poll_the_table_in_a_loop(store, make_worker):
    worker = make_worker(idle_max_s=30.0, listen=False)
    sleeps = observe_sleeps(worker, note=lambda: worker.stats.claims)
    task = asyncio.create_task(worker.run())
    try:
        # nothing pending: after its one claim it sleeps for the whole idle cap
        await worker.signals.wait_for(lambda: sleeps.asleep, 10)
        assert sleeps.asked == [30.0] and sleeps.notes == [1]
        await asyncio.sleep(0.2)  # and stays asleep (a wake-up bug would claim again here)
        assert sleeps.asleep and len(sleeps.asked) == 1 and worker.stats.claims == 1
    finally:
        worker.stop()
        await task


async def test_rows_locked_by_others_do_not_cause_a_hot_loop(store, make_worker):
    from vidpoll.models import ClaimMode

    await store.add_job("held", delay_s=-1)
    async with store.lock_batch(1, "other") as batch:
        assert len(batch.jobs) == 1
        worker = make_worker(claim_mode=ClaimMode.LEASE, listen=False)
        sleeps = observe_sleeps(worker, note=lambda: worker.stats.claims)
        task = asyncio.create_task(worker.run())
        try:
            await worker.signals.wait_for(lambda: len(sleeps.ended) >= 3, 10)
        finally:
            worker.stop()
            await task
    # due but locked: each empty claim is followed by a BUSY_RETRY_S sleep (0.25 s) that
    # lasts, never thousands of claims a second
    assert sleeps.notes[:3] == [1, 2, 3], sleeps.notes
    assert BUSY_RETRY_S >= 0.1  # a floor worth the name: ten claims a second at most
    assert sleeps.asked[:3] == [BUSY_RETRY_S] * 3 and sleeps.ended[:3] == ["timeout"] * 3
    assert worker.stats.reads == 0
