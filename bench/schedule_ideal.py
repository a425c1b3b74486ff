"""The ideal bound of a poll schedule: the fewest mean reads per job any schedule can have
while 95 % of ends are seen within `d` seconds, on a known distribution of render times.

Method (an exact optimisation on a grid, slow is fine):

- Read times are restricted to a grid t_0 = 0 (the create, not a read), t_1 = h, ... t_N = H,
  with h = d / D for a whole D (so t_j - d is a grid point) and H the 1 - 1e-7 quantile
  (a read there sees everything; the mass beyond it is below the figures' precision).
- A schedule is a chain of reads 0 = r_0 < r_1 < ... < r_K = H. Read k is made for a job iff
  the job had not ended by r_{k-1}: it costs S(r_{k-1}) = 1 - F(r_{k-1}) reads per job on
  average. A job ending in (r_{k-1}, r_k] is seen at r_k, later than d iff it ended before
  r_k - d: the share missed by that gap is F(max(r_{k-1}, r_k - d)) - F(r_{k-1}).
- Both sums are additive over gaps, so with a Lagrange multiplier lam on the share missed the
  problem min reads + lam * missed is a shortest path over the grid, solved backwards:
      V(i) = S_i + min( min_{i<j<=i+D} V(j),                   gaps <= d miss nobody
                        min_{j>i+D} [lam F(t_j - d) + V(j)] - lam F_i )
  The first term is a sliding-window minimum and the second a running suffix minimum, so
  each pass is O(N) (a plain O(N^2) search would do, only slower).
- The share missed falls as lam grows; lam is bisected (geometrically) to the smallest
  value whose schedule misses at most 5 %. That schedule is feasible, so its reads are an
  upper bound on the optimum (reported as the bound: a schedule that exists); and for every
  lam, V_lam(0) - lam * 0.05 is a lower bound (Lagrangian duality), so the optimum lies
  between the two, reported beside (`reads_lower`). The remaining gap is what a schedule
  randomised between two neighbouring Lagrangian optima could still gain (a fraction of a
  read), and the grid costs at most about h of delay.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

MISS = 0.05
"""A p95 target: at most 5 % of ends seen later than it."""


@dataclass(frozen=True)
class Ideal:
    """The best schedule found for one distribution and one target."""

    target_s: float
    reads: tuple[float, ...]
    """Read times, seconds since the create (the last one at the horizon)."""
    expected_reads: float
    """Mean reads per job on the distribution itself."""
    missed: float
    """Share of ends seen later than the target (<= MISS)."""
    reads_lower: float
    """A lower bound on any schedule's mean reads at this target (Lagrangian dual)."""


class LogNormal:
    """Render times exp(N(ln median, sigma^2)), seconds."""

    def __init__(self, median_s: float, sigma: float) -> None:
        self.mu = math.log(median_s)
        self.sigma = sigma

    def cdf(self, t: float) -> float:
        """P(T <= t)."""
        if t <= 0:
            return 0.0
        return 0.5 * (1.0 + math.erf((math.log(t) - self.mu) / (self.sigma * math.sqrt(2))))

    def quantile(self, p: float) -> float:
        """The inverse of `cdf` (bisection on the log scale: exact enough, no scipy)."""
        lo, hi = self.mu - 10 * self.sigma, self.mu + 10 * self.sigma
        for _ in range(100):
            mid = (lo + hi) / 2
            if self.cdf(math.exp(mid)) < p:
                lo = mid
            else:
                hi = mid
        return math.exp((lo + hi) / 2)


def _solve(cdf_grid: list[float], d_steps: int, lam: float) -> tuple[float, list[int]]:
    """One Lagrangian pass: (V(0), the chosen chain of grid indices)."""
    n = len(cdf_grid) - 1
    v = [0.0] * (n + 1)
    nxt = [n] * (n + 1)
    window: deque[int] = deque()  # indices j in (i, i + D], V increasing front to back
    suf_w, suf_j = math.inf, n  # min over j > i + D of lam F(t_j - d) + V(j)
    for i in range(n - 1, -1, -1):
        j_new = i + 1
        while window and v[window[-1]] >= v[j_new]:
            window.pop()
        window.append(j_new)
        while window[0] > i + d_steps:
            window.popleft()
        far = i + d_steps + 1
        if far <= n:
            w = lam * cdf_grid[far - d_steps] + v[far]
            if w < suf_w:
                suf_w, suf_j = w, far
        f_i = cdf_grid[i]
        near_v, near_j = v[window[0]], window[0]
        far_v = suf_w - lam * f_i
        if near_v <= far_v:
            v[i], nxt[i] = (1.0 - f_i) + near_v, near_j
        else:
            v[i], nxt[i] = (1.0 - f_i) + far_v, suf_j
    chain, i = [], 0
    while i < n:
        i = nxt[i]
        chain.append(i)
    return v[0], chain


def _cost(cdf_grid: list[float], d_steps: int, chain: list[int]) -> tuple[float, float]:
    """(mean reads, share missed) of a chain of grid indices."""
    reads = missed = 0.0
    prev = 0
    for j in chain:
        reads += 1.0 - cdf_grid[prev]
        missed += max(0.0, cdf_grid[max(prev, j - d_steps)] - cdf_grid[prev])
        prev = j
    return reads, missed


def ideal(cdf: Callable[[float], float], horizon_s: float, target_s: float, *,
          grid_s: float = 0.05, miss: float = MISS) -> Ideal:
    """The fewest mean reads per job at `miss` share seen later than `target_s`."""
    d_steps = max(1, round(target_s / grid_s))
    h = target_s / d_steps
    n = math.ceil(horizon_s / h)
    cdf_grid = [cdf(i * h) for i in range(n + 1)]
    lo, hi = 1e-3, 1e7
    best: tuple[float, float, list[int]] | None = None
    lower = 0.0
    for _ in range(60):
        lam = math.sqrt(lo * hi)
        value, chain = _solve(cdf_grid, d_steps, lam)
        lower = max(lower, value - lam * miss)
        reads, missed = _cost(cdf_grid, d_steps, chain)
        if missed <= miss:
            hi = lam
            if best is None or reads < best[0]:
                best = (reads, missed, chain)
        else:
            lo = lam
        if hi / lo < 1.0005:
            break
    if best is None:  # lam = 1e7 always reaches it (reads every d miss nobody)
        raise RuntimeError("no feasible schedule found")
    reads, missed, chain = best
    return Ideal(target_s, tuple(j * h for j in chain), reads, missed, min(lower, reads))


def ideal_p95_at_reads(cdf: Callable[[float], float], horizon_s: float, reads: float, *,
                       grid_s: float = 0.05, lo_s: float = 0.2, hi_s: float = 120.0) -> Ideal:
    """The smallest target whose ideal schedule takes at most `reads` per job (bisection on
    the target: the fewest reads fall as the target grows)."""
    found = ideal(cdf, horizon_s, hi_s, grid_s=grid_s)
    if found.expected_reads > reads:
        return found
    for _ in range(14):
        mid = math.sqrt(lo_s * hi_s)
        trial = ideal(cdf, horizon_s, mid, grid_s=grid_s)
        if trial.expected_reads <= reads:
            hi_s, found = mid, trial
        else:
            lo_s = mid
        if hi_s / lo_s < 1.01:
            break
    return found
