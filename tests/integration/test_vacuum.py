"""Workers vacuum the job table themselves after a set number of row writes (autovacuum
visits a database at most once a minute), and step aside when their role may not."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import sql

from vidpoll.store import PgStore

from ..conftest import run_until


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
    for i in range(30):
        fake.add_job(f"v{i}")
        await store.add_job(f"v{i}", delay_s=-1)
    # 30 jobs end: 30 claims + 30 records = 60 row versions, a vacuum every 20
    worker = make_worker(vacuum_every_rows=20, concurrency=5, batch_size=5)
    await run_until(worker, lambda: worker.stats.finished == 30 and worker.stats.vacuums >= 2)
    assert await wait_for_count(db_url, before + 2) >= before + 2


async def test_vacuum_off_with_zero(db_url, store, fake, make_worker):
    for i in range(10):
        fake.add_job(f"z{i}")
        await store.add_job(f"z{i}", delay_s=-1)
    worker = make_worker(vacuum_every_rows=0)
    await run_until(worker, lambda: worker.stats.finished == 10)
    assert worker.stats.vacuums == 0


@pytest.fixture
def plain_role(db_url: str) -> Iterator[str]:
    """A login role that may read and write video_jobs but does not own it."""
    name = f"vp_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(name)))
        conn.execute(sql.SQL("GRANT SELECT, UPDATE ON video_jobs TO {}").format(
            sql.Identifier(name)))
    yield psycopg.conninfo.make_conninfo(db_url, user=name)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


async def test_only_an_owner_may_vacuum(store, plain_role):
    assert await store.can_vacuum_jobs()  # the tests' role owns the table
    other = await PgStore.open(plain_role, check_schema=False)
    try:
        assert not await other.can_vacuum_jobs()
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

    for i in range(20):
        fake.add_job(f"n{i}")
        await store.add_job(f"n{i}", delay_s=-1)
    worker = make_worker(vacuum_every_rows=5, concurrency=4, batch_size=4)
    worker.store = NotOwner(store)  # type: ignore[assignment]
    caplog.set_level("INFO", logger="vidpoll.worker")
    await run_until(worker, lambda: worker.stats.finished == 20)
    assert worker.store.asked == 1 and worker.store.vacuums == 0  # type: ignore[attr-defined]
    assert worker.stats.vacuums == 0
    assert "may not VACUUM" in caplog.text
