"""Migrations: idempotent, concurrent, and in place on the seed's own table while its loop runs."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request

import psycopg
import pytest

from vidpoll.errors import SchemaError
from vidpoll.models import ClaimMode
from vidpoll.providers.sume.client import SumeClient
from vidpoll.providers.sume.fake import FakeSume
from vidpoll.sql import migrations
from vidpoll.store import PgStore, migrate
from vidpoll.worker import Worker, WorkerConfig

from ..conftest import API_KEY, FAST_POLICY

# The seed document's DDL, character for character.
SEED_DDL = """
CREATE TABLE video_jobs (
  job_id        text PRIMARY KEY,
  state         text NOT NULL DEFAULT 'pending',
  next_poll_at  timestamptz NOT NULL DEFAULT now() + interval '15 seconds'
);
CREATE INDEX ON video_jobs (next_poll_at) WHERE state = 'pending';
"""

# The seed's claim, character for character.
SEED_CLAIM = ("SELECT job_id FROM video_jobs WHERE state='pending' "
              "AND next_poll_at <= now() ORDER BY next_poll_at "
              "FOR UPDATE SKIP LOCKED LIMIT 1")


def schema_of(url: str) -> dict[str, list[tuple[object, ...]]]:
    with psycopg.connect(url) as conn:
        return {
            "columns": conn.execute(
                "SELECT table_name, column_name, data_type, is_nullable, column_default "
                "FROM information_schema.columns WHERE table_schema = 'public' "
                "ORDER BY table_name, column_name").fetchall(),
            "indexes": conn.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'public' "
                "ORDER BY indexname").fetchall(),
            "triggers": conn.execute(
                "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger WHERE NOT tgisinternal "
                "ORDER BY tgname").fetchall(),
            "options": conn.execute(
                "SELECT reloptions FROM pg_class WHERE relname = 'video_jobs'").fetchall(),
            "versions": conn.execute(
                "SELECT version, name FROM vidpoll_schema_migrations ORDER BY 1").fetchall(),
        }


async def test_migrate_is_idempotent(empty_db):
    applied = await migrate(empty_db)
    assert applied == [name for _, name, _ in migrations()]
    before = schema_of(empty_db)
    assert await migrate(empty_db) == []
    assert schema_of(empty_db) == before


async def test_concurrent_migrations_apply_once(empty_db):
    results = await asyncio.gather(*(migrate(empty_db) for _ in range(6)))
    assert sorted(len(r) for r in results) == [0] * 5 + [len(migrations())]
    assert len(schema_of(empty_db)["versions"]) == len(migrations())


async def test_newer_schema_is_refused(db_url):
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("INSERT INTO vidpoll_schema_migrations VALUES (999, '0999_future.sql')")
    with pytest.raises(SchemaError, match="newer"):
        await migrate(db_url)
    with pytest.raises(SchemaError, match="newer"):
        await PgStore.open(db_url)


async def test_seed_table_upgrades_to_the_same_schema(empty_db, db_url):
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute(SEED_DDL)
        conn.execute("INSERT INTO video_jobs (job_id) SELECT 'seed' || g "
                     "FROM generate_series(1, 100) g")
        conn.execute("UPDATE video_jobs SET state = 'completed' WHERE job_id = 'seed1'")
    await migrate(empty_db)
    upgraded, fresh = schema_of(empty_db), schema_of(db_url)
    assert upgraded["columns"] == fresh["columns"]
    assert upgraded["indexes"] == fresh["indexes"]
    assert upgraded["triggers"] == fresh["triggers"]
    assert upgraded["options"] == fresh["options"]
    with psycopg.connect(empty_db) as conn:
        assert conn.execute("SELECT count(*) FROM video_jobs").fetchone() == (100,)
        assert conn.execute("SELECT state FROM video_jobs WHERE job_id = 'seed1'"
                            ).fetchone() == ("completed",)


class SeedLoop(threading.Thread):
    """The seed's worker loop as the document gives it (urllib in place of requests)."""

    def __init__(self, url: str, base_url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.base_url = url, base_url
        self.stop = threading.Event()
        self.finished: list[str] = []
        self.reads = 0

    def get_status(self, job_id: str) -> dict[str, object]:
        request = urllib.request.Request(f"{self.base_url}/v1/jobs/{job_id}/status",
                                         headers={"Authorization": f"Bearer {API_KEY}"})
        with urllib.request.urlopen(request, timeout=15) as resp:
            return dict(json.loads(resp.read()))

    def run(self) -> None:
        with psycopg.connect(self.url) as db:
            while not self.stop.is_set():
                with db.transaction():
                    row = db.execute(SEED_CLAIM).fetchone()
                    if row:
                        job_id = row[0]
                        s = self.get_status(job_id)
                        self.reads += 1
                        if s.get("terminal"):
                            db.execute("UPDATE video_jobs SET state=%s WHERE job_id=%s",
                                       (s["sume_status"], job_id))
                            self.finished.append(job_id)
                        else:
                            wait = s.get("next_poll_after_seconds") or 15
                            db.execute("UPDATE video_jobs SET next_poll_at = now() "
                                       "+ make_interval(secs => %s) WHERE job_id=%s",
                                       (wait, job_id))
                if not row:
                    time.sleep(0.2)  # the seed sleeps 2 s; shorter keeps the test quick


@pytest.mark.slow
@pytest.mark.parametrize("mode", [ClaimMode.LEASE, ClaimMode.LOCK])
async def test_seed_loop_keeps_working_through_migrate_and_beside_vidpoll(
        empty_db, fake: FakeSume, fake_url, mode):
    fake.config.render_s, fake.config.next_poll_after_s = 1.5, 0.2
    fake.config.latency_s = 0.01
    with psycopg.connect(empty_db, autocommit=True) as conn:
        conn.execute(SEED_DDL)
        for i in range(60):
            fake.add_job(f"s{i}")
            conn.execute("INSERT INTO video_jobs (job_id, next_poll_at) VALUES (%s, now())",
                         (f"s{i}",))
    seed = SeedLoop(empty_db, fake_url)
    seed.start()
    try:
        async with asyncio.timeout(20):
            while seed.reads < 5:  # noqa: ASYNC110 - a counter of another thread's loop
                await asyncio.sleep(0.02)
        await migrate(empty_db)  # in place, while the seed's loop holds row locks
        reads_at_migrate = seed.reads
        store = await PgStore.open(empty_db)
        try:
            for i in range(60, 120):
                fake.add_job(f"s{i}")
                await store.add_job(f"s{i}", delay_s=0)
            async with SumeClient(fake_url, API_KEY, timeout_s=2) as client:
                worker = Worker(store, client, WorkerConfig(
                    claim_mode=mode, concurrency=10, drain=True, policy=FAST_POLICY,
                    lease_s=5))
                await asyncio.wait_for(worker.run(), 60)
            counts = await store.counts()
        finally:
            await store.close()
    finally:
        seed.stop.set()
        await asyncio.to_thread(seed.join, 10)
    assert counts == {"completed": 120}
    assert fake.overlaps == 0
    # both did real work side by side: the seed's claim kept running after the upgrade
    assert seed.reads > reads_at_migrate and worker.stats.finished > 0
    assert len(seed.finished) + worker.stats.finished == 120


def other_sessions(db_url: str) -> set[str]:
    """application_name of every other connection to this test's database."""
    with psycopg.connect(db_url) as conn:
        return {r[0] for r in conn.execute(
            "SELECT application_name FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()")}


async def test_every_connection_of_a_store_carries_its_application_name(db_url):
    store = await PgStore.open(db_url, application_name="vidpoll host:1:abcdef")
    try:
        await store.counts()
        assert other_sessions(db_url) == {"vidpoll host:1:abcdef"}
    finally:
        await store.close()


async def test_an_application_name_in_the_url_wins(db_url):
    url = psycopg.conninfo.make_conninfo(db_url, application_name="mine")
    store = await PgStore.open(url, application_name="vidpoll host:1:abcdef" + "x" * 80)
    try:
        await store.counts()
        assert other_sessions(db_url) == {"mine"}
    finally:
        await store.close()
