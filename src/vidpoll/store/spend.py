"""Spend (0017): every create reserves its estimate before it is sent, in the transaction that
claims it and under the account's admission lock, so a fleet of submitters never exceeds a cap
by even one job; what does not fit is held. Reports of where the money went. Queries:
spend.sql (the ledger is settled by triggers as jobs end: migrations/0017_spend.sql)."""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from decimal import Decimal
from typing import Any

from psycopg import AsyncConnection
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from vidpoll.models import HELD, QUEUED, Held
from vidpoll.spend import WARN_AT, AccountSpend, NoEstimate, month_start, prefixes_of
from vidpoll.store.base import PgBase, _q

PRICE = "price"
"""The `held_cap` of an intent held because its request has no estimate under a capped
account (its model has no price): held until the prices are changed and reloaded."""
NO_PRICE_RETRY = timedelta(hours=1)
"""How long such an intent waits before it is checked again (a reload wakes it sooner)."""
BURST_MIN = 50
BURST_FACTOR = 10.0
BURST_CHECK_EVERY_S = 60.0
BURST_PREFIXES_CHECKED = 3
"""At most this many prefixes are checked per claim (a claim takes a few intents)."""
_PREFIX = re.compile(r"^(.+?[-_:/.])[^-_:/.]+$")


NOTHING_USED: dict[str, Any] = {
    "reserved_keys": [], "day_spent": Decimal(0), "day_reserved": Decimal(0),
    "month_spent": None, "month_reserved": None, "prefix_used": [], "hour_creates": None,
    "hour_oldest": None}
"""What spend_used says of an account with no prices and no caps, without asking (a key that
holds a reservation already is left as it is by reserve_spend's ON CONFLICT)."""


@dataclass(frozen=True)
class SpendCheck:
    """What the spend check of one claim decided."""

    held: list[Held]
    warnings: list[str]


def money(amount: Decimal, currency: str) -> str:
    return f"{amount:.2f} {currency}"


async def check_claimed(conn: AsyncConnection[Any], account: str, spend: AccountSpend,
                        rows: list[dict[str, Any]], now: datetime | None,
                        burst_memo: dict[tuple[str, str], float] | None = None
                        ) -> tuple[list[dict[str, Any]], SpendCheck]:
    """Reserve the claimed intents' estimates within the account's caps, oldest first, in the
    claim's transaction (the caller holds the account's admission lock); those that do not fit
    are held. Returns the rows to send and what was decided."""
    if not rows:
        return rows, SpendCheck([], [])
    if now is None:  # the database's clock, as the claim read it: the fleet's one clock
        now = rows[0]["db_now"]
    assert now is not None
    day = spend.today(now)
    first = month_start(day)
    next_month = spend.month_end(now).date()
    prefixes = list(spend.cap_per_key_prefix)
    used: dict[str, Any] | None = NOTHING_USED
    if spend.guarded:  # else nothing to check: its creates are only counted
        cur2 = conn.cursor(row_factory=dict_row)
        await cur2.execute(_q("spend_used"), {
            "account": account, "day": day, "month_from": first, "month_to": next_month,
            "month": spend.cap_per_month is not None, "hour_max": spend.max_creates_per_hour,
            "hour_from": now - timedelta(hours=1), "prefixes": prefixes,
            "keys": [r["idempotency_key"] for r in rows]})
        used = await cur2.fetchone()
    assert used is not None
    have = set(used["reserved_keys"])
    day_used = used["day_spent"] + used["day_reserved"]
    month_spent = used["month_spent"] or Decimal(0)
    month_used = month_spent + (used["month_reserved"] or Decimal(0))
    prefix_used = dict(zip(prefixes, used["prefix_used"], strict=True))
    hour_creates = int(used["hour_creates"] or 0)
    hour_oldest: datetime | None = used["hour_oldest"]
    hourly_held: int | None = None  # held for the hourly cap already (read when needed)
    reserved: list[tuple[dict[str, Any], Decimal | None]] = []
    held: list[Held] = []

    def hold(row: dict[str, Any], cap: str, why: str, until: datetime) -> None:
        held.append(Held(row["idempotency_key"], row["claim_token"], cap, why, until,
                         again=row["state"] == HELD))

    def over(cap: str, limit: Decimal, spent: Decimal, reserved_now: Decimal,
             estimate: Decimal, until: datetime, when: str) -> str:
        c = spend.currency
        return (f"{cap} {money(limit, c)} reached: {money(spent + reserved_now, c)} used "
                f"({money(spent, c)} spent, {money(reserved_now, c)} reserved), this request "
                f"{money(estimate, c)}; resumes {until.astimezone(spend.zone):%Y-%m-%d %H:%M} "
                f"{spend.cap_timezone} ({when}), when budget frees, or when the cap is "
                f"raised")

    # retries and look-ups first (they may be billed already), then fresh ones oldest first
    order = sorted(rows, key=lambda r: (r["attempts"] == 1 and r["state"] in ("queued", HELD),
                                        -r["priority"], r["seq"]))
    for row in order:
        key = row["idempotency_key"]
        if key in have:
            continue
        fresh = (row["attempts"] == 1 and row["state"] in ("queued", HELD)
                 and not row["past_cap"])
        try:
            estimate = spend.estimate(row["payload"], row.get("model"))
        except NoEstimate as exc:
            if fresh and spend.capped:
                hold(row, PRICE, f"{exc}; the account has caps, so every request needs an "
                                 f"estimate", now + NO_PRICE_RETRY)
                continue
            estimate = None
        if fresh:
            e = estimate or Decimal(0)
            if (spend.max_creates_per_hour is not None
                    and hour_creates + 1 > spend.max_creates_per_hour):
                if hourly_held is None:
                    cur = await conn.execute(_q("held_for_cap"), {
                        "account": account, "cap": "max_creates_per_hour"})
                    found_n = await cur.fetchone()
                    hourly_held = int(found_n[0]) if found_n else 0
                # one resume per slot the hour frees, in order: all of them due at the first
                # would be claimed and held again together, each slot that frees
                slot = timedelta(hours=1) / spend.max_creates_per_hour
                until = max((hour_oldest or now) + timedelta(hours=1), now) + hourly_held * slot
                hourly_held += 1
                hold(row, "max_creates_per_hour",
                     f"max_creates_per_hour {spend.max_creates_per_hour} reached: "
                     f"{hour_creates} creates in the last hour; resumes "
                     f"{until.astimezone(spend.zone):%Y-%m-%d %H:%M:%S} {spend.cap_timezone}",
                     until)
                continue
            if spend.cap_per_day is not None and day_used + e > spend.cap_per_day:
                until = spend.day_end(now)
                hold(row, "cap_per_day", over("cap_per_day", spend.cap_per_day,
                                              used["day_spent"], day_used - used["day_spent"],
                                              e, until, "the next day"), until)
                continue
            if spend.cap_per_month is not None and month_used + e > spend.cap_per_month:
                until = spend.month_end(now)
                hold(row, "cap_per_month",
                     over("cap_per_month", spend.cap_per_month, month_spent,
                          month_used - month_spent, e, until, "the next month"), until)
                continue
            full = [p for p in prefixes_of(key, spend)
                    if prefix_used[p] + e > spend.cap_per_key_prefix[p]]
            if full:
                p, until = full[0], spend.day_end(now)
                c = spend.currency
                hold(row, f"cap_per_key_prefix:{p}",
                     f"cap_per_key_prefix {p!r} {money(spend.cap_per_key_prefix[p], c)} "
                     f"reached: {money(prefix_used[p], c)} used today, this request "
                     f"{money(e, c)}; resumes {until.astimezone(spend.zone):%Y-%m-%d %H:%M} "
                     f"{spend.cap_timezone} (the next day), when budget frees, or when the "
                     f"cap is raised", until)
                continue
        e = estimate or Decimal(0)
        day_used += e
        month_used += e
        hour_creates += 1
        hour_oldest = hour_oldest or now
        for p in prefixes_of(key, spend):
            prefix_used[p] += e
        reserved.append((row, estimate))
    if reserved:
        await conn.execute(_q("reserve_spend"), {
            "account": account, "day": day, "at": now, "currency": spend.currency,
            "keys": [r["idempotency_key"] for r, _ in reserved],
            "providers": [r["provider"] for r, _ in reserved],
            "models": [r.get("model") for r, _ in reserved],
            "tags": [None if r.get("tags") is None else Jsonb(r["tags"]) for r, _ in reserved],
            "estimates": [e for _, e in reserved],
            "past_cap": [bool(r["past_cap"]) for r, _ in reserved]})
    if held:
        await conn.execute(_q("hold_intents"), {
            "keys": [h.key for h in held], "tokens": [h.claim_token for h in held],
            "reasons": [h.reason for h in held], "caps": [h.cap for h in held],
            "untils": [h.until for h in held]})
    warnings = await _warnings(conn, account, spend, day, first, day_used, month_used,
                               prefix_used) if reserved else []
    sent_under = {key_prefix(r["idempotency_key"]) for r, _ in reserved}
    for namespace in sorted(n for n in sent_under if n)[:BURST_PREFIXES_CHECKED]:
        if burst_memo is not None:  # each prefix looked at once a minute per process
            seen = burst_memo.get((account, namespace))
            if seen is not None and time.monotonic() - seen < BURST_CHECK_EVERY_S:
                continue
            burst_memo[(account, namespace)] = time.monotonic()
        warnings += await _burst(conn, account, namespace, now)
    out = {h.key for h in held}
    going = [r for r in rows if r["idempotency_key"] not in out]
    chain = not held and any(r["state"] == HELD for r in going)
    going = await send_held(going, conn)
    if chain:
        # held intents go and none was held again: the next ones are due now, 20 at a time
        # (after send_held: those going are `queued` and claimed, never woken themselves)
        await conn.execute(_q("wake_next_held"), {"account": account})
    return going, SpendCheck(held, warnings)


async def send_held(rows: list[dict[str, Any]], conn: AsyncConnection[Any]
                    ) -> list[dict[str, Any]]:
    """The claimed rows, the held ones among them queued again to be sent (one statement,
    only when there are some)."""
    going = [r for r in rows if r["state"] == HELD]
    if going:
        await conn.execute(_q("send_held"), {
            "keys": [r["idempotency_key"] for r in going],
            "tokens": [r["claim_token"] for r in going]})
        for r in going:
            r["state"] = QUEUED
    return rows


def key_prefix(key: str) -> str | None:
    """A key's namespace: up to its last separator (`order-` of `order-1234`), None when it
    has none."""
    match = _PREFIX.match(key)
    return match.group(1) if match else None


async def _burst(conn: AsyncConnection[Any], account: str, prefix: str,
                 now: datetime) -> list[str]:
    """The runaway guard without prices: a prefix whose creates in the last 10 minutes are at
    least BURST_MIN and BURST_FACTOR times its 10-minute average over the day before; said
    once an hour per prefix, fleet-wide."""
    cur = await conn.execute(_q("spend_burst_recent"), {
        "account": account, "prefix": prefix, "now": now, "floor": BURST_MIN})
    found = await cur.fetchone()
    if found is None or int(found[0]) < BURST_MIN:
        return []  # the common case: one cheap count, never the day's
    cur = await conn.execute(_q("spend_burst"), {"account": account, "prefix": prefix,
                                                 "now": now})
    row = await cur.fetchone()
    assert row is not None
    recent, before = int(row[0]), int(row[1])
    usual = before / 144.0  # ten-minute slices in a day
    if recent < BURST_MIN or recent < BURST_FACTOR * usual:
        return []
    cur = await conn.execute(_q("spend_warning_once"), {
        "account": account, "cap": f"burst:{prefix}:{now:%H}", "window_start": now.date()})
    if await cur.fetchone() is None:
        return []
    return [f"account {account}: keys {prefix!r}... sent {recent} creates in the last 10 "
            f"minutes, {recent / max(usual, 1.0):.0f}x their usual rate (a runaway loop? "
            f"max_creates_per_hour or a cap stops one)"]


async def _warnings(conn: AsyncConnection[Any], account: str, spend: AccountSpend, day: date,
                    first: date, day_used: Decimal, month_used: Decimal,
                    prefix_used: dict[str, Decimal]) -> list[str]:
    """The 80 % warnings this claim is the first of the fleet to reach, once per window."""
    crossing: list[tuple[str, date, Decimal, Decimal]] = []
    if spend.cap_per_day is not None:
        crossing.append(("cap_per_day", day, day_used, spend.cap_per_day))
    if spend.cap_per_month is not None:
        crossing.append(("cap_per_month", first, month_used, spend.cap_per_month))
    for p, prefix_cap in spend.cap_per_key_prefix.items():
        crossing.append((f"cap_per_key_prefix:{p}", day, prefix_used[p], prefix_cap))
    said = []
    for cap, start, used, limit in crossing:
        if used < limit * WARN_AT:
            continue
        cur = await conn.execute(_q("spend_warning_once"), {
            "account": account, "cap": cap, "window_start": start})
        if await cur.fetchone() is not None:
            said.append(f"account {account}: {cap} {used / limit:.0%} used "
                        f"({money(used, spend.currency)} of {money(limit, spend.currency)})")
    return said


class PgSpend(PgBase):
    """Held intents released or woken, and the ledger's reports."""

    async def release_held(self, key: str) -> str | None:
        """`intents release KEY`: send a held intent past its cap; its account, or None if
        no such intent is held."""
        row = await self._one("release_held_intent", {"key": key})
        return None if row is None else str(row["account"])

    async def wake_held(self, accounts: Sequence[str]) -> int:
        """Make the oldest held intents of `accounts` due now (a start, settings reloaded:
        those that go wake the next ones); how many."""
        row = await self._one("wake_held_intents", {"accounts": list(accounts)})
        return int(row["woken"]) if row else 0

    async def spend_rows(self, windows: dict[str, tuple[date, date]]
                         ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(by day, account and model; by account and tag) within each account's window of
        days, both ends included."""
        params = {"accounts": list(windows), "froms": [w[0] for w in windows.values()],
                  "tos": [w[1] for w in windows.values()]}
        return (await self._all("spend_by_day", params),
                await self._all("spend_by_tag", params))

    async def held_by_cap(self) -> list[dict[str, Any]]:
        """Held intents by account and cap, with the earliest resume."""
        return await self._all("held_by_cap", {})

    async def spend_totals(self) -> list[dict[str, Any]]:
        """Spent (all time) and reserved (now) by account and model."""
        return await self._all("spend_totals", {})
