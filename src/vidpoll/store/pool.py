"""The connection pool's plumbing: opening a pool (one plain connection first), checking a
pooled connection before it is handed out, and PostgreSQL out of reach as DatabaseUnavailable,
for every module of the store."""

from __future__ import annotations

import select
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from vidpoll.errors import DatabaseUnavailable
from vidpoll.schema import _first_line, connect_refusal, redact_url


@asynccontextmanager
async def translate_errors() -> AsyncIterator[None]:
    """PostgreSQL out of reach (a connection error, no pooled connection in time) raises
    DatabaseUnavailable, the outage every caller knows how to wait out."""
    try:
        yield
    except (psycopg.OperationalError, PoolTimeout) as exc:
        raise DatabaseUnavailable(f"PostgreSQL is unavailable: {exc}".strip()) from exc


# A pooled connection is handed out after a select() on its socket (no round trip): a server
# that ended it (a restart, a failover, pg_terminate_backend) left its goodbye or EOF there.
# Only one idle for longer than _CHECK_AFTER_IDLE_S gets the pool's full check too, an empty
# query, which is a transaction of its own on the server: at 1 s, an idle worker's every
# probe cost two (issue 16 counts an idle worker's transactions). A connection that died
# silently (no FIN: a cut network) fails its statement, which the callers retry as an outage.
_CHECK_AFTER_IDLE_S = 120.0
POOL_MAX_IDLE_S = 60.0
"""A pooled connection beyond the first, unused this long, is closed: an idle worker holds
its listener and one pooled connection, not the pool a burst opened (psycopg_pool: 600 s)."""
_returned_at: weakref.WeakKeyDictionary[psycopg.AsyncConnection[Any], float] = (
    weakref.WeakKeyDictionary())


def _connect_kwargs(prepare: bool) -> dict[str, Any]:
    # prepare_threshold None: psycopg never prepares on the server
    return {"autocommit": True} if prepare else {"autocommit": True, "prepare_threshold": None}


async def _stamp_returned(conn: psycopg.AsyncConnection[Any]) -> None:
    _returned_at[conn] = time.monotonic()


class _IdleCheck:
    """The pool's check of a connection it is about to hand out (see _CHECK_AFTER_IDLE_S).

    When one fails, its idle peers most likely died with it (a restart, a failover, a
    pg_terminate_backend of the worker's sessions): all are checked at once, so the pool
    replaces them together. Handed out one by one instead, psycopg_pool pauses the caller
    after each failed check (0, 1, 2, 4 s...): four dead connections cost a caller 7 s, and a
    fifth ran out the pool's 10 s timeout, an outage for a server that was already back.
    """

    def __init__(self) -> None:
        self.pool: AsyncConnectionPool[Any] | None = None

    async def __call__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        returned = _returned_at.get(conn)
        if (returned is not None and time.monotonic() - returned <= _CHECK_AFTER_IDLE_S
                and not _has_input(conn)):
            return
        try:
            await AsyncConnectionPool.check_connection(conn)
        except Exception:
            if self.pool is not None:
                # takes the pool's lock, which the pool does not hold while it checks
                await self.pool.check()
            raise


def _has_input(conn: psycopg.AsyncConnection[Any]) -> bool:
    """An idle connection has nothing to read; one the server ended (pg_terminate_backend, a
    restart, a failover) has its goodbye or EOF waiting. One syscall, no round trip."""
    if conn.closed:
        return True
    try:
        readable, _, _ = select.select([conn.fileno()], [], [], 0)
    except (OSError, ValueError, psycopg.Error):
        return True
    return bool(readable)


async def open_pool(url: str, *, max_size: int, timeout_s: float,
                    prepare: bool) -> AsyncConnectionPool[Any]:
    """An open pool of autocommit connections to `url` (PgBase.open's arguments): raises
    DatabaseUnavailable if PostgreSQL cannot be reached within `timeout_s` (ConfigError if
    libpq refuses an option of the URL: connect_refusal)."""
    # One plain connection first: a dead server fails here at once with its real reason,
    # instead of after the pool's retries.
    await _probe(url, timeout_s)
    check = _IdleCheck()
    pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
        url, min_size=1, max_size=max_size, open=False, timeout=timeout_s,
        kwargs=_connect_kwargs(prepare), check=check, reset=_stamp_returned,
        reconnect_timeout=3600.0, max_idle=POOL_MAX_IDLE_S, name="vidpoll")
    check.pool = pool
    try:
        await pool.open(wait=True, timeout=timeout_s)
    except (PoolTimeout, psycopg.OperationalError) as exc:
        await pool.close()
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {redact_url(url)} within {timeout_s:g} s; "
            "is it running, and is DATABASE_URL right?") from exc
    return pool


async def _probe(url: str, timeout_s: float) -> None:
    try:
        conn = await psycopg.AsyncConnection.connect(url, connect_timeout=max(1, int(timeout_s)))
    except psycopg.OperationalError as exc:
        refused = connect_refusal(exc)
        if refused is not None:
            raise refused from None
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {redact_url(url)}: {_first_line(exc)}; "
            "is it running, and is DATABASE_URL right?") from exc
    await conn.close()
