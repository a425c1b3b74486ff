"""No thundering herd (issue 16 item 3): in a fleet, one NOTIFY of a new row is answered by
one claim, not by every idle worker. The test plays "another worker" with its own LISTEN and
pg_notify, so each rule is checked on what the worker under test did, not on timing."""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest

from vidpoll.worker import DRAINED_CHANNEL

pytestmark = pytest.mark.slow


class Listener:
    """A LISTEN connection of the test's own, collecting payloads per channel."""

    def __init__(self, conn: psycopg.AsyncConnection, task: asyncio.Task[None]) -> None:
        self.conn, self.task = conn, task
        self.payloads: dict[str, list[str]] = {}

    async def next(self, channel: str, within_s: float = 30) -> str:
        async with asyncio.timeout(within_s):
            while not self.payloads.get(channel):  # noqa: ASYNC110 (filled by the reader)
                await asyncio.sleep(0.01)
        return self.payloads[channel].pop(0)


async def listen(db_url: str, *channels: str) -> Listener:
    conn = await psycopg.AsyncConnection.connect(db_url, autocommit=True)
    for channel in channels:
        await conn.execute(f"LISTEN {channel}")

    async def read() -> None:
        async for note in conn.notifies():
            listener.payloads.setdefault(note.channel, []).append(note.payload)

    listener = Listener(conn, asyncio.create_task(read()))
    return listener


async def announce(db_url: str, **news: object) -> None:
    """What another worker sends after a claim that took every due row."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("SELECT pg_notify(%s, %s)", (DRAINED_CHANNEL, json.dumps(news)))


async def in_a_fleet(worker, db_url: str) -> None:
    """Another worker's announcement: from now on this worker staggers its answers (once it
    is asleep with nothing to do: a worker mid-turn answers a NOTIFY at once, rightly)."""
    await announce(db_url, by="another", accounts=[], results=False, covered=[])
    await worker.signals.wait_for(lambda: worker._herd_mode() and worker._idle_sleeping, 10)


async def test_a_lone_worker_answers_a_notify_at_once(store, fake, make_worker):
    # it tells the fleet it is there (a presence notice) and hears only itself
    worker = make_worker(idle_max_s=30.0, herd_stagger_s=30.0)
    task = asyncio.create_task(worker.run())
    try:
        await worker.signals.wait_for(lambda: worker.listening and worker.idle, 10)
        fake.add_job("lone", script=[{"sume_status": "completed", "terminal": True}])
        await store.add_job("lone", delay_s=0)
        # a 30 s stagger would outlast this: no stagger without a fleet
        await worker.signals.wait_for(lambda: worker.stats.finished == 1, 10)
        assert worker.stats.staggered == 0 and worker.stats.drained_sent == 0
    finally:
        worker.stop()
        await task


async def test_a_staggered_answer_is_skipped_when_another_claim_covered_it(
        store, db_url, make_worker):
    worker = make_worker(idle_max_s=30.0, herd_stagger_s=60.0)
    test = await listen(db_url, "vidpoll_jobs")
    task = asyncio.create_task(worker.run())
    try:
        await worker.signals.wait_for(lambda: worker.listening and worker.idle, 10)
        await in_a_fleet(worker, db_url)
        claims = worker.stats.claims
        await store.add_job("herd1", delay_s=0)
        txid = await test.next("vidpoll_jobs")
        assert txid.isdigit()  # migration 0012: the payload names the transaction
        await worker.signals.wait_for(lambda: worker.stats.staggered == 1, 10)
        # another worker claimed after this notification reached it, and took every row
        await announce(db_url, by="another", accounts=["default"], results=True,
                       covered=[txid])
        await worker.signals.wait_for(lambda: worker.stats.herd_skips == 1, 10)
        assert worker.stats.claims == claims  # it never claimed for that notification
        assert worker._stagger is None
    finally:
        worker.stop()
        await task
        test.task.cancel()
        await test.conn.close()


@pytest.mark.parametrize("news", [
    {"by": "another", "accounts": ["default"], "results": True, "covered": ["1"]},  # not it
    {"by": "another", "accounts": ["other"], "results": True, "covered": None},  # not ours
    {"by": "another", "accounts": ["default"], "results": False, "covered": None},  # no results
])
async def test_an_announcement_that_does_not_cover_the_notification_is_no_reason_to_skip(
        store, fake, db_url, make_worker, news):
    worker = make_worker(idle_max_s=30.0, herd_stagger_s=5.0)
    test = await listen(db_url, "vidpoll_jobs")
    task = asyncio.create_task(worker.run())
    try:
        await worker.signals.wait_for(lambda: worker.listening and worker.idle, 10)
        await in_a_fleet(worker, db_url)
        fake.add_job("herd2", script=[{"sume_status": "completed", "terminal": True}])
        await store.add_job("herd2", delay_s=0)
        txid = await test.next("vidpoll_jobs")
        await worker.signals.wait_for(lambda: worker.stats.staggered == 1, 10)
        if news["covered"] is None:
            news = {**news, "covered": [txid]}
        await announce(db_url, **news)
        # its stagger (0.5-5 s) runs out and it reads the row
        await worker.signals.wait_for(lambda: worker.stats.finished == 1, 30)
        assert worker.stats.herd_skips == 0
    finally:
        worker.stop()
        await task
        test.task.cancel()
        await test.conn.close()


async def test_a_claim_that_took_every_row_announces_what_it_covered(
        store, fake, db_url, make_worker):
    worker = make_worker(idle_max_s=30.0, herd_stagger_s=0.05)
    test = await listen(db_url, "vidpoll_jobs", DRAINED_CHANNEL)
    task = asyncio.create_task(worker.run())
    try:
        await worker.signals.wait_for(lambda: worker.listening and worker.idle, 10)
        await in_a_fleet(worker, db_url)
        fake.add_job("herd3", script=[{"sume_status": "completed", "terminal": True}])
        await store.add_job("herd3", delay_s=0)
        txid = await test.next("vidpoll_jobs")
        while True:  # past the test's own announcement and the worker's presence notice
            news = json.loads(await test.next(DRAINED_CHANNEL))
            if news["covered"]:
                break
        assert news == {"by": worker.config.worker_id, "accounts": ["default"],
                        "results": True, "covered": [txid]}
        assert worker.stats.drained_sent == 1 and worker.stats.staggered == 1
        await worker.signals.wait_for(lambda: worker.stats.finished == 1, 10)
    finally:
        worker.stop()
        await task
        test.task.cancel()
        await test.conn.close()


async def test_two_workers_answer_one_notification_with_one_claim(store, fake, db_url,
                                                                 make_worker):
    """Two real workers: each hears the other's presence notice, so both stagger; the second
    one's staggered answer is skipped because the first one's claim covered it (staggers
    fixed so the first is first: up to 0.05 s vs at least 6 s, room for a busy machine)."""
    quick = make_worker(idle_max_s=30.0, herd_stagger_s=0.05, worker_id="quick")
    slow = make_worker(idle_max_s=30.0, herd_stagger_s=60.0, worker_id="slow")
    tasks = [asyncio.create_task(w.run()) for w in (quick, slow)]
    try:
        for w in (quick, slow):  # no help from the test: they find each other
            # asleep with nothing to do (a worker mid-turn answers a NOTIFY at once, rightly)
            await w.signals.wait_for(
                lambda w=w: w.listening and w._idle_sleeping and w._herd_mode(), 10)
        fake.add_job("herd4", script=[{"sume_status": "completed", "terminal": True}])
        await store.add_job("herd4", delay_s=0)
        await quick.signals.wait_for(lambda: quick.stats.finished == 1, 10)
        await slow.signals.wait_for(lambda: slow.stats.herd_skips == 1, 10)
        assert quick.stats.drained_sent == 1
        assert slow.stats.notify_wakeups == 0 and slow.stats.finished == 0
    finally:
        for w in (quick, slow):
            w.stop()
        await asyncio.gather(*tasks)
