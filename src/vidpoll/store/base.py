"""PgBase, what every domain of the store stands on: a pool of autocommit connections and the
shared LISTEN connection, opening and closing them, the schema check, and the helpers that run
one named query; creating and dropping a database. Queries: base.sql (and schema.sql's
schema_level)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, LiteralString, Self, cast

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from vidpoll.errors import DatabaseUnavailable, SchemaError
from vidpoll.models import Notice
from vidpoll.schema import check_database_url, redact_url, refusal
from vidpoll.sql import QUERIES, migrations
from vidpoll.store.listener import JOBS_CHANNEL, Listener
from vidpoll.store.pool import open_pool, translate_errors
from vidpoll.store.presence import Serves, app_name, presence_name


def _q(name: str) -> LiteralString:
    """The named query `name`. (tests/unit/test_security_rules.py trusts calls of `_q`:
    keep the name.)"""
    return QUERIES[name]


def create_database_if_missing(admin_url: str, database: str) -> None:
    """CREATE DATABASE `database` on the server of `admin_url` unless it exists."""
    check_database_url(admin_url)
    try:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            exists = conn.execute(_q("database_exists"), {"name": database}).fetchone()
            if not exists:
                conn.execute(psycopg.sql.SQL("CREATE DATABASE {}").format(
                    psycopg.sql.Identifier(database)))
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"cannot reach PostgreSQL at {redact_url(admin_url)}") from exc


def drop_database(admin_url: str, database: str) -> None:
    """DROP DATABASE `database` (WITH FORCE) if it exists; for the demo and tests."""
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(psycopg.sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            psycopg.sql.Identifier(database)))


class PgBase:
    """A pool of autocommit connections and one LISTEN connection; each domain's queries are a
    subclass, PgStore all of them."""

    def __init__(self, pool: AsyncConnectionPool[Any], url: str, prepare: bool = True,
                 listen_url: str | None = None) -> None:
        self._pool = pool
        self._url = url
        self._prepare = prepare
        self._vacuum_notices: list[str] = []
        self._listener = Listener(listen_url or url)

    @classmethod
    async def open(cls, url: str, *, max_size: int = 4, timeout_s: float = 10.0,
                   check_schema: bool = True, prepare: bool = True,
                   application_name: str | None = None,
                   serves: Serves | None = None) -> Self:
        """Connect (failing with DatabaseUnavailable if PostgreSQL is down) and check the schema.

        `prepare=False`: no server-side prepared statements (PgBouncer before 1.21 in
        transaction mode hands each transaction another server connection).
        `application_name`: what pg_stat_activity shows for every connection of this store
        (a worker passes its id); an application_name already in `url` wins, but for the
        LISTEN connection of a store that `serves`.
        `serves`: what this process's workers do for which accounts; its LISTEN connection
        says so in its application_name (see presence_name), for `serving()` to read, always
        (the URL's own application_name would hide the worker from `jobs watch`).
        A malformed `url` raises ConfigError, which never quotes it (it may hold a password).
        """
        options = check_database_url(url)  # a ConfigError that never quotes it
        listen_url = url
        if application_name and "application_name" not in options:
            # the server truncates to 63 bytes; cut here so the name it keeps is predictable
            name = app_name(application_name)
            url = listen_url = psycopg.conninfo.make_conninfo(url, application_name=name)
        if application_name and serves is not None:
            # the LISTEN connection says what the worker serves (wait() reads it)
            listen_url = psycopg.conninfo.make_conninfo(
                url, application_name=presence_name(application_name, serves))
        pool = await open_pool(url, max_size=max_size, timeout_s=timeout_s, prepare=prepare)
        store = cls(pool, url, prepare, listen_url)
        if check_schema:
            try:
                await store.check_schema()
            except BaseException:
                await store.close()
                raise
        return store

    async def close(self) -> None:
        """Close every connection."""
        await self._listener.close()
        await self._pool.close()

    async def check_schema(self) -> int:
        """Raise SchemaError unless this vidpoll works with the database's schema: migrated to
        its version, or to a newer one whose every newer migration is marked compatible with
        it (the latest row records the oldest code level that works: rolling deploys)."""
        latest = len(migrations())
        version = await self.schema_version()
        if version is None:
            raise SchemaError("the database has no vidpoll schema; run `vidpoll migrate` first")
        if version < latest:
            raise SchemaError(f"schema version {version} is older than {latest}; "
                              "run `vidpoll migrate`")
        if version > latest:
            row = await self._one("schema_level", {})
            why = refusal(version, row["name"] if row else f"migration {version}",
                          row["oldest_code"] if row else None, latest)
            if why:
                raise SchemaError(why)
        return version

    async def schema_version(self) -> int | None:
        """The highest applied migration, or None if vidpoll never migrated this database."""
        present = await self._one("schema_table_exists", {})
        if not (present and present["present"]):
            return None
        row = await self._one("schema_version", {})
        return None if row is None else cast(int | None, row["version"])

    async def _one(self, name: str, params: dict[str, Any]) -> dict[str, Any] | None:
        async with translate_errors(), self._pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(_q(name), params)
            row: dict[str, Any] | None = await cur.fetchone()
            return row

    async def _all(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        async with translate_errors(), self._pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(_q(name), params)
            rows: list[dict[str, Any]] = await cur.fetchall()
            return rows

    async def _execute(self, name: str, params: dict[str, Any]) -> None:
        async with translate_errors(), self._pool.connection() as conn:
            await conn.execute(_q(name), params)

    def notifications(self, channels: Sequence[str] = (JOBS_CHANNEL,)
                      ) -> AsyncIterator[Notice]:
        """Yield Notice("", "") once LISTEN is in place, then one Notice per NOTIFY.

        The first item tells the caller it is listening (and that anything notified while it
        was not may have been missed). Every caller of one store shares ONE connection of its
        own (not a pooled one): the poller, the submitter, the deliverer and any number of
        wait() callers of a process cost one LISTEN connection, held while anyone listens.
        Raises DatabaseUnavailable when that connection drops, and the caller reconnects.
        """
        return self._listener.subscribe(channels)
