"""PNG plots of a benchmark run, from the JSON lines `bench/suite.py --out FILE` wrote (the
last line of each scenario wins), into docs/:

    .venv/bin/python bench/plots.py bench/results.jsonl

bench-throughput.png   reads/s against concurrency at 100 ms (ideal, bare client, vidpoll,
                       the peers at their one concurrency)
bench-lateness.png     the distribution of lateness at each backlog
bench-bloat.png        table + index size while 1M polls run over 10k live jobs
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

DOCS = Path(__file__).resolve().parent.parent / "docs"


def latest(path: Path) -> dict[str, dict[str, Any]]:
    runs: dict[str, dict[str, Any]] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            run = json.loads(line)
            runs[run["scenario"]] = run
    return runs


def throughput(runs: dict[str, dict[str, Any]]) -> Path | None:
    run = runs.get("throughput")
    if not run:
        return None
    curve = run["curve"]
    xs = [p["concurrency"] for p in curve]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(xs, [p["ideal_reads_per_s"] for p in curve], "k--",
            label="ideal (concurrency ÷ 0.1 s)")
    ax.plot(xs, [p["bare_client_reads_per_s"] for p in curve], "s-",
            label="bare aiohttp client, no DB")
    ax.plot(xs, [p["vidpoll_reads_per_s"] for p in curve], "o-", label="vidpoll worker")
    peers = runs.get("peers", {}).get("latency_100ms", {})
    for name, marker in (("pgqueuer", "^"), ("procrastinate", "v"), ("arq", "D")):
        rate = peers.get(f"{name}_reads_per_s")
        if rate:
            ax.plot([peers.get("concurrency", 200)], [rate], marker, markersize=9,
                    label=f"{name} (re-enqueue per poll)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("concurrent reads")
    ax.set_ylabel("status reads per second")
    ax.set_title("Throughput at 100 ms ± 30 % answers (one worker, 4 PG connections)")
    return save(fig, ax, "bench-throughput.png")


def lateness(runs: dict[str, dict[str, Any]]) -> Path | None:
    run = runs.get("lateness")
    if not run or "percentiles_ms" not in run["curve"][0]:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for point in run["curve"]:
        qs = point["percentiles_ms"]
        ax.plot([float(q) for q in qs], [max(v, 0.1) for v in qs.values()], "o-",
                label=f"{point['active_jobs']:,} active jobs ({point['reads_per_s']:,.0f} reads/s)")
    ax.axhline(100, color="k", linestyle="--", linewidth=1, label="target p99 at light load")
    ax.set_yscale("log")
    ax.set_xlabel("percentile")
    ax.set_ylabel("read start - next_poll_at (ms)")
    ax.set_title("Lateness (hint 1 s, 100 ms answers, concurrency 200)")
    return save(fig, ax, "bench-lateness.png")


def bloat(runs: dict[str, dict[str, Any]]) -> Path | None:
    run = runs.get("bloat")
    if not run or not run.get("samples"):
        return None
    samples = run["samples"]
    fresh = run["fresh"]["total"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot([s["reads"] for s in samples], [s["total"] / fresh for s in samples], "-",
            label="video_jobs, table + indexes")
    ax.axhline(run.get("target_ratio", 3.0), color="k", linestyle="--", linewidth=1,
               label="target: 3 x the fresh size")
    ax.set_xlabel("status reads so far")
    ax.set_ylabel("size ÷ fresh size")
    ax.set_ylim(bottom=0)
    ax.set_title(f"Bloat: {run['live_jobs']:,} live jobs, shipped settings (workers vacuum)")
    return save(fig, ax, "bench-bloat.png")


def save(fig: Any, ax: Any, name: str) -> Path:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = DOCS / name
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    runs = latest(Path(sys.argv[1] if len(sys.argv) > 1 else "bench/results.jsonl"))
    for plot in (throughput, lateness, bloat):
        out = plot(runs)
        print(f"{plot.__name__}: {out or 'no data in this file'}")


if __name__ == "__main__":
    main()
