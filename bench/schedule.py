"""The learned poll schedule measured (issue 31, item 4): detection delay and reads per job.

Two parts, one JSON line each per model (`--out FILE` appends them) and Markdown tables:

    .venv/bin/python bench/schedule.py              # both (about 15 minutes)
    .venv/bin/python bench/schedule.py --quick      # both, a short real run (a few minutes)
    .venv/bin/python bench/schedule.py --only model # the model alone (seconds)

1. **model** (exact, full time scale, no I/O): per model of render times (log-normal, see
   MODELS), a history of 1,000 renders gives `durations_from_samples` -> `plan` at each
   target; 20,000 fresh renders of the same distribution are then read by
   (a) today's fixed 15 s (first read at 15 s, as the seed's `add_job`),
   (b) the fixed interval whose reads per job equal the learned schedule's,
   (b') the longest fixed interval whose p95 is no worse than the learned schedule's,
   (c) Replicate's SDK default, a read every 0.5 s (replicate-python `client.py`:
       `REPLICATE_POLL_INTERVAL`, default "0.5"),
   (d) the learned schedule, and
   (e) the oracle: one read at the end.
   Beside them the ideal bound (`schedule_ideal.py`: the fewest mean reads per job any
   schedule can take at that p95 on the true distribution, by dynamic programming), and the
   target ratios. Detection delay = the read that sees the end - the end.
2. **run** (`schedule_run.py`): real workers, a real PostgreSQL, the fake Replicate over
   HTTP, accounts with fixed and learned schedules side by side; time scaled down.
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from schedule_ideal import Ideal, LogNormal, ideal, ideal_p95_at_reads

from vidpoll.schedule import durations_from_samples, evaluate, fixed_reads, plan

TODAY_S = 15.0
"""Today's fixed interval (and the first read of every job)."""
SDK_S = 0.5
"""Replicate's Python SDK polls every 0.5 s unless REPLICATE_POLL_INTERVAL says otherwise."""
HISTORY = 1000
FRESH = 20_000
TARGETS = (5.0, 14.0)
"""The default target (`detect_p95_s` = 5) and one giving no worse p95 than today's 15 s
(whose p95 is 0.95 x 15 = 14.25 s)."""
FLOOR_S = 1.0
"""The worker's default floor (PollPolicy.min_poll_s); Replicate documents none."""


@dataclass(frozen=True)
class Model:
    """A model's render times: log-normal, `median_s` and `sigma` (of the log)."""

    name: str
    median_s: float
    sigma: float


MODELS = (
    Model("short-40s", 40.0, 0.35),
    Model("mid-90s", 90.0, 0.30),
    Model("long-240s", 240.0, 0.25),
    Model("wide-90s", 90.0, 0.60),
)
"""Why these sigmas: renders of one model at one duration key vary by the queue wait before
the GPU starts and by load on it; sigma 0.25-0.35 means 80 % of renders end within x0.64 to
x1.57 (0.35) or x0.73 to x1.38 (0.25) of the median, a 90 s model between 58 s and 141 s. The
short model gets the widest of the three (a fixed queue wait weighs more on a short render).
These are assumptions, not measurements of a provider. `wide-90s` (sigma 0.6: x0.46 to x2.16)
is a group whose key misses what drives the time (mixed resolutions or frame counts, cold
boots): the case where the targets cannot be met."""
SWEEP_SIGMAS = (0.10, 0.15, 0.20, 0.25, 0.30, 0.35, 0.45, 0.60)


@dataclass(frozen=True)
class Figures:
    """How a schedule did on the fresh renders."""

    reads: float
    """Mean reads per job."""
    p50_s: float
    p95_s: float
    interval_s: float | None = None
    """For the fixed schedules: the interval."""


def lognormal(model: Model, n: int, seed: int) -> list[float]:
    """`n` render times of the model (seeded)."""
    rng = random.Random(seed)
    return [model.median_s * math.exp(rng.gauss(0.0, model.sigma)) for _ in range(n)]


def measure(reads: Sequence[float], ends: Sequence[float], fallback_s: float) -> Figures:
    """Mean reads, p50 and p95 detection delay: `schedule.evaluate`'s rules (the p95 is
    checked against it), the p50 read from the same delays."""
    counts = 0
    delays: list[float] = []
    last = reads[-1] if reads else 0.0
    for end in ends:
        i = bisect.bisect_left(reads, end)
        if i < len(reads):
            counts += i + 1
            delays.append(reads[i] - end)
        else:
            k = max(1, math.ceil((end - last) / fallback_s))
            counts += len(reads) + k
            delays.append(last + k * fallback_s - end)
    delays.sort()
    mean, p95 = counts / len(ends), delays[min(len(delays) - 1, int(0.95 * len(delays)))]
    check = evaluate(reads, ends, fallback_s)
    assert math.isclose(check[0], mean) and math.isclose(check[1], p95), (check, mean, p95)
    return Figures(mean, delays[len(delays) // 2], p95)


def fixed(interval_s: float, ends: Sequence[float], first_s: float | None = None) -> Figures:
    """A read every `interval_s` from `first_s` (default: the interval)."""
    first = interval_s if first_s is None else first_s
    f = measure(fixed_reads(interval_s, first, max(ends)), ends, interval_s)
    return Figures(f.reads, f.p50_s, f.p95_s, interval_s)


def fixed_at_reads(reads: float, ends: Sequence[float]) -> Figures:
    """The fixed interval whose mean reads per job equal `reads` (bisection: mean reads fall
    as the interval grows)."""
    lo, hi = 0.05, 10 * max(ends)
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if fixed(mid, ends).reads > reads:
            lo = mid
        else:
            hi = mid
    return fixed(hi, ends)


def fixed_at_p95(p95_s: float, ends: Sequence[float]) -> Figures:
    """The longest fixed interval whose p95 is no worse than `p95_s` (bisection, then a
    step back while the p95, not quite monotone in the interval, is over)."""
    lo, hi = 0.05, 10 * max(ends)
    for _ in range(60):
        mid = math.sqrt(lo * hi)
        if fixed(mid, ends).p95_s <= p95_s:
            lo = mid
        else:
            hi = mid
    f = fixed(lo, ends)
    while f.p95_s > p95_s:
        f = fixed(f.interval_s * 0.999, ends)  # type: ignore[operator]
    return f


def _ideal_figures(found: Ideal, ends: Sequence[float]) -> dict[str, Any]:
    on_fresh = measure(found.reads, ends, TODAY_S)
    return {"target_s": round(found.target_s, 3), "reads": round(found.expected_reads, 3),
            "reads_lower": round(found.reads_lower, 3), "missed": round(found.missed, 4),
            "first_read_s": round(found.reads[0], 1),
            "on_fresh": {k: round(v, 3) for k, v in asdict(on_fresh).items()
                         if v is not None}}


def model_case(model: Model, target_s: float, seed: int) -> dict[str, Any]:
    """One model at one target: every schedule on the same fresh renders."""
    history = durations_from_samples(lognormal(model, HISTORY, seed))
    ends = lognormal(model, FRESH, seed + 1)
    dist = LogNormal(model.median_s, model.sigma)
    horizon = dist.quantile(1 - 1e-7)
    learned_plan = plan(history, target_s=target_s, floor_s=FLOOR_S, fallback_s=TODAY_S,
                        first_read_s=TODAY_S)
    learned = measure(learned_plan.reads, ends, TODAY_S)
    # diagnostic: the same plan without the rule that the first read comes by 15 s
    no_cap = measure(plan(history, target_s=target_s, floor_s=FLOOR_S, fallback_s=TODAY_S,
                          first_read_s=math.inf).reads, ends, TODAY_S)
    today = fixed(TODAY_S, ends, TODAY_S)
    rows = {
        "a_fixed_15s": today,
        "b_fixed_equal_reads": fixed_at_reads(learned.reads, ends),
        "b2_fixed_equal_p95": fixed_at_p95(learned.p95_s, ends),
        "c_sdk_0.5s": fixed(SDK_S, ends),
        "d_learned": learned,
        "e_oracle": Figures(1.0, 0.0, 0.0),
    }
    at_target = ideal(dist.cdf, horizon, target_s)
    at_learned_p95 = ideal(dist.cdf, horizon, learned.p95_s)
    at_today_p95 = ideal(dist.cdf, horizon, today.p95_s)
    p95_at_reads = ideal_p95_at_reads(dist.cdf, horizon, learned.reads)
    b, b2 = rows["b_fixed_equal_reads"], rows["b2_fixed_equal_p95"]
    ratios = {
        # target 1: at equal reads per job, p95 <= half the fixed interval's
        "equal_reads_p95_ratio": learned.p95_s / b.p95_s,
        "equal_reads_p95_ratio_ideal": p95_at_reads.target_s / b.p95_s,
        # target 1': at equal p95, <= half the fixed interval's reads
        "equal_p95_reads_ratio": learned.reads / b2.reads,
        "equal_p95_reads_ratio_ideal": at_learned_p95.expected_reads / b2.reads,
        # target 2: against today, fewer reads (>= 3x on renders of 90 s and longer) at no
        # worse p95; on short renders no worse on either
        "today_reads_factor": today.reads / learned.reads,
        "today_reads_factor_ideal": today.reads / at_today_p95.expected_reads,
        "today_p95_no_worse": learned.p95_s <= today.p95_s,
    }
    return {
        "part": "model", "model": asdict(model), "target_s": target_s,
        "history_jobs": HISTORY, "fresh_renders": FRESH,
        "history": {"p10": round(history.p10, 1), "p50": round(history.p50, 1),
                    "p90": round(history.p90, 1), "longest": round(history.longest, 1)},
        "plan": {"reads_planned": len(learned_plan.reads),
                 "first_reads_s": [round(r, 1) for r in learned_plan.reads[:3]],
                 "expected_reads": round(learned_plan.expected_reads, 3),
                 "expected_p95_s": round(learned_plan.expected_p95_s, 3)},
        "rows": {k: {f: round(v, 3) for f, v in asdict(r).items() if v is not None}
                 for k, r in rows.items()},
        "learned_without_first_read_rule": {f: round(v, 3) for f, v in asdict(no_cap).items()
                                            if v is not None},
        "ideal_at_target": _ideal_figures(at_target, ends),
        "ideal_at_learned_p95": _ideal_figures(at_learned_p95, ends),
        "ideal_at_today_p95": _ideal_figures(at_today_p95, ends),
        "ideal_p95_at_learned_reads": _ideal_figures(p95_at_reads, ends),
        "ratios": {k: (round(v, 3) if isinstance(v, float) else v) for k, v in ratios.items()},
    }


def sweep(median_s: float, target_s: float, seed: int) -> list[dict[str, Any]]:
    """Where target 2 (>= 3x fewer reads than today at no worse p95) can be met: the
    learned schedule and the ideal against today, as the spread grows."""
    out = []
    for sigma in SWEEP_SIGMAS:
        m = Model(f"{median_s:g}s-sigma{sigma}", median_s, sigma)
        history = durations_from_samples(lognormal(m, HISTORY, seed))
        ends = lognormal(m, FRESH, seed + 1)
        dist = LogNormal(median_s, sigma)
        today = fixed(TODAY_S, ends, TODAY_S)
        learned = measure(plan(history, target_s=target_s, floor_s=FLOOR_S,
                               fallback_s=TODAY_S, first_read_s=TODAY_S).reads,
                          ends, TODAY_S)
        best = ideal(dist.cdf, dist.quantile(1 - 1e-7), today.p95_s)
        out.append({"part": "sweep", "median_s": median_s, "sigma": sigma,
                    "target_s": target_s, "today_reads": round(today.reads, 3),
                    "today_p95_s": round(today.p95_s, 3),
                    "learned_reads": round(learned.reads, 3),
                    "learned_p95_s": round(learned.p95_s, 3),
                    "ideal_reads": round(best.expected_reads, 3),
                    "learned_factor": round(today.reads / learned.reads, 3),
                    "ideal_factor": round(today.reads / best.expected_reads, 3)})
    return out


# -- printing ---------------------------------------------------------------------------------

LABELS = {
    "a_fixed_15s": "(a) fixed 15 s (today)",
    "b_fixed_equal_reads": "(b) fixed, equal reads",
    "b2_fixed_equal_p95": "(b') fixed, equal p95",
    "c_sdk_0.5s": "(c) fixed 0.5 s (Replicate SDK)",
    "d_learned": "(d) learned",
    "e_oracle": "(e) oracle",
}


def model_table(cases: list[dict[str, Any]]) -> str:
    """The (a)-(e) table of every model and target, with the ideal bound."""
    lines = ["| model | target | schedule | interval | reads/job | p50 delay | p95 delay |",
             "|---|---|---|---:|---:|---:|---:|"]
    for c in cases:
        m = c["model"]
        name = f"{m['name']} (median {m['median_s']:g} s, sigma {m['sigma']:g})"
        for key, label in LABELS.items():
            r = c["rows"][key]
            interval = f"{r['interval_s']:.2f} s" if "interval_s" in r else ""
            lines.append(f"| {name} | {c['target_s']:g} s | {label} | {interval} | "
                         f"{r['reads']:.2f} | {r['p50_s']:.2f} s | {r['p95_s']:.2f} s |")
            name = ""
        i = c["ideal_at_target"]
        lines.append(f"| | | ideal bound, p95 <= {c['target_s']:g} s | | {i['reads']:.2f} "
                     f"(>= {i['reads_lower']:.2f}) | {i['on_fresh']['p50_s']:.2f} s | "
                     f"{i['on_fresh']['p95_s']:.2f} s |")
    return "\n".join(lines)


def ratio_table(cases: list[dict[str, Any]]) -> str:
    """Each target's ratio beside what the ideal schedule reaches."""
    lines = ["| model | target | p95 vs (b), equal reads (<= 0.5) | reads vs (b'), equal p95 "
             "(<= 0.5) | fewer reads than today (>= 3x from 90 s; short: >= 1x) | p95 no "
             "worse than today |", "|---|---|---|---|---|---|"]
    for c in cases:
        r = c["ratios"]
        short = c["model"]["median_s"] < 90
        need = 1.0 if short else 3.0
        met1 = "met" if r["equal_reads_p95_ratio"] <= 0.5 else "not met"
        met2 = "met" if r["equal_p95_reads_ratio"] <= 0.5 else "not met"
        met3 = "met" if r["today_reads_factor"] >= need else "not met"
        lines.append(
            f"| {c['model']['name']} | {c['target_s']:g} s | {r['equal_reads_p95_ratio']:.2f} "
            f"{met1} (ideal {r['equal_reads_p95_ratio_ideal']:.2f}) | "
            f"{r['equal_p95_reads_ratio']:.2f} {met2} (ideal "
            f"{r['equal_p95_reads_ratio_ideal']:.2f}) | {r['today_reads_factor']:.2f}x {met3} "
            f"(ideal {r['today_reads_factor_ideal']:.2f}x) | "
            f"{'yes' if r['today_p95_no_worse'] else 'no'} "
            f"({c['rows']['d_learned']['p95_s']:.2f} vs {c['rows']['a_fixed_15s']['p95_s']:.2f}"
            f" s) |")
    return "\n".join(lines)


def sweep_table(rows: list[dict[str, Any]]) -> str:
    """Reads per job against today as the spread grows."""
    lines = ["| median | sigma | today: reads (p95) | learned 14 s: reads (p95) | factor | "
             "ideal at today's p95: reads | factor |", "|---:|---:|---|---|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['median_s']:g} s | {r['sigma']:g} | {r['today_reads']:.2f} "
                     f"({r['today_p95_s']:.2f} s) | {r['learned_reads']:.2f} "
                     f"({r['learned_p95_s']:.2f} s) | {r['learned_factor']:.2f}x | "
                     f"{r['ideal_reads']:.2f} | {r['ideal_factor']:.2f}x |")
    return "\n".join(lines)


def emit(record: dict[str, Any], out: Path | None) -> None:
    """One JSON line to stderr and to `out`, with a `scenario` of its own (bench/plots.py
    keeps the last line of each scenario of bench/results.jsonl)."""
    if "scenario" not in record:
        part = record["part"]
        what = {"model": lambda: f"{record['model']['name']}-{record['target_s']:g}s",
                "sweep": lambda: f"{record['median_s']:g}s-sigma{record['sigma']:g}",
                "run": lambda: f"{record['account']}-{record['model']}"}[part]()
        record = {"scenario": f"schedule-{part}-{what}", **record}
    line = json.dumps(record)
    print(line, file=sys.stderr)
    if out is not None:
        with out.open("a") as f:
            f.write(line + "\n")


def run_model(out: Path | None, quick: bool) -> None:
    """Part 1: every model at every target, then the spread sweep."""
    started = time.monotonic()
    cases = []
    for n, model in enumerate(MODELS):
        for target in TARGETS:
            case = model_case(model, target, seed=1000 * (n + 1))
            emit(case, out)
            cases.append(case)
    print("## Model (exact, full time scale)\n")
    print(model_table(cases))
    print()
    print(ratio_table(cases))
    print()
    if not quick:
        rows = [r for median in (90.0, 240.0) for r in sweep(median, 14.0, seed=77)]
        for r in rows:
            emit(r, out)
        print(sweep_table(rows))
        print()
    print(f"(model part: {time.monotonic() - started:.0f} s)\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="A short real run (a few minutes).")
    p.add_argument("--only", choices=("model", "run"))
    p.add_argument("--out", type=Path, help="Append each JSON line here too.")
    args = p.parse_args()
    if args.only in (None, "model"):
        run_model(args.out, args.quick)
    if args.only in (None, "run"):
        from schedule_run import main as run_main
        run_main(args.out, args.quick)


if __name__ == "__main__":
    main()
