"""`vidpoll migrate` online (issue 16, item 4): beside the seed's own loop on a seed-DDL table
with rows, no step blocks the loop for longer than a metadata change, a migrate killed half
way is finished by the next run, and the schema it leaves is the one-transaction runner's."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from vidpoll.schema import level_of_each, migrate, shipped_migrations

from ..conftest import admin_execute, url_for
from .test_schema import SEED_CLAIM, SEED_DDL

ONE_TRANSACTION_RUNNER = "d4bc286"
"""The last commit whose runner applied every migration in one transaction."""


def seed_table(url: str, rows: int) -> None:
    """The seed's DDL with `rows` rows: one in ten pending and due, the rest completed."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(SEED_DDL)
        conn.execute("INSERT INTO video_jobs (job_id, state, next_poll_at) "
                     "SELECT 'j' || lpad(g::text, 7, '0'), "
                     "CASE WHEN g %% 10 = 0 THEN 'pending' ELSE 'completed' END, now() "
                     "FROM generate_series(1, %(rows)s) g", {"rows": rows})
        conn.execute("ANALYZE video_jobs")


def listing(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Everything of the schema but vidpoll's own version table (whose oldest_code column
    the online runner added): columns in order, indexes (valid or not), constraints (validated
    or not), triggers, functions, relations and their options."""
    with psycopg.connect(url) as conn:
        def rows(query: str) -> list[tuple[Any, ...]]:
            return conn.execute(query).fetchall()

        return {
            "columns": rows(
                "SELECT table_name, ordinal_position, column_name, data_type, is_nullable, "
                "column_default, is_identity, identity_generation "
                "FROM information_schema.columns WHERE table_schema = 'public' "
                "AND table_name <> 'vidpoll_schema_migrations' ORDER BY 1, 2"),
            "indexes": rows(
                "SELECT c.relname, pg_get_indexdef(i.indexrelid), i.indisvalid, i.indisready "
                "FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid "
                "JOIN pg_class t ON t.oid = i.indrelid "
                "WHERE t.relnamespace = 'public'::regnamespace "
                "AND t.relname <> 'vidpoll_schema_migrations' ORDER BY 1"),
            "constraints": rows(
                "SELECT conrelid::regclass::text, conname, contype, "
                "pg_get_constraintdef(oid), convalidated FROM pg_constraint "
                "WHERE connamespace = 'public'::regnamespace "
                "AND conrelid::regclass::text <> 'vidpoll_schema_migrations' ORDER BY 1, 2"),
            "triggers": rows(
                "SELECT tgrelid::regclass::text, tgname, pg_get_triggerdef(oid), tgenabled "
                "FROM pg_trigger WHERE NOT tgisinternal ORDER BY 1, 2"),
            "functions": rows(
                "SELECT proname, pg_get_functiondef(oid) FROM pg_proc "
                "WHERE pronamespace = 'public'::regnamespace ORDER BY 1"),
            "relations": rows(
                "SELECT relname, relkind, reloptions FROM pg_class "
                "WHERE relnamespace = 'public'::regnamespace "
                "AND relname NOT LIKE 'vidpoll_schema_migrations%' ORDER BY 1"),
        }


@contextmanager
def scratch_databases(admin_url: str, n: int) -> Iterator[list[str]]:
    names = [f"t_{uuid.uuid4().hex[:16]}" for _ in range(n)]
    for name in names:
        admin_execute(admin_url, sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield [url_for(admin_url, name) for name in names]
    finally:
        for name in names:
            admin_execute(admin_url, sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
                          .format(sql.Identifier(name)))


def git(repo_root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo_root), *args], check=True,
                          capture_output=True, text=True).stdout


def one_transaction_files(repo_root: Path) -> list[tuple[int, str, str]]:
    """The migration files as the one-transaction runner shipped them (from git history)."""
    folder = "src/vidpoll/sql/migrations/"
    try:
        names = git(repo_root, "ls-tree", "--name-only", ONE_TRANSACTION_RUNNER, folder).split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"git history with {ONE_TRANSACTION_RUNNER} is not available")
    return [(int(Path(n).name[:4]), Path(n).name,
             git(repo_root, "show", f"{ONE_TRANSACTION_RUNNER}:{n}")) for n in sorted(names)]


def one_transaction_migrate(url: str, files: list[tuple[int, str, str]]) -> None:
    """What `migrate` did at ONE_TRANSACTION_RUNNER: every file in one transaction, after
    taking video_jobs' ACCESS EXCLUSIVE lock."""
    with psycopg.connect(url) as conn, conn.transaction():
        conn.execute("SET LOCAL lock_timeout = '60s'")
        conn.execute("SELECT pg_advisory_xact_lock(7306198364525511)")
        conn.execute("CREATE TABLE IF NOT EXISTS vidpoll_schema_migrations (version integer "
                     "PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL "
                     "DEFAULT now())")
        conn.execute("DO $$ BEGIN IF to_regclass('video_jobs') IS NOT NULL THEN "
                     "LOCK TABLE video_jobs IN ACCESS EXCLUSIVE MODE; END IF; END $$")
        for version, name, text in files:
            conn.execute(text)  # shipped SQL text of an earlier commit
            conn.execute("INSERT INTO vidpoll_schema_migrations (version, name) "
                         "VALUES (%(v)s, %(n)s)", {"v": version, "n": name})


async def test_schemas_equal_the_one_transaction_runners(pg_admin_url, repo_root):
    files = one_transaction_files(repo_root)
    with scratch_databases(pg_admin_url, 4) as (fresh, old_fresh, seed, old_seed):
        for url in (seed, old_seed):
            seed_table(url, 1000)
        await migrate(fresh)
        await migrate(seed)
        for url in (old_fresh, old_seed):
            one_transaction_migrate(url, files)
            # what was shipped since, and the version table's oldest_code column
            await migrate(url)
        assert listing(fresh) == listing(old_fresh)
        assert listing(seed) == listing(old_seed) == listing(fresh)
        levels = level_of_each(shipped_migrations())
        with psycopg.connect(old_fresh) as conn:
            recorded = dict(conn.execute(
                "SELECT version, oldest_code FROM vidpoll_schema_migrations").fetchall())
        assert recorded == levels  # filled in for the rows the old runner recorded


# -- beside the seed's loop --------------------------------------------------------------------


class SeedLoop(threading.Thread):
    """A seed-style loop without HTTP: claim one due row (FOR UPDATE SKIP LOCKED), then move it
    a second on or (one in ten) end it, one transaction per row, as fast as it can. Counts its
    steps and keeps every error its statements raise."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stop = threading.Event()
        self.steps = 0
        self.errors: list[str] = []
        self.longest_gap_s = 0.0

    def run(self) -> None:
        last = time.monotonic()
        with psycopg.connect(self.url) as db:
            while not self.stop.is_set():
                try:
                    with db.transaction():
                        row = db.execute(SEED_CLAIM).fetchone()
                        if row and self.steps % 10 == 9:
                            db.execute("UPDATE video_jobs SET state = 'completed' "
                                       "WHERE job_id = %s", row)
                        elif row:
                            db.execute("UPDATE video_jobs SET next_poll_at = now() "
                                       "+ interval '1 second' WHERE job_id = %s", row)
                except psycopg.Error as exc:
                    self.errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                if row:
                    self.steps += 1
                    now = time.monotonic()
                    self.longest_gap_s = max(self.longest_gap_s, now - last)
                    last = now
                else:
                    self.stop.wait(0.01)

    async def stepped(self, n: int, within_s: float = 60.0) -> None:
        """Return once the loop made `n` more steps."""
        target = self.steps + n
        async with asyncio.timeout(within_s):
            while self.steps < target:  # noqa: ASYNC110 - a counter of another thread's loop
                await asyncio.sleep(0.01)


@contextmanager
def seed_loop(url: str) -> Iterator[SeedLoop]:
    loop = SeedLoop(url)
    loop.start()
    try:
        yield loop
    finally:
        loop.stop.set()
        loop.join(10)


def migrate_session(url: str) -> tuple[str, str | None, str | None] | None:
    """(application_name, wait_event_type, wait_event) of a running migrate, or None."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT application_name, wait_event_type, wait_event FROM pg_stat_activity "
            "WHERE datname = current_database() AND application_name LIKE 'vidpoll migrate%' "
            "AND pid <> pg_backend_pid()").fetchone()
        return None if row is None else (row[0], row[1], row[2])


async def migrate_reaches(url: str, step: str,
                          waiting: Callable[[str | None], bool] = lambda _: True,
                          within_s: float = 60.0) -> None:
    """Return once a running migrate's session says it is at `step` (e.g. "0002_x.sql 1/")
    and its wait event satisfies `waiting`."""
    async with asyncio.timeout(within_s):
        while True:
            seen = await asyncio.to_thread(migrate_session, url)
            if seen and f" {step}" in seen[0] and waiting(seen[2]):
                return
            await asyncio.sleep(0.01)


async def at_step(url: str) -> str:
    seen = await asyncio.to_thread(migrate_session, url)
    assert seen is not None, "migrate is not running"
    return seen[0]


@pytest.mark.slow
async def test_the_seed_loop_keeps_stepping_while_migrate_waits_builds_and_backfills(
        empty_db, db_url):
    seed_table(empty_db, 50_000)
    shipped = shipped_migrations()
    with seed_loop(empty_db) as loop:
        await loop.stepped(20)

        # 1. A step that needs the table's ACCESS EXCLUSIVE lock (0002's ADD COLUMN) while a
        # transaction holds the table: it gives up after its lock_timeout and tries again
        # later; between its tries the seed's loop runs.
        with psycopg.connect(empty_db) as holder:
            holder.execute("SELECT 1 FROM video_jobs WHERE state = 'completed' LIMIT 1 "
                           "FOR UPDATE")
            task = asyncio.create_task(migrate(empty_db, found=shipped[:3]))
            await migrate_reaches(empty_db, "0002_tracking.sql 1/")
            await loop.stepped(20)
            assert " 0002_tracking.sql 1/" in await at_step(empty_db)  # still held back
            holder.rollback()
        await task

        # 2. CREATE INDEX CONCURRENTLY on video_jobs, held at its last phase by an older
        # snapshot: the seed's loop runs beside it.
        with psycopg.connect(empty_db) as holder:
            holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
            holder.execute("SELECT 1")
            task = asyncio.create_task(migrate(empty_db, found=shipped[:8]))
            await migrate_reaches(empty_db, "0004_accounts_budgets.sql 3/",
                                  lambda event: event == "virtualxid")
            await loop.stepped(20)
            assert " 0004_accounts_budgets.sql 3/" in await at_step(empty_db)
            holder.rollback()
        await task

        # 3. 0009's backfill of finished_at, in batches: one batch waits for a row lock held
        # by another transaction; the seed's loop runs beside it.
        task = asyncio.create_task(migrate(empty_db, batch_rows=100))
        await migrate_reaches(empty_db, "0009_operations.sql 5/")
        with psycopg.connect(empty_db) as holder:
            held = holder.execute(
                "SELECT job_id FROM video_jobs WHERE job_id = (SELECT max(job_id) FROM "
                "video_jobs WHERE state <> 'pending' AND finished_at IS NULL) FOR UPDATE"
            ).fetchone()
            assert held is not None, "the backfill was over before the test could hold a row"
            await loop.stepped(20)
            assert " 0009_operations.sql 5/" in await at_step(empty_db)
            holder.rollback()
        await task
        await loop.stepped(20)  # and beside the finished schema, with its triggers
    assert loop.errors == []
    assert listing(empty_db) == listing(db_url)
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT count(*) FROM video_jobs WHERE state <> 'pending' "
                            "AND finished_at IS NULL").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM video_jobs").fetchone() == (50_000,)


# -- killed half way ---------------------------------------------------------------------------

MIGRATE_SCRIPT = ("import asyncio, sys\nfrom vidpoll.schema import migrate\n"
                  "asyncio.run(migrate(sys.argv[1], batch_rows=int(sys.argv[2])))\n")


def start_migrate(url: str, batch_rows: int) -> subprocess.Popen[bytes]:
    """`migrate` in a process of its own, to be killed."""
    return subprocess.Popen([sys.executable, "-c", MIGRATE_SCRIPT, url, str(batch_rows)])


async def no_migrate_session(url: str, within_s: float = 30.0) -> None:
    async with asyncio.timeout(within_s):
        while await asyncio.to_thread(migrate_session, url) is not None:  # noqa: ASYNC110
            await asyncio.sleep(0.02)  # polls the server's own view of the session


def one(url: str, query: str) -> Any:
    with psycopg.connect(url) as conn:
        row = conn.execute(query).fetchone()
        assert row is not None
        return row[0]


@pytest.mark.slow
async def test_a_migrate_killed_in_its_backfill_is_finished_by_the_next(empty_db, db_url):
    seed_table(empty_db, 50_000)
    unfinished = ("SELECT count(*) FROM video_jobs WHERE state <> 'pending' "
                  "AND finished_at IS NULL")
    proc = start_migrate(empty_db, batch_rows=100)
    try:
        await migrate_reaches(empty_db, "0009_operations.sql 5/")
        # at the backfill's statement is not yet past its first batch (seen once under
        # load: killed with all 45,000 still to fill): wait for one batch's commit (in
        # another process: no event to wait on, so it is looked at every 10 ms)
        async with asyncio.timeout(60):
            while await asyncio.to_thread(one, empty_db, unfinished) == 45_000:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    finally:
        proc.kill()
        proc.wait(10)
    await no_migrate_session(empty_db)  # its backend ends with it
    # half way: 0009 not recorded, its backfill begun and not finished
    assert one(empty_db, "SELECT max(version) FROM vidpoll_schema_migrations") == 8
    missing = one(empty_db, unfinished)
    assert 0 < missing < 45_000
    applied = await migrate(empty_db)
    assert applied == [m.name for m in shipped_migrations()][8:]
    assert listing(empty_db) == listing(db_url)
    assert one(empty_db, "SELECT count(*) FROM video_jobs WHERE state <> 'pending' "
                         "AND finished_at IS NULL") == 0


@pytest.mark.slow
async def test_an_index_build_cut_off_is_dropped_and_built_again(empty_db, db_url):
    seed_table(empty_db, 20_000)
    await migrate(empty_db, found=shipped_migrations()[:3])
    with psycopg.connect(empty_db) as holder:
        # an older snapshot holds CREATE INDEX CONCURRENTLY at its last phase
        holder.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        holder.execute("SELECT 1")
        proc = start_migrate(empty_db, batch_rows=5000)
        try:
            await migrate_reaches(empty_db, "0004_accounts_budgets.sql 3/",
                                  lambda event: event == "virtualxid")
        finally:
            proc.kill()
            proc.wait(10)
        # the build is cut off before its end (its session ends: a restart,
        # pg_cancel_backend, or the client's death noticed), leaving the index INVALID
        holder.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                       "WHERE datname = current_database() "
                       "AND application_name LIKE 'vidpoll migrate%'")
        await no_migrate_session(empty_db)
        holder.rollback()
    assert one(empty_db, "SELECT indisvalid FROM pg_index "
                         "WHERE indexrelid = 'video_jobs_account_due_idx'::regclass") is False
    applied = await migrate(empty_db)
    assert applied[0] == "0004_accounts_budgets.sql"
    assert listing(empty_db) == listing(db_url)  # valid, and the same as a fresh one
