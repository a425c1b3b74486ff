"""Issue 30's "done when", end to end: a fleet of real Submitters and Workers in this process,
each on its own connection pool, against a real PostgreSQL and the fake Sume over loopback
HTTP. A day cap holds creates past ⌊cap / price⌋ whatever the number of submitters; raising
it (what SIGHUP does) sends exactly the difference; failures Sume refunds free budget for the
held; the day's turn, by an injected clock, resumes what was held the day before.

Every wait is on observed state (the database, the fake's counters), never on the clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any

import psycopg

from vidpoll.models import HELD, ClaimedIntent
from vidpoll.providers.sume.client import SumeClient
from vidpoll.providers.sume.fake import FakeSume
from vidpoll.spend import AccountSpend
from vidpoll.store import PgStore
from vidpoll.submitter import Submitter, SubmitterConfig
from vidpoll.worker import Worker, WorkerConfig

from ..conftest import API_KEY, FAST_POLICY, db_now

D = Decimal
PRICE = D("0.50")
ACCOUNT = "default"


def noon_zone(now: datetime) -> str:
    """A fixed-offset zone where `now` is near noon: the cap's day then ends hours after the
    test, so the database's own clock (the one production counts by) cannot turn it mid-run."""
    offset = 12 - now.astimezone(UTC).hour  # -11 .. 12 hours east of UTC
    return f"Etc/GMT{-offset:+d}"  # the Etc zones' signs are inverted: Etc/GMT-3 is UTC+3


def capped(cap: str, zone: str = "UTC") -> AccountSpend:
    # the fake charges credits_per_job = 50 credits a render: at 0.01 a credit, 0.50
    return AccountSpend(prices={"default": PRICE}, unit_prices={"credit": D("0.01")},
                        cap_per_day=D(cap), cap_timezone=zone)


class ClaimGate:
    """Holds the submitters' claims back while the test changes their settings (a cap, the
    spend clock), so that no claim begun with the old settings ends after the change: a
    claim reads them as it begins (see test_a_claim_under_way_when_the_cap_is_raised_...)."""

    def __init__(self) -> None:
        self._open = asyncio.Event()
        self._open.set()
        self._running = 0
        self._changed = asyncio.Condition()

    def guard(self, sub: Submitter) -> None:
        real = sub._claim

        async def claim(limit: int) -> list[ClaimedIntent]:
            await self._open.wait()
            self._running += 1
            try:
                return await real(limit)
            finally:
                self._running -= 1
                async with self._changed:
                    self._changed.notify_all()

        sub._claim = claim  # type: ignore[method-assign]

    @contextlib.asynccontextmanager
    async def closed(self) -> AsyncIterator[None]:
        """No claim runs inside: those under way have ended, new ones wait at the gate."""
        self._open.clear()
        try:
            async with self._changed:
                await self._changed.wait_for(lambda: self._running == 0)
            yield
        finally:
            self._open.set()


@dataclass
class Fleet:
    """Submitters and workers, each with its own pool and client, running until stopped."""

    subs: list[Submitter] = field(default_factory=list)
    workers: list[Worker] = field(default_factory=list)
    gate: ClaimGate = field(default_factory=ClaimGate)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    async def stop(self) -> None:
        for runner in (*self.subs, *self.workers):
            runner.stop()
        await asyncio.gather(*self.tasks)
        self.tasks.clear()

    def holds(self) -> int:
        """Intents held by the fleet's claims so far (each hold counted)."""
        return sum(s.stats.held for s in self.subs)


@contextlib.asynccontextmanager
async def fleet(db_url: str, fake_url: str, spend: AccountSpend, *, submitters: int = 6,
                workers: int = 3,
                spend_clock: Callable[[], datetime] | None = None) -> AsyncIterator[Fleet]:
    """`submitters` Submitters and `workers` Workers on the account's prices and caps."""
    out = Fleet()
    async with contextlib.AsyncExitStack() as stack:
        for n in range(submitters + workers):
            store = await PgStore.open(db_url, max_size=3)
            stack.push_async_callback(store.close)
            client = await stack.enter_async_context(
                SumeClient(fake_url, API_KEY, timeout_s=1.0))
            if n < submitters:
                sub = Submitter(store, client, SubmitterConfig(
                    concurrency=4, max_active=None, policy=FAST_POLICY, lease_s=5.0,
                    http_timeout_s=1.0, first_poll_s=0.0, worker_id=f"s{n}",
                    spends={ACCOUNT: spend}, spend_clock=spend_clock))
                out.gate.guard(sub)
                out.subs.append(sub)
            else:
                out.workers.append(Worker(store, client, WorkerConfig(
                    concurrency=20, policy=FAST_POLICY, lease_s=5.0, worker_id=f"w{n}",
                    herd_stagger_s=0.0, spends={ACCOUNT: spend})))
        runners: list[Submitter | Worker] = [*out.subs, *out.workers]
        out.tasks = [asyncio.create_task(r.run()) for r in runners]
        try:
            yield out
        finally:
            await out.stop()


async def rows(store: PgStore, query: str, *args: Any) -> list[tuple[Any, ...]]:
    async with store._pool.connection() as conn:
        cur = await conn.execute(query, args)
        found: list[tuple[Any, ...]] = await cur.fetchall()
        return found


async def value(store: PgStore, query: str, *args: Any) -> Any:
    found = await rows(store, query, *args)
    return found[0][0]


async def reserved_now(store: PgStore) -> Decimal:
    """What counts against the caps now: every reservation not released."""
    total: Decimal = await value(store, "SELECT coalesce(sum(amount), 0) FROM vidpoll_spend "
                                        "WHERE status <> 'released'")
    return total


async def busy(store: PgStore, jobs: bool = True) -> int:
    """Work left for the fleet: jobs running (unless no worker runs: `jobs` False), intents
    queued or in flight (a claimed intent is `queued` until its answer is recorded), held
    intents due (a refund or a reload makes them due at once). 0: nothing more can happen
    until a window turns."""
    left: int = await value(store, """
        SELECT (SELECT count(*) FROM video_jobs WHERE outcome IS NULL AND %s)
             + (SELECT count(*) FROM video_intents WHERE state = 'queued')
             + (SELECT count(*) FROM video_intents
                WHERE state = 'held' AND next_attempt_at <= clock_timestamp())""", jobs)
    return left


async def until(check: Callable[[], Awaitable[bool]], store: PgStore, fake: FakeSume,
                within_s: float = 10.0) -> None:
    """Look at the state again and again until `check()` holds (it may assert on the way)."""
    try:
        async with asyncio.timeout(within_s):
            while not await check():  # noqa: ASYNC110 (bounded: the state is in the db)
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(
            f"not reached in {within_s} s: intents {await store.intent_counts()}, jobs "
            f"{await store.counts()}, billed {fake.billed}, reserved {await reserved_now(store)}"
        ) from None


def watch_the_cap(fake: FakeSume, store: PgStore, cap: Callable[[], Decimal],
                  seen: list[Decimal]) -> None:
    """As each create reaches the fake (before it bills), what the fleet has reserved must be
    within the cap: the reservation of this very create is committed by then."""

    async def look(key: str | None) -> None:
        reserved = await reserved_now(store)
        seen.append(reserved)
        assert reserved <= cap(), f"{reserved} reserved past the cap {cap()} at {key}"

    fake.on_create = look


async def queue(store: PgStore, n: int) -> list[str]:
    keys = [f"clip-{i:03d}" for i in range(n)]
    await store.add_intents([(k, {"prompt": f"clip {k}"}, 0) for k in keys])
    return keys


async def sent_keys(store: PgStore) -> list[str]:
    return [r[0] for r in await rows(store, "SELECT idempotency_key FROM vidpoll_spend "
                                            "ORDER BY idempotency_key")]


async def test_sixty_submissions_under_a_cap_of_twenty_then_the_cap_raised(
        store: PgStore, fake: FakeSume, fake_url: str, db_url: str) -> None:
    zone = noon_zone(await db_now(db_url))
    spend = capped("10", zone)
    cap = [D(10)]
    seen: list[Decimal] = []
    watch_the_cap(fake, store, lambda: cap[0], seen)
    keys = await queue(store, 60)
    async with fleet(db_url, fake_url, spend) as f:

        async def sent_and_held(sent: int) -> bool:
            assert await reserved_now(store) <= cap[0]
            return (await busy(store) == 0 and fake.billed == sent
                    and await store.intent_counts() == {"submitted": sent, "held": 60 - sent})

        await until(lambda: sent_and_held(20), store, fake)
        # the cap, not the queue, stopped them: 20 creates reached Sume, each once, the oldest
        assert (fake.billed, len(fake.jobs), fake.creates) == (20, 20, 20)
        assert sorted(fake.by_key) == keys[:20] == await sent_keys(store)
        assert f.holds() >= 40
        held = await store.list_intents(HELD)
        assert sorted(i.key for i in held) == keys[20:]
        day_end = spend.day_end(await db_now(db_url))
        for intent in held:
            assert intent.held_cap == "cap_per_day"
            assert intent.held_reason is not None
            assert intent.held_reason.startswith(
                "cap_per_day 10.00 USD reached: 10.00 USD used ("), intent.held_reason
            assert f"resumes {day_end:%Y-%m-%d} 00:00 {zone}" in intent.held_reason
            assert intent.next_attempt_at == day_end
        # each job ended at Sume's own figure: 50 credits, 0.50 USD
        assert await rows(store, "SELECT count(*), sum(cost), min(provider_cost), "
                                 "max(provider_cost), min(provider_cost_unit) "
                                 "FROM video_jobs") == [(20, D("10.00"), 50, 50, "credit")]
        assert await rows(store, "SELECT status, count(*), sum(amount) FROM vidpoll_spend "
                                 "GROUP BY status") == [("spent", 20, D("10.00"))]

        # the cap raised to 20, as SIGHUP does it: every submitter gets the new settings
        async with f.gate.closed():
            cap[0] = D(20)
            raised = dataclasses.replace(spend, cap_per_day=D(20))
            for sub in f.subs:
                sub.reload_spends({ACCOUNT: raised})
        await until(lambda: sent_and_held(40), store, fake)
    # stopped: nothing was in flight, and nothing more went
    assert (fake.billed, len(fake.jobs), fake.creates) == (40, 40, 40)
    assert max(fake.billed_by_key.values()) == 1 and fake.create_overlaps == 0
    assert sorted(fake.by_key) == keys[:40] == await sent_keys(store)
    assert await store.intent_counts() == {"submitted": 40, "held": 20}
    still = await store.list_intents(HELD)
    assert sorted(i.key for i in still) == keys[40:]
    assert all(i.held_reason is not None and i.held_reason.startswith(
        "cap_per_day 20.00 USD reached: 20.00 USD used") for i in still)
    assert await rows(store, "SELECT status, count(*), sum(amount) FROM vidpoll_spend "
                             "GROUP BY status") == [("spent", 40, D("20.00"))]
    assert len(seen) == 40 and max(seen) <= D(20)


async def test_failures_sume_refunds_free_the_cap_for_held_intents(
        store: PgStore, fake: FakeSume, fake_url: str, db_url: str) -> None:
    fake.config.terminal_mix = {"completed": 2.0, "failed": 1.0}  # a third of renders fail
    spend = capped("10", noon_zone(await db_now(db_url)))
    seen: list[Decimal] = []
    watch_the_cap(fake, store, lambda: D(10), seen)
    await queue(store, 60)
    polled: list[Decimal] = []
    async with fleet(db_url, fake_url, spend):

        async def quiet() -> bool:
            polled.append(await reserved_now(store))
            assert polled[-1] <= D(10)
            return await busy(store) == 0 and fake.billed > 0

        await until(quiet, store, fake)
    outcomes = dict(await rows(store, "SELECT outcome, count(*) FROM video_jobs "
                                      "GROUP BY outcome"))
    succeeded, failed = outcomes.get("succeeded", 0), outcomes.get("failed", 0)
    sent = fake.billed
    # what failed was refunded, and its place in the cap went to a held intent: more than
    # ⌊10 / 0.50⌋ creates were sent, and exactly that many were charged
    assert failed > 0 and sent == 20 + failed, (sent, outcomes)
    assert sent > 20 and succeeded == 20 and set(outcomes) == {"succeeded", "failed"}
    assert (len(fake.jobs), max(fake.billed_by_key.values())) == (sent, 1)
    assert await store.intent_counts() == {"submitted": sent, "held": 60 - sent}
    # the ledger: spent is 0.50 a success, the fake's own captured credits at 0.01, and the
    # refunded failures released
    spent = await value(store, "SELECT coalesce(sum(amount), 0) FROM vidpoll_spend "
                               "WHERE status = 'spent'")
    ledger = fake.ledger()
    assert spent == PRICE * succeeded == D(ledger["captured"]) * D("0.01") == D(10)
    assert ledger["refunded"] == 50 * failed and ledger["reserved"] == 0
    assert dict(await rows(store, "SELECT status, count(*) FROM vidpoll_spend "
                                  "GROUP BY status")) == {"spent": succeeded,
                                                          "released": failed}
    assert await rows(store, """
        SELECT j.outcome, j.cost, j.provider_cost, j.provider_cost_unit, s.status, s.amount,
               count(*)
        FROM video_jobs j JOIN vidpoll_spend s USING (idempotency_key)
        GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY 1""") == [
        ("failed", D(0), D(0), "credit", "released", D(0), failed),
        ("succeeded", D("0.50"), D(50), "credit", "spent", D("0.50"), succeeded)]
    # never past the cap: at each create, at each look, and now
    assert len(seen) == sent and max(seen) <= D(10)
    assert max(polled) <= D(10) and await reserved_now(store) == D(10)


async def test_intents_held_on_one_day_go_out_when_the_clock_says_the_next(
        store: PgStore, fake: FakeSume, fake_url: str, db_url: str) -> None:
    # The caps count days by `spend_clock`; a held intent is due when its window ends
    # (next_attempt_at), compared with the database's clock, which a test cannot move. So the
    # clock's days are far ahead (the window's end is never reached by itself), and the turn
    # is made by hand: the held intents are made due (as the database's clock reaching their
    # next_attempt_at would make them), then the claim decides by the spend clock.
    # Made due while the clock still says day 1, they are held again and nothing is sent; made
    # due when it says day 2, the 20 oldest go on day 2's budget. Day 1's reservations are
    # still there (no worker ends those jobs): only the day changed.
    spend = capped("10", "Asia/Tokyo")
    zone = spend.zone
    clock = [datetime(2099, 6, 1, 12, tzinfo=zone)]
    keys = await queue(store, 60)

    async def turn() -> None:
        """Every held intent due now, as when the database's clock reaches their window's end
        (the NOTIFY stands in for the submitters' sleep running out at their due time)."""
        async with store._pool.connection() as conn:
            await conn.execute("UPDATE video_intents SET next_attempt_at = clock_timestamp() "
                               "WHERE state = 'held' AND account = %s", (ACCOUNT,))
            await conn.execute("SELECT pg_notify('vidpoll_intents', '')")

    async with fleet(db_url, fake_url, spend, submitters=3, workers=0,
                     spend_clock=lambda: clock[0]) as f:

        async def sent_and_held(sent: int, holds: int) -> bool:
            return (await busy(store, jobs=False) == 0 and fake.billed == sent
                    and f.holds() == holds
                    and await store.intent_counts() == {"submitted": sent, "held": 60 - sent})

        await until(lambda: sent_and_held(20, 40), store, fake)
        day1_end = datetime(2099, 6, 2, tzinfo=zone)
        assert all(i.next_attempt_at == day1_end for i in await store.list_intents(HELD))

        await turn()  # due, but the clock still says 1 June: held again, nothing sent
        await until(lambda: sent_and_held(20, 80), store, fake)
        assert all(i.next_attempt_at == day1_end for i in await store.list_intents(HELD))

        async with f.gate.closed():
            clock[0] += timedelta(days=1)
        await turn()
        await until(lambda: sent_and_held(40, 80 + 20), store, fake)
    assert fake.billed == 40 and sorted(fake.by_key) == keys[:40]
    held = await store.list_intents(HELD)
    assert sorted(i.key for i in held) == keys[40:]
    assert all(i.next_attempt_at == datetime(2099, 6, 3, tzinfo=zone) for i in held)
    assert all(i.held_reason is not None and "resumes 2099-06-03 00:00 Asia/Tokyo (the next "
               "day)" in i.held_reason for i in held)
    assert await rows(store, "SELECT day, count(*), sum(amount), min(idempotency_key), "
                             "max(idempotency_key) FROM vidpoll_spend GROUP BY day "
                             "ORDER BY day") == [
        (date(2099, 6, 1), 20, D("10.00"), keys[0], keys[19]),
        (date(2099, 6, 2), 20, D("10.00"), keys[20], keys[39])]


# --- what this file found -------------------------------------------------------------------

async def test_a_claim_that_takes_nothing_wakes_no_submitter(store: PgStore,
                                                             db_url: str) -> None:
    """Every submitter listens on vidpoll_intents: a claim that NOTIFYs it wakes the whole
    fleet, whose claims wake it again, and idle submitters never sleep. (0017's first claim
    set `state` to put a held intent back to `queued`, and the statement-level trigger
    vidpoll_intents_queued, AFTER UPDATE OF state ... FOR EACH STATEMENT, fired on every
    claim, even one that took no row: about 60 claims a second per idle submitter.)"""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as listener, \
            await psycopg.AsyncConnection.connect(db_url, autocommit=True) as other:
        await listener.execute("LISTEN vidpoll_intents")
        for spend in (None, capped("10")):
            assert (await store.claim_checked(4, 5.0, "s1", None, spend=spend)).intents == []
            # notifications come in commit order: all the claim sent is before this one
            await other.execute("SELECT pg_notify('vidpoll_intents', 'after the claim')")
            heard = []
            async with asyncio.timeout(10):
                async for notice in listener.notifies():
                    heard.append(notice.payload)
                    if notice.payload == "after the claim":
                        break
            assert heard == ["after the claim"], f"an empty claim woke the submitters: {heard}"


async def test_a_claim_under_way_when_the_cap_is_raised_does_not_hold_intents_till_tomorrow(
        store: PgStore, fake: FakeSume, client: SumeClient, db_url: str) -> None:
    """reload_spends (SIGHUP) wakes the held intents at once, but a claim already under way
    (waiting for the account's lock, or for a connection) carries the old caps: it claims the
    intents just woken and holds them again under the old cap, due at the window's end. No
    later wake comes: they stay held until tomorrow although the cap was raised."""
    spend = capped("10", noon_zone(await db_now(db_url)))
    keys = await queue(store, 30)
    in_claim, go_on, claim_done = asyncio.Event(), asyncio.Event(), asyncio.Event()
    arm = [False]
    real = store.claim_checked

    async def claim_checked(*args: Any, **kwargs: Any) -> Any:
        if not arm[0]:
            return await real(*args, **kwargs)
        arm[0] = False
        in_claim.set()
        await go_on.wait()  # as if waiting for the lock another submitter holds
        try:
            return await real(*args, **kwargs)
        finally:
            claim_done.set()

    store.claim_checked = claim_checked  # type: ignore[method-assign]
    sub = Submitter(store, client, SubmitterConfig(
        concurrency=4, max_active=None, policy=FAST_POLICY, lease_s=5.0, http_timeout_s=1.0,
        first_poll_s=0.0, worker_id="s1", spends={ACCOUNT: spend}))
    task = asyncio.create_task(sub.run())
    try:
        await until(lambda: _settled(store, fake, 20), store, fake)
        arm[0] = True
        await other_intent_recorded(db_url)  # a NOTIFY: the submitter claims
        await asyncio.wait_for(in_claim.wait(), 10)
        sub.reload_spends({ACCOUNT: dataclasses.replace(spend, cap_per_day=D(15))})

        async def woken() -> bool:
            due: int = await value(store, "SELECT count(*) FROM video_intents WHERE state = "
                                          "'held' AND next_attempt_at <= clock_timestamp()")
            return due == 10

        await until(woken, store, fake)
        go_on.set()
        await asyncio.wait_for(claim_done.wait(), 10)
        try:
            await until(lambda: _settled(store, fake, 30), store, fake, within_s=5.0)
        except AssertionError:
            again = [i for i in await store.list_intents(HELD)
                     if i.next_attempt_at > await db_now(db_url)]
            raise AssertionError(
                f"the cap was raised to 15.00, yet {fake.billed} were sent and {len(again)} "
                f"intents are held again under the old cap, until "
                f"{again[0].next_attempt_at if again else None}: "
                f"{again[0].held_reason if again else None}") from None
    finally:
        sub.stop()
        await task
    assert sorted(fake.by_key) == keys


async def _settled(store: PgStore, fake: FakeSume, sent: int) -> bool:
    return await busy(store, jobs=False) == 0 and fake.billed == sent


async def other_intent_recorded(db_url: str) -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("SELECT pg_notify('vidpoll_intents', '')")
