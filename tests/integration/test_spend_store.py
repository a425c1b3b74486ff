"""Caps in the store: reservations under concurrency, holds, refunds, the window's turn."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from vidpoll.models import HELD
from vidpoll.spend import AccountSpend
from vidpoll.store import PgStore

FLAT = AccountSpend(prices={"default": Decimal("0.50")}, cap_per_day=Decimal("10"))
# an injected day after today's (UTC): every intent the tests record is due by then
TOMORROW = datetime.now(UTC).date() + timedelta(days=1)
NOON = datetime.combine(TOMORROW, datetime.min.time(), UTC) + timedelta(hours=12)


async def _claim_all(store: PgStore, spend: AccountSpend, who: str,
                     now: datetime | None = NOON) -> tuple[list[str], list[str]]:
    """Claim until nothing is due; the keys sent and held by this claimer."""
    sent: list[str] = []
    held: list[str] = []
    while True:
        # a lease of days: what was sent is not due again when the test turns the day
        claim = await store.claim_checked(3, 3 * 86400.0, who, None, now=now, spend=spend)
        if not claim.intents and not claim.held:
            return sent, held
        sent += [i.key for i in claim.intents]
        held += [h.key for h in claim.held]


async def test_concurrent_claimers_never_exceed_the_day_cap(store: PgStore) -> None:
    for n in range(60):
        await store.add_intent(f"k-{n:03d}", {"n": n})
    results = await asyncio.gather(*(_claim_all(store, FLAT, f"w{i}") for i in range(6)))
    sent = [k for s, _ in results for k in s]
    held = [k for _, h in results for k in h]
    assert len(sent) == 20 and len(set(sent)) == 20
    assert len(held) == 40
    # oldest first: the first 20 keys went
    assert sorted(sent) == [f"k-{n:03d}" for n in range(20)]
    intent = await store.get_intent("k-059")
    assert intent is not None and intent.state == HELD and intent.held_cap == "cap_per_day"
    assert intent.held_reason is not None and "10.00 USD" in intent.held_reason
    assert intent.next_attempt_at == NOON + timedelta(hours=12)
    # the day turns: the 20 oldest held go, the rest wait for the next day
    next_day = NOON + timedelta(days=1)
    sent2, held2 = await _claim_all(store, FLAT, "w9", now=next_day)
    assert sorted(sent2) == [f"k-{n:03d}" for n in range(20, 40)]
    assert len(held2) == 20
    again = await store.get_intent("k-059")
    assert again is not None and again.state == HELD
    assert again.next_attempt_at == NOON + timedelta(hours=36)


async def test_a_refunded_failure_frees_budget_and_wakes_held_intents(store: PgStore) -> None:
    spend = AccountSpend(prices={"default": Decimal("0.50")}, cap_per_day=Decimal("1"))
    for n in range(3):
        await store.add_intent(f"r-{n}", {"n": n})
    sent, held = await _claim_all(store, spend, "w", now=None)
    assert (len(sent), held) == (2, ["r-2"])
    async with store._pool.connection() as conn:
        await conn.execute("INSERT INTO video_jobs (job_id, idempotency_key) VALUES "
                           "('j0', 'r-0'), ('j1', 'r-1')")
        # one ends charged (the estimate kept), one refunded by the provider (cost 0)
        await conn.execute("UPDATE video_jobs SET state = 'completed' WHERE job_id = 'j0'")
        await conn.execute("UPDATE video_jobs SET state = 'failed', cost = 0 "
                           "WHERE job_id = 'j1'")
        cur = await conn.execute("SELECT job_id, cost FROM video_jobs ORDER BY job_id")
        assert await cur.fetchall() == [("j0", Decimal("0.50")), ("j1", Decimal("0"))]
    woken = await store.get_intent("r-2")
    assert woken is not None and woken.state == HELD
    assert woken.next_attempt_at <= datetime.now(UTC) + timedelta(seconds=5)
    sent, held = await _claim_all(store, spend, "w", now=None)
    assert (sent, held) == (["r-2"], [])


async def test_the_spend_metrics_come_from_the_ledger(store: PgStore) -> None:
    """/metrics of `serve` (the table's figures) over real HTTP: spent by account and model,
    reserved by account, held by account and cap."""
    import aiohttp

    from vidpoll.web import metrics_app, start_server

    spend = AccountSpend(prices={"default": Decimal("0.50")}, cap_per_day=Decimal("1"))
    for n in range(4):
        await store.add_intent(f"m-{n}", {"n": n})
    sent, held = await _claim_all(store, spend, "w", now=None)
    assert (len(sent), len(held)) == (2, 2)
    async with store._pool.connection() as conn:
        await conn.execute("INSERT INTO video_jobs (job_id, idempotency_key) VALUES ('j', %s)",
                           (sent[0],))
        await conn.execute("UPDATE video_jobs SET state = 'completed' WHERE job_id = 'j'")
    runner, url = await start_server(metrics_app(store, table_gauges=True), "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as answer:
            text = await answer.text()
    finally:
        await runner.cleanup()
    assert 'vidpoll_spend_total{account="default",model=""} 0.5' in text
    assert 'vidpoll_spend_reserved{account="default"} 0.5' in text
    assert 'vidpoll_intents_held{account="default",cap="cap_per_day"} 2.0' in text


async def _ledger_matches_running_totals(store: PgStore) -> None:
    async with store._pool.connection() as conn:
        cur = await conn.execute(
            "SELECT account, day, coalesce(model, ''), "
            "coalesce(sum(amount) FILTER (WHERE status = 'reserved'), 0), "
            "coalesce(sum(amount) FILTER (WHERE status = 'spent'), 0), "
            "count(*) FILTER (WHERE status <> 'released') "
            "FROM vidpoll_spend GROUP BY 1, 2, 3 ORDER BY 1, 2, 3")
        ledger = await cur.fetchall()
        cur = await conn.execute(
            "SELECT account, day, model, reserved, spent, creates FROM vidpoll_spend_days "
            "WHERE reserved <> 0 OR spent <> 0 OR creates <> 0 ORDER BY 1, 2, 3")
        assert await cur.fetchall() == ledger


async def test_an_intent_given_back_unsent_gives_its_reservation_back(store: PgStore) -> None:
    """Claimed late on day 1 and given back unsent (a shutdown, a paused key): it reserves
    again on day 2, against day 2's cap, never on day 1's reservation."""
    spend = AccountSpend(prices={"default": Decimal("0.50")}, cap_per_day=Decimal("1"))
    late = NOON + timedelta(hours=11, minutes=59)
    for key in ("a0", "a1"):
        await store.add_intent(key, {"k": key})
    claim = await store.claim_checked(5, 30.0, "w", None, now=late, spend=spend)
    assert sorted(i.key for i in claim.intents) == ["a0", "a1"]
    for intent in claim.intents:
        assert await store.release_intent(intent, 0.0, now=late)
    for key in ("b0", "b1"):
        await store.add_intent(key, {"k": key})
    next_day = late + timedelta(minutes=2)
    sent, held = await _claim_all(store, spend, "w", now=next_day)
    assert len(sent) == 2 and len(held) == 2  # the cap of day 2: two creates, not four
    await _ledger_matches_running_totals(store)


async def test_a_release_past_the_cap_is_for_one_send(store: PgStore) -> None:
    spend = AccountSpend(prices={"default": Decimal("0.50")}, cap_per_day=Decimal("0.5"))
    await store.add_intent("first", {"n": 1})
    await store.add_intent("second", {"n": 2})
    sent, held = await _claim_all(store, spend, "w", now=None)
    assert (sent, held) == (["first"], ["second"])
    assert await store.release_held("second") == "default"
    claim = await store.claim_checked(5, 30.0, "w", None, spend=spend)
    assert [i.key for i in claim.intents] == ["second"]
    async with store._pool.connection() as conn:  # the provider refused it in its own words
        await conn.execute("UPDATE video_intents SET state = 'rejected', claim_token = NULL "
                           "WHERE idempotency_key = 'second'")
    assert await store.requeue_intents(["second"]) == ["second"]
    again = await store.claim_checked(5, 30.0, "w", None, spend=spend)
    assert again.intents == [] and [h.key for h in again.held] == ["second"]
    await _ledger_matches_running_totals(store)


async def test_the_hourly_cap_spaces_the_resumes_one_slot_apart(store: PgStore) -> None:
    """Held by max_creates_per_hour, each waits for a slot of its own: never all due at the
    moment the first slot frees (claimed and held again together, each time)."""
    spend = AccountSpend(max_creates_per_hour=2)
    for n in range(6):
        await store.add_intent(f"h-{n}", {"n": n})
    sent, held = await _claim_all(store, spend, "w", now=NOON)
    assert (len(sent), len(held)) == (2, 4)
    resumes = sorted([i.next_attempt_at for i in await store.list_intents("held")])
    first = NOON + timedelta(hours=1)
    assert resumes == [first + n * timedelta(minutes=30) for n in range(4)]
    await _ledger_matches_running_totals(store)


async def test_a_key_prefix_far_above_its_usual_rate_is_warned_about_once(
        store: PgStore) -> None:
    """Without prices or caps: 60 creates of `order-` within ten minutes, none the day
    before: one warning for the fleet, not one per claim."""
    async with store._pool.connection() as conn:
        await conn.execute(
            "INSERT INTO vidpoll_spend (idempotency_key, account, provider, day, reserved_at, "
            "status) SELECT 'order-' || n, 'default', 'sume', current_date, "
            "clock_timestamp() - interval '1 minute', 'reserved' "
            "FROM generate_series(1, 60) n")
    await store.add_intent("order-999", {"n": 1})
    await store.add_intent("order-1000", {"n": 2})
    first = await store.claim_checked(1, 30.0, "w", None, spend=AccountSpend())
    assert len(first.warnings) == 1 and "'order-'" in first.warnings[0]
    second = await store.claim_checked(1, 30.0, "w2", None, spend=AccountSpend())
    assert len(second.intents) == 1 and second.warnings == []


async def test_the_80_percent_warning_is_said_once_per_cap_and_window(store: PgStore) -> None:
    for n in range(40):
        await store.add_intent(f"w-{n:02d}", {"n": n})
    warnings: list[str] = []
    for who in ("a", "b", "c"):  # three submitters of one fleet
        claim = await store.claim_checked(4, 3 * 86400.0, who, None, now=NOON, spend=FLAT)
        warnings += claim.warnings
        while claim.intents or claim.held:
            claim = await store.claim_checked(4, 3 * 86400.0, who, None, now=NOON, spend=FLAT)
            warnings += claim.warnings
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith("account default: cap_per_day ")
    assert "of 10.00 USD" in warnings[0]
    # the next day is another window: its 20 go, and it is said again there
    tomorrow = NOON + timedelta(days=1)
    again: list[str] = []
    while True:
        claim = await store.claim_checked(4, 3 * 86400.0, "a", None, now=tomorrow, spend=FLAT)
        again += claim.warnings
        if not claim.intents and not claim.held:
            break
    assert len(again) == 1 and again[0].startswith("account default: cap_per_day ")


async def test_a_raised_cap_lets_every_held_intent_go_twenty_at_a_time(store: PgStore) -> None:
    """A reload wakes the 20 oldest held; a claim that sends held intents and holds none wakes
    the next 20: all 45 go, never one left waiting for the next day."""
    tight = AccountSpend(prices={"default": Decimal("0.50")}, cap_per_day=Decimal("0.5"))
    for n in range(46):
        await store.add_intent(f"c-{n:02d}", {"n": n})
    sent, held = await _claim_all(store, tight, "w", now=None)
    assert (len(sent), len(held)) == (1, 45)
    raised = AccountSpend(prices={"default": Decimal("0.50")}, cap_per_day=Decimal("100"))
    assert await store.wake_held(["default"]) == 20
    sent, held = await _claim_all(store, raised, "w", now=None)
    assert (len(sent), held) == (45, [])
    assert await store.list_intents("held") == []
