"""The job table's own work: claim due rows (lease or lock mode), record what each read found,
give claims back, track and poke jobs (poll now, a webhook), look them up and list them a page
at a time. Queries: jobs.sql, idle.sql (an idle poller's probes), lookup.sql (a shortened id)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

import psycopg
from psycopg.rows import dict_row

from vidpoll.cursor import decode_cursor, encode_cursor
from vidpoll.models import DEFAULT_ACCOUNT, PENDING, ClaimedJob, Job, MediaFile, Outcome
from vidpoll.policy import validate_account, validate_job_id
from vidpoll.providers import registry
from vidpoll.store.base import PgBase, _q
from vidpoll.store.pool import translate_errors

ORDERS = ("newest", "oldest")
"""list_jobs' orders besides each listing's own: by creation (finished rows: by when they
finished), newest or oldest first."""


def _job(row: dict[str, Any], sent_mono: float = 0.0, claimed_mono: float = 0.0
         ) -> ClaimedJob:
    return ClaimedJob(job_id=row["job_id"], claim_token=row["claim_token"],
                      due_at=row["due_at"], polling_since=row["polling_since"],
                      polls=row["polls"], consecutive_errors=row["consecutive_errors"],
                      not_found_count=row["not_found_count"], account=row["account"],
                      late_s=float(row["late_s"] or 0.0), sent_mono=sent_mono,
                      claimed_mono=claimed_mono, handle=row.get("handle"),
                      created_at=row.get("created_at"), model=row.get("model"),
                      duration_key=row.get("duration_key"))


def job_view(row: dict[str, Any], state: str, files: Any) -> Job:
    """A row as a Job in `state`, with the files of `files` (a download's detail, or None)."""
    listed = files.get("files", []) if isinstance(files, dict) else []
    return Job(job_id=row["job_id"], state=state, provider_status=row["provider_status"],
               polls=row["polls"], created_at=row["created_at"],
               finished_at=row["finished_at"], idempotency_key=row["idempotency_key"],
               account=row["account"], result=row["result"], result_state=row["result_state"],
               outcome=row.get("outcome"), provider=row.get("provider"),
               cost=row.get("cost"), provider_cost=row.get("provider_cost"),
               provider_cost_unit=row.get("provider_cost_unit"), tags=row.get("tags"),
               files=tuple(MediaFile(f["path"], f["size"], f["sha256"], f["url"])
                           for f in listed))


def _outcome_params(outcomes: Sequence[Outcome], now: datetime | None) -> dict[str, Any]:
    # One JSON document for the whole batch: json.dumps runs in C, while eleven parameter
    # arrays were dumped element by element in Python (a twentieth of a busy worker's CPU).
    # age_s: how long ago each answer arrived, on this process's monotonic clock; the query
    # counts the hint from then (the database's clock minus the age: no clock skew).
    # A field that is None is left out: jsonb_to_recordset reads a missing key as NULL, and
    # most of them are None on most reads (issue 31: about half the encoding work)
    sent = time.monotonic()
    rows = []
    for o in outcomes:
        row: dict[str, Any] = {
            "job_id": o.job_id, "claim_token": str(o.claim_token), "state": o.state,
            "delay_s": float(o.delay_s), "read_ok": o.read_ok,
            "age_s": max(0.0, sent - o.answered_mono) if o.answered_mono else 0.0,
            "succeeded": o.succeeded, "inline": o.inline_result and o.succeeded}
        if o.http_status is not None:
            row["http_status"] = o.http_status
        if o.error_class is not None:
            row["error_class"] = o.error_class.value
        if o.error is not None:
            row["error"] = o.error
        if o.provider_status is not None:
            row["provider_status"] = o.provider_status
        if o.body is not None:
            row["body"] = o.body
        if o.request_id is not None:
            row["request_id"] = o.request_id
        if o.outcome is not None:
            row["outcome"] = o.outcome
        if o.cost is not None:  # amounts as text: exact decimals through JSON (0017)
            row["cost"] = str(o.cost)
        if o.provider_cost is not None:
            row["provider_cost"] = str(o.provider_cost)
        if o.provider_cost_unit is not None:
            row["provider_cost_unit"] = o.provider_cost_unit
        if o.render_s is not None:
            row["render_s"] = o.render_s
        if o.poll_reason is not None:
            row["poll_reason"] = o.poll_reason
        if o.overdue_after_s is not None:
            row["overdue_after_s"] = o.overdue_after_s
        rows.append(row)
    return {"outcomes": json.dumps(rows, allow_nan=False), "now": now}


def _release_params(jobs: Sequence[ClaimedJob]) -> dict[str, Any]:
    return {"job_ids": [j.job_id for j in jobs], "tokens": [j.claim_token for j in jobs],
            "due_ats": [j.due_at for j in jobs]}


@dataclass
class LockedBatch:
    """Rows claimed in lock mode: their row locks last as long as this batch's transaction."""

    jobs: list[ClaimedJob]
    _conn: psycopg.AsyncConnection[Any]
    now: datetime | None = None

    async def record(self, outcomes: Sequence[Outcome]) -> set[str]:
        """Write outcomes inside the batch's transaction; committed when the batch ends."""
        if not outcomes:
            return set()
        async with translate_errors():
            cur = await self._conn.execute(_q("record_outcomes"),
                                           _outcome_params(outcomes, self.now))
            return {r[0] for r in await cur.fetchall()}

    async def release(self, jobs: Sequence[ClaimedJob]) -> set[str]:
        """Clear the claim of rows read without an outcome (a refused key), in the batch's
        transaction: left set, the token reads as a claim in flight (doctor's stuck claims,
        poll-now and webhooks would wait for a record that never comes)."""
        if not jobs:
            return set()
        async with translate_errors():
            cur = await self._conn.execute(_q("release_claims"), _release_params(jobs))
            return {r[0] for r in await cur.fetchall()}


class PgJobs(PgBase):
    """Claims, outcomes, releases, lookups and listings of video_jobs."""

    async def claim(self, limit: int, lease_s: float, worker_id: str,
                    account: str = DEFAULT_ACCOUNT,
                    now: datetime | None = None) -> list[ClaimedJob]:
        """Lease mode: claim up to `limit` due rows of `account` and commit at once.

        Each row carries `sent_mono`: time.monotonic() just before the statement left, after
        any wait for a pooled connection, so it is no later than the lease's start (the
        statement's now()) and a caller can tell how much of the lease is left.
        """
        async with translate_errors(), self._pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            sent = time.monotonic()
            await cur.execute(_q("claim_due"), {"limit": limit, "lease_s": lease_s,
                                                "worker_id": worker_id, "now": now,
                                                "account": account})
            rows: list[dict[str, Any]] = await cur.fetchall()
        arrived = time.monotonic()
        return [_job(r, sent, arrived) for r in rows]

    @asynccontextmanager
    async def lock_batch(self, limit: int, worker_id: str, account: str = DEFAULT_ACCOUNT,
                         now: datetime | None = None) -> AsyncIterator[LockedBatch]:
        """Lock mode: claim up to `limit` rows and hold their locks until the block ends."""
        async with translate_errors(), self._pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(_q("claim_due"), {"limit": limit, "lease_s": None,
                                                "worker_id": worker_id, "now": now,
                                                "account": account})
            rows = await cur.fetchall()
            arrived = time.monotonic()
            yield LockedBatch([_job(r, claimed_mono=arrived) for r in rows], conn, now)

    async def record(self, outcomes: Sequence[Outcome], now: datetime | None = None) -> set[str]:
        """Write read results; returns the job ids whose fence held (the others are stale).

        A job that completed is queued for its result fetch.
        """
        if not outcomes:
            return set()
        rows = await self._all("record_outcomes", _outcome_params(outcomes, now))
        return {r["job_id"] for r in rows}

    async def release(self, jobs: Sequence[ClaimedJob]) -> set[str]:
        """Give claimed rows back unread, due when they were due before the claim."""
        if not jobs:
            return set()
        rows = await self._all("release_claims", _release_params(jobs))
        return {r["job_id"] for r in rows}

    async def next_work_due_in(self, accounts: Sequence[str] = (DEFAULT_ACCOUNT,),
                               results: bool = False) -> tuple[float | None, float | None]:
        """(seconds until the earliest pending row is due, the same for result fetches, or
        None for results=False) in one statement; None where nothing waits."""
        row = await self._one("next_work_due_in", {"accounts": list(accounts),
                                                   "results": results})
        assert row is not None
        return (cast(float | None, row["poll_due_in_s"]),
                cast(float | None, row["result_due_in_s"]))

    async def announce_drained(self, payload: str) -> None:
        """NOTIFY vidpoll_drained (see the query)."""
        await self._execute("announce_drained", {"payload": payload})

    async def has_pending(self, accounts: Sequence[str] = (DEFAULT_ACCOUNT,),
                          results: bool = False) -> bool:
        """True while any row of `accounts` is still being polled (or, with `results`, has
        a result still to fetch)."""
        row = await self._one("has_pending", {"accounts": list(accounts), "results": results})
        return bool(row and row["has_pending"])

    async def add_job(self, job_id: str, delay_s: float = 15.0, now: datetime | None = None,
                      account: str = DEFAULT_ACCOUNT, provider: str | None = None) -> bool:
        """Track a job id; False if it was already tracked (the existing row is kept).
        `provider`: the account's (the default provider's when None)."""
        validate_job_id(job_id)
        validate_account(account)
        row = await self._one("insert_job", {"job_id": job_id, "delay_s": delay_s, "now": now,
                                             "account": account,
                                             "provider": provider or registry.DEFAULT_PROVIDER})
        return row is not None

    async def job_history(self, job_id: str) -> list[dict[str, Any]]:
        """One job's events (tracked, state changes, error changes), oldest first."""
        return await self._all("job_history", {"job_id": job_id})

    async def receive_webhook(self, event_id: str, job_id: str, signature: str
                              ) -> tuple[str | None, bool]:
        """Record one delivery and poke its job; (None, False) for a repeat (same event id
        or same signature). `signature`: the `v1=<hex>` value that verified (what
        webhook.verify returns), never the raw header."""
        row = await self._one("webhook_receive", {"event_id": event_id, "job_id": job_id,
                                                  "signature": signature})
        assert row is not None
        return row["effect"], bool(row["made_due"])

    async def receive_hint(self, job_id: str, provider: str, gap_s: float
                           ) -> tuple[str, bool]:
        """An unsigned delivery naming `job_id` (a provider that signs none: Luma's
        callbacks): nothing recorded; a pending job of `provider` poked unless it was within
        `gap_s`. (effect, made_due): `poked`, `duplicate` (poked within the gap), `finished`
        or `unknown` (no such job of that provider: another provider's job is never touched)."""
        row = await self._one("webhook_hint", {"job_id": job_id, "provider": provider,
                                               "gap_s": gap_s})
        assert row is not None
        return row["effect"], bool(row["made_due"])

    async def resume(self, job_id: str, now: datetime | None = None) -> str | None:
        """Put a gave_up/not_found row back to polling now ("resumed"). A row still pending is
        poked as poll_now does: "made_due", or "marked" when a worker is reading it (that
        read's record makes it due at once; never a second read beside it). None: no such row,
        or Sume's own terminal state."""
        if await self._one("resume_job", {"job_id": job_id, "now": now}) is not None:
            return "resumed"
        made_due = await self.poll_now(job_id)
        if made_due is None:
            return None
        return "made_due" if made_due else "marked"

    async def get_job(self, job_id: str) -> dict[str, Any] | None:
        """Every column of one row, or None."""
        return await self._one("get_job", {"job_id": job_id})

    async def list_jobs(self, state: str | None = None, account: str | None = None,
                        limit: int = 50, cursor: str | None = None, order: str | None = None
                        ) -> tuple[list[dict[str, Any]], str | None]:
        """One page of rows and the cursor of the next page (None on the last one).

        `order` None: each listing's own order, keyset-paged on an index, fast at any depth:
        pending rows in due order, finished ones (`state` one final state, or "finished" for
        all) newest first, every row by id. "newest"/"oldest": finished rows by when they
        finished (the same index, either way), any other listing by created_at, then job id
        (a scan and a top-N sort per page: the same cost at any depth). A cursor from
        another listing or order raises InvalidCursor."""
        if order is not None and order not in ORDERS:
            raise ValueError(f"order must be one of {ORDERS} or None, not {order!r}")
        finished = state not in (None, PENDING)
        kind = ("pending" if state == PENDING else "all" if state is None
                else f"finished:{state}")
        if order is not None and not (finished and order == "newest"):
            kind += f"/{order}"  # newest finished first is the finished listing's own order
        after_at, after_id = decode_cursor(cursor, kind)
        params = {"state": state if state not in (None, PENDING, "finished") else None,
                  "account": account, "limit": limit + 1, "after_at": after_at,
                  "after_id": after_id, "pending_only": state == PENDING}
        if finished:
            name = "list_finished_oldest" if order == "oldest" else "list_finished"
            rows, key = await self._all(name, params), "finished_at"
        elif order is not None:
            name = "list_created_newest" if order == "newest" else "list_created_oldest"
            rows, key = await self._all(name, params), "created_at"
        elif state == PENDING:
            rows, key = await self._all("list_pending", params), "next_poll_at"
        else:
            rows, key = await self._all("list_all", params), ""
        if len(rows) <= limit:
            return rows, None
        rows = rows[:limit]
        last = rows[-1]
        return rows, encode_cursor(kind, last[key] if key else None, last["job_id"])

    async def poll_now(self, job_id: str) -> bool | None:
        """Make a pending job due now; None if no pending row, else whether it was idle (a
        row being read now is read again as soon as that read is recorded)."""
        row = await self._one("poll_now", {"job_id": job_id})
        return None if row is None else bool(row["made_due"])

    async def jobs_by_short_id(self, head: str, tail: str) -> list[str]:
        """The ids (at most three) of jobs, tracked or archived, that `head…tail` shortens."""
        rows = await self._all("jobs_by_short_id", {
            "head": head, "tail": tail, "tail_len": len(tail),
            "min_len": len(head) + len(tail)})
        return [str(r["job_id"]) for r in rows]

    async def get_archived_job(self, job_id: str) -> dict[str, Any] | None:
        """An archived row, or None."""
        return await self._one("get_archived_job", {"job_id": job_id})
