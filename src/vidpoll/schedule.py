"""The learned poll schedule: when to read a job whose provider gives no hint (pure).

A provider that says nothing about when to look again (Replicate, fal, Veo, Runway, Luma,
Kling) is read every 15 s by default: a render that ended is seen 7.5 s late on average, and
a 3-minute one costs 12 reads. Render times cluster per provider and model, and the table
keeps thousands of them (`vidpoll_render_times`, summarised in `vidpoll_render_stats` as 51
quantiles per account, provider, model and duration key). From that distribution a `Plan`
places the reads: sparse while a render is unlikely to be done, one every `detect_p95_s`
where renders usually end, so that 95 % of ends are seen within `detect_p95_s` at the fewest
reads the history allows.

The plan is built once per summary and read by age (seconds since the create), so every
worker plans the same reads for the same job; `Step.reason` says why the next read is when
it is (`jobs show`). Past the oldest age the history covers, the fixed interval again.

How the reads are placed (`plan`): a render that ends between two reads t1 < t2 is seen at
t2, late by t2 - T; later than the target d only if it ended before t2 - d. So reads every d
from where renders start to end until they all have miss nobody.
The share allowed to be seen later than the target (5 % for a p95, planned at 3 %: the
history is a sample, and reads start a little late) is spent where it saves the most reads:
on the shortest renders (the first read waits until all but them could have ended, saving
reads for every job) and on the longest (reads stop once all but them have ended, the fixed
interval after that); `plan` tries a few splits between the two and keeps the fewest reads.
Reads are never closer together than the account's floor.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass

QUANTILE_STEPS = 50
"""The summary keeps the 0th, 2nd, …, 100th percentile of each group's render times."""
QUANTILE_POINTS = tuple(i / QUANTILE_STEPS for i in range(QUANTILE_STEPS + 1))
LEARN_AFTER_JOBS = 100
"""Finished jobs a group needs before its schedule is learned (fewer: the fixed interval)."""
HISTORY_JOBS = 1000
"""The newest finished jobs of a group that its distribution is drawn from."""
HISTORY_DAYS = 30
"""…ended within this many days."""
DEFAULT_DETECT_P95_S = 5.0
"""The detection delay a learned schedule aims at: 95 % of ends seen within it."""
DEFAULT_OVERDUE_FACTOR = 2.0
"""A job running longer than its group's p99 times this is overdue."""
PLANNED_MISS_SHARE = 0.03
"""The share of renders planned to be seen later than the target (the target is a p95: 5 %,
less a margin for a history that is a sample, and for reads that start a little late)."""
ANY_KEY = "*"
"""`duration_key` of a model's summary over every key."""


@dataclass(frozen=True, slots=True)
class Durations:
    """One group's render times: seconds from create to end, as quantiles."""

    account: str
    provider: str
    model: str
    duration_key: str
    jobs: int
    quantiles: tuple[float, ...]
    """`QUANTILE_STEPS + 1` non-decreasing values: quantiles[i] is the (i / STEPS) quantile."""

    def __post_init__(self) -> None:
        if len(self.quantiles) != QUANTILE_STEPS + 1:
            raise ValueError(f"{len(self.quantiles)} quantiles, not {QUANTILE_STEPS + 1}")
        if any(not math.isfinite(q) or q < 0 for q in self.quantiles):
            raise ValueError("quantiles must be finite and not negative")
        if any(b < a for a, b in zip(self.quantiles, self.quantiles[1:], strict=False)):
            raise ValueError("quantiles must not decrease")

    def quantile(self, p: float) -> float:
        """The render time below which a share `p` of renders ended (linear between points)."""
        p = min(1.0, max(0.0, p))
        x = p * QUANTILE_STEPS
        i = min(int(x), QUANTILE_STEPS - 1)
        lo, hi = self.quantiles[i], self.quantiles[i + 1]
        return lo + (hi - lo) * (x - i)

    def cdf(self, t: float) -> float:
        """The share of renders that ended by `t` seconds (the inverse of `quantile`)."""
        q = self.quantiles
        if t < q[0]:
            return 0.0
        if t >= q[-1]:
            return 1.0
        i = bisect.bisect_right(q, t) - 1  # q[i] <= t < q[i + 1]
        lo, hi = q[i], q[i + 1]
        frac = (t - lo) / (hi - lo) if hi > lo else 1.0
        return (i + frac) / QUANTILE_STEPS

    @property
    def p10(self) -> float:
        """10th percentile, seconds."""
        return self.quantile(0.10)

    @property
    def p50(self) -> float:
        """Median, seconds."""
        return self.quantile(0.50)

    @property
    def p90(self) -> float:
        """90th percentile, seconds."""
        return self.quantile(0.90)

    @property
    def p99(self) -> float:
        """99th percentile, seconds."""
        return self.quantile(0.99)

    @property
    def longest(self) -> float:
        """The longest render in the window: past it, the history says nothing."""
        return self.quantiles[-1]

    def shown(self) -> str:
        """`kling-v2 (key 5)` or `kling-v2`: the group as logs and `jobs show` name it."""
        name = self.model or "(no model)"
        if self.duration_key not in ("", ANY_KEY):
            name += f" (key {self.duration_key})"
        return name


def durations_from_samples(seconds: Sequence[float], *, account: str = "default",
                           provider: str = "", model: str = "",
                           duration_key: str = ANY_KEY) -> Durations:
    """The quantiles of `seconds` as the summary keeps them (PostgreSQL's percentile_cont)."""
    if not seconds:
        raise ValueError("no render times")
    s = sorted(float(x) for x in seconds)
    n = len(s)
    qs = []
    for p in QUANTILE_POINTS:
        x = p * (n - 1)
        i = int(x)
        j = min(i + 1, n - 1)
        qs.append(s[i] + (s[j] - s[i]) * (x - i))
    return Durations(account, provider, model, duration_key, n, tuple(qs))


@dataclass(frozen=True, slots=True)
class Step:
    """When to read next, and why (for `jobs show` and the row's `poll_reason`)."""

    delay_s: float
    reason: str


@dataclass(frozen=True, slots=True)
class Plan:
    """The reads of one group's jobs, as ages in seconds since the create."""

    durations: Durations
    reads: tuple[float, ...]
    target_s: float
    floor_s: float
    fallback_s: float
    expected_reads: float
    """Reads a job of this history takes on average (`evaluate`)."""
    expected_p95_s: float
    """The p95 detection delay over this history (`evaluate`)."""
    step_s: float = 0.0
    """The gap between dense reads: the target, or wider when the target costs too much."""

    def next_read(self, age_s: float) -> Step:
        """The read after one made at `age_s` seconds since the create."""
        d = self.durations
        i = bisect.bisect_right(self.reads, age_s + 1e-6)
        if i < len(self.reads):
            at = self.reads[i]
            delay = max(self.floor_s, at - age_s)
            dense = ("dense" if at - (self.reads[i - 1] if i else 0.0)
                     <= max(self.step_s, self.target_s) + 1e-6 else "sparse")
            return Step(delay, f"learned: read {i + 1} of {len(self.reads)} at age {at:.0f}s "
                               f"({dense}); {d.shown()} renders end p10 {d.p10:.0f}s, p50 "
                               f"{d.p50:.0f}s, p90 {d.p90:.0f}s ({d.jobs} jobs); aiming at "
                               f"{self.target_s:g}s p95 detection{self._short()}, "
                               f"~{self.expected_reads:.1f} reads a job")
        return Step(self.fallback_s,
                    f"fixed {self.fallback_s:g}s: age {age_s:.0f}s is past every {d.shown()} "
                    f"render in the history (longest {d.longest:.0f}s, {d.jobs} jobs)")

    def _short(self) -> str:
        """What a plan capped by the fixed interval's reads reaches instead of its target."""
        if self.expected_p95_s <= self.target_s * 1.05:
            return ""
        return (f" (reaching {self.expected_p95_s:.1f}s: more would cost over "
                f"{MAX_READS_VS_FIXED:g}x the reads of the fixed {self.fallback_s:g}s)")

    def first_read(self) -> Step:
        """The first read of a new job (from the create)."""
        return self.next_read(0.0)

    def overdue_after_s(self, factor: float) -> float:
        """Age past which a job of this group is overdue: its p99 times `factor`."""
        return self.durations.p99 * factor


def plan(durations: Durations, *, target_s: float = DEFAULT_DETECT_P95_S,
         floor_s: float = 1.0, fallback_s: float = 15.0, first_read_s: float = 15.0,
         miss_share: float = PLANNED_MISS_SHARE) -> Plan:
    """The fewest reads that see all but `miss_share` of this history's ends within
    `target_s`, none closer than `floor_s`; the first never later than `first_read_s` unless
    no render of the history ended that soon (then at the shortest one).

    Never more than `MAX_READS_VS_FIXED` times the reads a job takes, on this history, at
    the fixed interval (`fallback_s`, the first at `first_read_s`): where renders spread too
    widely for the target at that cost (a long tail of renders stuck for hours), the dense
    reads stop earlier and the fixed interval takes over; the plan's `expected_p95_s` then
    says what it reaches instead.
    """
    if not (target_s > 0 and math.isfinite(target_s)):
        raise ValueError("target_s must be a positive number")
    floor_s = max(0.05, floor_s)
    # a short history knows its tails poorly: fewer misses are planned on them, and none on
    # the longest renders until it is long enough (a thin tail ends the dense reads too soon)
    miss_share *= min(1.0, durations.jobs / CONFIDENT_JOBS)
    splits = RIGHT_SPLITS if durations.jobs >= CONFIDENT_JOBS else RIGHT_SPLITS[:1]
    probe = _probe_ends(durations)
    cap = max(first_read_s, durations.quantiles[0])
    fixed = evaluate(fixed_reads(fallback_s, min(first_read_s, fallback_s),
                                 durations.longest), probe, fallback_s)[0]
    best: tuple[float, ...] = ()
    step = target_s
    for widen in WIDENINGS:
        step = max(target_s, min(target_s * widen, fallback_s))
        best_reads = math.inf
        for right in splits:
            reads = _place(durations, step, floor_s, miss_share * (1 - right),
                           miss_share * right)
            if reads and reads[0] > cap:
                reads = (cap, *reads)
            mean_reads = evaluate(reads, probe, fallback_s)[0]
            if mean_reads < best_reads:
                best, best_reads = reads, mean_reads
        if best_reads <= fixed * MAX_READS_VS_FIXED or step >= fallback_s:
            break  # the target (or the widest step) within the price
    exp_reads, exp_p95 = evaluate(best, probe, fallback_s)
    return Plan(durations, best, target_s, floor_s, fallback_s, exp_reads, exp_p95,
                max(step, floor_s))


CONFIDENT_JOBS = 500
"""From this many render times a group's tails are trusted with the whole planned miss
share; below, the share shrinks in proportion and none of it goes to the longest renders
(measured: a plan from 130 render times of a 240 s model missed its 14 s target, p95 23 s,
when it spent misses on a tail it had barely seen)."""
RIGHT_SPLITS = (0.0, 0.25, 0.5, 0.75)
"""Shares of the planned misses tried on the longest renders (the rest on the shortest)."""
MAX_READS_VS_FIXED = 2.0
"""A plan's reads a job, on its history, at most this many times the fixed interval's: the
target is bought with reads only up to this price."""
WIDENINGS = (1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 4.0, 6.0, 10.0, 1000.0)
"""Steps tried, as multiples of the target, when the target's reads cost too much (the last
is the fixed interval's step)."""
MAX_PLANNED_READS = 5000
"""A plan's reads at most (a tiny target over a long history); the fixed interval after."""


def _place(d: Durations, target: float, floor: float, left: float,
           right: float) -> tuple[float, ...]:
    """Reads from the create: the first where renders start to end (the shortest `left` of
    the history seen late), then a read every `target` (never closer than `floor`) until
    all but the longest `right` have ended; past that, the fixed interval.

    Spending the misses on the shortest renders saves reads for every job (each is read
    from the first read on); spending them on the longest saves the reads of the long tail.
    `plan` tries a few splits and keeps the fewest reads.
    """
    step = max(target, floor)
    end = d.quantile(1.0 - right)
    t = max(d.quantile(left) + target, floor)
    reads = [t]
    while t < end and len(reads) < MAX_PLANNED_READS:
        t += step
        reads.append(t)
    return tuple(reads)


def missed_share(d: Durations, reads: Sequence[float], target: float) -> float:
    """The share of this history's renders seen more than `target` after they ended, when
    read at `reads` (and never after the last)."""
    missed, prev = 0.0, 0.0
    for r in reads:
        missed += max(0.0, d.cdf(r - target) - d.cdf(prev))
        prev = r
    return missed


def _probe_ends(d: Durations, n: int = 2000) -> list[float]:
    """Evenly spread quantiles of the history: renders to try a plan on."""
    return [d.quantile((i + 0.5) / n) for i in range(n)]


def evaluate(reads: Sequence[float], ends: Sequence[float],
             fallback_s: float) -> tuple[float, float]:
    """(mean reads per job, p95 detection delay) when jobs ending at `ends` (seconds after
    the create) are read at `reads`, then every `fallback_s` after the last."""
    if not ends:
        return 0.0, 0.0
    counts: list[int] = []
    delays: list[float] = []
    last = reads[-1] if reads else 0.0
    for end in ends:
        i = bisect.bisect_left(reads, end)
        if i < len(reads):
            counts.append(i + 1)
            delays.append(reads[i] - end)
        else:
            k = max(1, math.ceil((end - last) / fallback_s))
            counts.append(len(reads) + k)
            delays.append(last + k * fallback_s - end)
    delays.sort()
    return sum(counts) / len(counts), delays[min(len(delays) - 1, int(0.95 * len(delays)))]


def fixed_reads(interval_s: float, first_s: float, until_s: float) -> tuple[float, ...]:
    """The reads of a fixed schedule (first at `first_s`, then every `interval_s`), to
    compare plans with (`evaluate`)."""
    out, t = [], first_s
    while t <= until_s + interval_s:
        out.append(t)
        t += interval_s
    return tuple(out)
