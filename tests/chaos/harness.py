"""The chaos run: worker processes poll and submit against a faulty fake Sume while the
harness kills them -9, pauses them past their lease, crashes PostgreSQL and cuts the network;
then it lets the fleet drain and checks that nothing was lost, billed twice or written by a
stale claim.

    .venv/bin/python -m tests.chaos.harness --duration 300 --seed 1     # make chaos
    .venv/bin/python -m tests.chaos.harness --duration 40 --seed 7      # the variant in make test

Every random choice (faults, which worker dies, when) comes from one seed, so a failing seed
can be replayed; timing still varies between runs (real processes, real sockets). The run
prints one JSON document of figures and exits 1 if any invariant was violated.

What runs where:
- a private embedded PostgreSQL (never DATABASE_URL's server: the run crashes it), with an
  audit trigger on video_jobs that records every insert, claim, record and release together
  with the connection's application_name (`vidpoll <worker id>`);
- the fake Sume in this process (its counters are the provider's truth: clips billed per key,
  each job's true terminal state), behind a TCP proxy this process controls (network cuts),
  which also notes which worker process sent each status read;
- `vidpoll worker` processes (poll + submit + a completion hook), restarted after each kill.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import random
import re
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import psutil
import psycopg

from vidpoll.errors import DatabaseUnavailable
from vidpoll.providers.sume.fake import FakeConfig, FakeSume, start_fake
from vidpoll.store import PgStore, migrate

from ..private_pg import PrivateServer

REPO = Path(__file__).resolve().parents[2]
API_KEY = "sk-chaos-0123456789abcdef"  # fake, but treated as a secret: it must never be logged
TERMINAL = ("completed", "failed", "canceled", "expired")
CLOCK_SLACK_S = 0.02
"""Reads are timed by this process, due times by PostgreSQL's clock: the same host clock."""

AUDIT_SQL = """
CREATE TABLE chaos_audit (
  id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  job_id       text NOT NULL,
  at           timestamptz NOT NULL DEFAULT clock_timestamp(),
  txn_now      timestamptz NOT NULL DEFAULT now(),
  kind         text NOT NULL,
  old_state    text,
  new_state    text,
  claimed_by   text,
  app          text,
  next_poll_at timestamptz,
  read_ok      boolean,
  hint         float8,
  -- the answer's time as recorded (the hint counts from it): a record's last_polled_at
  answered_at  timestamptz
);
CREATE FUNCTION chaos_audit() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  k text;
BEGIN
  IF TG_OP = 'INSERT' THEN
    k := 'insert';
  ELSIF NEW.claim_token IS NOT NULL AND NEW.claim_token IS DISTINCT FROM OLD.claim_token THEN
    k := 'claim';
  ELSIF OLD.claim_token IS NOT NULL AND NEW.claim_token IS NULL
        AND NEW.updated_at IS DISTINCT FROM OLD.updated_at THEN
    k := 'record';
  ELSIF OLD.claim_token IS NOT NULL AND NEW.claim_token IS NULL THEN
    k := 'release';
  ELSIF NEW.updated_at IS DISTINCT FROM OLD.updated_at THEN
    k := 'unfenced';  -- an outcome written to a row nobody had claimed
  ELSE
    RETURN NULL;  -- result fetches and bookkeeping: not claims of the status row
  END IF;
  INSERT INTO chaos_audit (job_id, kind, old_state, new_state, claimed_by, app, next_poll_at,
                           read_ok, hint, answered_at)
  VALUES (NEW.job_id, k, CASE WHEN TG_OP = 'UPDATE' THEN OLD.state END, NEW.state,
          CASE WHEN TG_OP = 'UPDATE' THEN OLD.claimed_by END,
          current_setting('application_name'), NEW.next_poll_at,
          TG_OP = 'UPDATE' AND NEW.polls > OLD.polls,
          CASE WHEN jsonb_typeof(NEW.last_response -> 'next_poll_after_seconds') = 'number'
               THEN (NEW.last_response ->> 'next_poll_after_seconds')::float8 END,
          coalesce(NEW.last_polled_at, now()));
  RETURN NULL;
END
$$;
CREATE TRIGGER chaos_audit AFTER INSERT OR UPDATE ON video_jobs
  FOR EACH ROW EXECUTE FUNCTION chaos_audit();
"""


@dataclass
class ChaosConfig:
    """One run's shape; every random choice follows `seed`."""

    seed: int = 1
    duration_s: float = 300.0
    workers: int = 3
    intents_per_s: float = 2.0
    adopted_share: float = 0.2
    """Jobs created elsewhere and only tracked here (add_job), per intent."""
    lease_s: float = 3.0
    http_timeout_s: float = 1.0
    hint_s: float = 0.6
    kill_every_s: tuple[float, float] = (2.0, 5.0)
    pause_share: float = 0.3
    """Of the worker faults, this share is a SIGSTOP past the lease instead of a kill -9."""
    pg_restarts: int = 2
    net_cut_every_s: tuple[float, float] = (8.0, 15.0)
    drain_timeout_s: float = 180.0


@dataclass
class Figures:
    """What the run did and found; `violations` must be all zero."""

    seed: int
    duration_s: float
    workers: int
    kills: int = 0
    pauses: int = 0
    restarts: int = 0
    exits_on_their_own: dict[str, int] = field(default_factory=dict)
    """Workers that exited without being killed, by exit code (then replaced)."""
    pg_restarts: int = 0
    net_cuts: dict[str, int] = field(default_factory=dict)
    intents: int = 0
    adopted_jobs: int = 0
    jobs: int = 0
    status_reads: int = 0
    posts: int = 0
    clips_billed: int = 0
    faults_injected: dict[str, int] = field(default_factory=dict)
    reads_seen_by_proxy: int = 0
    reads_attributed_to_a_worker: int = 0
    writes_fenced_out: int = 0
    error_lines_in_logs: int = 0
    """Outcome writes refused because the claim was stale (from the workers' logs)."""
    overlapping_posts_of_one_key: int = 0
    """Two POSTs of one key in flight at once (Sume answers both with one job; counted)."""
    hook_calls: int = 0
    hooks_run_more_than_once: int = 0
    early_reads_after_own_pause: int = 0
    """Reads that reached Sume before the recorded due time, sent by a worker right after a
    SIGSTOP past its lease froze it between its lease check and the send (no client can fence
    a read at the provider; see RELIABILITY.md). Reported, not a violation."""
    drain_s: float = 0.0
    violations: dict[str, int] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=dict)


class Conn:
    """One client connection through the proxy; `pid` is filled in once looked up."""

    __slots__ = ("pid",)

    def __init__(self) -> None:
        self.pid: int | None = None


class ChaosProxy:
    """A TCP proxy in front of the fake Sume that can cut the network and tells which worker
    process sent each status read.

    It runs its own event loop in its own thread, and looks processes up off that loop: a
    proxy that stalls holds requests back past the client's timeout and then delivers them
    late, which would look like reads sent early.
    """

    REQUEST = re.compile(rb"(GET|POST) (/v1/[^ ]+) HTTP/1\.[01]\r\n")

    def __init__(self, upstream_port: int, pids: set[int]) -> None:
        self.upstream_port = upstream_port
        self.pids = pids
        self.mode = "open"
        self.log: list[tuple[float, Conn, str]] = []
        self._ports: dict[int, int] = {}
        self._links: set[asyncio.StreamWriter] = set()
        self._held: set[asyncio.StreamWriter] = set()
        self._loop = asyncio.new_event_loop()
        # one thread for lookups: two scans racing could leave the older one in place
        self._lookups = concurrent.futures.ThreadPoolExecutor(1, "chaos-proxy-lookup")
        self._thread = threading.Thread(target=self._loop.run_forever, name="chaos-proxy",
                                        daemon=True)
        self._server: asyncio.Server | None = None

    @property
    def reads(self) -> list[tuple[float, int | None, str]]:
        """(time, worker pid or None, job id segment) of every status read passed on."""
        return [(t, conn.pid, job) for t, conn, job in self.log]

    def start(self) -> str:
        self._thread.start()
        self._server = asyncio.run_coroutine_threadsafe(
            asyncio.start_server(self._accept, "127.0.0.1", 0), self._loop).result()
        port = self._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def cut(self, mode: str) -> None:
        """'reset': every connection dies now and new ones are refused at once; 'blackhole':
        connections die now and new ones hang unanswered (the client's timeout fires)."""
        self._loop.call_soon_threadsafe(self._cut, mode)

    def heal(self) -> None:
        self._loop.call_soon_threadsafe(self._cut, "open")

    def close(self) -> None:
        if self._thread.is_alive():
            async def shut() -> None:
                self._cut("open")
                if self._server is not None:
                    self._server.close()

            asyncio.run_coroutine_threadsafe(shut(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
        self._lookups.shutdown(wait=True, cancel_futures=True)
        self._loop.close()

    def _cut(self, mode: str) -> None:
        self.mode = mode
        for writer in [*self._links, *self._held]:
            writer.transport.abort()
        self._held.clear()

    def _pid_of(self, port: int) -> int | None:
        """Which worker owns the client end `port` (one system-wide scan per miss)."""
        if port not in self._ports:
            with contextlib.suppress(psutil.Error):
                self._ports.update({c.laddr.port: c.pid for c in psutil.net_connections("tcp")
                                    if c.pid in self.pids and c.laddr})
        return self._ports.get(port)

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode == "reset":
            writer.transport.abort()
            return
        if self.mode == "blackhole":
            self._held.add(writer)
            return
        conn = Conn()
        lookup = self._loop.run_in_executor(self._lookups, self._pid_of,
                                            writer.get_extra_info("peername")[1])
        lookup.add_done_callback(lambda f: setattr(conn, "pid", f.result()))
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1",
                                                                 self.upstream_port)
        except OSError:
            writer.transport.abort()
            return
        self._links.update((writer, up_writer))
        try:
            await asyncio.gather(self._pipe(reader, up_writer, conn),
                                 self._pipe(up_reader, writer, None))
        finally:
            for w in (writer, up_writer):
                self._links.discard(w)
                w.transport.abort()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    conn: Conn | None) -> None:
        tail = b""
        with contextlib.suppress(OSError, asyncio.IncompleteReadError):
            while data := await reader.read(65536):
                if conn is not None:  # note each status read as it passes (lines may split)
                    joined = tail + data
                    for m in self.REQUEST.finditer(joined):
                        path = m.group(2).decode()
                        if m.end() > len(tail) and path.endswith("/status"):
                            job = path.removeprefix("/v1/jobs/").removesuffix("/status")
                            self.log.append((time.time(), conn, job))
                    tail = joined[-300:]
                writer.write(data)
                await writer.drain()
        writer.transport.abort()


class Fleet:
    """The worker processes: spawned, killed, paused and replaced."""

    def __init__(self, env: dict[str, str], logs: Path, rng: random.Random) -> None:
        self.env = env
        self.logs = logs
        self.rng = rng
        self.procs: list[asyncio.subprocess.Process] = []
        self.pids: set[int] = set()
        self.paused: dict[int, float] = {}
        self.pause_log: list[tuple[int, float, float]] = []
        self.spawned = 0

    async def spawn(self, *extra: str) -> asyncio.subprocess.Process:
        self.spawned += 1
        log = (self.logs / f"worker-{self.spawned:03d}.log").open("wb")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "vidpoll.cli", "--log-level", "INFO", "--log-format", "json",
            "worker", "--lease-seconds", self.env["CHAOS_LEASE_S"], "--concurrency", "16",
            "--batch-size", "16", "--submit-concurrency", "4", "--max-active", "100000",
            "--on-terminal", "tests.chaos.hook:record", "--hook-timeout", "5",
            "--vacuum-every", "500", *extra,
            env=self.env, cwd=REPO, stdout=log, stderr=log)
        log.close()
        self.procs.append(proc)
        self.pids.add(proc.pid)
        return proc

    async def replace_exited(self) -> Counter[int]:
        """Start a new worker for each one that exited on its own (e.g. it started while
        PostgreSQL was down, and said so); return their exit codes."""
        codes: Counter[int] = Counter()
        for proc in [p for p in self.procs if p.returncode is not None]:
            codes[proc.returncode or 0] += 1
            self.procs.remove(proc)
            await self.spawn()
        return codes

    def alive(self) -> list[asyncio.subprocess.Process]:
        return [p for p in self.procs if p.returncode is None and p.pid not in self.paused]

    async def kill_one(self) -> bool:
        victims = self.alive()
        if not victims:
            return False
        victim = self.rng.choice(victims)
        victim.kill()
        await victim.wait()
        self.procs.remove(victim)
        await self.spawn()
        return True

    async def pause_one(self, seconds: float) -> bool:
        victims = self.alive()
        if not victims:
            return False
        victim = self.rng.choice(victims)
        started = time.time()
        self.paused[victim.pid] = started
        victim.send_signal(signal.SIGSTOP)
        await asyncio.sleep(seconds)
        with contextlib.suppress(ProcessLookupError):
            victim.send_signal(signal.SIGCONT)
        del self.paused[victim.pid]
        self.pause_log.append((victim.pid, started, time.time()))
        return True

    async def stop_all(self) -> None:
        for proc in self.procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGCONT)
                    proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                await asyncio.wait_for(proc.wait(), 30)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        self.procs.clear()


async def _retrying(what: Any) -> Any:
    """Run a store call, waiting out a database restart."""
    for attempt in range(100):
        try:
            return await what()
        except DatabaseUnavailable:
            await asyncio.sleep(min(1.0, 0.1 * (attempt + 1)))
    raise RuntimeError("the database did not come back")


async def _feed(store: PgStore, fake: FakeSume, cfg: ChaosConfig, rng: random.Random,
                until: float, keys: list[str], adopted: list[str]) -> None:
    """Record intents (and adopt jobs created elsewhere) at a steady rate until `until`."""
    n = 0
    while time.monotonic() < until:
        key = f"chaos-{cfg.seed}-{n:05d}"
        await _retrying(lambda k=key: store.add_intent(k, {"prompt": f"clip {k}"}))
        keys.append(key)
        if rng.random() < cfg.adopted_share:
            job_id = fake.add_job(f"adopted-{cfg.seed}-{n:05d}")
            await _retrying(lambda j=job_id: store.add_job(j, delay_s=0.2))
            adopted.append(job_id)
        n += 1
        await asyncio.sleep(1.0 / cfg.intents_per_s)


async def _worker_faults(fleet: Fleet, cfg: ChaosConfig, rng: random.Random, until: float,
                         figures: Figures) -> None:
    pauses: set[asyncio.Task[bool]] = set()
    while time.monotonic() < until:
        await asyncio.sleep(rng.uniform(*cfg.kill_every_s))
        for code, n in (await fleet.replace_exited()).items():
            figures.exits_on_their_own[str(code)] = figures.exits_on_their_own.get(
                str(code), 0) + n
        if rng.random() < cfg.pause_share:
            seconds = cfg.lease_s + rng.uniform(0.5, 2.5)
            task = asyncio.create_task(fleet.pause_one(seconds))
            pauses.add(task)
            task.add_done_callback(pauses.discard)
            figures.pauses += 1
        elif await fleet.kill_one():
            figures.kills += 1
            figures.restarts += 1
    await asyncio.gather(*pauses)


async def _pg_faults(server: PrivateServer, cfg: ChaosConfig, rng: random.Random,
                     started: float, figures: Figures) -> None:
    for i in range(cfg.pg_restarts):
        at = started + cfg.duration_s * (i + 1) / (cfg.pg_restarts + 1)
        await asyncio.sleep(max(0.0, at - time.monotonic()))
        mode = "immediate" if i % 2 == 0 else "fast"  # a crash, then a clean restart
        await asyncio.to_thread(server.restart, rng.uniform(1.0, 3.0), mode)
        figures.pg_restarts += 1


async def _net_faults(proxy: ChaosProxy, cfg: ChaosConfig, rng: random.Random, until: float,
                      figures: Figures) -> None:
    cuts: Counter[str] = Counter()
    while True:
        await asyncio.sleep(rng.uniform(*cfg.net_cut_every_s))
        if time.monotonic() >= until:
            break
        mode = rng.choice(["reset", "blackhole"])
        proxy.cut(mode)
        cuts[mode] += 1
        await asyncio.sleep(rng.uniform(1.0, 3.0))
        proxy.heal()
    figures.net_cuts = dict(cuts)


def _fake_config(cfg: ChaosConfig) -> FakeConfig:
    return FakeConfig(
        api_key=API_KEY, latency_s=0.02, latency_jitter=0.5, queued_s=0.5, render_s=3.0,
        render_jitter=0.7, next_poll_after_s=cfg.hint_s, uppercase=True,
        terminal_mix={"completed": 0.7, "failed": 0.15, "canceled": 0.1, "expired": 0.05},
        fail_5xx=0.04, rate_429=0.003, unavailable_503=0.02, retry_after_s=0.3, hang=0.02,
        hang_s=cfg.http_timeout_s * 3, malformed=0.03, html=0.03, not_found_for_s=0.8,
        create_fail_5xx=0.08, create_5xx_billed=0.08, create_rate_429=0.05,
        create_lose_reply=0.08, seed=cfg.seed)


def _quiet(fake: FakeSume) -> None:
    """Every fault off: the fleet may now drain."""
    c = fake.config
    c.fail_5xx = c.rate_429 = c.unavailable_503 = c.hang = c.malformed = c.html = 0.0
    c.create_fail_5xx = c.create_5xx_billed = c.create_rate_429 = c.create_lose_reply = 0.0


async def run(cfg: ChaosConfig, work: Path) -> Figures:
    """One chaos run in `work` (logs, hook log); returns its figures. Whatever fails, every
    process, the proxy, the fake and the private PostgreSQL are stopped on the way out."""
    rng = random.Random(cfg.seed)
    figures = Figures(cfg.seed, cfg.duration_s, cfg.workers)
    async with contextlib.AsyncExitStack() as stack:
        server = await asyncio.to_thread(PrivateServer)
        stack.push_async_callback(asyncio.to_thread, server.close)
        fake = FakeSume(_fake_config(cfg))
        runner, fake_base = await start_fake(fake)
        stack.push_async_callback(runner.cleanup)
        url = server.url()
        await migrate(url)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(AUDIT_SQL)
        store = await PgStore.open(url, timeout_s=2.0)
        stack.push_async_callback(store.close)
        hook_log = work / "hooks.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SUME_", "VIDPOLL_"))}
        env.update(DATABASE_URL=url, SUME_API_KEY=API_KEY, CHAOS_HOOK_LOG=str(hook_log),
                   CHAOS_LEASE_S=f"{cfg.lease_s:g}", PYTHONPATH=str(REPO),
                   VIDPOLL_HTTP_TIMEOUT=f"{cfg.http_timeout_s:g}", VIDPOLL_MIN_POLL_S="0.2",
                   VIDPOLL_BACKOFF_MAX_S="1", VIDPOLL_FIRST_POLL_S="0.2",
                   VIDPOLL_NOT_FOUND_MAX_TRIES="30")
        fleet = Fleet(env, work, rng)
        proxy = ChaosProxy(int(fake_base.rsplit(":", 1)[1]), fleet.pids)
        env["SUME_BASE_URL"] = proxy.start()
        stack.callback(proxy.close)
        stack.push_async_callback(fleet.stop_all)
        for _ in range(cfg.workers):
            await fleet.spawn()
        started = time.monotonic()
        until = started + cfg.duration_s
        keys: list[str] = []
        adopted: list[str] = []
        async with asyncio.TaskGroup() as storm:  # one failing cancels the others
            storm.create_task(_feed(store, fake, cfg, random.Random(rng.random()),
                                    until - cfg.duration_s * 0.15, keys, adopted))
            storm.create_task(_worker_faults(fleet, cfg, random.Random(rng.random()), until,
                                             figures))
            storm.create_task(_pg_faults(server, cfg, random.Random(rng.random()), started,
                                         figures))
            storm.create_task(_net_faults(proxy, cfg, random.Random(rng.random()), until,
                                          figures))
        # the storm is over: faults off, the chaos fleet stops, two workers drain the rest
        proxy.heal()
        _quiet(fake)
        await fleet.stop_all()
        drain_started = time.monotonic()
        drainers = [await fleet.spawn("--drain") for _ in range(2)]
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in drainers)),
                                   cfg.drain_timeout_s)
        except TimeoutError:
            figures.violations["drain_did_not_finish"] = 1
            await fleet.stop_all()
        figures.drain_s = round(time.monotonic() - drain_started, 1)
        figures.intents, figures.adopted_jobs = len(keys), len(adopted)
        await asyncio.to_thread(_check, url, fake, proxy, fleet, keys, adopted, hook_log,
                                work, cfg, figures)
    return figures


def _violation(figures: Figures, name: str, examples: list[str]) -> None:
    figures.violations[name] = len(examples)
    if examples:
        figures.examples[name] = examples[:5]


class AuditRow(NamedTuple):
    """One row of chaos_audit, times as epoch seconds."""

    job_id: str
    at: float
    kind: str
    claimed_by: str | None
    app: str | None
    next_poll_at: float
    read_ok: bool | None
    hint: float | None
    due_after_s: float
    state: str


def stale_writes(audit: list[AuditRow]) -> list[str]:
    """Records and releases not made by the process holding the claim they consumed, and
    outcomes written to a row that nobody had claimed."""
    return [f"{a.job_id} by {a.app!r}, claim of {a.claimed_by!r}" for a in audit
            if a.kind == "unfenced" or (a.kind in ("record", "release")
                                        and a.app != ("vidpoll " + (a.claimed_by or ""))[:63])]


def short_hints(audit: list[AuditRow], answers: list[tuple[float, str]]) -> list[str]:
    """Not-ready reads recorded with a due time sooner than the server's hint after the
    answer left the fake (its own log, `answers`: (wall-clock time, job id)), so the check
    does not take vidpoll's word for when the answer came."""
    sent: dict[str, list[float]] = defaultdict(list)
    for t, job in answers:
        sent[job].append(t)
    short = []
    for a in audit:
        if not (a.kind == "record" and a.read_ok and a.state == "pending"
                and a.hint is not None):
            continue
        before = [t for t in sent.get(a.job_id, []) if t <= a.at + CLOCK_SLACK_S]
        if not before:
            continue  # no 200 answer logged before this record: nothing to count from
        due_after_s = a.next_poll_at - before[-1]
        if due_after_s < min(a.hint, 3600.0) - 0.001:
            short.append(f"{a.job_id}: due {due_after_s:.3f}s after the answer < hint {a.hint}")
    return short


def early_reads(reads: list[tuple[float, int | None, str]], audit: list[AuditRow],
                pause_log: list[tuple[int, float, float]], window_s: float
                ) -> tuple[int, list[str]]:
    """Status reads that reached Sume before the due time last recorded for their job.

    Returns (those sent by a worker within `window_s` of its own SIGSTOP, the others). A
    worker frozen between its lease check and the send sends a read after its lease ended;
    no client can fence a read at the provider, so those are counted apart.
    """
    due: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for a in audit:
        if a.kind in ("insert", "record", "release"):
            due[a.job_id].append((a.at, a.next_poll_at))
    pauses: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for pid, stopped, resumed in pause_log:
        pauses[pid].append((stopped, resumed))
    excused, early = 0, []
    for t, pid, job in reads:
        before = [npa for at, npa in due.get(job, []) if at <= t]
        if before and t < before[-1] - CLOCK_SLACK_S:
            if pid is not None and any(s < t and r > t - window_s for s, r in pauses[pid]):
                excused += 1
            else:
                early.append(f"{job} by pid {pid}: {before[-1] - t:.3f}s early")
    return excused, early


def _check(url: str, fake: FakeSume, proxy: ChaosProxy, fleet: Fleet, keys: list[str],
           adopted: list[str], hook_log: Path, work: Path, cfg: ChaosConfig,
           figures: Figures) -> None:
    """Every invariant, from the provider's truth, the table, its audit and the logs."""
    figures.status_reads = sum(fake.reads.values())
    figures.posts = sum(fake.posts_by_key.values())
    figures.clips_billed = fake.billed
    figures.faults_injected = dict(sorted(fake.faults.items()))
    with psycopg.connect(url) as conn:
        rows = {r[0]: r[1:] for r in conn.execute(
            "SELECT job_id, state, claim_token, result_state, result_token FROM video_jobs")}
        intents = dict(conn.execute("SELECT idempotency_key, state FROM video_intents").fetchall())
        deliveries = conn.execute(
            "SELECT count(*) FILTER (WHERE state <> 'done') FROM vidpoll_deliveries").fetchone()
        transitions = conn.execute(
            "SELECT job_id, count(*) FILTER (WHERE to_state = ANY(%(t)s)), "
            "count(*) FILTER (WHERE from_state = ANY(%(t)s)) FROM video_job_events "
            "WHERE kind = 'state' GROUP BY job_id", {"t": list(TERMINAL)}).fetchall()
        audit = conn.execute(
            "SELECT job_id, extract(epoch FROM at)::float8, kind, claimed_by, app, "
            "extract(epoch FROM next_poll_at)::float8, read_ok, hint, "
            "extract(epoch FROM next_poll_at - answered_at)::float8, new_state FROM chaos_audit "
            "ORDER BY id").fetchall()
    figures.jobs = len(rows)

    # at most once billing per key, and every key billed (nothing lost before the POST)
    _violation(figures, "keys_billed_twice", [k for k in keys if fake.billed_by_key[k] > 1])
    _violation(figures, "keys_never_billed", [k for k in keys if fake.billed_by_key[k] == 0])
    # (the fake never bills one key twice; a second clip would come under another key)
    _violation(figures, "clips_billed_beyond_intents",
               [f"{fake.billed} clips for {len(keys)} intents"] if fake.billed != len(keys)
               else [])
    figures.overlapping_posts_of_one_key = fake.create_overlaps
    _violation(figures, "intents_not_submitted",
               [f"{k}={s}" for k, s in intents.items() if s != "submitted"])
    # every paid job tracked, in the provider's true terminal state
    truth = {fake.by_key[k]: fake.jobs[fake.by_key[k]].outcome
             for k in keys if k in fake.by_key}
    truth.update({j: fake.jobs[j].outcome for j in adopted})
    _violation(figures, "jobs_not_tracked", [j for j in truth if j not in rows])
    _violation(figures, "rows_unknown_to_sume", [j for j in rows if j not in fake.jobs])
    _violation(figures, "jobs_in_wrong_state",
               [f"{j}: {rows[j][0]} != {s}" for j, s in truth.items()
                if j in rows and rows[j][0] != s])
    _violation(figures, "rows_left_pending", [j for j, r in rows.items() if r[0] == "pending"])
    _violation(figures, "rows_left_claimed",
               [j for j, r in rows.items() if r[1] is not None or r[3] is not None])
    _violation(figures, "results_not_fetched",
               [j for j, r in rows.items() if r[0] == "completed" and r[2] != "fetched"])
    _violation(figures, "deliveries_not_done",
               ["deliveries"] * int(deliveries[0] if deliveries else 0))
    # exactly one terminal transition per job, and none out of a terminal state
    terminal_once = {j: (into, out) for j, into, out in transitions}
    _violation(figures, "terminal_transitions_not_once",
               [j for j in rows if terminal_once.get(j, (0, 0))[0] != 1])
    _violation(figures, "transitions_out_of_terminal",
               [j for j, (_, out) in terminal_once.items() if out])
    # every completion hook ran at least once
    calls = Counter(line.split()[0] for line in hook_log.read_text().splitlines()
                    if line.strip()) if hook_log.exists() else Counter()
    figures.hook_calls = sum(calls.values())
    figures.hooks_run_more_than_once = sum(1 for n in calls.values() if n > 1)
    _violation(figures, "hooks_never_run",
               [j for j, r in rows.items() if r[0] in TERMINAL and not calls[j]])
    audit_rows = [AuditRow(*row) for row in audit]
    _violation(figures, "stale_writes_accepted", stale_writes(audit_rows))
    _violation(figures, "due_sooner_than_hint", short_hints(audit_rows, fake.answer_log))
    reads = proxy.reads
    figures.reads_seen_by_proxy = len(reads)
    figures.reads_attributed_to_a_worker = sum(1 for _, pid, _ in reads if pid)
    excused, early = early_reads(reads, audit_rows, fleet.pause_log,
                                 cfg.lease_s + cfg.http_timeout_s)
    figures.early_reads_after_own_pause = excused
    _violation(figures, "early_reads", early)
    # the logs: stale writes refused, and no secret anywhere
    text = "\n".join(p.read_text(errors="replace") for p in sorted(work.glob("worker-*.log")))
    figures.writes_fenced_out = (text.count("another worker owns the row now")
                                 + text.count("another submitter owns it now"))
    _violation(figures, "api_key_in_logs", ["log"] * text.count(API_KEY))
    errors = [line[:200] for line in text.splitlines() if '"level": "error"' in line]
    figures.error_lines_in_logs = len(errors)
    # a traceback (log.exception) is a code path nobody meant to take; an outage is not
    _violation(figures, "tracebacks_in_logs",
               [line[:200] for line in text.splitlines() if '"exc": ' in line])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration", type=float, default=300.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=3)
    p.add_argument("--keep", action="store_true", help="keep the logs directory")
    args = p.parse_args()
    # the harness's own pool complains through every PostgreSQL restart it causes
    logging.getLogger("psycopg.pool").setLevel(logging.CRITICAL)
    cfg = ChaosConfig(seed=args.seed, duration_s=args.duration, workers=args.workers)
    work = Path(tempfile.mkdtemp(prefix="vidpoll-chaos-"))
    try:
        figures = asyncio.run(run(cfg, work))
    finally:
        if args.keep:
            print(f"logs: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(asdict(figures), indent=2))
    sys.exit(1 if any(figures.violations.values()) else 0)


if __name__ == "__main__":
    main()
