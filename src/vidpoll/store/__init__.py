"""PostgreSQL access: the only package that imports psycopg (with vidpoll.schema). One method
per named query, in one module per domain, each beside the .sql files it runs:

    base        PgBase: the pool, the LISTEN connection, open/close, the schema check
    pool        the pool's plumbing; listener: the shared LISTEN connection and channels
    jobs        claim, record, release, track, poke, look up and list jobs
    intents     submission intents (the submit side)
    budgets     the fleet-wide rate buckets
    deliveries  result fetches and deliveries (downloads, hooks)
    operations  vacuum, counters, figures, the dashboard's sessions, presence, doctor's reads
    retention   `jobs prune` and the pruning of webhook events
    spend       held intents and the ledger's reports
    durations   render times: the learned schedule's summary, overdue jobs
    presence    what a worker's connections say it serves (pure)

PgStore is all of them; the two methods that read across domains are its own.
"""

from __future__ import annotations

from typing import Any

from vidpoll.cursor import InvalidCursor
from vidpoll.models import DEFAULT_ACCOUNT, DOWNLOAD, UNKNOWN, Job
from vidpoll.schema import migrate as migrate  # re-exported: callers import it from here
from vidpoll.schema import refusal
from vidpoll.sql import migrations
from vidpoll.store.base import _q, create_database_if_missing, drop_database
from vidpoll.store.budgets import PgBudgets
from vidpoll.store.deliveries import PgDeliveries
from vidpoll.store.durations import PgDurations
from vidpoll.store.intents import PgIntents
from vidpoll.store.jobs import ORDERS, LockedBatch, PgJobs, job_view
from vidpoll.store.listener import INTENTS_CHANNEL, JOB_DONE_CHANNEL, JOBS_CHANNEL
from vidpoll.store.operations import PgOperations
from vidpoll.store.pool import POOL_MAX_IDLE_S, translate_errors
from vidpoll.store.presence import (
    APP_NAME_MAX_BYTES,
    POLLS,
    SUBMITS,
    Serves,
    names_serve,
    presence_name,
)
from vidpoll.store.retention import (
    ARCHIVED_COLUMNS,
    PRUNE_KEPT_REASONS,
    PRUNE_STALE_S,
    PgRetention,
)
from vidpoll.store.spend import PgSpend

__all__ = [
    "APP_NAME_MAX_BYTES",
    "ARCHIVED_COLUMNS",
    "INTENTS_CHANNEL",
    "JOBS_CHANNEL",
    "JOB_DONE_CHANNEL",
    "ORDERS",
    "POLLS",
    "POOL_MAX_IDLE_S",
    "PRUNE_KEPT_REASONS",
    "PRUNE_STALE_S",
    "SUBMITS",
    "InvalidCursor",
    "LockedBatch",
    "PgStore",
    "Serves",
    "create_database_if_missing",
    "drop_database",
    "migrate",
    "names_serve",
    "presence_name",
]


class PgStore(PgJobs, PgIntents, PgBudgets, PgDeliveries, PgOperations, PgRetention,
              PgSpend, PgDurations):
    """The job table, through a small pool of autocommit connections. Its own two methods read
    across domains: a job with its deliveries, and everything doctor looks at."""

    async def job(self, job_id: str) -> Job | None:
        """One tracked job (with its result and downloaded files), or None."""
        row = await self.get_job(job_id)
        if row is None:
            return None
        files = None
        for d in await self.job_deliveries(job_id):
            if d["consumer"] == DOWNLOAD and d["state"] == "done":
                files = d["detail"]
        return job_view(row, row["state"], files)

    async def doctor(self) -> dict[str, Any]:
        """Everything `vidpoll doctor` looks at, in one place."""
        async with translate_errors(), self._pool.connection() as conn:
            cur = await conn.execute("EXPLAIN (FORMAT JSON) " + _q("claim_due"), {
                "limit": 100, "lease_s": 25.0, "worker_id": "doctor", "now": None,
                "account": DEFAULT_ACCOUNT})
            row = await cur.fetchone()
            plan = row[0] if row else []
        rows = await self._one("hot_table_rows", {})
        version = await self.schema_version()
        level = await self._one("schema_level", {}) if version is not None else None
        return {"schema_version": version,
                # why this code may not run on a newer schema (None: it may, or not newer)
                "schema_refusal": None if version is None or level is None else refusal(
                    version, level["name"], level["oldest_code"], len(migrations())),
                "claim_plan": plan, "hot_rows_estimate": int(rows["estimate"]) if rows else 0,
                "tables": await self._all("doctor_tables", {}),
                "indexes": await self._all("doctor_hot_indexes", {}),
                "xmin": await self._all("doctor_xmin", {}),
                "connections": await self._one("doctor_connections", {}),
                "stuck_claims": await self.stuck_claims(),
                "unknown_intents": (await self.intent_counts()).get(UNKNOWN, 0)}
