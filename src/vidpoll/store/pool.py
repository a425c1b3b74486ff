"""The connection pool's plumbing: opening a pool (one plain connection first), checking a
pooled connection before it is handed out, replacing a lost one within seconds of the server's
return, and PostgreSQL out of reach as DatabaseUnavailable, for every module of the store."""

from __future__ import annotations

import random
import select
import time
import weakref
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from psycopg_pool.base import AttemptWithBackoff

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


RECONNECT_MAX_S = 2.0
"""The longest wait between two tries to replace a lost pooled connection. psycopg_pool doubles
it without a cap (1, 2, 4, 8, 16, 32 s ... until reconnect_timeout): after a 45 s outage the
next try came 13-18 s after the database was back, and every caller waited (issue 31)."""
RECONNECT_TIMEOUT_S = 3600.0
"""How long the pool keeps trying to replace a lost connection; after that it gives the slot
up and opens a new one only when a caller asks (psycopg_pool stops retrying on its own)."""


class _CappedBackoff(AttemptWithBackoff):
    """psycopg_pool's reconnect backoff (1 s, doubling, +-10 % jitter), at most
    RECONNECT_MAX_S: a try costs a refused connect, so trying every 2 s during an outage is
    cheap, and it puts the pool back within 2 s of the server's return, whatever the outage's
    length. Jittered, so a fleet's pools that lost the server together do not come back in
    step."""

    def update_delay(self, now: float) -> None:
        super().update_delay(now)
        # the cap keeps update_delay's own clip to the give-up time (min of the two)
        self.delay = min(self.delay, RECONNECT_MAX_S * random.uniform(0.9, 1.0))


class _Pool(AsyncConnectionPool[psycopg.AsyncConnection[Any]]):
    """psycopg_pool's pool with the wait between reconnect tries capped (_CappedBackoff).

    Every try to (re)open a connection goes through _add_connection: psycopg_pool starts
    each series of tries with attempt=None and passes the same attempt to each retry it
    schedules, so a series begun here is capped to its end. The choice of hook, against
    the two public ones: `reconnect_failed` runs only once reconnect_timeout has given up
    (then the pool no longer retries on its own), and a periodic `check()` looks at idle
    connections only, not at a retry already scheduled 16 or 32 s ahead. A psycopg_pool
    that renames the method or the class fails tests/integration/test_db_failover.py.
    """

    async def _add_connection(self, attempt: AttemptWithBackoff | None,
                              growing: bool = False) -> None:
        if attempt is None:
            attempt = _CappedBackoff(timeout=self.reconnect_timeout)
        await super()._add_connection(attempt, growing=growing)


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
    pool: AsyncConnectionPool[Any] = _Pool(
        url, min_size=1, max_size=max_size, open=False, timeout=timeout_s,
        kwargs=_connect_kwargs(prepare), check=check, reset=_stamp_returned,
        reconnect_timeout=RECONNECT_TIMEOUT_S, max_idle=POOL_MAX_IDLE_S, name="vidpoll")
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
