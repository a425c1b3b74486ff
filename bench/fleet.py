"""Scenario "fleet" (issue #16, item 3): 20 default `vidpoll worker` processes (real
subprocesses, default settings: poller, submitter and result fetcher) against one PostgreSQL
and one fake Sume (its own process).

1. idle: nothing due for 60 s after start-up. Transactions/s of the fleet (pg_stat_database's
   xact_commit + xact_rollback delta of the scratch database, this script's own statements
   taken out) and connections held (pg_stat_activity, application_name LIKE 'vidpoll%'), in
   total and per worker.
2. trickle: ten single-row INSERTs into the idle fleet, one at a time (each one NOTIFY):
   transactions each one causes beyond the idle rate (how many workers a NOTIFY wakes, seen
   from outside), and insert-to-read latency. The fake's hint is an hour here, so these rows
   are read once and then stay quiet.
3. load: 20,000 rows due at once (one INSERT ... generate_series, next_poll_at = now()), the
   fake answering "processing" with a 1 s hint, so every row stays pending and is read again
   as soon as a worker gets to it: the fleet's reads/s (fake's count over a window), then the
   same 20,000 rows read by ONE default worker in the same run; ratio fleet / (20 x one).
   Each read takes 1 s +- 30 % (--latency-ms), so the fleet's ideal (20 x 50 reads in flight /
   1 s = 1,000 reads/s) stays within what a small machine serves and the ratio shows the
   database's share, not the CPU's.
4. at SIGTERM each worker logs `worker <id> stopped: reads=N ... claims=N notify_wakeups=N
   empty_notify_wakeups=N`: per-worker reads (claims spread: min/median/max) and NOTIFY
   wake-ups, empty ones (a thundering herd) over every NOTIFY of the run; fields a worker does
   not log are reported as "n/a".

The server: DATABASE_URL's if it has room for the fleet's connections (FLEET x 8 + 20 free),
else a private embedded server (under the temp directory) started with max_connections 400,
so the fleet never takes the connections other users of a shared server need.

    .venv/bin/python bench/suite.py --only fleet [--quick]
    .venv/bin/python bench/fleet.py [--quick] [--workers 20] [--latency-ms 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import psycopg
from suite import env_for, fake_config, fake_stats, fake_sume

from vidpoll.embedded import start_embedded
from vidpoll.store import create_database_if_missing, drop_database, migrate

FLEET = 20
JOBS = 20_000
CONNECTIONS_PER_WORKER_ROOM = 8
"""Connections per worker the server must have free before the fleet may use it (today's
worker holds 5-8)."""
PRIVATE_MAX_CONNECTIONS = 400
PRIVATE_HOME = Path(tempfile.gettempdir()) / "vidpoll-bench-fleet"
STOPPED = re.compile(r"worker (\S+) stopped: (.*)$")
STARTED = re.compile(r"worker (\S+) started:")
COUNTERS = ("reads", "finished", "fenced_out", "claims", "notify_wakeups",
            "empty_notify_wakeups")


# -- the server ----------------------------------------------------------------------------
class Observer:
    """This script's statements against the scratch database, each on a connection of its own
    (closed at once, so its own statistics report lands at once), counted so that they can be
    taken out of the transaction deltas."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.statements = 0

    def rows(self, query: str, params: Any = None) -> list[tuple[Any, ...]]:
        self.statements += 1
        with psycopg.connect(self.url, autocommit=True) as conn:
            cur = conn.execute(query, params)
            return cur.fetchall() if cur.description else []

    def transactions(self) -> tuple[int, int]:
        """(the database's transactions so far, this script's statements before this one)."""
        before = self.statements
        row = self.rows("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                        "WHERE datname = current_database()")[0]
        return int(row[0]), before

    def connections(self) -> dict[str, int]:
        """application_name -> connections, for every vidpoll connection."""
        return {name: n for name, n in self.rows(
            "SELECT application_name, count(*) FROM pg_stat_activity WHERE datname = "
            "current_database() AND application_name LIKE 'vidpoll%%' GROUP BY 1")}


def _room(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT current_setting('max_connections')::int "
                           "- current_setting('superuser_reserved_connections')::int "
                           "- count(*) FROM pg_stat_activity").fetchone()
        assert row is not None
        return int(row[0])


def _private_admin_url() -> str:
    """The private embedded server's admin URL, max_connections raised (a restart: set in a
    child process, whose exit stops the server, then started again here)."""
    code = ("import sys, psycopg; from pathlib import Path; "
            "from vidpoll.embedded import start_embedded; "
            "u = start_embedded(Path(sys.argv[1]), database='postgres'); "
            "c = psycopg.connect(u, autocommit=True); "
            f"c.execute('ALTER SYSTEM SET max_connections = {PRIVATE_MAX_CONNECTIONS}'); "
            "c.close()")
    subprocess.run([sys.executable, "-c", code, str(PRIVATE_HOME)], check=True,
                   stderr=subprocess.DEVNULL)
    admin = start_embedded(PRIVATE_HOME, database="postgres")
    with psycopg.connect(admin, autocommit=True) as conn:
        row = conn.execute("SHOW max_connections").fetchone()
    if row is None or int(row[0]) < PRIVATE_MAX_CONNECTIONS:
        raise RuntimeError(f"the embedded server in {PRIVATE_HOME} kept max_connections "
                           f"{row and row[0]} (another process holds it open?)")
    return admin


@contextmanager
def fleet_database(url: str, workers: int) -> Iterator[tuple[str, str]]:
    """(a migrated scratch database URL, which server) with room for `workers` workers."""
    if _room(url) >= workers * CONNECTIONS_PER_WORKER_ROOM + 20:
        yield url, "DATABASE_URL's" if os.environ.get("DATABASE_URL") else "embedded"
        return
    admin = _private_admin_url()
    name = f"bench_fleet_{uuid.uuid4().hex[:8]}"
    create_database_if_missing(admin, name)
    db = psycopg.conninfo.make_conninfo(admin, dbname=name)
    try:
        asyncio.run(migrate(db))
        yield db, f"private embedded (max_connections {PRIVATE_MAX_CONNECTIONS})"
    finally:
        drop_database(admin, name)


def fake_cpu_s() -> float:
    """CPU seconds of the fake Sume (this process's child running `fake-sume`)."""
    total = 0.0
    for child in psutil.Process().children(recursive=True):
        try:
            if "fake-sume" in child.cmdline():
                t = child.cpu_times()
                total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def machine_busy() -> tuple[float, float]:
    """(busy CPU seconds, all CPU seconds) of the whole machine so far, every core."""
    t = psutil.cpu_times()
    idle = t.idle + getattr(t, "iowait", 0.0)
    return sum(t) - idle, sum(t)


def server_cpu_s(url: str) -> float:
    """CPU seconds of this database's server so far: the postmaster, its live children and
    the children it has reaped (exited backends)."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        postmaster = psutil.Process(int(row[0])).parent()
    assert postmaster is not None
    t = postmaster.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in postmaster.children():
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except psutil.NoSuchProcess:
            pass
    return total


# -- the workers ---------------------------------------------------------------------------
class Fleet:
    """`n` default `vidpoll worker` processes, --log-level info, stderr to files."""

    def __init__(self, url: str, base: str, n: int, logs: Path, tag: str) -> None:
        self.logs = [logs / f"{tag}-{i}.log" for i in range(n)]
        env = env_for(url, base)
        self.procs = []
        for path in self.logs:
            with path.open("wb") as err:
                self.procs.append(subprocess.Popen(
                    [sys.executable, "-m", "vidpoll.cli", "--log-level", "info", "worker"],
                    env=env, stdout=subprocess.DEVNULL, stderr=err))

    def ids(self) -> list[str | None]:
        out: list[str | None] = []
        for path in self.logs:
            m = STARTED.search(path.read_text(errors="replace"))
            out.append(m.group(1) if m else None)
        return out

    def wait_started(self, within_s: float) -> list[str]:
        deadline = time.monotonic() + within_s
        while None in (ids := self.ids()):
            for p, path in zip(self.procs, self.logs, strict=True):
                if p.poll() is not None:
                    raise RuntimeError(f"a worker exited with {p.returncode}: "
                                       f"{path.read_text(errors='replace')[-2000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{ids.count(None)} workers never logged 'started'")
            time.sleep(0.2)
        return [i for i in ids if i is not None]

    def cpu_s(self) -> float:
        total = 0.0
        for p in self.procs:
            t = psutil.Process(p.pid).cpu_times()
            total += t.user + t.system
        return total

    def stop(self) -> list[dict[str, Any]]:
        """SIGTERM all, wait, and parse each one's `stopped:` line (None: not logged)."""
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        return [stopped_counters(path.read_text(errors="replace")) for path in self.logs]


def stopped_counters(log: str) -> dict[str, Any]:
    """The integer key=value pairs of a worker's last `stopped:` line; absent keys: None."""
    found: dict[str, Any] = dict.fromkeys(COUNTERS)
    lines = [m for line in log.splitlines() if (m := STOPPED.search(line))]
    if lines:
        for key, value in re.findall(r"\b(\w+)=(-?\d+)\b", lines[-1].group(2)):
            found[key] = int(value)
    found["logged_stop"] = bool(lines)
    return found


def app_name(worker_id: str) -> str:
    return f"vidpoll {worker_id}".encode()[:63].decode(errors="ignore")


def spread(values: list[int | None]) -> dict[str, Any] | str:
    known = [v for v in values if v is not None]
    if not known or len(known) < len(values):
        return "n/a"
    return {"min": min(known), "median": statistics.median(known), "max": max(known),
            "total": sum(known)}


# -- phases ----------------------------------------------------------------------------------
def _insert_due(obs: Observer, prefix: str, n: int) -> None:
    obs.rows("INSERT INTO video_jobs (job_id, next_poll_at) SELECT %s || g, now() "
             "FROM generate_series(1, %s) g", (prefix, n))


def _reads(base: str) -> int:
    return int(fake_stats(base)["reads"])


def _wait_reads(base: str, at_least: int, within_s: float) -> float:
    deadline = time.monotonic() + within_s
    while (n := _reads(base)) < at_least:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the fake answered {n} reads, never {at_least}")
        time.sleep(0.02)
    return time.monotonic()


def idle_phase(obs: Observer, fleet: Fleet, ids: list[str], window: float) -> dict[str, Any]:
    names = [app_name(i) for i in ids]
    x0, s0 = obs.transactions()
    t0 = time.monotonic()
    peaks: dict[str, int] = {}
    while time.monotonic() < t0 + window:
        time.sleep(min(10.0, max(0.0, t0 + window - time.monotonic())))
        for name, n in obs.connections().items():
            peaks[name] = max(peaks.get(name, 0), n)
    x1, s1 = obs.transactions()
    lived = time.monotonic() - t0
    own = s1 - s0
    n = x1 - x0 - own
    per = [peaks.get(name, 0) for name in names]
    return {"window_s": round(lived, 1), "transactions": n, "observer_transactions": own,
            "transactions_per_s": round(n / lived, 2),
            "transactions_per_worker_per_30s": round(n / lived * 30 / len(ids), 2),
            "target_per_worker_per_30s": 6,
            "connections_total": sum(per),
            "connections_per_worker": {"min": min(per), "median": statistics.median(per),
                                       "max": max(per), "mean": round(sum(per) / len(per), 2)},
            "target_connections_per_worker": 4,
            "unknown_vidpoll_connections": sum(v for k, v in peaks.items() if k not in names)}


def trickle_phase(obs: Observer, base: str, idle_per_s: float, inserts: int) -> dict[str, Any]:
    """One row at a time into the idle fleet: transactions each NOTIFY causes (beyond the idle
    rate) and insert-to-read latency."""
    fake_config(base, next_poll_after_s=3600.0)  # read once, then quiet for the phase
    caused, latencies = [], []
    for i in range(inserts):
        r0 = _reads(base)
        x0, s0 = obs.transactions()
        t0 = time.monotonic()
        _insert_due(obs, f"t{i}-", 1)
        read_at = _wait_reads(base, r0 + 1, 30)
        latencies.append((read_at - t0) * 1000)
        time.sleep(3.0)  # the woken workers' statements end and their statistics land (~1 s)
        x1, s1 = obs.transactions()
        lived = time.monotonic() - t0
        caused.append(x1 - x0 - (s1 - s0) - idle_per_s * lived)
    return {"inserts": inserts, "notifies": inserts,
            "transactions_per_notify": {"mean": round(statistics.mean(caused), 1),
                                        "min": round(min(caused), 1),
                                        "max": round(max(caused), 1)},
            "insert_to_read_ms": {"median": round(statistics.median(latencies), 1),
                                  "max": round(max(latencies), 1)}}


def load_window(obs: Observer, base: str, url: str, fleet: Fleet, warmup: float,
                window: float, names: list[str]) -> dict[str, Any]:
    time.sleep(warmup)
    r0, t0 = _reads(base), time.monotonic()
    x0, s0 = obs.transactions()
    c0, w0, f0, m0 = server_cpu_s(url), fleet.cpu_s(), fake_cpu_s(), machine_busy()
    peaks: dict[str, int] = {}
    while time.monotonic() < t0 + window:
        time.sleep(min(5.0, max(0.0, t0 + window - time.monotonic())))
        for name, n in obs.connections().items():
            peaks[name] = max(peaks.get(name, 0), n)
    r1, t1 = _reads(base), time.monotonic()
    x1, s1 = obs.transactions()
    c1, w1, f1, m1 = server_cpu_s(url), fleet.cpu_s(), fake_cpu_s(), machine_busy()
    reads = r1 - r0
    per = [peaks.get(name, 0) for name in names]
    return {"window_s": round(t1 - t0, 1), "reads": reads,
            "reads_per_s": round(reads / (t1 - t0), 1),
            "transactions_per_s": round((x1 - x0 - (s1 - s0)) / (t1 - t0), 1),
            "transactions_per_read": round((x1 - x0 - (s1 - s0)) / max(reads, 1), 3),
            "postgres_cpu_s_per_1000_reads": round((c1 - c0) / max(reads, 1) * 1000, 3),
            "workers_cpu_s_per_1000_reads": round((w1 - w0) / max(reads, 1) * 1000, 3),
            # cores busy over the window: the machine's (other agents' work included), and
            # the share of it that PostgreSQL, the workers and the fake took
            "machine_cores_busy": round((m1[0] - m0[0]) / (t1 - t0), 2),
            "machine_busy_share": round((m1[0] - m0[0]) / max(m1[1] - m0[1], 1e-9), 3),
            "postgres_cores": round((c1 - c0) / (t1 - t0), 2),
            "workers_cores": round((w1 - w0) / (t1 - t0), 2),
            "fake_cores": round((f1 - f0) / (t1 - t0), 2),
            "connections_total": sum(per),
            "connections_per_worker_max": max(per)}


def fleet(url: str, quick: bool, workers: int = FLEET, latency_ms: float = 1000.0,
          jobs: int = JOBS) -> dict[str, Any]:
    idle_window, inserts, warmup, window = (20.0, 5, 5.0, 10.0) if quick else (60.0, 10, 5.0,
                                                                               30.0)
    out: dict[str, Any] = {"scenario": "fleet", "workers": workers, "jobs": jobs,
                           "fake_latency_ms": latency_ms, "fake_jitter": 0.3,
                           "hint_s": 1.0, "worker_settings": "default (50 reads in flight)",
                           "ideal_fleet_reads_per_s": round(workers * 50 / (latency_ms / 1000))}
    with fleet_database(url, workers) as (db, server), \
            fake_sume(latency_ms, next_poll_after=1.0) as base, \
            tempfile.TemporaryDirectory(prefix="vidpoll-fleet-") as tmp:
        out["server"] = server
        # the server's whole process tree: on a shared server, other databases' work too
        out["postgres_cpu_is_whole_server"] = not server.startswith("private")
        obs = Observer(db)
        out["postgres"] = obs.rows("SHOW server_version")[0][0]
        obs.rows("TRUNCATE video_jobs, video_job_events, vidpoll_minutes")
        crowd = Fleet(db, base, workers, Path(tmp), "fleet")
        try:
            ids = crowd.wait_started(180)
            time.sleep(15)  # start-up: migration check, pools, LISTEN, first probes
            out["idle"] = idle_phase(obs, crowd, ids, idle_window)
            out["trickle"] = trickle_phase(obs, base, out["idle"]["transactions_per_s"],
                                           inserts)
            fake_config(base, next_poll_after_s=1.0)
            r0, t0 = _reads(base), time.monotonic()
            _insert_due(obs, "f", jobs)
            out["load_first_read_ms"] = round((_wait_reads(base, r0 + 1, 60) - t0) * 1000, 1)
            out["load"] = load_window(obs, base, db, crowd, warmup, window,
                                      [app_name(i) for i in ids])
        finally:
            counters = crowd.stop()
        notifies = inserts + 1  # the trickle's single rows and the load's one INSERT
        out["per_worker"] = {
            "logged_stop": sum(c["logged_stop"] for c in counters),
            **{key: spread([c[key] for c in counters]) for key in COUNTERS}}
        wakes = [c["notify_wakeups"] for c in counters]
        empty = [c["empty_notify_wakeups"] for c in counters]
        if None in wakes or None in empty:
            out["notify"] = {"notifies": notifies, "wakeups_per_notify": "n/a",
                             "empty_wakeups_per_notify": "n/a"}
        else:
            out["notify"] = {"notifies": notifies,
                             "wakeups_per_notify": round(sum(wakes) / notifies, 2),
                             "empty_wakeups_per_notify": round(sum(empty) / notifies, 2)}

        # the same rows, one default worker, same fake, same server
        obs.rows("TRUNCATE video_jobs, video_job_events, vidpoll_minutes")
        one = Fleet(db, base, 1, Path(tmp), "one")
        try:
            one_ids = one.wait_started(60)
            time.sleep(5)
            _insert_due(obs, "s", jobs)
            out["one_worker"] = load_window(obs, base, db, one, warmup, window,
                                            [app_name(i) for i in one_ids])
        finally:
            out["one_worker"]["stopped"] = one.stop()[0]
    fleet_rate, one_rate = out["load"]["reads_per_s"], out["one_worker"]["reads_per_s"]
    out["fleet_vs_20x_one"] = round(fleet_rate / (workers * one_rate), 3) if one_rate else None
    print(summary(out), file=sys.stderr, flush=True)
    return out


def summary(r: dict[str, Any]) -> str:
    i, t, ld, one = r["idle"], r["trickle"], r["load"], r["one_worker"]
    pw = r["per_worker"]
    return "\n".join([
        f"fleet of {r['workers']} default workers on {r['server']} PostgreSQL {r['postgres']}",
        f"  idle {i['window_s']} s: {i['transactions_per_s']} transactions/s in total, "
        f"{i['transactions_per_worker_per_30s']} per worker per 30 s (target 6); "
        f"connections {i['connections_total']} in total, per worker "
        f"{i['connections_per_worker']} (target 4)",
        f"  single-row NOTIFY into the idle fleet: {t['transactions_per_notify']} transactions "
        f"each beyond the idle rate; insert to read {t['insert_to_read_ms']} ms",
        f"  {r['jobs']} due at once: fleet {ld['reads_per_s']} reads/s vs one worker "
        f"{one['reads_per_s']} reads/s: fleet / ({r['workers']} x one) = "
        f"{r['fleet_vs_20x_one']} (ideal fleet {r['ideal_fleet_reads_per_s']}); "
        f"connections under load {ld['connections_total']} (max {ld['connections_per_worker_max']}"
        f" a worker); PostgreSQL CPU {ld['postgres_cpu_s_per_1000_reads']} s per 1,000 reads",
        f"  cores busy under load: machine {ld['machine_cores_busy']} of {os.cpu_count()} "
        f"(PostgreSQL {ld['postgres_cores']}, workers {ld['workers_cores']}, fake "
        f"{ld['fake_cores']}); one worker alone: machine {one['machine_cores_busy']}",
        f"  per-worker reads {pw['reads']}; claims {pw['claims']}",
        f"  NOTIFY: {r['notify']}"])


def main() -> None:
    from scratch_db import scratch_database

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--workers", type=int, default=FLEET)
    p.add_argument("--latency-ms", type=float, default=1000.0)
    p.add_argument("--jobs", type=int, default=JOBS)
    args = p.parse_args()
    started = time.monotonic()
    with scratch_database() as url:
        asyncio.run(migrate(url))
        result = fleet(url, args.quick, args.workers, args.latency_ms, args.jobs)
    result.update(quick=args.quick, took_s=round(time.monotonic() - started, 1),
                  machine={"cpus": os.cpu_count(), "python": sys.version.split()[0]})
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
