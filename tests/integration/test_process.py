"""Worker processes: kill -9 mid-batch, SIGTERM, --drain, and the CLI's error paths."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import sys
import tempfile
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from vidpoll.models import ClaimMode
from vidpoll.providers.sume.fake import FakeSume
from vidpoll.store import PgStore

from ..conftest import API_KEY, hold_reads, run_until

pytestmark = pytest.mark.slow


def cli_env(db_url: str, fake_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUME_", "VIDPOLL_"))}
    env.update(DATABASE_URL=db_url, SUME_BASE_URL=fake_url, SUME_API_KEY=API_KEY,
               VIDPOLL_HTTP_TIMEOUT="5", VIDPOLL_MIN_POLL_S="0.05",
               # hooks (tests.integration.hook_fixtures:record) import from the repository,
               # asked for explicitly: the working directory is not searched by default
               VIDPOLL_HOOK_PATH=os.path.dirname(os.path.dirname(os.path.dirname(
                   os.path.abspath(__file__)))))
    env.update(extra)
    return env


class Spawned:
    """A worker process whose log (stderr) goes to an unnamed file, never to a pipe: a pipe
    nobody reads while the test waits fills at 64 KiB, and then the worker's next log line
    blocks its event loop (seen in CI: a --drain of 300 jobs with a hook "never ended").
    Everything else is the asyncio process's own."""

    def __init__(self, proc: asyncio.subprocess.Process, log_fd: int) -> None:
        self.proc = proc
        self.log_fd = log_fd

    def __del__(self) -> None:
        os.close(self.log_fd)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.proc, name)

    def err(self) -> bytes:
        """What the worker has logged so far."""
        return os.pread(self.log_fd, os.fstat(self.log_fd).st_size, 0)

    async def dump_tasks(self) -> str:
        """What every task of the worker waits on (its SIGUSR1 answer), for a test's message
        when the worker seems stuck."""
        start = len(self.err())
        self.proc.send_signal(signal.SIGUSR1)

        def dump() -> str:
            text = self.err()[start:].decode(errors="replace")
            header = re.search(r"SIGUSR1: (\d+) tasks", text)
            done = header is not None and text.count(" waits in ") >= int(header[1])
            return text[header.start():] if header is not None and done else ""

        with contextlib.suppress(TimeoutError):
            await wait_for(dump, 10, "the task dump")
        return dump() or "(no task dump within 10 s)"

    async def communicate(self) -> tuple[bytes, bytes]:
        out, _ = await self.proc.communicate()
        return out, self.err()


async def spawn_worker(env: dict[str, str], *args: str) -> Spawned:
    log_fd, path = tempfile.mkstemp(prefix="vidpoll-worker-", suffix=".log")
    os.unlink(path)  # the file lives as long as the Spawned holds it open
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "vidpoll.cli", "--log-level", "INFO", "worker", *args, env=env,
        stdout=asyncio.subprocess.PIPE, stderr=log_fd)
    return Spawned(proc, log_fd)


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
        # every row read at least once, and reads in flight now (a read that timed out before
        # this was recorded as an error: still pending, just not this test's subject)
        await wait_for(lambda: all(fake.reads[i] for i in ids)
                       and sum(fake.in_flight.values()) > 0, 30,
                       "the worker should have read every row, with reads in flight")
    finally:
        proc.kill()
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert await store.counts() == {"pending": len(ids)}  # nothing recorded, nothing lost
    rows = {i: await store.get_job(i) for i in ids}
    if mode == "lock":
        # the dead batch's claim rolled back with its connection: no lease, no token; its
        # rows (at least those whose reads were in flight) were due all along
        assert all(r["claim_token"] is None for r in rows.values())
        due = await due_now(db_url, ids)
        assert due
        # claimable as soon as the server has noticed the connection died (no lease to wait
        # for): once its backends are gone, one claim takes every row that is due
        await wait_for_backends_gone(db_url, proc.pid)
        with contextlib.suppress(LookOnly):
            async with store.lock_batch(len(ids), "probe") as probe:
                assert {j.job_id for j in probe.jobs} >= due
                raise LookOnly  # roll the probe's claim back
    else:
        # the dead worker's leases: still claimed by it, due again when the lease ends
        leased = {i: r["next_poll_at"] for i, r in rows.items() if r["claim_token"] is not None}
        assert leased
        assert all(rows[i]["claimed_at"] + timedelta(seconds=2) == end
                   for i, end in leased.items())
    fake.config.latency_s = 0.0
    worker = make_worker(claim_mode=ClaimMode(mode))
    await run_until(worker, lambda: worker.stats.finished == len(ids), within_s=30)
    assert await store.counts() == {"completed": len(ids)}
    if mode == "lease":
        # leases had to run out first: by the database's clock, no leased row was claimed
        # again before its lease ended (the last claim of each row is the one that read it)
        for i, lease_end in leased.items():
            assert (await store.get_job(i))["claimed_at"] >= lease_end


class LookOnly(Exception):
    """Raised to roll back a claim made only to look."""


async def due_now(db_url: str, ids: list[str]) -> set[str]:
    """The rows among `ids` that are due by the database's clock."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cur = await conn.execute("SELECT job_id FROM video_jobs WHERE job_id = ANY(%s) "
                                 "AND next_poll_at <= now()", (ids,))
        return {row[0] for row in await cur.fetchall()}


async def wait_for_backends_gone(db_url: str, pid: int) -> None:
    """Until the server has ended every connection of worker process `pid`."""
    pattern = f"%:{pid}:%"  # application_name "vidpoll host:pid:random"
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        async with asyncio.timeout(30):
            while True:
                cur = await conn.execute("SELECT count(*) FROM pg_stat_activity "
                                         "WHERE application_name LIKE %s", (pattern,))
                row = await cur.fetchone()
                if row is not None and row[0] == 0:
                    return
                await asyncio.sleep(0.05)


async def test_sigterm_finishes_in_flight_reads_then_exits_0(store, fake, fake_url, db_url):
    ids = await seed_jobs(store, fake, 10)
    gate = hold_reads(fake)  # the reads stay in flight until the worker has the SIGTERM
    proc = await spawn_worker(cli_env(db_url, fake_url, VIDPOLL_HTTP_TIMEOUT="60"),
                              "--concurrency", "50", "--lease-seconds", "90")
    try:
        await wait_for(lambda: sum(fake.in_flight.values()) == len(ids), 30, "reads in flight")
        proc.send_signal(signal.SIGTERM)
        # the worker says it stops, with every read in flight
        await wait_for(lambda: b"in-flight reads" in proc.err(), 30, "the stopping line")
        seen = proc.err()
        assert f"finishing {len(ids)} in-flight reads".encode() in seen, seen.decode()
        assert sum(fake.in_flight.values()) == len(ids)  # none answered yet
        gate.set()
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    finally:
        gate.set()
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode == 0, err.decode()
    # every read that was in flight was recorded before exit
    assert await store.counts() == {"completed": len(ids)}, err.decode()


async def test_sigusr1_says_where_every_task_waits_and_the_worker_goes_on(
        store, fake, fake_url, db_url):
    gate = hold_reads(fake)  # a read in flight: something to wait on
    await seed_jobs(store, fake, 1)
    proc = await spawn_worker(cli_env(db_url, fake_url), "--poll-only")
    try:
        await wait_for(lambda: sum(fake.in_flight.values()) == 1, 30, "a read in flight")
        dump = await proc.dump_tasks()
        assert "task vidpoll-writer waits in _writer (worker.py:" in dump, dump
        assert "_main_loop (worker.py:" in dump, dump
        gate.set()  # the dump stopped nothing: the read ends and is recorded
        async with asyncio.timeout(30):
            while await store.counts() != {"completed": 1}:  # noqa: ASYNC110
                await asyncio.sleep(0.05)
    finally:
        gate.set()
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()


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
