"""Operations: VACUUM of the hot table, per-minute counters, the figures of `jobs stats`,
/metrics and the dashboard's overview (never a scan of video_jobs), the dashboard's sign-in
state and the accounts of its spend page, which workers are connected, and what `doctor`
reads. Queries: operations.sql, scrape.sql, dashboard.sql, presence.sql."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date, datetime
from typing import Any

import psycopg

from vidpoll.errors import DatabaseUnavailable
from vidpoll.store.base import PgBase, _q
from vidpoll.store.pool import translate_errors
from vidpoll.store.presence import names_serve


class PgOperations(PgBase):
    """Maintenance, figures and presence."""

    async def can_vacuum_jobs(self) -> bool:
        """Whether this role may VACUUM video_jobs."""
        row = await self._one("can_vacuum_jobs", {})
        return bool(row and row["allowed"])

    async def vacuum_jobs(self) -> bool:
        """VACUUM video_jobs; False if it was skipped (another vacuum held the table).

        On one of the pool's connections (a process's connections stay within its pool and
        its listener): the others serve the worker meanwhile. A statement_timeout that
        cancels it raises RuntimeError (not an outage: every later VACUUM would be cancelled
        the same way).
        """
        def notice(diag: psycopg.errors.Diagnostic) -> None:
            self._vacuum_notices.append(diag.message_primary or "")

        try:
            async with translate_errors(), self._pool.connection() as conn:
                self._vacuum_notices.clear()
                conn.add_notice_handler(notice)
                try:
                    await conn.execute(_q("vacuum_jobs"))
                finally:
                    conn.remove_notice_handler(notice)
        except DatabaseUnavailable as exc:
            if isinstance(exc.__cause__, psycopg.errors.QueryCanceled):
                raise RuntimeError(f"VACUUM was cancelled (statement_timeout?): "
                                   f"{exc.__cause__}".strip()) from exc
            raise
        # VACUUM reports a skip (or a role that may not) as a notice, never an error
        return not any(m.startswith("skipping") for m in self._vacuum_notices)

    # -- the dashboard's sign-in state (migration 0013, dashboard.sql) -------------------------
    async def dashboard_salt(self, candidate: bytes) -> bytes:
        """The database's salt for the dashboard's signing key; `candidate` becomes it if
        there is none yet (the first `serve` with a token), so every `serve` agrees."""
        for _ in range(3):  # a first start racing another sees no row once: ask again
            row = await self._one("dashboard_salt", {"salt": candidate})
            if row is not None:
                return bytes(row["salt"])
        raise DatabaseUnavailable("the dashboard's salt could be neither stored nor read")

    async def add_dashboard_session(self, digest: bytes, max_age_s: float) -> None:
        """Record a signed-in session (by its id's digest) for `max_age_s` seconds."""
        await self._execute("add_dashboard_session", {"digest": digest,
                                                      "max_age_s": max_age_s})

    async def dashboard_session_live(self, digest: bytes) -> bool:
        """Whether the session was signed in and is neither logged out nor expired."""
        row = await self._one("dashboard_session_live", {"digest": digest})
        return bool(row and row["live"])

    async def end_dashboard_session(self, digest: bytes) -> bool:
        """Log a session out for every `serve`; False: it was not signed in (any more)."""
        return await self._one("end_dashboard_session", {"digest": digest}) is not None

    async def spend_accounts_since(self, since: date) -> list[str]:
        """The accounts with ledger rows (vidpoll_spend) from `since` on: the dashboard's
        spend page shows them even when the settings no longer name them."""
        return [r["account"] for r in await self._all("spend_accounts_since",
                                                      {"since": since})]

    # -- figures: `jobs stats`, the overview, doctor -------------------------------------------
    async def counts(self) -> dict[str, int]:
        """Rows per state."""
        return {r["state"]: r["n"] for r in await self._all("count_by_state", {})}

    async def backlog(self, now: datetime | None = None) -> tuple[int, float]:
        """(rows due now, seconds the oldest due row is late)."""
        row = await self._one("due_backlog", {"now": now})
        assert row is not None
        return int(row["due"]), float(row["oldest_late_s"] or 0.0)

    async def recent_errors(self, limit: int = 20) -> list[dict[str, Any]]:
        """The newest error events of the history."""
        return await self._all("recent_errors", {"limit": limit})

    async def stuck_claims(self) -> list[dict[str, Any]]:
        """Per worker: claims whose lease ended over a minute ago without a record."""
        return await self._all("stuck_claims", {})

    # -- cheap scrapes (scrape.sql): /metrics and the overview never scan video_jobs -----------
    async def table_estimate(self) -> dict[str, Any]:
        """PostgreSQL's estimate of video_jobs (catalog reads only): `rows` (None if never
        vacuumed or analyzed), `states` and their `shares` in ANALYZE's sample (None if never
        analyzed), `analyzed_at`."""
        row = await self._one("scrape_table_estimate", {})
        assert row is not None
        return row

    async def count_states_upto(self, upto: int) -> dict[str, int] | None:
        """Exact rows per state if the table holds at most `upto` rows (reading at most
        `upto` + 1 of them), else None."""
        counts = {r["state"]: int(r["n"])
                  for r in await self._all("scrape_count_states_upto", {"upto": upto})}
        return None if sum(counts.values()) > upto else counts

    async def pending_upto(self, upto: int) -> tuple[int, int, float]:
        """(pending rows, rows due now: each exact up to `upto` and `upto` + 1 beyond it;
        seconds the most overdue row is late), through the pending partial index."""
        row = await self._one("scrape_pending", {"upto": upto})
        assert row is not None
        return int(row["pending"]), int(row["due"]), float(row["oldest_late_s"])

    async def stuck_claims_upto(self, upto: int) -> list[dict[str, Any]]:
        """stuck_claims among the `upto` most overdue pending rows only."""
        return await self._all("scrape_stuck_claims", {"upto": upto})

    # -- per-minute counters (0009): the overview's chart --------------------------------------
    async def add_minutes(self, rows: Sequence[tuple[tuple[datetime, str, str, str], int,
                                                      float, float]]) -> None:
        """Add per-minute counters ((minute, kind, account, outcome), n, late sum, late max)."""
        if not rows:
            return
        # one order for every writer: concurrent flushes never wait on each other in a cycle
        rows = sorted(rows, key=lambda r: r[0])
        await self._execute("add_minutes", {
            "minutes": [k[0] for k, *_ in rows], "kinds": [k[1] for k, *_ in rows],
            "accounts": [k[2] for k, *_ in rows], "outcomes": [k[3] for k, *_ in rows],
            "ns": [r[1] for r in rows], "late_sums": [r[2] for r in rows],
            "late_maxes": [r[3] for r in rows]})

    async def forget_old_minutes(self) -> None:
        """Delete counters older than a week."""
        await self._execute("forget_old_minutes", {})

    async def due_backlog_sample(self) -> tuple[int, float]:
        """(rows due now, counted up to 100,000; seconds the oldest pending row is late)."""
        row = await self._one("due_backlog_sample", {})
        assert row is not None
        return int(row["due"]), max(0.0, float(row["oldest_late_s"]))

    async def minutes_since(self, minutes: int) -> list[dict[str, Any]]:
        """Counters of the last `minutes` minutes, summed over accounts."""
        return await self._all("minutes_since", {"minutes": minutes})

    # -- presence (presence.sql): which workers are connected, serving what --------------------
    async def serving(self, account: str, role: str) -> bool | None:
        """Whether a worker process connected to this database does `role` (POLLS or
        SUBMITS) for `account`, as its connections' application_names say (names_serve);
        None if that cannot be read."""
        try:
            rows = await self._all("session_names", {})
        except (DatabaseUnavailable, psycopg.Error):
            return None
        return names_serve([r["application_name"] for r in rows], account, role)
