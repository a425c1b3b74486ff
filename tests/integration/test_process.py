"""Worker processes: kill -9 mid-batch, SIGTERM, --drain, and the CLI's error paths."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import pytest

from vidpoll.fake_sume import FakeSume
from vidpoll.models import ClaimMode
from vidpoll.store import PgStore

from ..conftest import API_KEY, run_until

pytestmark = pytest.mark.slow


def cli_env(db_url: str, fake_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUME_", "VIDPOLL_"))}
    env.update(DATABASE_URL=db_url, SUME_BASE_URL=fake_url, SUME_API_KEY=API_KEY,
               VIDPOLL_HTTP_TIMEOUT="5", VIDPOLL_MIN_POLL_S="0.05")
    env.update(extra)
    return env


async def spawn_worker(env: dict[str, str], *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vidpoll.cli", "--log-level", "INFO", "worker", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def wait_for(predicate: Any, within_s: float, what: str) -> None:
    async with asyncio.timeout(within_s):
        # the fake's counters change inside request handlers and a subprocess: no event to
        # wait on, so this checks them every 20 ms (bounded by the timeout above)
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.02)
    assert predicate(), what


async def seed_jobs(store: PgStore, fake: FakeSume, n: int, prefix: str = "k") -> list[str]:
    ids = [f"{prefix}{i}" for i in range(n)]
    for job_id in ids:
        fake.add_job(job_id, script=[{"sume_status": "completed", "terminal": True}])
        await store.add_job(job_id, delay_s=0)
    return ids


@pytest.mark.parametrize("mode", ["lease", "lock"])
async def test_kill_9_mid_batch_loses_nothing(store, fake, fake_url, db_url, make_worker, mode):
    ids = await seed_jobs(store, fake, 20)
    fake.config.latency_s = 30.0  # every read hangs in flight until the process dies
    # a 1 s HTTP timeout: reads hang for 30 s, so the lease guard (timeout + 1 s) matters
    proc = await spawn_worker(cli_env(db_url, fake_url, VIDPOLL_HTTP_TIMEOUT="1"), "--claim",
                              mode, "--concurrency", "50", "--lease-seconds", "2", "--poll-only")
    try:
        await wait_for(lambda: sum(fake.in_flight.values()) == len(ids), 20,
                       "the worker should have every row in flight")
    finally:
        proc.kill()
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    counts = await store.counts()
    assert counts == {"pending": len(ids)}  # nothing recorded, nothing lost
    fake.config.latency_s = 0.0
    started = asyncio.get_running_loop().time()
    worker = make_worker(claim_mode=ClaimMode(mode))
    await run_until(worker, lambda: worker.stats.finished == len(ids), within_s=20)
    waited = asyncio.get_running_loop().time() - started
    assert await store.counts() == {"completed": len(ids)}
    if mode == "lock":
        assert waited < 1.5  # locks died with the connection: claimable at once
    else:
        assert waited >= 0.5  # leases had to run out first (2 s from the claim)


async def test_sigterm_finishes_in_flight_reads_then_exits_0(store, fake, fake_url, db_url):
    ids = await seed_jobs(store, fake, 10)
    fake.config.latency_s = 1.0
    proc = await spawn_worker(cli_env(db_url, fake_url), "--concurrency", "50")
    await wait_for(lambda: sum(fake.in_flight.values()) == len(ids), 20, "reads in flight")
    proc.send_signal(signal.SIGTERM)
    _, err = await asyncio.wait_for(proc.communicate(), 10)
    assert proc.returncode == 0, err.decode()
    # every read that was in flight was recorded before exit
    assert await store.counts() == {"completed": len(ids)}, err.decode()
    assert b"stopping" in err


async def test_drain_exits_0_when_nothing_is_pending(store, fake, fake_url, db_url):
    await seed_jobs(store, fake, 15)
    proc = await spawn_worker(cli_env(db_url, fake_url), "--drain", "--no-listen")
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    assert await store.counts() == {"completed": 15}
    assert API_KEY not in err.decode()


async def test_worker_with_dead_database_fails_clearly(fake_url):
    env = cli_env("postgresql://postgres@127.0.0.1:1/nowhere?connect_timeout=2", fake_url)
    proc = await spawn_worker(env, "--drain")
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 3
    message = err.decode()
    assert "cannot connect to PostgreSQL" in message and "Traceback" not in message


async def test_worker_without_api_key_fails_clearly(db_url, fake_url):
    env = cli_env(db_url, fake_url)
    env.pop("SUME_API_KEY")
    proc = await spawn_worker(env, "--drain")
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2 and b"SUME_API_KEY is not set" in err


async def test_worker_on_unmigrated_database_says_run_migrate(empty_db, fake_url):
    proc = await spawn_worker(cli_env(empty_db, fake_url), "--drain")
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 4 and b"vidpoll migrate" in err


async def test_a_lease_too_short_to_submit_is_refused(db_url, fake_url):
    proc = await spawn_worker(cli_env(db_url, fake_url), "--lease-seconds", "2")
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2 and b"must be longer than the HTTP timeout" in err


async def test_bad_setting_is_named(db_url, fake_url):
    proc = await spawn_worker(cli_env(db_url, fake_url, VIDPOLL_HTTP_TIMEOUT="soon"), "--drain")
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2 and b"VIDPOLL_HTTP_TIMEOUT" in err
