"""Scenario 3 of issue #7, the peers: the Postgres queues a user would pick instead of vidpoll
(pgqueuer, procrastinate), and arq on Redis, doing the same work on the same machine, the same
PostgreSQL and the same fake Sume, at the same concurrency (200 reads in flight). In each peer
every poll is a job: run, it makes vidpoll's GET once from one shared aiohttp session and
re-enqueues itself `next_poll_after_seconds` later (bench/peer_*.py, each in its own process).

Two regimes (answers at once; 100 ms ± 30 %), `next_poll_after_seconds` 1 in both, a backlog of
N jobs all due now; reads/s is the fake's own count over a window after a warm-up. Cost per poll
is taken over each worker's whole life: PostgreSQL transactions (pg_stat_database) for vidpoll
and the Postgres queues, Redis commands (INFO total_commands_processed) for arq.

    .venv/bin/python bench/peers.py --quick     # a scratch database on DATABASE_URL's server
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import redis
from scratch_db import scratch_database
from suite import (
    DB_CONNECTIONS,
    HERE,
    cpu_s,
    db_transactions,
    env_for,
    fake_stats,
    fake_sume,
    load_backlog,
    spawn_vidpoll,
    stop,
)

from vidpoll.store import migrate

CONCURRENCY = 200
WARMUP_S = 4.0
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
POSTGRES_PEERS = ("pgqueuer", "procrastinate")

# Each peer's best documented settings for many short I/O-bound jobs, at vidpoll's concurrency.
SETTINGS: dict[str, dict[str, Any]] = {
    "vidpoll": {"concurrency": CONCURRENCY, "db_connections": DB_CONNECTIONS,
                "claim": "lease (default)", "listen": True},
    "pgqueuer": {
        # a hard cap on picked jobs, enforced by the dequeue query: the same 200 in flight
        "max_concurrent_tasks": CONCURRENCY,
        # docs: raise batch_size for short jobs (at most max_concurrent_tasks / 2). Measured
        # here at 10, 25, 50 and 100: no gain from larger batches (finished jobs hold their
        # slot until the status log, flushed every batch_size jobs or 0.1 s, is written), and
        # 10 costs the fewest transactions per poll, so the default stays
        "batch_size": 10,
        # the fallback poll; LISTEN/NOTIFY (always on) and the next deferred job's ETA wake it
        "dequeue_timeout_s": 30.0,
        # docs: a dedicated asyncpg connection for the QueueManager, a pool for producers
        # (here the re-enqueues; 4, 10 and 20 measured alike); `pgq autovac` applied;
        # durability "durable" (the default, vidpoll's guarantee)
        "driver": "asyncpg", "producer_pool_size": 10, "event_loop": "uvloop (as `pgq run`)",
    },
    "procrastinate": {
        "concurrency": CONCURRENCY,
        "listen_notify": True,
        # a job deferred 1 s ahead sends its NOTIFY when inserted, not when due: the poll
        # interval bounds how late a due job is found when no insert wakes the worker
        "fetch_job_polling_interval_s": 0.1,
        # docs (delete finished jobs): the table stays the size of the live set, as vidpoll's
        "delete_jobs": "successful",
        # psycopg_pool's connections (one kept for LISTEN); 4, 10 and 30 measured the same:
        # the worker fetches one job per statement, one fetch at a time
        "pool_size": 10,
    },
    "arq": {
        "max_jobs": CONCURRENCY,
        # arq has no wake-up: it reads due jobs (up to max_jobs) every poll_delay (default
        # 0.5 s); measured at 0.5, 0.05 and 0.01 s, 0.05 s gave the most reads/s
        "poll_delay_s": 0.05,
        # nobody reads a poll's return value
        "keep_result_s": 0,
    },
}


def peers(url: str, quick: bool) -> dict[str, Any]:
    """3. vidpoll vs pgqueuer, procrastinate (and arq) at saturation and at 100 ms answers."""
    jobs, window = (3000, 10.0) if quick else (5000, 30.0)
    settings = {name: dict(s) for name, s in SETTINGS.items()}
    settings["arq"].update(queue_name=f"vidpoll-bench-{uuid.uuid4().hex[:8]}",
                           redis_url=REDIS_URL)
    names = ["vidpoll", *POSTGRES_PEERS]
    arq_skipped = _redis_unreachable()
    if not arq_skipped:
        names.append("arq")

    sat: dict[str, dict[str, float]] = {}
    with fake_sume(0, jitter=0) as base:
        for name in names:
            sat[name] = _measure(name, url, base, jobs, window, settings[name])
    lat: dict[str, dict[str, float]] = {}
    with fake_sume(100) as base:
        for name in names:
            lat[name] = _measure(name, url, base, jobs, window, settings[name])

    ideal = CONCURRENCY / 0.1
    vidpoll_rate = sat["vidpoll"]["reads_per_s"]
    saturation: dict[str, Any] = {f"{n}_reads_per_s": _get(sat, n, "reads_per_s")
                                  for n in ("vidpoll", *POSTGRES_PEERS, "arq")}
    saturation.update({f"ratio_vs_{n}": round(vidpoll_rate / sat[n]["reads_per_s"], 2)
                       for n in POSTGRES_PEERS})
    saturation.update(
        target_ratio=5,
        transactions_per_poll={n: sat[n]["cost_per_poll"] for n in ("vidpoll", *POSTGRES_PEERS)},
        target_statements_per_poll_vidpoll=0.05,
        arq_redis_commands_per_poll=_get(sat, "arq", "cost_per_poll"),
        worker_cpu_s_per_1000_polls={n: sat[n]["cpu_s_per_1000"] for n in names})
    latency: dict[str, Any] = {f"{n}_reads_per_s": _get(lat, n, "reads_per_s")
                               for n in ("vidpoll", *POSTGRES_PEERS, "arq")}
    latency.update(
        ideal_reads_per_s=ideal,
        share_of_ideal={n: round(lat[n]["reads_per_s"] / ideal, 3) for n in names},
        target_share=0.85,
        transactions_per_poll={n: lat[n]["cost_per_poll"] for n in ("vidpoll", *POSTGRES_PEERS)},
        arq_redis_commands_per_poll=_get(lat, "arq", "cost_per_poll"))
    out: dict[str, Any] = {"scenario": "peers", "jobs": jobs, "window_s": window,
                           "concurrency": CONCURRENCY, "saturation": saturation,
                           "latency_100ms": latency, "settings": settings,
                           "versions": _versions()}
    if arq_skipped:
        out["arq_skipped"] = arq_skipped
    return out


def _measure(name: str, url: str, base: str, jobs: int, window: float,
             settings: dict[str, Any]) -> dict[str, float]:
    """Load `name`'s backlog (not timed), run its worker through a warm-up and the window, stop
    it; reads/s over the window, bookkeeping per poll over the worker's whole life."""
    env = env_for(url, base)
    if name == "vidpoll":
        load_backlog(url, jobs)
    else:
        _run_peer(name, env, "load", str(jobs), settings)
    count = _redis_counter() if name == "arq" else lambda: db_transactions(url)
    before, life0 = count(), fake_stats(base)["reads"]
    with tempfile.TemporaryFile() as log:
        if name == "vidpoll":
            proc = spawn_vidpoll(url, base, CONCURRENCY)
        else:
            proc = subprocess.Popen(_peer_cmd(name, "work", settings), env=env, stderr=log)
        time.sleep(WARMUP_S)
        r0, t0, c0 = fake_stats(base)["reads"], time.monotonic(), cpu_s(proc)
        time.sleep(window)
        r1, t1, c1 = fake_stats(base)["reads"], time.monotonic(), cpu_s(proc)
        died = proc.poll() is not None
        stop([proc])
        log.seek(0)
        if died or r1 == r0:
            raise RuntimeError(f"{name}'s worker did not poll: {log.read()[-2000:].decode()}")
    life1 = fake_stats(base)["reads"]
    after = count()
    if name == "arq":
        _run_peer(name, env, "clean", settings)
    # the counters' own reads are taken out: two transactions (suite.saturation), one INFO
    own = 1 if name == "arq" else 2
    return {"reads_per_s": round((r1 - r0) / (t1 - t0), 1),
            "cost_per_poll": round((after - before - own) / (life1 - life0), 4),
            "cpu_s_per_1000": round((c1 - c0) / (r1 - r0) * 1000, 3)}


def _run_peer(name: str, env: dict[str, str], mode: str, *args: Any) -> None:
    done = subprocess.run(_peer_cmd(name, mode, *args), env=env, capture_output=True)
    if done.returncode:
        raise RuntimeError(f"peer_{name}.py {mode} failed: {done.stderr[-2000:].decode()}")


def _peer_cmd(name: str, mode: str, *args: Any) -> list[str]:
    return [sys.executable, str(HERE / f"peer_{name}.py"), mode,
            *(json.dumps(a) if isinstance(a, dict) else a for a in args)]


def _redis_counter() -> Callable[[], int]:
    """Commands the Redis server has processed so far, read on one connection opened here (so
    only the first INFO itself falls between two reads)."""
    client = redis.Redis.from_url(REDIS_URL)
    client.ping()
    return lambda: int(client.info("stats")["total_commands_processed"])


def _redis_unreachable() -> str | None:
    try:
        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except redis.RedisError as e:
        return f"Redis at {REDIS_URL} unreachable: {e}"
    return None


def _get(results: dict[str, dict[str, float]], name: str, key: str) -> float | None:
    return results[name][key] if name in results else None


def _versions() -> dict[str, str]:
    from importlib.metadata import version

    return {p: version(p) for p in ("pgqueuer", "procrastinate", "arq", "asyncpg", "aiohttp")}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true", help="Short windows, 3,000 jobs.")
    args = p.parse_args()
    with scratch_database() as url:
        asyncio.run(migrate(url))
        with psycopg.connect(url) as conn:
            server = conn.info.parameter_status("server_version") or "?"
        started = time.monotonic()
        result = peers(url, args.quick)
    result.update(quick=args.quick, took_s=round(time.monotonic() - started, 1),
                  machine={"cpus": os.cpu_count(), "python": sys.version.split()[0],
                           "postgres": server})
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
