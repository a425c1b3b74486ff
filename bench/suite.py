"""The side-by-side benchmark suite (issue #7): every scenario measures vidpoll and its
baseline in the same run, on the same machine, the same PostgreSQL and the same fake Sume (in
its own process), and prints ratios. One JSON line per scenario; `--out FILE` appends them.

    make bench-quick      # .venv/bin/python bench/suite.py --quick
    make bench            # .venv/bin/python bench/suite.py

Scenarios: latency (vs the seed's loop), throughput (against concurrency, vs the bare
client), saturation (vs a bare aiohttp client, with CPU seconds per 1,000 polls,
transactions and WAL bytes per poll), peers (pgqueuer, procrastinate, arq: bench/peers.py),
lateness (light load and past capacity), idle (transactions per minute vs the seed's loop),
recovery (kill -9 to rows read again), scale (claim latency with 10k vs 1M rows), bloat (size
after 1M polls: bench/bloat.py). `bench/plots.py` draws docs/bench-*.png from the output.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import psycopg
from scratch_db import scratch_database

from vidpoll.models import ClaimedJob, Outcome
from vidpoll.policy import PollPolicy
from vidpoll.providers.sume.client import SumeClient
from vidpoll.store import PgStore, migrate
from vidpoll.worker import Worker, WorkerConfig, late_at_read

KEY = "sk-bench"
HERE = Path(__file__).resolve().parent
DB_CONNECTIONS = 4
PERCENTILES = (1, 5, 10, 25, 50, 75, 90, 95, 99, 99.9)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def fake_sume(latency_ms: float, next_poll_after: float = 1.0,
              jitter: float = 0.3) -> Iterator[str]:
    """The fake in its own process: long renders, `next_poll_after_seconds` as given."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "vidpoll.cli", "fake-sume", "--port",
                             str(port), "--api-key", KEY, "--latency-ms", str(latency_ms),
                             "--latency-jitter", str(jitter), "--render-seconds", "1000000",
                             "--next-poll-after", str(next_poll_after), "--auto-create"],
                            stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                fake_stats(base)
                break
            except OSError:
                time.sleep(0.05)
        yield base
    finally:
        proc.terminate()
        proc.wait(10)


def fake_stats(base: str) -> dict[str, Any]:
    return json.loads(urllib.request.urlopen(f"{base}/_fake/stats", timeout=5).read())


def fake_config(base: str, **changes: Any) -> None:
    req = urllib.request.Request(f"{base}/_fake/config", data=json.dumps(changes).encode(),
                                 headers={"Content-Type": "application/json"})
    urllib.request.urlopen(req, timeout=5).read()


def load_backlog(url: str, jobs: int) -> None:
    """`jobs` pending rows, all due now (ids b1..bN; the fake creates them on first read)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE video_jobs, video_job_events, vidpoll_minutes")
        conn.execute("INSERT INTO video_jobs (job_id, next_poll_at) "
                     "SELECT 'b' || g, now() FROM generate_series(1, %s) g", (jobs,))
        conn.execute("VACUUM ANALYZE video_jobs")


def env_for(url: str, base: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SUME_", "VIDPOLL_"))}
    env.update(DATABASE_URL=url, SUME_BASE_URL=base, SUME_API_KEY=KEY,
               VIDPOLL_HTTP_TIMEOUT="15")
    return env


def spawn_vidpoll(url: str, base: str, concurrency: int, *extra: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "vidpoll.cli", "--log-level", "WARNING", "worker", "--poll-only",
         "--no-fetch-results", "--concurrency", str(concurrency), "--db-connections",
         str(DB_CONNECTIONS), *extra], env=env_for(url, base), stderr=subprocess.DEVNULL)


def spawn_seed_loops(url: str, base: str, n: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen([sys.executable, str(HERE / "seed_loop.py")],
                             env=env_for(url, base), stderr=subprocess.DEVNULL)
            for _ in range(n)]


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def reads_per_s(base: str, warmup_s: float, window_s: float) -> float:
    """Status reads the fake answered per second over a window after a warm-up."""
    time.sleep(warmup_s)
    r0, t0 = fake_stats(base)["reads"], time.monotonic()
    time.sleep(window_s)
    return (fake_stats(base)["reads"] - r0) / (time.monotonic() - t0)


def db_transactions(url: str) -> int:
    """Transactions committed or rolled back in the scratch database so far. Read only while
    no worker is connected: a backend reports its counts when it exits (or every few
    seconds), so counts taken around a worker's whole life are exact."""
    time.sleep(1.5)  # the exited backends' last reports land
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                           "WHERE datname = current_database()").fetchone()
        assert row is not None
        return int(row[0])


def wal_bytes(url: str) -> int:
    """The server's WAL position in bytes (what a replica or an archive has to carry)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')").fetchone()
        assert row is not None
        return int(row[0])


def postgres_cpu_s() -> float:
    """CPU seconds of every PostgreSQL server process on this machine so far."""
    total = 0.0
    for p in psutil.process_iter(["name", "cpu_times"]):
        if p.info["name"] and p.info["name"].startswith("postgres") and p.info["cpu_times"]:
            total += p.info["cpu_times"].user + p.info["cpu_times"].system
    return total


def cpu_s(proc: subprocess.Popen[bytes]) -> float:
    t = psutil.Process(proc.pid).cpu_times()
    return t.user + t.system


# -- scenarios ---------------------------------------------------------------------------
def latency(url: str, quick: bool) -> dict[str, Any]:
    """1. 100 ms ± 30 %: vidpoll (concurrency 200, 4 connections) vs the seed's loop (4
    processes: at most the same 4 connections)."""
    jobs, window = (3000, 5.0) if quick else (5000, 30.0)
    with fake_sume(100) as base:
        load_backlog(url, jobs)
        seed = spawn_seed_loops(url, base, DB_CONNECTIONS)
        seed_rate = reads_per_s(base, 3, window)
        stop(seed)
        load_backlog(url, jobs)
        worker = [spawn_vidpoll(url, base, 200)]
        rate = reads_per_s(base, 4, window)
        stop(worker)
    ideal = 200 / 0.1
    return {"scenario": "latency", "jobs": jobs, "window_s": window,
            "seed_loop_reads_per_s": round(seed_rate, 1), "vidpoll_reads_per_s": round(rate, 1),
            "ratio": round(rate / seed_rate, 1), "target_ratio": 40,
            "share_of_ideal": round(rate / ideal, 3), "target_share": 0.85}


def saturation(url: str, quick: bool) -> dict[str, Any]:
    """2. No added latency: vidpoll vs the bare aiohttp client (no database), concurrency 200;
    CPU seconds per 1,000 polls (worker, PostgreSQL) and transactions per poll."""
    jobs, window = (3000, 5.0) if quick else (5000, 30.0)
    with fake_sume(0, jitter=0) as base:
        bare = subprocess.Popen([sys.executable, str(HERE / "bare_client.py"), base, KEY, "200",
                                 str(window + 3), str(jobs)])
        bare_rate = reads_per_s(base, 2, window)
        bare.wait()
        load_backlog(url, jobs)
        x0, life0 = db_transactions(url), fake_stats(base)["reads"]
        worker = spawn_vidpoll(url, base, 200)
        time.sleep(4)
        r0, t0 = fake_stats(base)["reads"], time.monotonic()
        c0, p0, w0 = cpu_s(worker), postgres_cpu_s(), wal_bytes(url)
        time.sleep(window)
        r1, t1 = fake_stats(base)["reads"], time.monotonic()
        c1, p1, w1 = cpu_s(worker), postgres_cpu_s(), wal_bytes(url)
        stop([worker])
        life1 = fake_stats(base)["reads"]
        x1 = db_transactions(url)
    polls = r1 - r0
    rate = polls / (t1 - t0)
    return {"scenario": "saturation", "jobs": jobs, "window_s": window,
            "bare_client_reads_per_s": round(bare_rate, 1),
            "vidpoll_reads_per_s": round(rate, 1), "share_of_client_limit":
            round(rate / bare_rate, 3), "target_share": 0.8,
            "worker_cpu_s_per_1000_polls": round((c1 - c0) / polls * 1000, 3),
            "postgres_cpu_s_per_1000_polls": round((p1 - p0) / polls * 1000, 3),
            # the whole server's WAL over the window (nothing else writes meanwhile)
            "wal_bytes_per_poll": round((w1 - w0) / polls),
            # over the worker's whole life, start-up included (each autocommit statement is
            # one transaction; the two reads of the counter are taken out)
            "transactions_per_poll": round((x1 - x0 - 2) / (life1 - life0), 4),
            "target_statements_per_poll": 0.05}


def throughput(url: str, quick: bool) -> dict[str, Any]:
    """1b. Reads/s against concurrency at 100 ms ± 30 %: vidpoll and the bare client (no
    database) at each concurrency, beside the ideal concurrency ÷ latency."""
    levels = [200] if quick else [25, 50, 100, 200, 400]
    jobs, window = 5000, (5.0 if quick else 10.0)
    curve = []
    with fake_sume(100) as base:
        for c in levels:
            bare = subprocess.Popen([sys.executable, str(HERE / "bare_client.py"), base, KEY,
                                     str(c), str(window + 3), str(jobs)])
            bare_rate = reads_per_s(base, 2, window)
            bare.wait()
            load_backlog(url, jobs)
            worker = [spawn_vidpoll(url, base, c)]
            rate = reads_per_s(base, 4, window)
            stop(worker)
            curve.append({"concurrency": c, "ideal_reads_per_s": c / 0.1,
                          "bare_client_reads_per_s": round(bare_rate, 1),
                          "vidpoll_reads_per_s": round(rate, 1),
                          "share_of_ideal": round(rate / (c / 0.1), 3)})
    return {"scenario": "throughput", "jobs": jobs, "window_s": window, "curve": curve}


def lateness(url: str, quick: bool) -> dict[str, Any]:
    """4. Lateness of each read (its start minus next_poll_at, by the database's clock) at light
    load (1,000 active jobs, next_poll_after 1 s, 100 ms answers) and past capacity."""
    loads = [1000, 3000] if quick else [1000, 2000, 3000, 5000, 10000]
    window = 5.0 if quick else 20.0
    curve = []
    with fake_sume(100, next_poll_after=1.0) as base:
        for jobs in loads:
            load_backlog(url, jobs)
            lates, rate = asyncio.run(_measure_lateness(url, base, window))
            lates.sort()
            curve.append({"active_jobs": jobs, "reads_per_s": round(rate, 1),
                          "p50_ms": round(1000 * lates[len(lates) // 2], 1),
                          "p99_ms": round(1000 * lates[int(len(lates) * 0.99)], 1),
                          "reads": len(lates),
                          # the distribution, for docs/bench-lateness.png
                          "percentiles_ms": {str(q): round(1000 * lates[min(
                              len(lates) - 1, int(len(lates) * q / 100))], 1)
                              for q in PERCENTILES}})
    return {"scenario": "lateness", "window_s": window, "curve": curve,
            "light_load_p99_ms": curve[0]["p99_ms"], "target_p99_ms": 100}


async def _measure_lateness(url: str, base: str, window: float) -> tuple[list[float], float]:
    store = await PgStore.open(url, max_size=DB_CONNECTIONS)
    lates: list[float] = []
    measuring = [False]

    class Measured(Worker):
        async def _read(self, job: ClaimedJob) -> Outcome | None:
            if measuring[0]:
                lates.append(late_at_read(job))  # at the read's start, as the worker does
            return await super()._read(job)

    async with SumeClient(base, KEY, max_connections=200) as client:
        worker = Measured(store, client, WorkerConfig(
            concurrency=200, lock_lanes=DB_CONNECTIONS - 1, lease_s=25, fetch_results=False,
            policy=PollPolicy()))
        task = asyncio.create_task(worker.run())
        await asyncio.sleep(5)  # the first due-now burst is a backlog, not lateness
        measuring[0] = True
        await asyncio.sleep(window)
        measuring[0] = False
        worker.stop()
        await task
    await store.close()
    return lates, len(lates) / window


def idle(url: str, quick: bool) -> dict[str, Any]:
    """5. Transactions per minute of an idle worker (nothing due), vs the seed's loop."""
    window = 30.0 if quick else 120.0
    out: dict[str, Any] = {"scenario": "idle", "window_s": window}
    with fake_sume(0) as base:
        for name, spawn in (("vidpoll", lambda: [spawn_vidpoll(url, base, 200)]),
                            ("seed_loop", lambda: spawn_seed_loops(url, base, 1))):
            load_backlog(url, 0)
            x0 = db_transactions(url)
            started = time.monotonic()
            procs = spawn()
            time.sleep(window)
            stop(procs)
            lived = time.monotonic() - started
            x1 = db_transactions(url)
            # the process's whole life, start-up included
            out[f"{name}_transactions_per_min"] = round((x1 - x0 - 1) * 60 / lived, 1)
    return out


def recovery(url: str, quick: bool) -> dict[str, Any]:
    """7. kill -9 of a worker holding rows mid-read: seconds until they are read again, per
    claim mode (lease: its lease ends; lock: the row locks die with the connection)."""
    jobs = 200
    out: dict[str, Any] = {"scenario": "recovery", "jobs": jobs, "lease_s": 20}
    for mode in ("lease", "lock"):
        with fake_sume(60_000, jitter=0) as base:  # every read hangs until the kill
            load_backlog(url, jobs)
            first = spawn_vidpoll(url, base, 400, "--claim", mode, "--lease-seconds", "20")
            _wait(lambda b=base: fake_stats(b)["in_flight"] >= jobs, 60)
            first.kill()
            first.wait()
            killed = time.monotonic()
            fake_config(base, latency_s=0.0)
            reads = fake_stats(base)["reads"]
            second = spawn_vidpoll(url, base, 400, "--claim", mode, "--lease-seconds", "20")
            _wait(lambda b=base, r=reads: fake_stats(b)["reads"] >= r + jobs, 120)
            out[f"{mode}_recovery_s"] = round(time.monotonic() - killed, 2)
            stop([second])
    return out


def scale(url: str, quick: bool) -> dict[str, Any]:
    """6a. Claim latency with 10,000 rows vs 1,000,000 (10,000 pending, the rest finished): the
    claim statement (lease mode, 100 rows) timed in a transaction rolled back, so every
    repetition claims the same due rows; EXPLAIN of the large case kept in the output."""
    from vidpoll.sql import QUERIES

    pending, repeat = 10_000, (50 if quick else 200)
    params = {"limit": 100, "lease_s": 25.0, "worker_id": "bench", "now": None,
              "account": "default"}
    out: dict[str, Any] = {"scenario": "scale", "pending_rows": pending, "repeat": repeat}
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE video_jobs")
        conn.execute("ALTER TABLE video_jobs DISABLE TRIGGER USER")
        conn.execute("INSERT INTO video_jobs (job_id, next_poll_at) SELECT 'p' || g, "
                     "now() - make_interval(secs => g %% 600) FROM generate_series(1, %s) g",
                     (pending,))
        for total in (10_000, 1_000_000):
            finished = total - pending
            if finished:
                conn.execute("INSERT INTO video_jobs (job_id, state, finished_at) "
                             "SELECT 'f' || g, 'completed', now() "
                             "FROM generate_series(1, %s) g", (finished,))
            conn.execute("VACUUM ANALYZE video_jobs")
            times = []
            for _ in range(repeat):
                with conn.transaction(force_rollback=True):
                    started = time.perf_counter()
                    conn.execute(QUERIES["claim_due"], params).fetchall()
                    times.append((time.perf_counter() - started) * 1000)
            times.sort()
            out[f"claim_ms_{total}"] = {"median": round(times[len(times) // 2], 3),
                                        "p95": round(times[int(len(times) * 0.95)], 3)}
        plan = conn.execute("EXPLAIN " + QUERIES["claim_due"], params).fetchall()
        conn.execute("ALTER TABLE video_jobs ENABLE TRIGGER USER")
    out["ratio_1m_to_10k"] = round(out["claim_ms_1000000"]["median"]
                                   / out["claim_ms_10000"]["median"], 2)
    out["target_ratio"] = 2.0
    out["explain_1m"] = [r[0] for r in plan]
    return out


def peers(url: str, quick: bool) -> dict[str, Any]:
    """3. pgqueuer, procrastinate (and arq on Redis), a job per poll re-enqueued
    `next_poll_after_seconds` later, vs vidpoll: bench/peers.py."""
    import peers as peer_scenario

    return peer_scenario.peers(url, quick)


def bloat(url: str, quick: bool) -> dict[str, Any]:
    """6b. Size after 1M polls over 10k live jobs, on the embedded PostgreSQL (autovacuum
    on, whatever DATABASE_URL says): bench/bloat.py."""
    import bloat as bloat_scenario

    return bloat_scenario.bloat(url, quick)


def _wait(predicate: Callable[[], bool], within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark condition not reached")
        time.sleep(0.05)


SCENARIOS: dict[str, Callable[[str, bool], dict[str, Any]]] = {
    "latency": latency, "throughput": throughput, "saturation": saturation,
    "peers": peers, "lateness": lateness, "idle": idle, "recovery": recovery, "scale": scale,
    "bloat": bloat,
    # issue #16: bench/fleet.py (20 workers), bench/vacuum_scale.py (5M rows); imported late,
    # as they import this module
    "fleet": lambda url, quick: __import__("fleet").fleet(url, quick),
    "vacuum_scale": lambda url, quick: __import__("vacuum_scale").vacuum_scale(url, quick),
    "upgrade": lambda url, quick: __import__("upgrade").upgrade(url, quick)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="Short windows (under 2 minutes).")
    p.add_argument("--only", nargs="*", choices=sorted(SCENARIOS))
    p.add_argument("--out", type=Path, help="Append each scenario's JSON line here too.")
    args = p.parse_args()
    machine = {"cpus": os.cpu_count(), "python": sys.version.split()[0]}
    # --quick (make bench-quick, under 2 minutes) leaves out the scenarios that need minutes
    # to mean anything: idle (start-up dominates a short life), peers, bloat (its vacuums),
    # fleet (20 processes), vacuum_scale (a 5M-row table), upgrade (a 1M-row table)
    quick_skips = {"idle", "peers", "bloat", "fleet", "vacuum_scale", "upgrade"}
    for name in args.only or [n for n in SCENARIOS if not (args.quick and n in quick_skips)]:
        with scratch_database() as url:
            asyncio.run(migrate(url))
            with psycopg.connect(url) as conn:
                machine["postgres"] = conn.info.parameter_status("server_version") or "?"
            started = time.monotonic()
            result = SCENARIOS[name](url, args.quick)
        result.update(quick=args.quick, took_s=round(time.monotonic() - started, 1),
                      machine=machine)
        line = json.dumps(result)
        print(line, flush=True)
        if args.out:
            with args.out.open("a") as f:
                f.write(line + "\n")


if __name__ == "__main__":
    main()
