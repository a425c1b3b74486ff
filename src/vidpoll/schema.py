"""The schema's versions: `migrate` applies the shipped migration files to a database, online.

Imports psycopg (as store does); knows nothing of jobs.

Online: `vidpoll migrate` runs beside live traffic (the seed's own loop, older workers). No
statement holds a lock that blocks reads and writes for longer than a metadata change:

- A migration file is a list of **steps**, each started by a directive line (a file without
  one is a single transactional step):

      -- vidpoll: step                     one transaction; every lock it asks for is asked
                                           with a short lock_timeout (LOCK_TIMEOUT_S), and a
                                           step that times out is rolled back and retried with
                                           backoff (for ADD COLUMN, triggers, constraints:
                                           keep each such step tiny, strongest lock first)
      -- vidpoll: step no-transaction      one statement outside any transaction, e.g.
                                           CREATE INDEX CONCURRENTLY IF NOT EXISTS <name>; an
                                           INVALID index of that name (a killed build) is
                                           dropped (concurrently) and built again
      -- vidpoll: step batched TABLE KEY   one UPDATE run on consecutive KEY ranges of
                                           BATCH_ROWS rows, %(first)s..%(last)s, a transaction
                                           per batch (backfills)

- File-level marks for rolling deploys (docs/UPGRADING.md): `-- vidpoll: expand` (code of the
  previous level keeps working: the oldest code level recorded stays the previous one's),
  `-- vidpoll: oldest-code N` (code from level N on works with it). Unmarked: a contract
  migration, only code that ships it works with it. Each applied migration's row in
  vidpoll_schema_migrations records that level (oldest_code), so code older than the schema
  can tell, without knowing the newer files, whether it may run (PgStore.check_schema).
- Every step is idempotent (IF NOT EXISTS, CREATE OR REPLACE, DROP ... IF EXISTS then CREATE,
  backfills that skip rows already done), and a migration is recorded after its last step: a
  `migrate` killed half way is simply run again. CHECK constraints are added NOT VALID, then
  validated in a step of their own (VALIDATE takes no lock that blocks writes). A column with
  a volatile default would rewrite the table: add it without one, backfill in batches, then
  set the default.
- Concurrent runs are serialised by a session advisory lock, taken by polling
  (pg_try_advisory_lock): a run waiting inside a statement would hold a snapshot that the
  running one's CREATE INDEX CONCURRENTLY waits for.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import psycopg
from psycopg import sql as pgsql

from vidpoll.errors import ConfigError, DatabaseUnavailable, SchemaError
from vidpoll.outcome_words import settle_outcomes
from vidpoll.sql import QUERIES, migrations

log = logging.getLogger(__name__)
SLOW_STEP_S = 1.0
"""A step that takes this long is logged at INFO (quicker ones at DEBUG)."""

__all__ = ["Migration", "Step", "check_database_url", "connect_refusal", "level_of_each",
           "migrate", "parse_migration", "redact_url", "refusal", "shipped_migrations"]

LOCK_TIMEOUT_S = 0.5
"""How long one step waits for a lock before it gives up, rolls back and tries again. While it
waits, everything that needs the table queues behind it: the seed's loop stalls for at most
this long (plus the step's own milliseconds)."""
LOCK_PATIENCE_S = 300.0
"""How long a step keeps retrying before migrate stops with an error (run it again later)."""
BATCH_ROWS = 5000
"""Rows per backfill transaction."""
_ADVISORY_POLL_S = 0.2
_ADVISORY_LOG_EVERY_S = 10.0
_BACKOFF_FIRST_S, _BACKOFF_MAX_S = 0.1, 2.0

_DIRECTIVE = re.compile(r"^--\s*vidpoll:\s*(.*?)\s*$", re.MULTILINE)
_INDEX_NAME = re.compile(
    r"^\s*CREATE\s+(?:UNIQUE\s+)?INDEX\s+CONCURRENTLY\s+IF\s+NOT\s+EXISTS\s+(\w+)",
    re.IGNORECASE | re.MULTILINE)
_IDENT = re.compile(r"^[a-z_][a-z0-9_]*$")
T = TypeVar("T")


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


_URL_FORMS = ("a URL (postgresql:// then USER:PASSWORD@HOST:5432/DBNAME) or key=value pairs "
              "('host=... port=5432 dbname=... user=...')")
_CHOICES = {
    "sslmode": ("disable", "allow", "prefer", "require", "verify-ca", "verify-full"),
    "gssencmode": ("disable", "prefer", "require"),
    "channel_binding": ("disable", "prefer", "require"),
    "target_session_attrs": ("any", "read-write", "read-only", "primary", "standby",
                             "prefer-standby"),
    "load_balance_hosts": ("disable", "random"),
    "sslnegotiation": ("postgres", "direct"),
}
_INTEGERS = ("connect_timeout", "keepalives", "keepalives_idle", "keepalives_interval",
             "keepalives_count", "tcp_user_timeout")
_BAD_OPTION = re.compile(r"invalid (?:[\w ]+ value|integer value|port number)")
# libpq's parse errors quote the text they could not parse, which may be (a piece of) the
# password, and they pair quotes naively: nothing of its message is shown but one of these
# fixed phrases (and an option name libpq knows, or one given as a URL query parameter).
_PHRASES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r'^missing "=" after'), 'a part of it is neither a URL nor a key=value pair'),
    (re.compile(r"^unterminated quoted string"), "a quoted value is not closed"),
    (re.compile(r"percent-encoded"), "a %-escape (%XX) in it is invalid"),
    (re.compile(r"URI query parameter"), "a query parameter (?name=value) is malformed"),
    (re.compile(r"IPv6 host address"), "a [IPv6] host in it is empty or not closed"),
    (re.compile(r"URI"), "it is not a valid postgresql:// URL"),
    (re.compile(r"^invalid port number"), "a port is not a number"),
)
_UNKNOWN_OPTION = re.compile(
    r'^invalid (?:connection option|URI query parameter:) "([a-z_]{1,40})"')
_OPTION_VALUE = re.compile(r'^invalid (\w+) value|for connection option "([a-z_]{1,40})"')


def _keywords() -> frozenset[str]:
    try:
        return frozenset(d.keyword.decode() for d in psycopg.pq.Conninfo.get_defaults())
    except Exception:  # a libpq without it: no option name is shown
        return frozenset()


def _libpq_says(text: str, url: str) -> str:
    """What libpq found wrong, in a fixed phrase that quotes nothing of the URL but an
    option's name (a name libpq knows, or a URL query parameter's)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    unknown = _UNKNOWN_OPTION.match(line)
    if unknown:
        name = unknown.group(1)
        query = urlsplit_query(url)
        return f"it has an unknown option {name!r}" if name in query else \
            "it has an unknown option (a key=value pair libpq does not know)"
    option = _OPTION_VALUE.search(line)
    if option:
        name = option.group(1) or option.group(2)
        if name in _keywords():
            return f"libpq refuses the value of {name}"
    for pattern, phrase in _PHRASES:
        if pattern.search(line):
            return phrase
    return "libpq cannot parse it"


def urlsplit_query(url: str) -> frozenset[str]:
    """The names of a URL's query parameters (none for a key=value string)."""
    if "://" not in url or "?" not in url:
        return frozenset()
    query = url.split("?", 1)[1]
    return frozenset(part.split("=", 1)[0] for part in query.split("&") if "=" in part)


def _hint(url: str) -> str:
    """Why a string libpq cannot parse is likely wrong, without quoting it."""
    text = url.strip()
    if text[:1] in ("'", '"'):
        return (" (it is in quotes: remove them, as docker --env-file and some .env readers "
                "keep them)")
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", text)
    if scheme and scheme.group(1).lower() not in ("postgresql", "postgres"):
        return " (it must start with postgresql:// or postgres:// instead)"
    if "://" not in text and "=" not in text:
        return " (postgresql:// or postgres:// is missing at its start)"
    return ""


def check_database_url(url: str) -> dict[str, str]:
    """The options of a libpq URL or key=value string, or a ConfigError saying what is wrong
    with it without quoting it (it may hold a password): unparseable, a port that is not a
    number from 1 to 65535, an option whose value libpq would refuse at connect time."""
    if not url.strip():
        raise ConfigError(f"the database URL (DATABASE_URL) is empty; expected {_URL_FORMS}")
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.Error as exc:
        raise ConfigError(
            f"the database URL (DATABASE_URL) is malformed{_hint(url)}: "
            f"{_libpq_says(str(exc), url)}; expected {_URL_FORMS} (not shown: it may hold a "
            "password)") from None
    for port in str(info.get("port") or "").split(","):
        if port.strip() and not (port.strip().isdigit() and 1 <= int(port) <= 65535):
            raise ConfigError("the database URL (DATABASE_URL) has a port that is not a number "
                              "from 1 to 65535 (not shown: it may hold a password)")
    for name, allowed in _CHOICES.items():
        value = info.get(name)
        if value is not None and value not in allowed:
            raise ConfigError(f"the database URL (DATABASE_URL) has {name}={value!r}; it must "
                              f"be one of {', '.join(allowed)}")
    for name in _INTEGERS:
        value = info.get(name)
        if value is not None and not re.fullmatch(r"\s*-?\d+\s*", str(value)):
            raise ConfigError(f"the database URL (DATABASE_URL) has {name}={value!r}; it must "
                              "be a whole number")
    return {k: str(v) for k, v in info.items()}


def connect_refusal(exc: BaseException) -> ConfigError | None:
    """A ConfigError if libpq refused to connect because of an option's value (a setting to
    fix, not an outage), else None."""
    text = str(exc).removeprefix("connection is bad: ")
    if not _BAD_OPTION.search(text):
        return None
    return ConfigError(f"the database URL (DATABASE_URL) has an option libpq refuses: "
                       f"{_libpq_says(text, '')} (not shown: it may hold a password)")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# -- the file format ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """One step of a migration: how it runs (`transaction`, `no-transaction`, `batched`)."""

    kind: str
    sql: str
    table: str | None = None
    """batched: the table walked."""
    key: str | None = None
    """batched: its unique key, walked in order."""
    index: str | None = None
    """no-transaction CREATE INDEX CONCURRENTLY: the index's name."""


@dataclass(frozen=True)
class Migration:
    """A parsed migration file."""

    version: int
    name: str
    steps: tuple[Step, ...]
    expand: bool = False
    """Code of the previous level keeps working (`-- vidpoll: expand`)."""
    oldest_code: int | None = None
    """`-- vidpoll: oldest-code N`."""


def _code_of(text: str) -> str:
    """The SQL of `text` without comment lines and blank lines."""
    return "\n".join(line for line in text.splitlines()
                     if line.strip() and not line.strip().startswith("--")).strip()


def _single_statement(name: str, text: str) -> str:
    code = _code_of(text).rstrip().rstrip(";")
    if ";" in code:
        raise ValueError(f"{name}: a no-transaction or batched step is one statement")
    return code


def parse_migration(version: int, name: str, text: str) -> Migration:
    """Split a migration file into its steps; raise ValueError on a malformed directive."""
    expand, oldest = False, None
    steps: list[Step] = []
    # (directive, body) pairs: text before the first directive belongs to an implicit step
    pieces = _DIRECTIVE.split(text)
    chunks: list[tuple[str | None, str]] = [(None, pieces[0])]
    chunks += list(zip(pieces[1::2], pieces[2::2], strict=True))
    pending_body = ""
    pending_kind: list[str] | None = None

    def close(kind: list[str] | None, body: str) -> None:
        if kind is None:
            if _code_of(body):
                steps.append(Step("transaction", body.strip()))
            return
        if not _code_of(body):
            raise ValueError(f"{name}: an empty step")
        if kind == ["step"]:
            steps.append(Step("transaction", body.strip()))
        elif kind == ["step", "no-transaction"]:
            statement = _single_statement(name, body)
            match = _INDEX_NAME.match(statement)
            steps.append(Step("no-transaction", statement,
                              index=match.group(1) if match else None))
        elif len(kind) == 4 and kind[:2] == ["step", "batched"]:
            table, key = kind[2], kind[3]
            if not (_IDENT.match(table) and _IDENT.match(key)):
                raise ValueError(f"{name}: batched needs a table and a key column")
            statement = _single_statement(name, body)
            if "%(first)s" not in statement or "%(last)s" not in statement:
                raise ValueError(f"{name}: a batched step uses %(first)s and %(last)s")
            steps.append(Step("batched", statement, table=table, key=key))
        else:
            raise ValueError(f"{name}: unknown step directive {' '.join(kind)!r}")

    for directive, body in chunks:
        if directive is None:
            pending_body = body
            continue
        words = directive.split()
        if words == ["expand"]:
            expand = True
            pending_body += body
        elif len(words) == 2 and words[0] == "oldest-code" and words[1].isdigit():
            oldest = int(words[1])
            if oldest > version:
                raise ValueError(f"{name}: oldest-code {oldest} is newer than the migration")
            pending_body += body
        elif words and words[0] == "step":
            close(pending_kind, pending_body)
            pending_kind, pending_body = words, body
        else:
            raise ValueError(f"{name}: unknown directive {directive!r}")
    close(pending_kind, pending_body)
    if expand and oldest is not None:
        raise ValueError(f"{name}: expand and oldest-code are exclusive")
    if not steps:
        raise ValueError(f"{name}: no SQL")
    return Migration(version, name, tuple(steps), expand, oldest)


def shipped_migrations() -> list[Migration]:
    """Every migration file of this vidpoll, parsed, in order."""
    return [parse_migration(v, n, t) for v, n, t in migrations()]


def level_of_each(found: Sequence[Migration]) -> dict[int, int]:
    """version -> the oldest code level that works with the schema once it is applied."""
    levels: dict[int, int] = {}
    previous = 0
    for m in found:
        if m.expand:
            level = previous
        elif m.oldest_code is not None:
            level = max(previous, m.oldest_code)
        else:
            level = m.version
        levels[m.version] = previous = level
    return levels


def refusal(version: int, name: str, oldest_code: int | None, latest: int) -> str | None:
    """Why code of level `latest` may not run on a schema at `version`, or None if it may."""
    if version <= latest:
        return None
    if oldest_code is not None and oldest_code <= latest:
        return None
    needs = oldest_code if oldest_code is not None else version
    return (f"schema version {version} is newer than this vidpoll ({latest}), and "
            f"{name} needs vidpoll code of level {needs} or later (it is not marked "
            "compatible with older code); upgrade vidpoll")


# -- the runner --------------------------------------------------------------------------------


Run = Callable[[Mapping[str, Any] | None], Awaitable[Any]]
"""Runs the current step's shipped SQL text with these parameters (None: none)."""


async def migrate(url: str, timeout_s: float = 10.0, *, lock_timeout_s: float = LOCK_TIMEOUT_S,
                  batch_rows: int = BATCH_ROWS, patience_s: float = LOCK_PATIENCE_S,
                  found: Sequence[Migration] | None = None) -> list[str]:
    """Apply every migration not applied yet, step by step, online (see the module's doc).

    Safe to run concurrently and repeatedly: a second run waits for the first, then finds
    nothing to do; a run killed half way is finished by the next. `found`: the migrations to
    apply (default: the shipped ones; tests add fixtures beyond them). Returns the names of
    the files it applied.
    """
    found = list(found) if found is not None else shipped_migrations()
    levels = level_of_each(found)
    check_database_url(url)
    try:
        conn = await psycopg.AsyncConnection.connect(
            url, connect_timeout=max(1, int(timeout_s)), autocommit=True)
    except psycopg.OperationalError as exc:
        refused = connect_refusal(exc)
        if refused is not None:
            raise refused from None
        raise DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {redact_url(url)}: {_first_line(exc)}") from exc
    runner = _Runner(conn, lock_timeout_s, batch_rows, patience_s)
    applied: list[str] = []
    try:
        await runner.setup()
        await runner.take_advisory_lock()
        done = await runner.prepare_table(levels)
        if done and max(done) > len(found):
            cur = await conn.execute(_q("schema_level"))
            row = await cur.fetchone()
            assert row is not None
            why = refusal(row[0], row[1], row[2], len(found))
            if why:
                raise SchemaError(why)
            log.info("schema version %s is newer than this vidpoll (%s) and works with it: "
                     "nothing to do", row[0], len(found))
            return []
        for m in found:
            if m.version in done:
                continue
            log.debug("applying migration %s (%d steps)", m.name, len(m.steps))
            for i, step in enumerate(m.steps, 1):
                # the one place shipped migration text reaches psycopg; the lambda is
                # awaited within this iteration, so it sees this step's text
                sql = step.sql
                await runner.step(m, i, step,
                                  lambda params: conn.execute(sql, params))  # noqa: B023
            await runner.record(m, levels[m.version])
            applied.append(m.name)
        # every provider's terminal words (0014's trigger looks them up for writers that name
        # no outcome), then the outcome of finished rows that have none: on every run, so a
        # provider added since, or a run killed half way, is finished (vidpoll.outcome_words)
        await runner._set("application_name", "vidpoll migrate outcome words")
        await settle_outcomes(conn, batch_rows, patience_s=patience_s)
    except psycopg.OperationalError as exc:
        raise DatabaseUnavailable(f"PostgreSQL went away during migrate: {exc}") from exc
    finally:
        await conn.close()  # ends the session: the advisory lock goes with it
    return applied


class _Runner:
    """The steps' mechanics on one autocommit connection."""

    def __init__(self, conn: psycopg.AsyncConnection[Any], lock_timeout_s: float,
                 batch_rows: int, patience_s: float) -> None:
        self.conn = conn
        self.lock_timeout = f"{max(1, int(lock_timeout_s * 1000))}ms"
        self.batch_rows = batch_rows
        self.patience_s = patience_s

    async def _set(self, name: str, value: str, local: bool = False) -> None:
        await self.conn.execute(_q("set_setting"),
                                {"name": name, "value": value, "local": local})

    async def setup(self) -> None:
        await self._set("application_name", "vidpoll migrate")
        # outside the short-lock steps, a wait is for other transactions to end (the phases
        # of CREATE INDEX CONCURRENTLY), which blocks nobody: no limit
        await self._set("lock_timeout", "0")
        if self.conn.info.server_version >= 140000:
            # a killed migrate's backend stops within a second instead of finishing its batch
            await self._set("client_connection_check_interval", "1s")

    async def take_advisory_lock(self) -> None:
        """Wait for any other migrate, without holding a snapshot while waiting."""
        waited_since = time.monotonic()
        logged = waited_since
        while True:
            cur = await self.conn.execute(_q("try_lock_migrations"))
            row = await cur.fetchone()
            if row and row[0]:
                return
            if time.monotonic() - logged >= _ADVISORY_LOG_EVERY_S:
                logged = time.monotonic()
                log.info("waiting for another vidpoll migrate to finish (%.0f s)",
                         logged - waited_since)
            await asyncio.sleep(_ADVISORY_POLL_S)

    async def prepare_table(self, levels: Mapping[int, int]) -> set[int]:
        """Create the version table (and its oldest_code column); the versions applied."""

        async def create() -> None:
            async with self.conn.transaction():
                await self._set("lock_timeout", self.lock_timeout, local=True)
                await self.conn.execute(_q("create_migrations_table"))
                cur = await self.conn.execute(_q("migrations_have_oldest_code"))
                row = await cur.fetchone()
                if not (row and row[0]):
                    # a table made by the one-transaction runner: fill in the levels it knew
                    await self.conn.execute(_q("add_oldest_code_column"))
                    await self.conn.execute(_q("fill_oldest_code"), {
                        "versions": list(levels), "levels": list(levels.values())})

        await self._retrying("the version table", create)
        cur = await self.conn.execute(_q("applied_migrations"))
        return {r[0] for r in await cur.fetchall()}

    async def step(self, m: Migration, i: int, step: Step, run: Run) -> None:
        what = f"{m.name} step {i}/{len(m.steps)}"
        await self._set("application_name", f"vidpoll migrate {m.name} {i}/{len(m.steps)} "
                        f"{step.kind}"[:63])
        started = time.monotonic()
        if step.kind == "transaction":
            await self._retrying(what, lambda: self._in_transaction(run))
        elif step.kind == "no-transaction":
            await self._retrying(what, lambda: self._outside_transaction(step, run))
        else:
            await self._batched(what, step, run)
        took = time.monotonic() - started
        # a step of a big table is news (the operator watches it); thirty quick ones are noise
        log.log(logging.INFO if took >= SLOW_STEP_S else logging.DEBUG, "%s (%s) took %.2f s",
                what, step.kind, took)

    async def _in_transaction(self, run: Run) -> None:
        async with self.conn.transaction():
            await self._set("lock_timeout", self.lock_timeout, local=True)
            await run(None)

    async def _outside_transaction(self, step: Step, run: Run) -> None:
        if step.index is not None:
            cur = await self.conn.execute(_q("index_is_invalid"), {"name": step.index})
            row = await cur.fetchone()
            if row and row[0]:
                log.warning("index %s is INVALID (a build was interrupted): dropping it to "
                            "build it again", step.index)
                await self.conn.execute(pgsql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}")
                                        .format(pgsql.Identifier(step.index)))
        await run(None)

    async def _batched(self, what: str, step: Step, run: Run) -> None:
        assert step.table is not None and step.key is not None
        after: Any = None
        batches = rows = 0
        while True:
            params = {"rows": self.batch_rows, "after": after}

            async def one_batch(params: dict[str, Any] = params) -> tuple[Any, int]:
                async with self.conn.transaction():
                    await self._set("lock_timeout", self.lock_timeout, local=True)
                    # the next batch_rows keys in order (the key's unique index walks them)
                    if params["after"] is None:
                        cur = await self.conn.execute(pgsql.SQL(
                            "SELECT min(k), max(k), count(*) FROM (SELECT {key} AS k "
                            "FROM {table} ORDER BY {key} LIMIT %(rows)s) b").format(
                                key=pgsql.Identifier(step.key or ""),
                                table=pgsql.Identifier(step.table or "")), params)
                    else:
                        cur = await self.conn.execute(pgsql.SQL(
                            "SELECT min(k), max(k), count(*) FROM (SELECT {key} AS k "
                            "FROM {table} WHERE {key} > %(after)s ORDER BY {key} "
                            "LIMIT %(rows)s) b").format(
                                key=pgsql.Identifier(step.key or ""),
                                table=pgsql.Identifier(step.table or "")), params)
                    bounds = await cur.fetchone()
                    if bounds is None or not bounds[2]:
                        return None, 0
                    cur = await run({"first": bounds[0], "last": bounds[1]})
                    return bounds[1], cur.rowcount

            last, changed = await self._retrying(f"{what} batch {batches + 1}", one_batch)
            if last is None:
                break
            after, batches, rows = last, batches + 1, rows + max(changed, 0)
            if batches % 50 == 0:
                log.info("%s: %d batches, %d rows changed", what, batches, rows)
        log.log(logging.INFO if batches else logging.DEBUG, "%s: %d batches, %d rows changed",
                what, batches, rows)

    async def record(self, m: Migration, level: int) -> None:
        async def insert() -> None:
            async with self.conn.transaction():
                await self._set("lock_timeout", self.lock_timeout, local=True)
                await self.conn.execute(_q("record_migration"), {
                    "version": m.version, "name": m.name, "oldest_code": level})

        await self._retrying(f"recording {m.name}", insert)

    async def _retrying(self, what: str, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run `attempt` until it gets its locks: a lock timeout or a deadlock rolls it back
        (every step is idempotent) and it is tried again after a backoff."""
        deadline = time.monotonic() + self.patience_s
        delay = _BACKOFF_FIRST_S
        while True:
            try:
                return await attempt()
            except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected) as exc:
                if time.monotonic() + delay > deadline:
                    raise SchemaError(
                        f"{what}: could not get its locks for {self.patience_s:g} s "
                        f"({_first_line(exc)}); a long transaction holds the table: end it "
                        "and run `vidpoll migrate` again (it resumes)") from exc
                log.info("%s: %s; again in %.1f s", what, _first_line(exc), delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _BACKOFF_MAX_S)
