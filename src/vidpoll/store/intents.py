"""Submission intents: recorded before any paid POST, claimed like jobs (within each
account's admission cap), their outcome recorded fenced on the claim, settled or re-queued by
hand. Queries: intents.sql."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, cast

from psycopg.rows import dict_row
from psycopg.types.json import Jsonb

from vidpoll.errors import KeyConflict
from vidpoll.models import (
    DEFAULT_ACCOUNT,
    QUEUED,
    RECONCILING,
    REJECTED,
    SUBMITTED,
    UNKNOWN,
    Claim,
    ClaimedIntent,
    Intent,
    SubmitOutcome,
)
from vidpoll.policy import validate_account, validate_job_id, validate_key, validate_payload
from vidpoll.providers import registry
from vidpoll.spend import AccountSpend
from vidpoll.store.base import PgBase, _q
from vidpoll.store.pool import translate_errors
from vidpoll.store.spend import SpendCheck, check_claimed, send_held


def _handle(outcome: SubmitOutcome) -> Jsonb | None:
    """The job's handle as the insert takes it (None: the column stays NULL)."""
    return None if outcome.handle is None else Jsonb(outcome.handle)


def _intent(row: dict[str, Any]) -> Intent:
    return Intent(key=row["idempotency_key"], state=row["state"], payload=row["payload"],
                  priority=row["priority"], attempts=row["attempts"], job_id=row["job_id"],
                  created_at=row["created_at"], next_attempt_at=row["next_attempt_at"],
                  submitted_at=row["submitted_at"], last_http_status=row["last_http_status"],
                  last_error_class=row["last_error_class"], last_error=row["last_error"],
                  last_request_id=row["last_request_id"], error_code=row["error_code"],
                  error_message=row["error_message"], account=row["account"],
                  unknown_outcome_at=row.get("unknown_outcome_at"),
                  resolution=row.get("resolution"), resolved_at=row.get("resolved_at"),
                  provider=row.get("provider"), model=row.get("model"),
                  tags=row.get("tags"), held_reason=row.get("held_reason"),
                  held_cap=row.get("held_cap"), past_cap=bool(row.get("past_cap")),
                  estimate=row.get("spend_estimate"), spend_status=row.get("spend_status"))


def _tags(tags: Mapping[str, str] | None) -> Jsonb | None:
    return Jsonb(dict(tags)) if tags else None


def _claimed_intent(row: dict[str, Any]) -> ClaimedIntent:
    return ClaimedIntent(key=row["idempotency_key"], claim_token=row["claim_token"],
                         payload=row["payload"], attempts=row["attempts"],
                         consecutive_errors=row["consecutive_errors"], account=row["account"],
                         state=row["state"], outcome_unknown=bool(row["outcome_unknown"]),
                         model=row.get("model"), unsettled=bool(row.get("unsettled")),
                         window_from=row.get("window_from"), window_to=row.get("window_to"),
                         last_http_status=row.get("last_http_status"))


class PgIntents(PgBase):
    """The submit side: vidpoll_intents."""

    async def add_intent(self, key: str, payload: dict[str, Any], priority: int = 0,
                         account: str = DEFAULT_ACCOUNT, *, provider: str | None = None,
                         model: str | None = None,
                         tags: Mapping[str, str] | None = None) -> tuple[Intent, bool]:
        """Record an intent before any POST; returns (intent, newly recorded).

        The same key with the same payload returns the existing intent untouched (a re-run is
        harmless); the same key with another payload raises KeyConflict. `provider`: the
        account's (the default provider's when None); `model`: `submit --model`.
        """
        validate_key(key)
        validate_account(account)
        payload = validate_payload(payload)
        provider = provider or registry.DEFAULT_PROVIDER
        row = await self._one("insert_intent", {
            "key": key, "payload": Jsonb(payload), "priority": priority, "account": account,
            "provider": provider, "model": model, "tags": _tags(tags),
            "duration_key": registry.duration_key_of(provider, payload, model)})
        intent = await self.get_intent(key)
        assert intent is not None
        if row is None and (intent.payload != payload or intent.account != account
                            or (intent.model or None) != (model or None)):
            raise KeyConflict(f"idempotency key {key!r} is already recorded with a different "
                              "payload or account; use a new key for a new request")
        return intent, row is not None

    async def add_intents(self, items: Sequence[tuple[str, dict[str, Any], int]],
                          account: str = DEFAULT_ACCOUNT, *, provider: str | None = None,
                          model: str | None = None,
                          tags: Mapping[str, str] | None = None) -> tuple[int, list[str]]:
        """Bulk-record (key, payload, priority) in one transaction.

        Returns (how many were new, keys already recorded, or repeated in `items`, with a
        different payload). Keys and payloads must have been validated by the caller.
        """
        first: dict[str, tuple[str, dict[str, Any], int]] = {}
        conflicts: list[str] = []
        for item in items:
            seen = first.setdefault(item[0], item)
            if seen is not item and seen[1] != item[1]:
                conflicts.append(item[0])  # one key, two requests, in the same batch
        items = list(first.values())
        if not items:
            return 0, conflicts
        provider = provider or registry.DEFAULT_PROVIDER
        async with translate_errors(), self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(_q("insert_intents"), {
                "keys": [k for k, _, _ in items], "payloads": [Jsonb(p) for _, p, _ in items],
                "priorities": [pr for _, _, pr in items], "account": validate_account(account),
                "provider": provider, "model": model, "tags": _tags(tags),
                "duration_keys": [registry.duration_key_of(provider, p, model)
                                  for _, p, _ in items]})
            new = {r[0] for r in await cur.fetchall()}
            old = [k for k, _, _ in items if k not in new]
            if old:
                cur = await conn.execute(_q("intent_payloads"), {"keys": old})
                stored = dict(await cur.fetchall())
                conflicts += [k for k, p, _ in items if k in stored and stored[k] != p]
        return len(new), conflicts

    async def get_intent(self, key: str) -> Intent | None:
        """One intent by key, or None."""
        row = await self._one("get_intent", {"key": key})
        return None if row is None else _intent(row)

    async def intent_of_job(self, job_id: str) -> Intent | None:
        """The intent that created a job, or None (ids added by hand have none)."""
        row = await self._one("get_intent_by_job", {"job_id": job_id})
        return None if row is None else _intent(row)

    async def list_intents(self, state: str | None = None, limit: int = 50) -> list[Intent]:
        """Newest intents first, optionally of one state."""
        return [_intent(r) for r in await self._all("list_intents",
                                                     {"state": state, "limit": limit})]

    async def claim_intents(self, limit: int, lease_s: float, worker_id: str,
                            max_active: int | None, key: str | None = None,
                            account: str = DEFAULT_ACCOUNT,
                            now: datetime | None = None) -> list[ClaimedIntent]:
        """Claim one account's due intents (committed at once), within its admission cap."""
        return (await self.claim_checked(limit, lease_s, worker_id, max_active, key,
                                         account, now)).intents

    async def claim_checked(self, limit: int, lease_s: float, worker_id: str,
                            max_active: int | None, key: str | None = None,
                            account: str = DEFAULT_ACCOUNT, now: datetime | None = None, *,
                            spend: AccountSpend | None = None,
                            spend_now: datetime | None = None) -> Claim:
        """Claim one account's due intents (committed at once), within its admission cap and,
        with `spend`, its caps: each create's estimate reserved in the same transaction (or,
        without prices, only counted: max_creates_per_hour, the burst warning, `vidpoll
        spend`), the intents that do not fit held (vidpoll.store.spend). `spend_now`: the
        clock the caps' windows are counted by (tests turn the day with it); None: the
        database's."""
        params = {"limit": limit, "lease_s": lease_s, "worker_id": worker_id,
                  "max_active": max_active, "key": key, "now": now, "account": account}
        guarded = spend is not None  # (no prices: every create is still in the ledger)
        check = SpendCheck([], [])
        async with translate_errors(), self._pool.connection() as conn, conn.transaction():
            if max_active is not None or guarded:
                await conn.execute(_q("lock_admission"), {"account": account})
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(_q("claim_intents"), params)
            rows = await cur.fetchall()
            if guarded and rows:
                assert spend is not None
                rows, check = await check_claimed(conn, account, spend, rows,
                                                  spend_now if spend_now is not None else now,
                                                  # when each key prefix was last looked at
                                                  # for a burst, by this store
                                                  self.__dict__.setdefault("_burst_memo", {}))
            elif rows:
                rows = await send_held(rows, conn)
        return Claim([_claimed_intent(r) for r in rows], check.held, check.warnings)

    async def claim_unknown_intents(self, limit: int, lease_s: float, worker_id: str,
                                    account: str = DEFAULT_ACCOUNT,
                                    now: datetime | None = None) -> list[ClaimedIntent]:
        """Claim only one account's due `unknown` intents (its submitting is paused for
        credits, their slow re-sends go on); leased, committed at once."""
        rows = await self._all("claim_unknown_intents", {
            "limit": limit, "lease_s": lease_s, "worker_id": worker_id, "account": account,
            "now": now})
        return [_claimed_intent(r) for r in rows]

    async def resolve_intent(self, key: str, *, job_id: str | None = None,
                             not_billed: bool = False, now: datetime | None = None) -> bool:
        """`intents resolve`: settle an intent by hand, with the job Sume billed for it (the
        intent becomes submitted, the job is tracked from now) or as not billed (rejected for
        good). False if no intent may be settled so (unknown key, submitted already, being
        sent right now, or `job_id` tracked under another key)."""
        if (job_id is None) == (not not_billed):
            raise ValueError("resolve_intent needs exactly one of job_id or not_billed")
        if job_id is not None:
            validate_job_id(job_id)
            row = await self._one("resolve_intent_job", {"key": key, "job_id": job_id,
                                                         "now": now})
            return bool(row and row["key"] is not None)
        row = await self._one("resolve_intent_not_billed", {"key": key, "now": now})
        return row is not None

    async def record_submit(self, outcome: SubmitOutcome, first_poll_s: float = 15.0,
                            now: datetime | None = None) -> bool:
        """Write one POST's outcome; False if the intent's fence failed (another owner)."""
        params: dict[str, Any] = {
            "key": outcome.key, "token": outcome.claim_token, "now": now,
            "http_status": outcome.http_status, "request_id": outcome.request_id,
            "error_class": outcome.error_class.value if outcome.error_class else None,
            "error": outcome.error}
        if outcome.state == SUBMITTED and outcome.adopted:
            assert outcome.job_id is not None
            validate_job_id(outcome.job_id)
            row = await self._one("adopt_job", {**params, "job_id": outcome.job_id,
                                                "delay_s": 0.0, "handle": _handle(outcome)})
            return bool(row and row["intent_updated"])
        if outcome.state == SUBMITTED:
            assert outcome.job_id is not None
            validate_job_id(outcome.job_id)
            row = await self._one("record_submitted", {
                **params, "job_id": outcome.job_id, "delay_s": first_poll_s,
                # (the intent's own provider first)
                "provider": registry.DEFAULT_PROVIDER, "handle": _handle(outcome)})
            return bool(row and row["intent_updated"])
        if outcome.state == REJECTED:
            row = await self._one("record_intent_rejected", {
                **params, "error_code": outcome.error_code,
                "error_message": outcome.error_message})
            return row is not None
        if outcome.state == UNKNOWN:
            row = await self._one("record_intent_unknown", {
                **params, "delay_s": outcome.delay_s, "error_code": outcome.error_code,
                "error_message": outcome.error_message})
            return row is not None
        if outcome.state == RECONCILING:
            row = await self._one("record_intent_reconciling",
                                  {**params, "delay_s": outcome.delay_s})
            return row is not None
        assert outcome.state == QUEUED
        if outcome.settled:
            row = await self._one("record_intent_settled", params)
            return row is not None
        row = await self._one("record_intent_retry", {**params, "delay_s": outcome.delay_s})
        return row is not None

    async def jobs_of_ids(self, ids: Sequence[str]) -> dict[str, str | None]:
        """Which of `ids` are tracked already, each with the intent key that holds it (None:
        a job added by hand)."""
        rows = await self._all("jobs_of_ids", {"ids": list(ids)})
        return {r["job_id"]: r["idempotency_key"] for r in rows}

    async def release_intent(self, intent: ClaimedIntent, delay_s: float,
                             now: datetime | None = None) -> bool:
        """Give a claimed intent back unsent (no attempt counted), due after `delay_s`."""
        row = await self._one("release_intent", {"key": intent.key,
                                                 "token": intent.claim_token,
                                                 "delay_s": delay_s, "now": now})
        return row is not None

    async def requeue_intents(self, keys: Sequence[str], *, all_rejected: bool = False,
                              code: str | None = None) -> list[str]:
        """`intents retry`: rejected (or backing-off queued) intents due now; returns keys."""
        rows = await self._all("requeue_intents", {"keys": list(keys),
                                                   "all_rejected": all_rejected,
                                                   "code": code, "now": None})
        return [r["idempotency_key"] for r in rows]

    async def next_intent_due_in(self, accounts: Sequence[str] = (DEFAULT_ACCOUNT,),
                                 unknown_accounts: Sequence[str] = ()) -> float | None:
        """Seconds until the earliest queued or unknown intent of `accounts` (or unknown one
        of `unknown_accounts`) is due; None if none is waiting."""
        row = await self._one("next_intent_due_in", {"accounts": list(accounts),
                                                     "unknown_accounts": list(unknown_accounts)})
        return None if row is None else cast(float | None, row["next_due_in_s"])

    async def has_queued_intents(self, accounts: Sequence[str] = (DEFAULT_ACCOUNT,)) -> bool:
        """True while any intent of `accounts` is still waiting to be sent."""
        row = await self._one("has_queued_intents", {"accounts": list(accounts)})
        return bool(row and row["has_queued"])

    async def admission(self, account: str | None = None) -> dict[str, int]:
        """pending_jobs, unconfirmed (attempted, no job yet: the unknown ones included),
        unknown and queued intents."""
        row = await self._one("admission", {"account": account})
        assert row is not None
        return {k: int(v) for k, v in row.items()}

    async def intents_ahead(self, key: str) -> int:
        """How many queued intents go out before this one."""
        row = await self._one("intents_ahead", {"key": key})
        return int(row["n"]) if row else 0

    async def intent_counts(self) -> dict[str, int]:
        """Intents per state."""
        return {r["state"]: r["n"] for r in await self._all("count_intents_by_state", {})}
