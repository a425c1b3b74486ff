"""Issue 16 items 1 and 2: what a worker costs the database at rest, and how many connections
a process holds whatever it runs.

Transactions are counted by the server (pg_stat_database of this test's own database), after
the store is closed and its backends are gone (a backend flushes its counts as it exits), so
the figures are the server's, not vidpoll's own bookkeeping.
"""

from __future__ import annotations

import asyncio
import contextlib

import psycopg
import pytest

from vidpoll.models import ClaimMode
from vidpoll.providers.sume.client import SumeClient
from vidpoll.store import PgStore
from vidpoll.submitter import Submitter, SubmitterConfig
from vidpoll.worker import Worker, WorkerConfig

from ..conftest import API_KEY, FAST_POLICY
from .test_process import cli_env, seed_jobs, spawn_worker

pytestmark = pytest.mark.slow


def _dbname(url: str) -> str:
    return str(psycopg.conninfo.conninfo_to_dict(url)["dbname"])


async def _transactions_after_exit(admin_url: str, dbname: str) -> int:
    """The database's transaction count once none of its backends is left."""
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        async with asyncio.timeout(30):
            while True:  # backends exit (and flush their counts) just after their client left
                cur = await conn.execute("SELECT count(*) FROM pg_stat_activity "
                                         "WHERE datname = %s", (dbname,))
                row = await cur.fetchone()
                if row is not None and row[0] == 0:
                    break
                await asyncio.sleep(0.05)
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        cur = await conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                                 "WHERE datname = %s", (dbname,))
        row = await cur.fetchone()
        assert row is not None
        return int(row[0])


async def _idle_run(db_url: str, fake_url: str, probes: int) -> tuple[int, int]:
    """Run a poller and a submitter (a default worker's runners, listening) on one store
    with nothing to do until each made `probes` idle checks; returns (probes made in all,
    the number they really made)."""
    store = await PgStore.open(db_url, max_size=3)
    try:
        async with SumeClient(fake_url, API_KEY, timeout_s=1.0) as client:
            worker = Worker(store, client, WorkerConfig(
                policy=FAST_POLICY, lease_s=5.0, idle_max_s=0.2, listen=True))
            submitter = Submitter(store, client, SubmitterConfig(
                policy=FAST_POLICY, lease_s=5.0, http_timeout_s=1.0, first_poll_s=0.0,
                max_active=None, idle_max_s=0.2, listen=True))
            tasks = [asyncio.create_task(worker.run()), asyncio.create_task(submitter.run())]
            try:
                async with asyncio.timeout(60):
                    while worker.stats.probes < probes or submitter.stats.probes < probes:
                        await asyncio.gather(
                            worker.signals.wait_for(lambda: worker.stats.probes >= probes, 60),
                            submitter.signals.wait_for(
                                lambda: submitter.stats.probes >= probes, 60))
            finally:
                worker.stop()
                submitter.stop()
                await asyncio.gather(*tasks)
            return worker.stats.probes + submitter.stats.probes, worker.stats.claims
    finally:
        await store.close()


async def test_an_idle_worker_costs_one_statement_per_runner_per_idle_turn(
        pg_admin_url, db_url, fake_url):
    dbname = _dbname(db_url)
    x0 = await _transactions_after_exit(pg_admin_url, dbname)
    short, _ = await _idle_run(db_url, fake_url, probes=2)
    x1 = await _transactions_after_exit(pg_admin_url, dbname)
    long, claims = await _idle_run(db_url, fake_url, probes=32)
    x2 = await _transactions_after_exit(pg_admin_url, dbname)
    # the same start-up and shutdown in both runs: the difference is the idle turns'
    extra_turns = long - short
    extra_transactions = (x2 - x1) - (x1 - x0)
    assert extra_turns >= 50
    # one probe each; before issue 16 an idle turn was a claim, a result claim and two
    # probes for the poller and a claim and a probe for the submitter (six, not two)
    assert extra_transactions <= 1.25 * extra_turns, (extra_transactions, extra_turns)
    assert claims <= 3  # the idle loop probes; it does not claim an empty table each turn


async def _vidpoll_connections(admin_url: str, dbname: str) -> tuple[int, int]:
    """(connections of vidpoll worker processes, of which LISTEN connections) right now."""
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT count(*), count(*) FILTER (WHERE query ILIKE 'LISTEN%%') "
            "FROM pg_stat_activity WHERE datname = %s AND application_name LIKE 'vidpoll %%'",
            (dbname,))
        row = await cur.fetchone()
        assert row is not None
        return int(row[0]), int(row[1])


@pytest.mark.parametrize("extra", [[], ["--on-terminal",
                                        "tests.integration.hook_fixtures:record"]])
async def test_a_worker_process_holds_at_most_four_connections_one_listening(
        store, fake, fake_url, db_url, pg_admin_url, extra, tmp_path):
    """Default settings, poller + submitter + result fetcher (and a deliverer with a hook),
    under load: never more than 4 connections, exactly one of them LISTENing."""
    ids = await seed_jobs(store, fake, 300)
    fake.config.latency_s = 0.02  # reads in flight long enough to keep the pool busy
    dbname = _dbname(db_url)
    seen: list[tuple[int, int]] = []
    env = cli_env(db_url, fake_url, HOOK_LOG=str(tmp_path / "hooks.log"))
    proc = await spawn_worker(env, "--drain", *extra)
    hung, tasks = False, ""
    try:
        async with asyncio.timeout(120):  # a bound for a hang; the drain takes seconds
            while proc.returncode is None:
                seen.append(await _vidpoll_connections(pg_admin_url, dbname))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), 0.05)
    except TimeoutError:
        hung = True
        tasks = await proc.dump_tasks()
    finally:
        if proc.returncode is None:
            proc.kill()
        _, err = await proc.communicate()
    assert not hung, f"the drain never ended:\n{tasks}\n" + err.decode()[-3000:]
    assert proc.returncode == 0, err.decode()[-2000:]
    assert await store.counts() == {"completed": len(ids)}
    busy = [s for s in seen if s[0] > 0]
    assert busy, "the worker's connections were never seen"
    assert max(n for n, _ in busy) <= 4, max(busy)
    assert max(listen for _, listen in busy) == 1  # one listener for every runner
    assert max(n for n, _ in busy) >= 2  # it did use its pool (the check can fail)


async def test_wait_callers_of_one_client_share_one_listener(store, db_url, pg_admin_url):
    from vidpoll.api import Vidpoll

    for i in range(3):
        await store.add_job(f"w{i}", delay_s=60)
    dbname = _dbname(db_url)
    async with await Vidpoll.open(db_url) as vp:
        waits = [asyncio.create_task(vp.wait(f"w{i}")) for i in range(3)]
        try:
            async with asyncio.timeout(30):
                # all three subscribed (and so listening) before the count
                while len(vp.store._listener._subscribers) < 3:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
            async with await psycopg.AsyncConnection.connect(pg_admin_url,
                                                             autocommit=True) as conn:
                cur = await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE "
                                         "datname = %s AND query ILIKE 'LISTEN%%'", (dbname,))
                row = await cur.fetchone()
            assert row is not None and row[0] == 1  # one connection for the three
            assert all(not w.done() for w in waits)
        finally:
            for w in waits:
                w.cancel()
            await asyncio.gather(*waits, return_exceptions=True)
        # the last subscriber gone, the listening connection is closed
        assert vp.store._listener._conn is None


def test_lock_mode_needs_a_pooled_connection_besides_the_listener(db_url, fake_url):
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-m", "vidpoll.cli", "worker", "--claim", ClaimMode.LOCK.value,
         "--db-connections", "2"], env=cli_env(db_url, fake_url), capture_output=True,
        text=True, timeout=60)
    assert result.returncode == 2
    assert "--db-connections 3 or more" in result.stderr
