"""PostgreSQL access: the only module that imports psycopg. One method per named query."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import re
import select
import time
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, LiteralString, cast

import psycopg
from psycopg.rows import dict_row
from psycopg.types.json import Jsonb
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from vidpoll.aio import cancel_and_wait
from vidpoll.errors import DatabaseUnavailable, KeyConflict, SchemaError
from vidpoll.models import (
    DEFAULT_ACCOUNT,
    DOWNLOAD,
    PENDING,
    QUEUED,
    REJECTED,
    SUBMITTED,
    UNKNOWN,
    ClaimedDelivery,
    ClaimedIntent,
    ClaimedJob,
    ClaimedResult,
    DeliveryOutcome,
    Intent,
    Job,
    MediaFile,
    Notice,
    Outcome,
    ResultOutcome,
    SubmitOutcome,
)
from vidpoll.policy import (
    MIN_RATE_FACTOR,
    RATE_CUT,
    Budget,
    Grant,
    take_tokens,
    validate_account,
    validate_job_id,
    validate_key,
    validate_payload,
)
from vidpoll.schema import _first_line, check_database_url, connect_refusal, redact_url, refusal
from vidpoll.schema import migrate as migrate  # re-exported: callers import it from here
from vidpoll.sql import QUERIES, migrations

log = logging.getLogger(__name__)

JOBS_CHANNEL = "vidpoll_jobs"
"""NOTIFY channel: rows inserted or made due sooner (wakes pollers)."""
INTENTS_CHANNEL = "vidpoll_intents"
"""NOTIFY channel: intents recorded or re-queued (wakes submitters)."""
JOB_DONE_CHANNEL = "vidpoll_job_done"
"""NOTIFY channel: a job left `pending`; the payload is its id (wakes waiters, submitters)."""
ARCHIVED_COLUMNS = (
    "job_id", "state", "next_poll_at", "created_at", "updated_at", "polling_since",
    "finished_at", "polls", "consecutive_errors", "errors_total", "not_found_count",
    "last_polled_at", "last_http_status", "last_error_class", "last_error", "last_request_id",
    "provider_status", "last_response", "claim_token", "claimed_by", "claimed_at",
    "idempotency_key", "account", "poked_at", "result", "result_state", "result_next_at",
    "result_attempts", "result_token", "result_error", "result_fetched_at")
"""The columns prune_finished copies to video_jobs_archive (named there, in the same order)."""
PRUNE_STALE_S = 900.0
"""Work (a result fetch, a delivery) due longer ago than this and untaken: no worker for it."""
PRUNE_KEPT_REASONS = {
    "already_archived": "its job id is already in the archive (tracked again after a prune)",
    "result_unfetched": "its result was due long ago and nobody fetched it: is a worker with "
                        "--fetch-results (the default) running for its account?",
    "result_pending": "its result is being fetched (or retried)",
    "consumer_gone": "a delivery is pending for a consumer no longer registered: "
                     "`vidpoll deliveries forget {consumer}` drops it",
    "delivery_stalled": "a delivery was due long ago and nobody took it: no worker runs that "
                        "consumer (if it is gone: `vidpoll deliveries forget {consumer}`)",
    "delivery_pending": "a delivery is being delivered (or retried)",
    "busy": "it was being written during the prune: the next prune moves it",
}
"""What each reason of prune_kept means, as `jobs prune` prints it ({consumer}: its name)."""


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


def _q(name: str) -> LiteralString:
    return QUERIES[name]


def _job(row: dict[str, Any], sent_mono: float = 0.0, claimed_mono: float = 0.0
         ) -> ClaimedJob:
    return ClaimedJob(job_id=row["job_id"], claim_token=row["claim_token"],
                      due_at=row["due_at"], polling_since=row["polling_since"],
                      polls=row["polls"], consecutive_errors=row["consecutive_errors"],
                      not_found_count=row["not_found_count"], account=row["account"],
                      late_s=float(row["late_s"] or 0.0), sent_mono=sent_mono,
                      claimed_mono=claimed_mono)


def _job_view(row: dict[str, Any], state: str, files: Any) -> Job:
    listed = files.get("files", []) if isinstance(files, dict) else []
    return Job(job_id=row["job_id"], state=state, provider_status=row["provider_status"],
               polls=row["polls"], created_at=row["created_at"],
               finished_at=row["finished_at"], idempotency_key=row["idempotency_key"],
               account=row["account"], result=row["result"], result_state=row["result_state"],
               files=tuple(MediaFile(f["path"], f["size"], f["sha256"], f["url"])
                           for f in listed))


APP_NAME_MAX_BYTES = 63
"""PostgreSQL keeps this much of an application_name (NAMEDATALEN - 1)."""
POLLS, SUBMITS = "p", "s"
"""What a worker does for its accounts, as presence_name spells it: reads jobs, sends intents."""
_PRESENCE = re.compile(r"^vidpoll (\S+) serves ([ps]+):([a-z0-9_,]+);$")


@dataclass(frozen=True)
class Serves:
    """What one worker process does (POLLS, SUBMITS or both) for which accounts."""

    roles: str
    accounts: tuple[str, ...]


def _app_name(name: str) -> str:
    return name.encode()[:APP_NAME_MAX_BYTES].decode(errors="ignore")


def presence_name(application_name: str, serves: Serves) -> str:
    """The application_name of a worker's LISTEN connection: `vidpoll <worker id> serves
    ps:default,acme;` (p: polls, s: sends intents). If it does not fit in 63 bytes, the plain
    name: the worker is then taken as serving every account (never a false "no worker")."""
    full = f"{application_name} serves {serves.roles}:{','.join(sorted(serves.accounts))};"
    return full if len(full.encode()) <= APP_NAME_MAX_BYTES else _app_name(application_name)


def names_serve(names: Sequence[str], account: str, role: str) -> bool:
    """Whether the application_names of a database's sessions show a worker process that does
    `role` (POLLS or SUBMITS) for `account`. A worker's connections are named `vidpoll <worker
    id>` and its LISTEN connection says what it serves (presence_name); a worker without one
    (--no-listen, a name cut at 63 bytes, an older vidpoll) counts as serving everything."""
    known: dict[str, bool] = {}
    for name in names:
        if not name.startswith("vidpoll ") or name.startswith("vidpoll migrate"):
            continue
        match = _PRESENCE.match(name)
        if match is not None:
            known[match.group(1)] = (role in match.group(2)
                                     and account in match.group(3).split(","))
        else:
            known.setdefault(name.split(" ")[1], True)
    return any(known.values())


class InvalidCursor(ValueError):
    """A page cursor that is malformed, or from another listing."""


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ORDERS = ("newest", "oldest")
"""list_jobs' orders besides each listing's own: by creation (finished rows: by when they
finished), newest or oldest first."""


def _encode_cursor(kind: str, at: datetime | None, job_id: str) -> str:
    # compact (microseconds since the epoch, exact): a page footer fits 80 columns
    micros = None if at is None else (at - _EPOCH) // timedelta(microseconds=1)
    raw = json.dumps([kind, micros, job_id], separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str | None, kind: str) -> tuple[datetime | None, str | None]:
    """A page cursor of listing `kind` back to (time, job id)."""
    if not cursor:
        return None, None
    try:
        got, micros, job_id = json.loads(
            base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        when = None if micros is None else _EPOCH + timedelta(microseconds=int(micros))
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidCursor(f"not a page cursor: {cursor[:40]!r}") from exc
    if got != kind or (kind != "all" and when is None):
        raise InvalidCursor("a cursor of another listing (state or order); start from page 1")
    return when, str(job_id)


def _intent(row: dict[str, Any]) -> Intent:
    return Intent(key=row["idempotency_key"], state=row["state"], payload=row["payload"],
                  priority=row["priority"], attempts=row["attempts"], job_id=row["job_id"],
                  created_at=row["created_at"], next_attempt_at=row["next_attempt_at"],
                  submitted_at=row["submitted_at"], last_http_status=row["last_http_status"],
                  last_error_class=row["last_error_class"], last_error=row["last_error"],
                  last_request_id=row["last_request_id"], error_code=row["error_code"],
                  error_message=row["error_message"], account=row["account"],
                  unknown_outcome_at=row.get("unknown_outcome_at"),
                  resolution=row.get("resolution"), resolved_at=row.get("resolved_at"))


def _claimed_intent(row: dict[str, Any]) -> ClaimedIntent:
    return ClaimedIntent(key=row["idempotency_key"], claim_token=row["claim_token"],
                         payload=row["payload"], attempts=row["attempts"],
                         consecutive_errors=row["consecutive_errors"], account=row["account"],
                         state=row["state"], outcome_unknown=bool(row["outcome_unknown"]))


def _outcome_params(outcomes: Sequence[Outcome], now: datetime | None) -> dict[str, Any]:
    # One JSON document for the whole batch: json.dumps runs in C, while eleven parameter
    # arrays were dumped element by element in Python (a twentieth of a busy worker's CPU).
    # age_s: how long ago each answer arrived, on this process's monotonic clock; the query
    # counts the hint from then (the database's clock minus the age: no clock skew)
    sent = time.monotonic()
    return {"outcomes": json.dumps([
        {"job_id": o.job_id, "claim_token": str(o.claim_token), "state": o.state,
         "delay_s": float(o.delay_s), "read_ok": o.read_ok, "http_status": o.http_status,
         "error_class": o.error_class.value if o.error_class else None, "error": o.error,
         "provider_status": o.provider_status, "body": o.body, "request_id": o.request_id,
         "age_s": max(0.0, sent - o.answered_mono) if o.answered_mono else 0.0,
         "succeeded": o.succeeded}
        for o in outcomes], allow_nan=False), "now": now}


def _release_params(jobs: Sequence[ClaimedJob]) -> dict[str, Any]:
    return {"job_ids": [j.job_id for j in jobs], "tokens": [j.claim_token for j in jobs],
            "due_ats": [j.due_at for j in jobs]}


@asynccontextmanager
async def _translate_errors() -> AsyncIterator[None]:
    try:
        yield
    except (psycopg.OperationalError, PoolTimeout) as exc:
        raise DatabaseUnavailable(f"PostgreSQL is unavailable: {exc}".strip()) from exc


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
        async with _translate_errors():
            cur = await self._conn.execute(_q("record_outcomes"),
                                           _outcome_params(outcomes, self.now))
            return {r[0] for r in await cur.fetchall()}

    async def release(self, jobs: Sequence[ClaimedJob]) -> set[str]:
        """Clear the claim of rows read without an outcome (a refused key), in the batch's
        transaction: left set, the token reads as a claim in flight (doctor's stuck claims,
        poll-now and webhooks would wait for a record that never comes)."""
        if not jobs:
            return set()
        async with _translate_errors():
            cur = await self._conn.execute(_q("release_claims"), _release_params(jobs))
            return {r[0] for r in await cur.fetchall()}


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


class _Listener:
    """One LISTEN connection shared by every subscriber of a store.

    A subscriber names its channels; a channel nobody listened to yet is added with LISTEN
    (the reader steps out of notifies() for it; psycopg keeps what arrives meanwhile). Each
    NOTIFY goes to the subscribers of its channel. When the connection drops, every
    subscriber's iterator raises DatabaseUnavailable and the next subscribe reconnects; the
    connection closes when its last subscriber leaves.
    """

    def __init__(self, url: str) -> None:
        self._url = url
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._channels: set[str] = set()
        self._subscribers: dict[int, tuple[frozenset[str], asyncio.Queue[Notice | Exception]]] \
            = {}
        self._lock = asyncio.Lock()

    async def subscribe(self, channels: Sequence[str]) -> AsyncIterator[Notice]:
        queue: asyncio.Queue[Notice | Exception] = asyncio.Queue()
        async with self._lock:
            await self._listen(channels)
            self._subscribers[id(queue)] = (frozenset(channels), queue)
        try:
            yield Notice("", "")
            while True:
                item = await queue.get()
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            self._subscribers.pop(id(queue), None)
            if not self._subscribers:
                async with self._lock:
                    if not self._subscribers:
                        await self._drop()

    async def _listen(self, channels: Sequence[str]) -> None:
        """Connected and listening on `channels` (caller holds the lock)."""
        async with _translate_errors():
            if self._conn is None or self._conn.closed:
                await self._drop()
                self._conn = await psycopg.AsyncConnection.connect(self._url, autocommit=True)
            new = [c for c in dict.fromkeys(channels) if c not in self._channels]
            if new:
                await self._stop_reader()
                for channel in new:
                    await self._conn.execute(psycopg.sql.SQL("LISTEN {}").format(
                        psycopg.sql.Identifier(channel)))
                    self._channels.add(channel)
            if self._reader is None:
                self._reader = asyncio.create_task(self._read(self._conn),
                                                   name="vidpoll-listener")

    async def _read(self, conn: psycopg.AsyncConnection[Any]) -> None:
        try:
            async for note in conn.notifies():
                for wanted, queue in list(self._subscribers.values()):
                    if note.channel in wanted:
                        queue.put_nowait(Notice(note.channel, note.payload))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the connection dropped: every subscriber reconnects
            lost = DatabaseUnavailable(f"the LISTEN connection dropped: {_first_line(exc)}")
            lost.__cause__ = exc
            subscribers = list(self._subscribers.values())
            self._subscribers.clear()
            for _, queue in subscribers:
                queue.put_nowait(lost)
            self._reader = None
            self._channels.clear()
            with contextlib.suppress(Exception):
                await conn.close()

    async def _stop_reader(self) -> None:
        reader, self._reader = self._reader, None
        await cancel_and_wait(reader)

    async def _drop(self) -> None:
        await self._stop_reader()
        conn, self._conn = self._conn, None
        self._channels.clear()
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()

    async def close(self) -> None:
        async with self._lock:
            await self._drop()


class PgStore:
    """The job table, through a small pool of autocommit connections."""

    def __init__(self, pool: AsyncConnectionPool[Any], url: str, prepare: bool = True,
                 listen_url: str | None = None) -> None:
        self._pool = pool
        self._url = url
        self._prepare = prepare
        self._vacuum_notices: list[str] = []
        self._listener = _Listener(listen_url or url)

    @classmethod
    async def open(cls, url: str, *, max_size: int = 4, timeout_s: float = 10.0,
                   check_schema: bool = True, prepare: bool = True,
                   application_name: str | None = None,
                   serves: Serves | None = None) -> PgStore:
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
            name = _app_name(application_name)
            url = listen_url = psycopg.conninfo.make_conninfo(url, application_name=name)
        if application_name and serves is not None:
            # the LISTEN connection says what the worker serves (wait() reads it)
            listen_url = psycopg.conninfo.make_conninfo(
                url, application_name=presence_name(application_name, serves))
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
        async with _translate_errors(), self._pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(_q(name), params)
            row: dict[str, Any] | None = await cur.fetchone()
            return row

    async def _all(self, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        async with _translate_errors(), self._pool.connection() as conn:
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(_q(name), params)
            rows: list[dict[str, Any]] = await cur.fetchall()
            return rows

    async def claim(self, limit: int, lease_s: float, worker_id: str,
                    account: str = DEFAULT_ACCOUNT,
                    now: datetime | None = None) -> list[ClaimedJob]:
        """Lease mode: claim up to `limit` due rows of `account` and commit at once.

        Each row carries `sent_mono`: time.monotonic() just before the statement left, after
        any wait for a pooled connection, so it is no later than the lease's start (the
        statement's now()) and a caller can tell how much of the lease is left.
        """
        async with _translate_errors(), self._pool.connection() as conn:
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
        async with _translate_errors(), self._pool.connection() as conn, conn.transaction():
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
            async with _translate_errors(), self._pool.connection() as conn:
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

    # -- results --------------------------------------------------------------------------
    async def claim_results(self, limit: int, lease_s: float, account: str = DEFAULT_ACCOUNT,
                            now: datetime | None = None) -> list[ClaimedResult]:
        """Claim completed jobs whose result is due to fetch (leased, committed at once)."""
        rows = await self._all("claim_results", {"limit": limit, "lease_s": lease_s,
                                                 "account": account, "now": now})
        return [ClaimedResult(r["job_id"], r["result_token"], r["result_attempts"],
                              r["account"]) for r in rows]

    async def record_result(self, outcome: ResultOutcome, now: datetime | None = None) -> bool:
        """Write one result fetch's outcome, fenced on its token."""
        row = await self._one("record_result", {
            "job_id": outcome.job_id, "token": outcome.token, "state": outcome.state,
            "result": None if outcome.result is None else Jsonb(outcome.result),
            "error": outcome.error, "delay_s": outcome.delay_s, "now": now})
        return row is not None

    async def add_job(self, job_id: str, delay_s: float = 15.0, now: datetime | None = None,
                      account: str = DEFAULT_ACCOUNT) -> bool:
        """Track a job id; False if it was already tracked (the existing row is kept)."""
        validate_job_id(job_id)
        validate_account(account)
        row = await self._one("insert_job", {"job_id": job_id, "delay_s": delay_s, "now": now,
                                             "account": account})
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

    # -- the rate budget ----------------------------------------------------------------------
    async def take_tokens(self, account: str, kind: str, want: int, budget: Budget) -> Grant:
        """Take up to `want` tokens from the fleet's bucket for (account, kind), atomically."""
        params: dict[str, Any] = {"account": account, "kind": kind,
                                  "rate_per_s": budget.rate_per_s, "burst": budget.burst}
        async with _translate_errors(), self._pool.connection() as conn, conn.transaction():
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

    # -- the dashboard's sign-in state (migration 0013, sql/dashboard.sql) ----------------------

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

    async def _execute(self, name: str, params: dict[str, Any]) -> None:
        async with _translate_errors(), self._pool.connection() as conn:
            await conn.execute(_q(name), params)

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

    async def job(self, job_id: str) -> Job | None:
        """One tracked job (with its result and downloaded files), or None."""
        row = await self.get_job(job_id)
        if row is None:
            return None
        files = None
        for d in await self.job_deliveries(job_id):
            if d["consumer"] == DOWNLOAD and d["state"] == "done":
                files = d["detail"]
        return _job_view(row, row["state"], files)

    async def job_deliveries(self, job_id: str) -> list[dict[str, Any]]:
        """One job's deliveries (downloads, hooks) with their state and last error."""
        return await self._all("job_deliveries", {"job_id": job_id})

    # -- deliveries -----------------------------------------------------------------------
    async def register_consumer(self, name: str) -> bool:
        """Deliveries are wanted for `name` from now on; True if it was not registered."""
        row = await self._one("register_consumer", {"name": name})
        return bool(row and row["new"])

    async def claim_deliveries(self, consumer: str, limit: int, lease_s: float,
                               now: datetime | None = None) -> list[ClaimedDelivery]:
        """Lease up to `limit` claimable deliveries of `consumer` (committed at once)."""
        rows = await self._all("claim_deliveries", {"consumer": consumer, "limit": limit,
                                                    "lease_s": lease_s, "now": now})
        return [ClaimedDelivery(_job_view(r, r["job_state"], r["files"]), r["consumer"],
                                r["token"], r["attempts"], r["detail"], r["generation"])
                for r in rows]

    async def extend_delivery(self, claim: ClaimedDelivery, lease_s: float) -> bool:
        """Push a running delivery's lease `lease_s` out; False if it is not ours any more."""
        row = await self._one("extend_delivery", {
            "job_id": claim.job.job_id, "consumer": claim.consumer, "token": claim.token,
            "lease_s": lease_s})
        return row is not None

    async def release_delivery(self, claim: ClaimedDelivery, delay_s: float,
                               error: str | None = None) -> bool:
        """Hand a running delivery back (its worker is stopping): due in `delay_s`, its try
        given back unless `error` says why it counts; fenced on its token; False if not ours."""
        row = await self._one("release_delivery", {
            "job_id": claim.job.job_id, "consumer": claim.consumer, "token": claim.token,
            "delay_s": delay_s, "error": error})
        return row is not None

    async def record_delivery(self, outcome: DeliveryOutcome) -> bool:
        """Write one delivery attempt's outcome, fenced on its token."""
        row = await self._one("record_delivery", {
            "job_id": outcome.job_id, "consumer": outcome.consumer, "token": outcome.token,
            "state": outcome.state, "delay_s": outcome.delay_s, "error": outcome.error,
            "detail": None if outcome.detail is None else Jsonb(outcome.detail),
            "refresh_result": outcome.refresh_result, "generation": outcome.generation})
        return row is not None

    async def next_delivery_due_in(self, consumers: Sequence[str]) -> float | None:
        """Seconds until the next claimable delivery is due; None if none."""
        row = await self._one("next_delivery_due_in", {"consumers": list(consumers)})
        return None if row is None else cast(float | None, row["next_due_in_s"])

    async def pending_deliveries(self, consumers: Sequence[str], within_s: float
                                 ) -> tuple[int, int]:
        """(deliveries not done, of which due within `within_s`)."""
        row = await self._one("pending_deliveries", {"consumers": list(consumers),
                                                     "within_s": within_s})
        assert row is not None
        return int(row["pending"]), int(row["due_soon"])

    async def delivery_counts(self) -> list[dict[str, Any]]:
        """Per registered consumer: pending, retrying, done, failed, oldest pending."""
        return await self._all("delivery_counts", {})

    async def failed_deliveries(self, consumer: str | None = None, limit: int = 20
                                ) -> list[dict[str, Any]]:
        """Failed and retrying deliveries with their last error, newest first."""
        return await self._all("failed_deliveries", {"consumer": consumer, "limit": limit})

    async def retry_deliveries(self, consumer: str | None = None, job_id: str | None = None
                               ) -> list[dict[str, Any]]:
        """Failed (or backing-off) deliveries due now with fresh tries; returns them."""
        return await self._all("retry_deliveries", {"consumer": consumer, "job_id": job_id})

    async def forget_consumer(self, name: str) -> tuple[int, int]:
        """Unregister a consumer; (consumers removed, undone deliveries removed)."""
        row = await self._one("forget_consumer", {"name": name})
        assert row is not None
        return int(row["consumers"]), int(row["dropped"])

    async def counts(self) -> dict[str, int]:
        """Rows per state."""
        return {r["state"]: r["n"] for r in await self._all("count_by_state", {})}

    async def backlog(self, now: datetime | None = None) -> tuple[int, float]:
        """(rows due now, seconds the oldest due row is late)."""
        row = await self._one("due_backlog", {"now": now})
        assert row is not None
        return int(row["due"]), float(row["oldest_late_s"] or 0.0)

    # -- cheap scrapes (scrape.sql): /metrics and the overview never scan video_jobs ------
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

    # -- operations (0009) ----------------------------------------------------------------
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
        after_at, after_id = _decode_cursor(cursor, kind)
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
        return rows, _encode_cursor(kind, last[key] if key else None, last["job_id"])

    async def serving(self, account: str, role: str) -> bool | None:
        """Whether a worker process connected to this database does `role` (POLLS or
        SUBMITS) for `account`, as its connections' application_names say (names_serve);
        None if that cannot be read."""
        try:
            rows = await self._all("session_names", {})
        except (DatabaseUnavailable, psycopg.Error):
            return None
        return names_serve([r["application_name"] for r in rows], account, role)

    async def poll_now(self, job_id: str) -> bool | None:
        """Make a pending job due now; None if no pending row, else whether it was idle (a
        row being read now is read again as soon as that read is recorded)."""
        row = await self._one("poll_now", {"job_id": job_id})
        return None if row is None else bool(row["made_due"])

    async def prune_finished(self, before: datetime, batch: int = 5000) -> int:
        """Move one batch of rows finished before `before` to video_jobs_archive (the columns
        of ARCHIVED_COLUMNS; unarchived_columns() names any other)."""
        return len(await self._all("prune_finished", {"before": before, "batch": batch}))

    async def prune_kept(self, before: datetime,
                         stale_s: float = PRUNE_STALE_S) -> list[dict[str, Any]]:
        """Why rows finished before `before` are still in video_jobs: (reason, consumer, n,
        oldest_finished) rows, one reason per row; see PRUNE_KEPT_REASONS."""
        return await self._all("prune_kept", {"before": before, "stale_s": stale_s})

    async def unarchived_columns(self) -> list[str]:
        """Columns of video_jobs that prune does not archive (added outside the migrations)."""
        rows = await self._all("unarchived_columns", {"archived": list(ARCHIVED_COLUMNS)})
        return [r["column_name"] for r in rows]

    async def prune_job_events(self, older_than_s: float, batch: int = 5000,
                               progress: Callable[[int], None] | None = None
                               ) -> tuple[int, int]:
        """Delete the history of jobs no longer in video_jobs whose every event is older than
        `older_than_s` (the database's clock), a window of `batch` events per transaction,
        reading the table once; returns (deleted, kept: events that old of jobs still in
        video_jobs, or with newer events)."""
        after, deleted, old = 0, 0, 0
        while True:
            row = await self._one("prune_job_events", {
                "older_than_s": older_than_s, "after_id": after, "batch": batch})
            if row is None or not row["scanned"]:
                break
            after = int(row["last_id"])
            deleted += int(row["deleted"])
            old += int(row["old"])
            if progress is not None and row["deleted"]:
                progress(deleted)
            if not row["old"]:  # ids follow insertion: the rest is newer still
                break
        return deleted, old - deleted

    async def prune_webhook_events(self, older_than_s: float, batch: int = 5000,
                                   progress: Callable[[int], None] | None = None) -> int:
        """Delete the webhook events received more than `older_than_s` ago (the database's
        clock), a window of `batch` per transaction, reading the table once in event id
        order; returns how many."""
        after, deleted = "", 0
        while True:
            row = await self._one("prune_webhook_events", {
                "older_than_s": older_than_s, "after": after, "batch": batch})
            if row is None or not row["scanned"]:
                return deleted
            after = str(row["last_key"])
            deleted += int(row["deleted"])
            if progress is not None and row["deleted"]:
                progress(deleted)

    async def may_delete_webhook_events(self) -> bool:
        """Whether this role may delete webhook events (`vidpoll serve` prunes them if so)."""
        row = await self._one("may_delete_webhook_events", {})
        return bool(row and row["allowed"])

    async def jobs_by_short_id(self, head: str, tail: str) -> list[str]:
        """The ids (at most three) of jobs, tracked or archived, that `head…tail` shortens."""
        rows = await self._all("jobs_by_short_id", {
            "head": head, "tail": tail, "tail_len": len(tail),
            "min_len": len(head) + len(tail)})
        return [str(r["job_id"]) for r in rows]

    async def get_archived_job(self, job_id: str) -> dict[str, Any] | None:
        """An archived row, or None."""
        return await self._one("get_archived_job", {"job_id": job_id})

    async def recent_errors(self, limit: int = 20) -> list[dict[str, Any]]:
        """The newest error events of the history."""
        return await self._all("recent_errors", {"limit": limit})

    async def delivery_backlog(self) -> list[dict[str, Any]]:
        """Per consumer: pending, retrying and failed deliveries (cheap: partial indexes)."""
        return await self._all("delivery_backlog", {})

    async def stuck_claims(self) -> list[dict[str, Any]]:
        """Per worker: claims whose lease ended over a minute ago without a record."""
        return await self._all("stuck_claims", {})

    async def doctor(self) -> dict[str, Any]:
        """Everything `vidpoll doctor` looks at, in one place."""
        async with _translate_errors(), self._pool.connection() as conn:
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

    # -- submission intents -----------------------------------------------------------------
    async def add_intent(self, key: str, payload: dict[str, Any], priority: int = 0,
                         account: str = DEFAULT_ACCOUNT) -> tuple[Intent, bool]:
        """Record an intent before any POST; returns (intent, newly recorded).

        The same key with the same payload returns the existing intent untouched (a re-run is
        harmless); the same key with another payload raises KeyConflict.
        """
        validate_key(key)
        validate_account(account)
        payload = validate_payload(payload)
        row = await self._one("insert_intent", {"key": key, "payload": Jsonb(payload),
                                                "priority": priority, "account": account})
        intent = await self.get_intent(key)
        assert intent is not None
        if row is None and (intent.payload != payload or intent.account != account):
            raise KeyConflict(f"idempotency key {key!r} is already recorded with a different "
                              "payload or account; use a new key for a new request")
        return intent, row is not None

    async def add_intents(self, items: Sequence[tuple[str, dict[str, Any], int]],
                          account: str = DEFAULT_ACCOUNT) -> tuple[int, list[str]]:
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
        async with _translate_errors(), self._pool.connection() as conn, conn.transaction():
            cur = await conn.execute(_q("insert_intents"), {
                "keys": [k for k, _, _ in items], "payloads": [Jsonb(p) for _, p, _ in items],
                "priorities": [pr for _, _, pr in items], "account": validate_account(account)})
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
        params = {"limit": limit, "lease_s": lease_s, "worker_id": worker_id,
                  "max_active": max_active, "key": key, "now": now, "account": account}
        async with _translate_errors(), self._pool.connection() as conn, conn.transaction():
            if max_active is not None:
                await conn.execute(_q("lock_admission"), {"account": account})
            cur = conn.cursor(row_factory=dict_row)
            await cur.execute(_q("claim_intents"), params)
            rows = await cur.fetchall()
        return [_claimed_intent(r) for r in rows]

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
        if outcome.state == SUBMITTED:
            assert outcome.job_id is not None
            validate_job_id(outcome.job_id)
            row = await self._one("record_submitted", {**params, "job_id": outcome.job_id,
                                                       "delay_s": first_poll_s})
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
        assert outcome.state == QUEUED
        row = await self._one("record_intent_retry", {**params, "delay_s": outcome.delay_s})
        return row is not None

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
