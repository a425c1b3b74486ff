"""Shared fixtures: a real PostgreSQL (DATABASE_URL or the embedded one) and a real fake Sume.

A template database is migrated once per session; each test gets its own
`CREATE DATABASE t_<uuid> TEMPLATE ...`, dropped afterwards (both on a thread of their own:
`Clones`).
"""

from __future__ import annotations

import asyncio
import atexit
import logging
import os
import queue
import shutil
import socket
import tempfile
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from vidpoll.api import Vidpoll
from vidpoll.config import Settings
from vidpoll.embedded import start_embedded
from vidpoll.policy import PollPolicy
from vidpoll.providers.sume.client import SumeClient
from vidpoll.providers.sume.fake import FakeConfig, FakeSume, start_fake
from vidpoll.store import PgStore, migrate
from vidpoll.submitter import Submitter, SubmitterConfig
from vidpoll.worker import Worker, WorkerConfig

API_KEY = "sk-test-7f3a9c1e-secret"
FAST_POLICY = PollPolicy(min_poll_s=0.05, backoff_base_s=0.1, backoff_max_s=0.5,
                         default_poll_s=15.0)


def free_port() -> int:
    """A loopback TCP port nothing listens on (bound, then closed again)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def own_logging() -> Iterator[None]:
    """logs.setup replaces the root handlers (pytest's too): put them back after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


@pytest.fixture
async def vp(db_url: str, fake_url: str) -> AsyncIterator[Vidpoll]:
    """The Python API on the test database and the fake Sume, with the fake's key."""
    settings = Settings.from_env({"DATABASE_URL": db_url, "SUME_BASE_URL": fake_url,
                                  "SUME_API_KEY": API_KEY})
    async with await Vidpoll.open(settings=settings) as handle:
        yield handle


def url_for(base_url: str, dbname: str) -> str:
    """The same server as `base_url`, another database."""
    return psycopg.conninfo.make_conninfo(base_url, dbname=dbname)


def admin_execute(url: str, statement: sql.Composable) -> None:
    """Run one statement outside a transaction (CREATE/DROP DATABASE)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement)


def embedded_home() -> Path:
    """A VIDPOLL_HOME for an embedded server. Not pytest's tmp_path: pytest keeps its base
    folder at mode 0700, which the server's own (non-root) system user cannot traverse."""
    return Path(tempfile.mkdtemp(prefix="vidpoll-test-"))


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """A server to create test databases on: DATABASE_URL, or the embedded PostgreSQL."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    home = embedded_home()
    yield start_embedded(home, database="postgres")
    # the server stops when this process exits (cleanup_mode="stop"); its files go then too
    atexit.register(shutil.rmtree, home, True)


@pytest.fixture(scope="session")
def template_db(pg_admin_url: str) -> Iterator[str]:
    """A database migrated once, cloned by every test."""
    name = f"vidpoll_tpl_{os.getpid()}"
    admin_execute(pg_admin_url, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
        sql.Identifier(name)))
    admin_execute(pg_admin_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    asyncio.run(migrate(url_for(pg_admin_url, name)))
    yield name
    admin_execute(pg_admin_url, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
        sql.Identifier(name)))


class Clones:
    """Test databases cloned from the template a little ahead of the tests that take them,
    and dropped behind them, on a thread of its own: a clone and a drop cost about 170 ms of
    the server's time each test, which then overlaps the tests instead of adding to them.
    Each test still gets a database of its own, cloned before it began and never used by
    another; a test waits for one when none is ready yet."""

    AHEAD = 2

    def __init__(self, admin_url: str, template: str) -> None:
        self._admin_url = admin_url
        self._template = template
        self._ready: queue.Queue[str] = queue.Queue()
        self._drops: queue.Queue[str] = queue.Queue()
        self._wanted = threading.Semaphore(self.AHEAD)
        self._stopping = threading.Event()
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="test-db-clones", daemon=True)
        self._thread.start()

    def take(self) -> str:
        """A fresh clone's name (made now if the thread has none ready or has failed)."""
        try:
            name = self._ready.get(timeout=0 if self.failure else 30)
        except queue.Empty:
            name = self._clone(None)
        else:
            self._wanted.release()
        return name

    def drop_later(self, name: str) -> None:
        self._drops.put(name)

    def close(self) -> None:
        """Drop every clone, used or not, before the session ends."""
        self._stopping.set()
        self._wanted.release()
        self._thread.join(60)
        with psycopg.connect(self._admin_url, autocommit=True) as conn:
            for pending in (self._drops, self._ready):
                while not pending.empty():
                    self._drop(conn, pending.get_nowait())

    def _clone(self, conn: psycopg.Connection[Any] | None) -> str:
        name = f"t_{uuid.uuid4().hex[:16]}"
        statement = sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(
            sql.Identifier(name), sql.Identifier(self._template))
        if conn is None:
            admin_execute(self._admin_url, statement)
        else:
            conn.execute(statement)
        return name

    @staticmethod
    def _drop(conn: psycopg.Connection[Any], name: str) -> None:
        conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))

    def _run(self) -> None:
        try:
            with psycopg.connect(self._admin_url, autocommit=True) as conn:
                while not self._stopping.is_set():
                    while not self._drops.empty():  # behind first: they free the server
                        self._drop(conn, self._drops.get_nowait())
                    if self._wanted.acquire(timeout=0.05) and not self._stopping.is_set():
                        self._ready.put(self._clone(conn))
        except BaseException as exc:  # the tests go on cloning for themselves
            self.failure = exc


@pytest.fixture(scope="session")
def clones(pg_admin_url: str, template_db: str) -> Iterator[Clones]:
    pool = Clones(pg_admin_url, template_db)
    yield pool
    pool.close()


@pytest.fixture
def empty_db(pg_admin_url: str, clones: Clones) -> Iterator[str]:
    """A new, empty database (no vidpoll schema); yields its URL."""
    name = f"t_{uuid.uuid4().hex[:16]}"
    admin_execute(pg_admin_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    yield url_for(pg_admin_url, name)
    clones.drop_later(name)


@pytest.fixture
def db_url(pg_admin_url: str, clones: Clones) -> Iterator[str]:
    """A migrated database of this test's own (cloned from the template); yields its URL."""
    name = clones.take()
    yield url_for(pg_admin_url, name)
    clones.drop_later(name)


@pytest.fixture
async def store(db_url: str) -> AsyncIterator[PgStore]:
    """A PgStore on this test's database."""
    s = await PgStore.open(db_url, max_size=6)
    yield s
    await s.close()


@pytest.fixture
def fake() -> FakeSume:
    """A fake Sume with instant jobs and no faults (tests script what they need)."""
    return FakeSume(FakeConfig(api_key=API_KEY, queued_s=0, render_s=0, render_jitter=0,
                               seed=1))


@pytest.fixture
async def fake_url(fake: FakeSume) -> AsyncIterator[str]:
    """The fake served on a loopback port."""
    runner, url = await start_fake(fake)
    yield url
    await runner.cleanup()


@pytest.fixture
async def client(fake_url: str) -> AsyncIterator[SumeClient]:
    """The real Sume client pointed at the fake, with a short timeout."""
    async with SumeClient(fake_url, API_KEY, timeout_s=1.0) as c:
        yield c


@pytest.fixture
def make_worker(store: PgStore, client: SumeClient) -> Callable[..., Worker]:
    """Build a worker on this test's store and client; keyword args go to WorkerConfig."""

    def build(**kwargs: Any) -> Worker:
        kwargs.setdefault("policy", FAST_POLICY)
        kwargs.setdefault("lease_s", 5.0)
        kwargs.setdefault("concurrency", 20)
        return Worker(store, client, WorkerConfig(**kwargs))

    return build


@pytest.fixture
def make_submitter(store: PgStore, client: SumeClient) -> Callable[..., Submitter]:
    """Build a submitter on this test's store and client; keyword args go to SubmitterConfig."""

    def build(**kwargs: Any) -> Submitter:
        kwargs.setdefault("policy", FAST_POLICY)
        kwargs.setdefault("lease_s", 5.0)
        kwargs.setdefault("http_timeout_s", 1.0)
        kwargs.setdefault("first_poll_s", 0.0)
        kwargs.setdefault("max_active", None)
        return Submitter(kwargs.pop("store", store), kwargs.pop("creator", client),
                         SubmitterConfig(**kwargs))

    return build


async def run_until(worker: Worker | Submitter, predicate: Callable[[], bool],
                    within_s: float = 10.0) -> None:
    """Run `worker` until `predicate()` holds (checked on its signals), then stop it."""
    task = asyncio.create_task(worker.run())
    try:
        await worker.signals.wait_for(lambda: predicate() or task.done(), within_s)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 10)
    assert predicate(), "worker stopped before the condition held"


async def db_now(url: str) -> datetime:
    """The database's clock now: a time to inject (`now=`) into store calls, so a test moves a
    lease past its end by passing a later `now` instead of sleeping until it ends."""
    async with await psycopg.AsyncConnection.connect(url) as conn:
        cur = await conn.execute("SELECT clock_timestamp()")
        row = await cur.fetchone()
        assert row is not None
        return row[0]  # type: ignore[no-any-return]


def hold_reads(fake: FakeSume) -> asyncio.Event:
    """Hold every request the fake serves (at its latency step: status reads, result reads,
    creates) until the returned event is set.

    A read then stays in flight for as long as the test needs, instead of for a latency that
    a loaded machine can outlast before the test looks. The client's own timeout still ends
    it: give the client a long one.
    """
    gate = asyncio.Event()

    async def held() -> None:
        await gate.wait()

    fake._latency = held  # type: ignore[method-assign]
    return gate


@dataclass
class SleepLog:
    """What a loop's sleeps were: how long each was asked to last and how each ended."""

    asked: list[float] = field(default_factory=list)
    """The seconds each sleep was asked for, in order."""
    notes: list[Any] = field(default_factory=list)
    """What `note()` returned as each sleep began (None without a `note`)."""
    ended: list[str] = field(default_factory=list)
    """How each finished sleep ended: "woken" (a wake-up, e.g. a NOTIFY), "stop", or
    "timeout" (it lasted as long as asked)."""

    @property
    def asleep(self) -> bool:
        """Whether the loop is in a sleep now."""
        return len(self.ended) < len(self.asked)


def observe_sleeps(loop: Worker | Submitter,
                   note: Callable[[], Any] | None = None) -> SleepLog:
    """Record every sleep `loop` asks for and how it ends, pulsing its signals at both.

    A test then waits for "the loop went to sleep" (signals.wait_for on the log) and checks
    how long it meant to sleep and what ended it, instead of counting what it did in a window
    of wall-clock time, which a loaded machine stretches and shrinks at will.
    """
    log = SleepLog()
    real_sleep = loop._sleep

    async def sleep(seconds: float) -> bool:
        log.asked.append(seconds)
        log.notes.append(note() if note is not None else None)
        await loop.signals.pulse()
        woken = await real_sleep(seconds)
        log.ended.append("stop" if loop._stopping.is_set()
                         else "woken" if loop._wake.is_set() else "timeout")
        await loop.signals.pulse()
        return woken

    loop._sleep = sleep  # type: ignore[method-assign]
    return log


@pytest.fixture
def repo_root() -> Path:
    """The checkout's root, for tests that run the CLI."""
    return Path(__file__).resolve().parent.parent
