"""What a worker adds around each HTTP call (issue 31, item 5): variants measured side by side,
interleaved over several rounds against one fake Sume that answers at once (saturation), on
one scratch database. Reports each variant's median reads/s and spread, and, per round, the
ratio of each vidpoll variant to the bare client on the same event loop.

    DATABASE_URL=... .venv/bin/python bench/read_cost.py --rounds 5 --window 15 \\
        bare:asyncio vidpoll:asyncio bare:uvloop vidpoll:uvloop pgqueuer

A variant is KIND[:LOOP[:SRC[:ARGS]]]:
- `bare`: bench/bare_client.py (no database), at the same concurrency;
- `vidpoll`: `vidpoll worker --poll-only --no-fetch-results` (suite.spawn_vidpoll's flags);
  `vidpollN`: the same with `--processes N` (N children of one supervisor, each with its own
  --concurrency and --db-connections);
- `pgqueuer`: bench/peer_pgqueuer.py as bench/peers.py runs it (uvloop, its own settings);
- LOOP: asyncio (default) or uvloop (VIDPOLL_EVENT_LOOP for vidpoll);
- SRC: another source tree (its `src` put first on PYTHONPATH), to measure a proposed change
  to files the variant would otherwise take from this checkout;
- ARGS: more `vidpoll worker` arguments, comma-separated (`--batch-size=200`).

Per measurement: reads/s is the fake's own count over the window after a warm-up; CPU is
psutil's, of the process and its children, over the window, per read; transactions per read
are pg_stat_database's over the worker's whole life (as suite.saturation). One JSON line per
measurement on stdout (and --out), then a summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import psycopg
from scratch_db import scratch_database
from suite import (
    DB_CONNECTIONS,
    HERE,
    KEY,
    db_transactions,
    env_for,
    fake_stats,
    fake_sume,
    load_backlog,
    postgres_cpu_s,
    stop,
)

from vidpoll.store import migrate

CONCURRENCY = 200


def tree_cpu_s(pid: int) -> float:
    """CPU seconds of a process and its live children so far."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += t.user + t.system
    return total


def fake_pid(base: str) -> int:
    """The fake Sume's process (suite.fake_sume does not hand it out): its CPU per read says
    how much of the two cores the fake itself takes."""
    port = base.rsplit(":", 1)[1]
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "fake-sume" in cmd and port in cmd:
            return p.pid
    raise RuntimeError("the fake Sume's process was not found")


def parse(spec: str) -> dict[str, Any]:
    kind, _, rest = spec.partition(":")
    loop, _, rest = rest.partition(":")
    src, _, extra = rest.partition(":")
    processes = 0
    if kind.startswith("vidpoll") and kind != "vidpoll":
        processes = int(kind.removeprefix("vidpoll"))
    return {"spec": spec, "kind": "vidpoll" if kind.startswith("vidpoll") else kind,
            "processes": processes, "loop": loop or ("uvloop" if kind == "pgqueuer"
                                                     else "asyncio"), "src": src or None,
            "args": [a for a in extra.split(",") if a]}


def spawn(variant: dict[str, Any], url: str, base: str, jobs: int, seconds: float
          ) -> subprocess.Popen[bytes]:
    env = env_for(url, base)
    if variant["src"]:
        env["PYTHONPATH"] = str(Path(variant["src"]) / "src")
    if variant["kind"] == "bare":
        return subprocess.Popen([sys.executable, str(HERE / "bare_client.py"), base, KEY,
                                 str(CONCURRENCY), str(seconds), str(jobs), variant["loop"]],
                                env=env)
    env["VIDPOLL_EVENT_LOOP"] = variant["loop"]
    extra = ["--processes", str(variant["processes"])] if variant["processes"] else []
    extra += variant["args"]
    return subprocess.Popen(
        [sys.executable, "-m", "vidpoll.cli", "--log-level", "WARNING", "worker", "--poll-only",
         "--no-fetch-results", "--concurrency", str(CONCURRENCY), "--db-connections",
         str(DB_CONNECTIONS), *extra], env=env, stderr=subprocess.DEVNULL)


def measure(variant: dict[str, Any], url: str, base: str, jobs: int, warmup: float,
            window: float, fake: int) -> dict[str, Any]:
    if variant["kind"] == "pgqueuer":
        import peers

        got = peers._measure("pgqueuer", url, base, jobs, window,
                             peers.SETTINGS["pgqueuer"])
        return {"reads_per_s": got["reads_per_s"], "tx_per_read": got["cost_per_poll"],
                "cpu_ms_per_read": got["cpu_s_per_1000"]}
    if variant["kind"] == "vidpoll":
        load_backlog(url, jobs)
        x0 = db_transactions(url)
    life0 = fake_stats(base)["reads"]
    proc = spawn(variant, url, base, jobs, warmup + window + 1)
    time.sleep(warmup)
    r0, t0, c0, p0 = fake_stats(base)["reads"], time.monotonic(), tree_cpu_s(proc.pid), \
        postgres_cpu_s()
    f0 = tree_cpu_s(fake)
    psutil.cpu_percent(None)  # the machine's busy cores over the window, from here
    time.sleep(window)
    r1, t1, c1, p1 = fake_stats(base)["reads"], time.monotonic(), tree_cpu_s(proc.pid), \
        postgres_cpu_s()
    f1 = tree_cpu_s(fake)
    reads = r1 - r0
    out: dict[str, Any] = {"reads_per_s": round(reads / (t1 - t0), 1),
                           "cpu_ms_per_read": round((c1 - c0) / max(1, reads) * 1000, 4),
                           "fake_cpu_ms_per_read": round((f1 - f0) / max(1, reads) * 1000, 4),
                           "cores_busy": round(psutil.cpu_percent(None) / 100 * (
                               os.cpu_count() or 1), 2)}
    if variant["kind"] == "bare":
        proc.wait(60)
        return out
    died = proc.poll() is not None
    stop([proc])
    if died:
        raise RuntimeError(f"{variant['spec']}: the worker exited early ({proc.returncode})")
    life1 = fake_stats(base)["reads"]
    x1 = db_transactions(url)
    out["tx_per_read"] = round((x1 - x0 - 2) / max(1, life1 - life0), 4)
    out["pg_cpu_ms_per_read"] = round((p1 - p0) / max(1, reads) * 1000, 4)
    return out


def summarize(results: list[dict[str, Any]], variants: list[dict[str, Any]],
              rounds: int) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for v in variants:
        mine = [r for r in results if r["spec"] == v["spec"]]
        rates = [r["reads_per_s"] for r in mine]
        entry: dict[str, Any] = {"median_reads_per_s": round(statistics.median(rates), 1),
                                 "min": min(rates), "max": max(rates),
                                 "median_cpu_ms_per_read": round(statistics.median(
                                     r["cpu_ms_per_read"] for r in mine), 4)}
        if "tx_per_read" in mine[0]:
            entry["median_tx_per_read"] = round(statistics.median(
                r["tx_per_read"] for r in mine), 4)
        # per round, against the bare client of the same round on the same loop
        bare = {r["round"]: r["reads_per_s"] for r in results
                if r["spec"].startswith("bare") and parse(r["spec"])["loop"] == v["loop"]}
        ratios = [r["reads_per_s"] / bare[r["round"]] for r in mine if r["round"] in bare]
        if v["kind"] != "bare" and ratios:
            entry["share_of_bare_same_loop"] = {
                "median": round(statistics.median(ratios), 3),
                "min": round(min(ratios), 3), "max": round(max(ratios), 3)}
        pgq = {r["round"]: r["reads_per_s"] for r in results if r["spec"] == "pgqueuer"}
        vs_pgq = [r["reads_per_s"] / pgq[r["round"]] for r in mine if r["round"] in pgq]
        if v["kind"] == "vidpoll" and vs_pgq:
            entry["ratio_vs_pgqueuer"] = {"median": round(statistics.median(vs_pgq), 2),
                                          "min": round(min(vs_pgq), 2),
                                          "max": round(max(vs_pgq), 2)}
        summary[v["spec"]] = entry
    return summary


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("variants", nargs="+")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--window", type=float, default=15.0)
    p.add_argument("--warmup", type=float, default=4.0)
    p.add_argument("--jobs", type=int, default=5000)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    variants = [parse(s) for s in args.variants]
    results: list[dict[str, Any]] = []

    def emit(line: dict[str, Any]) -> None:
        text = json.dumps(line)
        print(text, flush=True)
        if args.out:
            with args.out.open("a") as f:
                f.write(text + "\n")

    with scratch_database() as url:
        asyncio.run(migrate(url))
        with psycopg.connect(url) as conn:
            server = conn.info.parameter_status("server_version") or "?"
        with fake_sume(0, jitter=0) as base:
            fake = fake_pid(base)
            for rnd in range(args.rounds):
                # a different variant first each round: no variant always follows another
                order = variants[rnd % len(variants):] + variants[:rnd % len(variants)]
                for v in order:
                    got = measure(v, url, base, args.jobs, args.warmup, args.window, fake)
                    got.update(spec=v["spec"], round=rnd, load_avg=round(os.getloadavg()[0], 2))
                    results.append(got)
                    emit(got)
    emit({"summary": summarize(results, variants, args.rounds), "rounds": args.rounds,
          "window_s": args.window, "concurrency": CONCURRENCY, "jobs": args.jobs,
          "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0],
                      "postgres": server}})


if __name__ == "__main__":
    main()
