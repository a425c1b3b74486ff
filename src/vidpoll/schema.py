"""The schema's versions: `migrate` applies the shipped migration files to a database.

Imports psycopg (as store does); knows nothing of jobs.
"""

from __future__ import annotations

import logging

import psycopg

from vidpoll.errors import DatabaseUnavailable, SchemaError
from vidpoll.sql import QUERIES, migrations

log = logging.getLogger(__name__)

__all__ = ["migrate", "redact_url"]


def _q(name: str) -> str:
    return QUERIES[name]


def redact_url(url: str) -> str:
    """A connection string without its password, for messages."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparseable DATABASE_URL>"
    info.pop("password", None)
    return " ".join(f"{k}={v}" for k, v in info.items())


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


async def migrate(url: str, timeout_s: float = 10.0) -> list[str]:
    """Apply every migration not applied yet, in one transaction under an advisory lock.

    Safe to run concurrently and repeatedly: a second run waits for the lock, then finds
    nothing to do. Returns the names of the files it applied.
    """
    try:
        conn = await psycopg.AsyncConnection.connect(url, connect_timeout=max(1, int(timeout_s)))
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {redact_url(url)}: {_first_line(exc)}") from exc
    applied: list[str] = []
    try:
        async with conn.transaction():
            # Waits for DDL on a table the seed's loop keeps busy instead of failing at once,
            # but never forever.
            await conn.execute("SET LOCAL lock_timeout = '60s'")
            await conn.execute(_q("lock_migrations"))
            await conn.execute(_q("create_migrations_table"))
            cur = await conn.execute(_q("applied_migrations"))
            done = {r[0] for r in await cur.fetchall()}
            shipped = migrations()
            if done and max(done) > len(shipped):
                raise SchemaError(f"schema version {max(done)} is newer than this vidpoll "
                                  f"({len(shipped)}); upgrade vidpoll")
            if len(done) < len(shipped):
                await conn.execute(_q("lock_jobs_table"))
            for version, name, sql in shipped:
                if version in done:
                    continue
                log.info("applying migration %s", name)
                await conn.execute(sql)
                await conn.execute(_q("record_migration"), {"version": version, "name": name})
                applied.append(name)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"PostgreSQL went away during migrate: {exc}") from exc
    finally:
        await conn.close()
    return applied

