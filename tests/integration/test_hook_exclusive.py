"""A sync hook never runs beside itself, even when its worker is cut off from the database for
longer than the lease while the hook's thread still runs (README: "never beside it").

The first worker reaches PostgreSQL through a TCP proxy that the test cuts: silently (a
partition: bytes stop, connections stay open) or with resets (connections closed, new ones
refused, as after pg_terminate_backend). The worker cannot extend its lease or say anything,
and a thread cannot be stopped; the second worker, which reaches the database directly,
claims the delivery once the lease lapses. The hook holds an exclusive flock while it runs, so
a second run beside the first is seen by the hook itself. Both workers are real processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import threading
from pathlib import Path

import psycopg
import pytest

from vidpoll.deliver import LOST_LEASE_EXIT_CODE, Deliverer, DeliveryConfig
from vidpoll.models import Job
from vidpoll.store import PgStore

from ..conftest import FAST_POLICY
from .test_process import cli_env, spawn_worker, wait_for

FAILED = [{"sume_status": "failed", "terminal": True}]
HOOK = "tests.integration.hook_exclusive_fixture:exclusive"
CONSUMER = f"hook:{HOOK}"


class DbLink:
    """A TCP proxy in front of PostgreSQL, on an event loop in a thread of its own, that can
    cut off whoever connects through it: `silent` (bytes stop flowing both ways, connections
    stay open, new ones hang unanswered) or `reset` (every connection closed, new ones refused
    at once)."""

    def __init__(self, url: str) -> None:
        info = psycopg.conninfo.conninfo_to_dict(url)
        self._url = url
        self._host = str(info.get("host") or "127.0.0.1")
        self._port = int(info.get("port") or 5432)
        self.mode = "open"
        self._transports: set[asyncio.WriteTransport] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="db-link",
                                        daemon=True)
        self._flowing: asyncio.Event | None = None
        self._server: asyncio.Server | None = None

    def start(self) -> str:
        """Listen on loopback; returns the connection string through the proxy."""
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(10)
        return psycopg.conninfo.make_conninfo(self._url, host="127.0.0.1", port=str(port))

    def cut(self, mode: str) -> None:
        self._loop.call_soon_threadsafe(self._cut, mode)

    def close(self) -> None:
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._shut(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._loop.close()

    async def _serve(self) -> int:
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        return int(self._server.sockets[0].getsockname()[1])

    def _cut(self, mode: str) -> None:
        assert self._flowing is not None
        self.mode = mode
        self._flowing.clear()
        if mode == "reset":
            for transport in list(self._transports):
                transport.abort()

    async def _shut(self) -> None:
        assert self._flowing is not None
        if self._server is not None:
            self._server.close()
        self._cut("reset")
        self._flowing.set()  # whatever waits sees `reset` and ends
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        await asyncio.wait(tasks, timeout=5)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        self._transports.add(writer.transport)
        try:
            await self._flowing.wait()  # silent: a new connection hangs unanswered
            if self.mode != "open":
                return
            if self._host.startswith("/"):  # the embedded server listens on a socket
                up_reader, up_writer = await asyncio.open_unix_connection(
                    f"{self._host}/.s.PGSQL.{self._port}")
            else:
                up_reader, up_writer = await asyncio.open_connection(self._host, self._port)
            self._transports.add(up_writer.transport)
            try:
                await asyncio.gather(self._pipe(reader, up_writer),
                                     self._pipe(up_reader, writer))
            finally:
                up_writer.transport.abort()
                self._transports.discard(up_writer.transport)
        finally:
            writer.transport.abort()
            self._transports.discard(writer.transport)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self._flowing is not None
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                await self._flowing.wait()  # silent: nothing passes, either way
                if self.mode != "open":
                    break
                writer.write(data)
                await writer.drain()
        writer.transport.abort()


def runs(log: Path) -> list[tuple[str, int]]:
    """(start | done | beside, pid) of each line the hook wrote."""
    if not log.exists():
        return []
    return [(word, int(pid)) for word, _, pid in
            (line.split() for line in log.read_text().splitlines())]


async def killed(*procs: asyncio.subprocess.Process | None) -> None:
    """Kill whichever of `procs` still runs (a test that failed leaves them)."""
    for proc in procs:
        if proc is not None and proc.returncode is None:
            proc.kill()
            await proc.communicate()


async def delivery(store: PgStore, within_s: float, state: str) -> dict[str, object]:
    """The delivery of j1, once it is in `state`."""
    async with asyncio.timeout(within_s):
        while True:
            [d] = await store.job_deliveries("j1")
            if d["state"] == state:
                return d
            await asyncio.sleep(0.05)


@pytest.mark.parametrize("cut", ["silent", "reset"])
async def test_a_sync_hook_never_runs_beside_itself_when_its_worker_is_cut_off(
        store, fake, fake_url, db_url, tmp_path, cut):
    fake.add_job("j1", script=FAILED)
    await store.add_job("j1", delay_s=0)
    log, lock, block = tmp_path / "hook.log", tmp_path / "hook.lock", tmp_path / "block"
    block.touch()  # the first run hangs in its thread until the test ends
    hook_env = {"HOOK_LOG": str(log), "HOOK_LOCK": str(lock), "VIDPOLL_HTTP_TIMEOUT": "1"}
    args = ("--poll-only", "--on-terminal", HOOK, "--lease-seconds", "3")
    link = DbLink(db_url)
    through_link = link.start()
    first = await spawn_worker(cli_env(through_link, fake_url, HOOK_BLOCK=str(block),
                                       **hook_env), *args)
    second: asyncio.subprocess.Process | None = None
    try:
        await wait_for(lambda: runs(log) == [("start", first.pid)], 30,
                       "the first worker's hook running")
        second = await spawn_worker(cli_env(db_url, fake_url, **hook_env), *args)
        link.cut(cut)  # the first worker can no longer write anything, its thread runs on
        # the lease lapses 3 s after the last extension got through; then the second worker
        # claims the delivery and runs the hook
        await wait_for(lambda: any(pid == second.pid for _, pid in runs(log)), 60,
                       "the hook run by the second worker")
        assert ("beside", second.pid) not in runs(log), "the hook ran beside itself"
        # the first worker ended itself (and its thread) before its lease could lapse
        _, err = await asyncio.wait_for(first.communicate(), 10)
        assert first.returncode == LOST_LEASE_EXIT_CODE, err.decode()[-3000:]
        assert b"could not be extended for" in err
        assert b"still runs in its thread and its lease is no longer extended" in err
        await wait_for(lambda: ("done", second.pid) in runs(log), 30, "the second run done")
        d = await delivery(store, 30, "done")
        assert d["attempts"] == 2
        assert runs(log) == [("start", first.pid), ("start", second.pid),
                             ("done", second.pid)]
    finally:
        await killed(first, second)
        link.close()
        block.unlink(missing_ok=True)


async def test_an_async_hook_is_stopped_before_its_lease_can_lapse_when_its_worker_is_cut_off(
        store, fake, make_worker, db_url):
    # an async hook can be stopped: it is cancelled before the lease could lapse (by the
    # worker's own clock), not when the database is back, so it never overlaps the next run
    running: list[int] = []
    events: list[str] = []
    calls = itertools.count()
    forever = asyncio.Event()

    async def hook(job: Job) -> None:
        run = next(calls)
        events.append(f"start {run} beside {len(running)}")
        running.append(run)
        try:
            if run == 0:
                await forever.wait()
        except asyncio.CancelledError:
            events.append(f"cancelled {run}")
            raise
        finally:
            running.remove(run)

    link = DbLink(db_url)
    cut_off = await PgStore.open(link.start(), max_size=2, timeout_s=1)
    # a 6 s lease: the hook is cancelled 1 s before the lease could lapse, and only a hook
    # still running 0.5 s later would end the process (this one, pytest's)
    config = DeliveryConfig(hooks={"app:h": hook}, lease_s=6.0, policy=FAST_POLICY)
    one, two = Deliverer(cut_off, config), Deliverer(store, config)
    await one.prepare()
    fake.add_job("j1", script=FAILED)
    await store.add_job("j1", delay_s=0)
    await asyncio.wait_for(make_worker(drain=True).run(), 10)
    first = asyncio.create_task(one.run())
    second: asyncio.Task[None] | None = None
    try:
        await one.signals.wait_for(lambda: events == ["start 0 beside 0"], 10)
        second = asyncio.create_task(two.run())
        link.cut("silent")
        await two.signals.wait_for(lambda: two.stats.deliveries_done == 1, 30)
        assert events == ["start 0 beside 0", "cancelled 0", "start 1 beside 0"]
        d = await delivery(store, 10, "done")
        assert d["attempts"] == 2
    finally:
        forever.set()
        link.close()  # every connection of the cut-off store fails at once now
        for deliverer, task in ((one, first), (two, second)):
            deliverer.stop()
            if task is not None:
                await asyncio.wait_for(task, 30)
        await cut_off.close()


async def test_a_stopped_worker_whose_sync_hook_hangs_never_lets_it_run_beside(
        store, fake, fake_url, db_url, tmp_path):
    # SIGTERM gives hooks until shortly before --shutdown-timeout; a sync hook's thread still
    # running then (here past its --hook-timeout too) is handed back due a few seconds ahead
    # and the process ends at once, the thread with it, before anyone can take it
    fake.add_job("j1", script=FAILED)
    await store.add_job("j1", delay_s=0)
    log, lock, block = tmp_path / "hook.log", tmp_path / "hook.lock", tmp_path / "block"
    block.touch()
    hook_env = {"HOOK_LOG": str(log), "HOOK_LOCK": str(lock), "VIDPOLL_HTTP_TIMEOUT": "1"}
    args = ("--poll-only", "--on-terminal", HOOK, "--lease-seconds", "3")
    first = await spawn_worker(cli_env(db_url, fake_url, HOOK_BLOCK=str(block), **hook_env),
                               *args, "--hook-timeout", "0.5", "--shutdown-timeout", "3")
    second: asyncio.subprocess.Process | None = None
    try:
        await wait_for(lambda: runs(log) == [("start", first.pid)], 30,
                       "the first worker's hook running")
        second = await spawn_worker(cli_env(db_url, fake_url, **hook_env), *args)
        first.terminate()
        await wait_for(lambda: any(pid == second.pid for _, pid in runs(log)), 60,
                       "the hook run by the second worker")
        assert ("beside", second.pid) not in runs(log), "the hook ran beside itself"
        _, err = await asyncio.wait_for(first.communicate(), 10)
        assert first.returncode == LOST_LEASE_EXIT_CODE, err.decode()[-3000:]
        assert b"still runs in its thread and its lease is no longer extended" in err
        await wait_for(lambda: ("done", second.pid) in runs(log), 30, "the second run done")
        assert (await delivery(store, 30, "done"))["attempts"] == 2
    finally:
        await killed(first, second)
        block.unlink(missing_ok=True)
