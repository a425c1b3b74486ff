"""The fleet-wide rate budget: one token bucket per (account, kind of call) that every worker
takes from, refunds to, and pauses when the provider says stop. Queries: budgets.sql."""

from __future__ import annotations

from typing import Any

from psycopg.rows import dict_row

from vidpoll.policy import MIN_RATE_FACTOR, RATE_CUT, Budget, Grant, take_tokens
from vidpoll.store.base import PgBase, _q
from vidpoll.store.pool import translate_errors


class PgBudgets(PgBase):
    """vidpoll_rate_buckets: take, refund, pause, list."""

    async def take_tokens(self, account: str, kind: str, want: int, budget: Budget) -> Grant:
        """Take up to `want` tokens from the fleet's bucket for (account, kind), atomically."""
        params: dict[str, Any] = {"account": account, "kind": kind,
                                  "rate_per_s": budget.rate_per_s, "burst": budget.burst}
        async with translate_errors(), self._pool.connection() as conn, conn.transaction():
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(_q("bucket_for_update"), params)
            row = await cur.fetchone()
            if row is None:
                await cur.execute(_q("bucket_create"), params)
                await cur.execute(_q("bucket_for_update"), params)
                row = await cur.fetchone()
                assert row is not None
            grant = take_tokens(row["tokens"], row["elapsed_s"], row["paused_s"], want, budget,
                                row["rate_factor"])
            if row["paused_s"] <= 0:
                await cur.execute(_q("bucket_spend"), {**params, "tokens": grant.tokens_left,
                                                       "at": row["at"],
                                                       "rate_factor": grant.rate_factor})
        return grant

    async def refund_tokens(self, account: str, kind: str, n: int) -> None:
        """Give back `n` tokens taken for rows that were not there to claim."""
        if n > 0:
            await self._execute("bucket_refund", {"account": account, "kind": kind, "n": n})

    async def pause_bucket(self, account: str, kind: str, seconds: float,
                           refused: bool = False) -> None:
        """The server asked for a pause: every worker's claims for (account, kind) wait.

        `refused` (a 429, not just `RateLimit-Remaining: 0`) also lowers the fleet's rate.
        """
        await self._execute("bucket_pause", {"account": account, "kind": kind,
                                             "seconds": seconds, "cut": refused,
                                             "factor": RATE_CUT, "min_factor": MIN_RATE_FACTOR})

    async def buckets(self) -> list[dict[str, Any]]:
        """Every bucket's tokens (refilled to now), pause and counters."""
        return await self._all("list_buckets", {})

    async def backlog_by_account(self) -> list[dict[str, Any]]:
        """Per account: rows due now and how late the oldest is."""
        return await self._all("backlog_by_account", {})
