"""Rolling deploys (issue 16, item 5): code older than the schema keeps working when every
newer migration is marked compatible with it (expand), and refuses, saying why, when one is
not (contract). "Old code" here is this tree's code against a schema one fixture migration
ahead of it, and, once the history has one, the previous release's code from git."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tarfile
from io import BytesIO
from pathlib import Path

import aiohttp
import psycopg
import pytest

from vidpoll.doctor import FAIL, WARN, diagnose
from vidpoll.errors import SchemaError
from vidpoll.providers.sume.client import SumeClient
from vidpoll.providers.sume.fake import FakeSume
from vidpoll.schema import level_of_each, migrate, parse_migration, shipped_migrations
from vidpoll.sql import migrations
from vidpoll.store import PgStore
from vidpoll.web import make_app, start_server
from vidpoll.worker import Worker, WorkerConfig

from ..conftest import API_KEY, FAST_POLICY

LATEST = len(migrations())

# The next release's migrations, as far as this code can tell: one expand, one contract.
EXPAND = """-- A column and an index the next release reads; this release never sees them.
-- vidpoll: expand
-- vidpoll: step
ALTER TABLE video_jobs ADD COLUMN IF NOT EXISTS next_release_note text;
-- vidpoll: step no-transaction
CREATE INDEX CONCURRENTLY IF NOT EXISTS video_jobs_next_release_note_idx
  ON video_jobs (next_release_note) WHERE next_release_note IS NOT NULL;
"""
CONTRACT = """-- Removes something this release still uses (marked only: nothing is removed here).
COMMENT ON TABLE video_jobs IS 'contracted';
"""


def ahead(text: str, name: str) -> list:
    return [*shipped_migrations(), parse_migration(LATEST + 1, f"{LATEST + 1:04d}_{name}.sql",
                                                   text)]


async def readyz(store: PgStore) -> tuple[int, dict[str, str]]:
    """`vidpoll serve`'s /readyz over loopback."""
    runner, url = await start_server(make_app(store, None), "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as http, http.get(f"{url}/readyz") as resp:
            return resp.status, await resp.json()
    finally:
        await runner.cleanup()


async def test_older_code_works_against_a_newer_expand_schema(empty_db, fake: FakeSume,
                                                              fake_url):
    assert await migrate(empty_db, found=ahead(EXPAND, "expand")) != []
    with psycopg.connect(empty_db) as conn:
        recorded = conn.execute("SELECT oldest_code FROM vidpoll_schema_migrations "
                                "WHERE version = %s", (LATEST + 1,)).fetchone()
    assert recorded == (level_of_each(shipped_migrations())[LATEST],)  # the previous level
    # this release's `migrate` (a rollback's, or an old init container's) has nothing to do
    assert await migrate(empty_db) == []
    store = await PgStore.open(empty_db)
    try:
        assert await store.check_schema() == LATEST + 1
        status, _ = await readyz(store)
        assert status == 200
        # doctor: a warning (a rollout in progress), not a failure
        schema = {f.check: f for f in diagnose(await store.doctor(), LATEST)}["schema"]
        assert schema.status == WARN and "compatible" in schema.detail, schema
        for i in range(20):
            fake.add_job(f"r{i}")
            await store.add_job(f"r{i}", delay_s=0)
        async with SumeClient(fake_url, API_KEY, timeout_s=2) as client:
            worker = Worker(store, client, WorkerConfig(
                concurrency=5, drain=True, policy=FAST_POLICY, lease_s=5))
            await asyncio.wait_for(worker.run(), 60)
        assert await store.counts() == {"completed": 20}
    finally:
        await store.close()


async def test_older_code_refuses_a_newer_contract_schema(empty_db):
    name = f"{LATEST + 1:04d}_contract.sql"
    await migrate(empty_db, found=ahead(CONTRACT, "contract"))
    with pytest.raises(SchemaError, match=rf"newer than this vidpoll \({LATEST}\).*{name}.*"
                                          rf"level {LATEST + 1}.*upgrade vidpoll"):
        await PgStore.open(empty_db)
    with pytest.raises(SchemaError, match="newer"):
        await migrate(empty_db)
    store = await PgStore.open(empty_db, check_schema=False)
    try:
        status, body = await readyz(store)
        assert (status, body["reason"]) == (503, "SchemaError")
        schema = {f.check: f for f in diagnose(await store.doctor(), LATEST)}["schema"]
        assert schema.status == FAIL and schema.fix == "upgrade vidpoll", schema
    finally:
        await store.close()


async def test_an_expand_after_a_contract_keeps_the_contracts_level(empty_db):
    found = [*ahead(CONTRACT, "contract"),
             parse_migration(LATEST + 2, f"{LATEST + 2:04d}_expand.sql", EXPAND)]
    await migrate(empty_db, found=found)
    with pytest.raises(SchemaError, match=f"level {LATEST + 1}"):
        await PgStore.open(empty_db)


async def test_a_version_table_without_levels_reads_as_not_compatible(db_url):
    # a newer row recorded by a runner from before rolling deploys (no oldest_code column)
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("ALTER TABLE vidpoll_schema_migrations DROP COLUMN oldest_code")
        conn.execute("INSERT INTO vidpoll_schema_migrations (version, name) VALUES (%s, %s)",
                     (LATEST + 1, f"{LATEST + 1:04d}_later.sql"))
    with pytest.raises(SchemaError, match="newer"):
        await PgStore.open(db_url)


# -- the previous release's own code -----------------------------------------------------------

OLD_CODE_SCRIPT = """
import asyncio, json, sys
from vidpoll.store import PgStore
from vidpoll.errors import SchemaError

async def main():
    try:
        store = await PgStore.open(sys.argv[1])
    except SchemaError as exc:
        return {"refused": str(exc)}
    try:
        await store.add_job("from-the-previous-release", delay_s=0)
        return {"version": await store.check_schema(), "counts": await store.counts()}
    finally:
        await store.close()

print(json.dumps(asyncio.run(main())))
"""


def git(repo_root: Path, *args: str) -> bytes:
    return subprocess.run(["git", "-C", str(repo_root), *args], check=True,
                          capture_output=True).stdout


def previous_release(repo_root: Path) -> str:
    """The parent of the commit that added the latest migration file, if that code reads the
    schema levels (rolling deploys); else skip (nothing older can run beside this schema)."""
    latest_file = f"src/vidpoll/sql/migrations/{migrations()[-1][1]}"
    try:
        added = git(repo_root, "log", "--diff-filter=A", "--format=%H", "--",
                    latest_file).decode().split()
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("no git history")
    if not added:
        pytest.skip(f"{latest_file} is not committed yet")
    parent = f"{added[-1]}^"
    try:
        schema_sql = git(repo_root, "show", f"{parent}:src/vidpoll/sql/schema.sql").decode()
    except subprocess.CalledProcessError:
        schema_sql = ""
    if "name: schema_level" not in schema_sql:
        pytest.skip(f"the code before {Path(latest_file).name} predates rolling deploys")
    return parent


@pytest.mark.slow
def test_the_previous_release_against_this_schema(db_url, repo_root, tmp_path):
    parent = previous_release(repo_root)
    with tarfile.open(fileobj=BytesIO(git(repo_root, "archive", parent, "src"))) as tar:
        tar.extractall(tmp_path, filter="data")
    done = subprocess.run([sys.executable, "-c", OLD_CODE_SCRIPT, db_url],
                          env={**os.environ, "PYTHONPATH": str(tmp_path / "src")},
                          capture_output=True, text=True, timeout=60, check=True)
    answer = json.loads(done.stdout)
    if level_of_each(shipped_migrations())[LATEST] < LATEST:  # the latest is an expand
        assert answer == {"version": LATEST, "counts": {"pending": 1}}
    else:
        assert "newer" in answer["refused"]
