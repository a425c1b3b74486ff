"""Workers vacuum the job table themselves after a set number of row writes (autovacuum
visits a database at most once a minute), and step aside when their role may not."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from vidpoll.providers.sume.fake import FakeSume
from vidpoll.store import PgStore

from ..conftest import run_until


async def due_jobs(store: PgStore, fake: FakeSume, prefix: str, n: int) -> None:
    """`n` jobs the fake knows, all due now."""
    for i in range(n):
        fake.add_job(f"{prefix}{i}")
        await store.add_job(f"{prefix}{i}", delay_s=-1)


def vacuum_count(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT vacuum_count FROM pg_stat_user_tables "
                           "WHERE relname = 'video_jobs'").fetchone()
        assert row is not None
        return int(row[0])


async def wait_for_count(url: str, at_least: int, within_s: float = 10.0) -> int:
    """Statistics reach pg_stat_user_tables a moment after the VACUUM ends."""
    deadline = asyncio.get_running_loop().time() + within_s
    while (n := vacuum_count(url)) < at_least:
        assert asyncio.get_running_loop().time() < deadline, f"vacuum_count stayed at {n}"
        await asyncio.sleep(0.1)
    return n


async def test_a_worker_vacuums_after_its_row_threshold(db_url, store, fake, make_worker):
    before = vacuum_count(db_url)
    await due_jobs(store, fake, "v", 30)
    # 30 jobs end: 30 claims + 30 records = 60 row versions, a vacuum every 20 at most
    worker = make_worker(vacuum_every_rows=20, concurrency=5, batch_size=5)
    await run_until(worker, lambda: worker.stats.finished == 30 and worker.stats.vacuums >= 1)
    # every vacuum the worker counts really ran (skips are counted apart); one more may have
    # finished on the server as the stop cancelled it, before the worker could count it
    counted = before + worker.stats.vacuums
    assert counted <= await wait_for_count(db_url, counted) <= counted + 1


async def test_a_vacuum_steps_aside_while_another_holds_the_table(db_url, store):
    with psycopg.connect(db_url) as other:  # a transaction holding VACUUM's own lock level
        other.execute("LOCK TABLE video_jobs IN SHARE UPDATE EXCLUSIVE MODE")
        assert await store.vacuum_jobs() is False
    assert await store.vacuum_jobs() is True


async def test_stop_cancels_a_running_vacuum(store, fake, make_worker):
    class SlowVacuum:
        """The real store, with a VACUUM that would never end."""

        def __init__(self, inner: PgStore) -> None:
            self.inner = inner
            self.started = asyncio.Event()
            self.cancelled = False

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

        async def vacuum_jobs(self) -> bool:
            self.started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.cancelled = True
                raise
            return True

    await due_jobs(store, fake, "s", 5)
    slow = SlowVacuum(store)
    worker = make_worker(vacuum_every_rows=2, concurrency=5, batch_size=5)
    worker.store = slow  # type: ignore[assignment]
    task = asyncio.create_task(worker.run())
    await asyncio.wait_for(slow.started.wait(), 10)
    worker.stop()
    await asyncio.wait_for(task, 10)  # not the VACUUM's (endless) time
    assert slow.cancelled


async def test_pooled_connections_the_server_ended_are_replaced_unseen(db_url, store,
                                                                      monkeypatch):
    """A connection used a moment ago skips the pool's check round trip, unless the server
    ended it (pg_terminate_backend here; a restart or failover alike): then it is checked and
    replaced, and the caller never sees an error."""
    # "a moment ago" lasts an hour here: however slow this machine, only the goodbye waiting
    # on a socket (not the idle time) can send these connections to the check
    monkeypatch.setattr("vidpoll.store.pool._CHECK_AFTER_IDLE_S", 3600.0)
    async with contextlib.AsyncExitStack() as stack:  # exactly six, all held at once
        held = [await stack.enter_async_context(store._pool.connection()) for _ in range(6)]
        pids = [conn.info.backend_pid for conn in held]
    with psycopg.connect(db_url, autocommit=True) as admin:
        ended = [r[0] for r in admin.execute(
            "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))]
        assert ended == [True] * 6
        async with asyncio.timeout(30):  # until the server has ended all six
            while admin.execute(  # noqa: ASYNC110 (bounded; nothing to wait on)
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)",
                    (pids,)).fetchone()[0]:
                await asyncio.sleep(0.05)
    for _ in range(6):  # every pooled connection is dead; none of these may fail
        assert await store.has_pending() is False
    assert store._pool.get_stats()["connections_lost"] == 6  # each one noticed, none reused


async def test_vacuum_off_with_zero(db_url, store, fake, make_worker):
    await due_jobs(store, fake, "z", 10)
    worker = make_worker(vacuum_every_rows=0)
    await run_until(worker, lambda: worker.stats.finished == 10)
    assert worker.stats.vacuums == 0


def role_url(db_url: str, admin: psycopg.Connection, name: str, *grants: str) -> str:
    admin.execute(sql.SQL("CREATE ROLE {} LOGIN NOSUPERUSER").format(sql.Identifier(name)))
    for grant in grants:
        admin.execute(sql.SQL(grant).format(sql.Identifier(name)))
    return psycopg.conninfo.make_conninfo(db_url, user=name)


@pytest.fixture
def roles(db_url: str) -> Iterator[dict[str, str]]:
    """Non-superuser roles: the table's owner, a member of it, the database's owner, and one
    that may read and write video_jobs but owns nothing."""
    tag = uuid.uuid4().hex[:8]
    names = {k: f"vp_{k}_{tag}" for k in ("owner", "member", "dbowner", "plain")}
    dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    with psycopg.connect(db_url, autocommit=True) as admin:
        urls = {
            "owner": role_url(db_url, admin, names["owner"],
                              "ALTER TABLE video_jobs OWNER TO {}"),
            "member": role_url(db_url, admin, names["member"],
                               f"GRANT {names['owner']} TO {{}}"),
            "dbowner": role_url(db_url, admin, names["dbowner"],
                                f'ALTER DATABASE "{dbname}" OWNER TO {{}}',
                                "GRANT SELECT ON video_jobs TO {}"),
            "plain": role_url(db_url, admin, names["plain"],
                              "GRANT SELECT, UPDATE ON video_jobs TO {}"),
        }
    yield urls
    with psycopg.connect(db_url, autocommit=True) as admin:
        admin.execute(sql.SQL("ALTER TABLE video_jobs OWNER TO CURRENT_USER"))
        admin.execute(sql.SQL("ALTER DATABASE {} OWNER TO CURRENT_USER").format(
            sql.Identifier(str(dbname))))
        for name in names.values():
            admin.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


@pytest.mark.parametrize(("who", "may"), [("owner", True), ("member", True),
                                          ("dbowner", True), ("plain", False)])
async def test_who_may_vacuum(roles, who, may):
    other = await PgStore.open(roles[who], check_schema=False)
    try:
        assert await other.can_vacuum_jobs() is may
        if may:  # and the answer is right: VACUUM really runs for them
            assert await other.vacuum_jobs() is True
    finally:
        await other.close()


async def test_a_worker_whose_role_may_not_vacuum_asks_once_and_keeps_polling(
        db_url, store, fake, make_worker, caplog):
    class NotOwner:
        """The real store, as a role that does not own video_jobs would see it."""

        def __init__(self, inner: PgStore) -> None:
            self.inner, self.asked, self.vacuums = inner, 0, 0

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

        async def can_vacuum_jobs(self) -> bool:
            self.asked += 1
            return False

        async def vacuum_jobs(self) -> None:
            self.vacuums += 1

    await due_jobs(store, fake, "n", 20)
    worker = make_worker(vacuum_every_rows=5, concurrency=4, batch_size=4)
    worker.store = NotOwner(store)  # type: ignore[assignment]
    caplog.set_level("INFO", logger="vidpoll.worker")
    await run_until(worker, lambda: worker.stats.finished == 20)
    assert worker.store.asked == 1 and worker.store.vacuums == 0  # type: ignore[attr-defined]
    assert worker.stats.vacuums == 0
    assert "may not VACUUM" in caplog.text


async def test_a_statement_timeout_that_cancels_vacuum_is_not_an_outage(db_url):
    """A role's statement_timeout would cancel every VACUUM alike: a RuntimeError the worker
    reports once (it then leaves the table to autovacuum), not a silent retry forever."""
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO video_jobs (job_id, next_poll_at) "
                     "SELECT 'big' || g, now() FROM generate_series(1, 100000) g")
        conn.execute("UPDATE video_jobs SET next_poll_at = next_poll_at + interval '1 s'")
    timed = psycopg.conninfo.make_conninfo(db_url, options="-c statement_timeout=1")
    store = await PgStore.open(timed, check_schema=False)
    try:
        with pytest.raises(RuntimeError, match="VACUUM was cancelled"):
            await store.vacuum_jobs()
    finally:
        await store.close()


async def test_a_worker_gives_up_vacuuming_loudly_after_a_non_outage_error(
        store, fake, make_worker, caplog):
    class Refusing:
        def __init__(self, inner: PgStore) -> None:
            self.inner, self.tries = inner, 0

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

        async def vacuum_jobs(self) -> bool:
            self.tries += 1
            raise RuntimeError("VACUUM was cancelled (statement_timeout?)")

    await due_jobs(store, fake, "r", 20)
    refusing = Refusing(store)
    worker = make_worker(vacuum_every_rows=4, concurrency=4, batch_size=4)
    worker.store = refusing  # type: ignore[assignment]
    caplog.set_level("WARNING", logger="vidpoll.worker")
    await run_until(worker, lambda: worker.stats.finished == 20)
    assert refusing.tries == 1  # tried once, said so, stopped trying
    assert "leaving the table to autovacuum" in caplog.text
