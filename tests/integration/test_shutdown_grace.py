"""Shutdown within a grace period (issue 16, item 6): after stop() a Deliverer returns, or its
process ends, within `shutdown_timeout_s`; what finished is recorded as usual, what could not
is handed back (lease released, its try given back) for another worker, never run twice at
once. Real PostgreSQL; the sync-hook case with a real worker process sent SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from vidpoll.deliver import (
    LOST_LEASE_EXIT_CODE,
    UNSTOPPABLE_HANDBACK_DELAY_S,
    Deliverer,
    DeliveryConfig,
)
from vidpoll.download import Downloader
from vidpoll.fetch_guard import FetchPolicy
from vidpoll.models import DOWNLOAD, Job
from vidpoll.store import PgStore

from ..conftest import FAST_POLICY
from .shutdown_fixtures import CONSUMER, HOOK_NAME, exclusive_run, marks
from .test_deliveries import DONE, FAILED, end_jobs, started
from .test_process import wait_for

GRACE_S = 1.5
"""The grace period of the stopped deliverer (its hand-back comes 0.3 s before its end)."""
WITHIN_S = GRACE_S + 10
"""The generous bound a test waits for run() to return: a hang fails, a slow machine passes."""


@pytest.fixture
async def handing_store(db_url: str) -> AsyncIterator[PgStore]:
    """A store on this test's database that can hand deliveries back."""
    s = await PgStore.open(db_url, max_size=6)
    yield s
    await s.close()


def deliverer(store: PgStore, hook: Any, **kwargs: Any) -> Deliverer:
    kwargs.setdefault("policy", FAST_POLICY)
    kwargs.setdefault("lease_s", 3.0)
    kwargs.setdefault("shutdown_timeout_s", GRACE_S)
    return Deliverer(store, DeliveryConfig(hooks={HOOK_NAME: hook}, **kwargs))


async def row(db_url: str, job_id: str = "j1", consumer: str = CONSUMER) -> dict[str, Any]:
    """A delivery as the database has it, with how far its next_at is from now."""
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT state, token, attempts, last_error, "
            "extract(epoch FROM next_at - clock_timestamp())::float8 AS due_in_s "
            "FROM vidpoll_deliveries WHERE job_id = %s AND consumer = %s", (job_id, consumer))
        found = await cur.fetchone()
        assert found is not None
        return dict(zip(("state", "token", "attempts", "last_error", "due_in_s"), found,
                        strict=True))


class Runs:
    """An async hook's runs, in order, and how many ran at once at most."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.now = 0
        self.most = 0
        self.finish: dict[str, asyncio.Event] = {}

    def hook(self, who: str) -> Any:
        self.finish.setdefault(who, asyncio.Event())

        async def run(job: Job) -> None:
            self.now += 1
            self.most = max(self.most, self.now)
            self.events.append(f"start {who}")
            try:
                await self.finish[who].wait()
                self.events.append(f"end {who}")
            except asyncio.CancelledError:
                self.events.append(f"cancelled {who}")
                raise
            finally:
                self.now -= 1

        return run


async def test_an_async_hook_that_cannot_finish_in_time_is_handed_back_to_another_worker(
        handing_store, fake, make_worker, db_url):
    runs = Runs()
    one = deliverer(handing_store, runs.hook("one"))
    task = await started(one)
    await end_jobs(handing_store, fake, make_worker, FAILED, "j1")
    await one.signals.wait_for(lambda: runs.events == ["start one"], 10)
    one.stop()
    await asyncio.wait_for(task, WITHIN_S)  # returned: it did not wait for the hook
    assert runs.events == ["start one", "cancelled one"] and one.handed_back == 1
    released = await row(db_url)
    # the lease released and due now, the try given back (its claim had counted it)
    assert released["state"] == "pending" and released["token"] is None
    assert released["attempts"] == 0 and released["due_in_s"] <= 0
    two = deliverer(handing_store, runs.hook("two"))
    runs.finish["two"].set()
    task = await started(two)
    await two.signals.wait_for(lambda: two.stats.deliveries_done == 1, 10)
    two.stop()
    await asyncio.wait_for(task, WITHIN_S)
    assert runs.events == ["start one", "cancelled one", "start two", "end two"]
    assert runs.most == 1
    done = await row(db_url)
    assert done["state"] == "done" and done["attempts"] == 1


async def test_a_worker_stopping_mid_hook_gives_it_to_a_running_one_never_beside(
        handing_store, fake, make_worker, db_url):
    # the second worker runs all along, listening: the NOTIFY of the hand-back wakes it, and
    # the hook never runs in both at once
    runs = Runs()
    one = deliverer(handing_store, runs.hook("one"))
    first = await started(one)
    await end_jobs(handing_store, fake, make_worker, FAILED, "j1")
    await one.signals.wait_for(lambda: runs.events == ["start one"], 10)
    two = deliverer(handing_store, runs.hook("two"))
    runs.finish["two"].set()
    second = await started(two)
    one.stop()
    await asyncio.wait_for(first, WITHIN_S)
    await two.signals.wait_for(lambda: two.stats.deliveries_done == 1, 10)
    two.stop()
    await asyncio.wait_for(second, WITHIN_S)
    assert runs.events == ["start one", "cancelled one", "start two", "end two"]
    assert runs.most == 1
    assert (await row(db_url))["attempts"] == 1


async def test_a_hook_that_finishes_within_the_grace_period_is_recorded_as_usual(
        handing_store, fake, make_worker, db_url):
    runs = Runs()
    one = deliverer(handing_store, runs.hook("one"), shutdown_timeout_s=30.0)
    task = await started(one)
    await end_jobs(handing_store, fake, make_worker, FAILED, "j1")
    await one.signals.wait_for(lambda: runs.events == ["start one"], 10)
    one.stop()
    runs.finish["one"].set()  # after stop(): it ends within the grace period
    await asyncio.wait_for(task, 40)
    assert runs.events == ["start one", "end one"] and one.handed_back == 0
    assert one.stats.deliveries_done == 1
    done = await row(db_url)
    assert done["state"] == "done" and done["attempts"] == 1


async def test_a_download_that_cannot_finish_in_time_is_handed_back_and_resumed(
        handing_store, fake, fake_url, make_worker, db_url, tmp_path):
    fake.config.media_bytes_per_s = 4096.0  # 256 KiB: a minute, far past the grace period
    async with Downloader(tmp_path / "videos", read_timeout_s=5,
                          policy=FetchPolicy.for_origin(fake_url)) as downloader:
        one = Deliverer(handing_store, DeliveryConfig(
            lease_s=3.0, shutdown_timeout_s=GRACE_S, policy=FAST_POLICY), downloader)
        task = await started(one)
        await end_jobs(handing_store, fake, make_worker, DONE, "v1")
        await wait_for(lambda: len(fake.media_log) == 1, 10, "the download under way")
        one.stop()
        await asyncio.wait_for(task, WITHIN_S)
        assert one.handed_back == 1 and one.stats.deliveries_done == 0
        released = await row(db_url, "v1", DOWNLOAD)
        assert released["state"] == "pending" and released["token"] is None
        assert released["attempts"] == 0 and released["due_in_s"] <= 0
        fake.config.media_bytes_per_s = None
        two = Deliverer(handing_store, DeliveryConfig(lease_s=3.0, policy=FAST_POLICY),
                        downloader)
        task = await started(two)
        await two.signals.wait_for(lambda: two.stats.deliveries_done == 1, 10)
        two.stop()
        await asyncio.wait_for(task, WITHIN_S)
    done = await row(db_url, "v1", DOWNLOAD)
    assert done["state"] == "done" and done["attempts"] == 1
    [job] = [await handing_store.job("v1")]
    [f] = job.files
    assert Path(f.path).read_bytes() == fake.media_content("v1", fake.config.media_bytes)


class Ended:
    """An injected process end: records the codes it was called with."""

    def __init__(self) -> None:
        self.codes: list[int] = []

    def __call__(self, code: int) -> None:
        self.codes.append(code)


@pytest.mark.parametrize("overran", [False, True])
async def test_a_sync_hook_still_running_is_released_due_ahead_and_its_process_ended(
        handing_store, fake, make_worker, db_url, overran):
    # in process, the end injected: what is decided and written; the real end (and that the
    # thread dies with it) is the subprocess test below
    entered, finish = threading.Event(), threading.Event()

    def hook(job: Job) -> None:
        entered.set()
        finish.wait(30)

    ended = Ended()
    one = Deliverer(handing_store, DeliveryConfig(
        hooks={HOOK_NAME: hook}, lease_s=3.0, shutdown_timeout_s=GRACE_S, policy=FAST_POLICY,
        hook_timeout_s=0.2 if overran else 300.0), exit_process=ended)
    task = await started(one)
    try:
        await end_jobs(handing_store, fake, make_worker, FAILED, "j1")
        assert await asyncio.to_thread(entered.wait, 10)
        one.stop()
        await asyncio.wait_for(task, WITHIN_S)  # an injected end returns
        assert ended.codes[:1] == [LOST_LEASE_EXIT_CODE]
        released = await row(db_url)
        assert released["state"] == "pending" and released["token"] is None
        # due only after the process has ended, and no later than the delay
        assert 0 < released["due_in_s"] <= UNSTOPPABLE_HANDBACK_DELAY_S
        if overran:  # a hook that hangs spends its tries
            assert released["attempts"] == 1
            assert "still ran when its worker stopped" in released["last_error"]
        else:
            assert released["attempts"] == 0 and released["last_error"] is None
    finally:
        finish.set()


async def test_an_async_hook_that_ignores_its_cancellation_is_handed_back_as_unstoppable(
        handing_store, fake, make_worker, db_url):
    entered, finish = asyncio.Event(), asyncio.Event()

    async def stubborn(job: Job) -> None:
        entered.set()
        while not finish.is_set():
            with contextlib.suppress(asyncio.CancelledError):  # swallowed: it runs on
                await finish.wait()

    ended = Ended()
    one = Deliverer(handing_store, DeliveryConfig(
        hooks={HOOK_NAME: stubborn}, lease_s=3.0, shutdown_timeout_s=GRACE_S,
        policy=FAST_POLICY), exit_process=ended)
    task = await started(one)
    try:
        await end_jobs(handing_store, fake, make_worker, FAILED, "j1")
        await one.signals.wait_for(entered.is_set, 10)
        one.stop()
        await asyncio.wait_for(task, WITHIN_S)
        assert ended.codes[:1] == [LOST_LEASE_EXIT_CODE]
        released = await row(db_url)
        assert released["token"] is None and released["attempts"] == 0
        assert 0 < released["due_in_s"] <= UNSTOPPABLE_HANDBACK_DELAY_S
    finally:
        finish.set()


async def test_sigterm_mid_sync_hook_exits_75_in_time_and_another_worker_runs_it_alone(
        handing_store, fake, make_worker, db_url, tmp_path, repo_root):
    log, lock, block = tmp_path / "hook.log", tmp_path / "hook.lock", tmp_path / "block"
    block.touch()
    await handing_store.register_consumer(CONSUMER)  # before the job ends: it gets a delivery
    await end_jobs(handing_store, fake, make_worker, FAILED, "j1")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUME_", "VIDPOLL_"))}
    env.update(HOOK_LOG=str(log), HOOK_LOCK=str(lock), HOOK_BLOCK=str(block),
               SHUTDOWN_TIMEOUT_S="2")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.integration.shutdown_fixtures", db_url, env=env,
        cwd=repo_root, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    two: Deliverer | None = None
    second: asyncio.Task[None] | None = None
    try:
        await wait_for(lambda: [w for w, _, _ in marks(log)] == ["start"], 30,
                       "the worker's hook running")

        def hook(job: Job) -> None:  # the second worker's run: the same hook, not blocking
            exclusive_run(log, lock, "second", None)

        two = deliverer(handing_store, hook)
        second = await started(two)  # listening, ready to take it the moment it is due
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), 30)  # ended: well within 30 s
        assert proc.returncode == LOST_LEASE_EXIT_CODE, err.decode()[-3000:]
        assert b"cannot be stopped; handed back to other workers" in err
        await two.signals.wait_for(lambda: two.stats.deliveries_done == 1, 30)
        assert marks(log) == [("start", "first", proc.pid), ("start", "second", os.getpid()),
                              ("end", "second", os.getpid())]
        done = await row(db_url)
        # taken after a hand-back, not after the lease lapsed: the first try was given back
        assert done["state"] == "done" and done["attempts"] == 1
    finally:
        block.unlink(missing_ok=True)
        if proc.returncode is None:
            proc.kill()
            await proc.communicate()
        if two is not None and second is not None:
            two.stop()
            await asyncio.wait_for(second, WITHIN_S)
