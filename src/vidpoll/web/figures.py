"""The table's figures for /metrics and the dashboard's overview, at a cost that does not grow
with the table: no read of video_jobs scans it.

- pending rows, rows due now and the most overdue row's lateness: exact, through the partial
  index on next_poll_at WHERE state = 'pending' (each count stops at COUNT_CAP_ROWS);
- rows per finished state: exact while the table holds at most EXACT_ROWS rows; beyond that
  an estimate: PostgreSQL's own row estimate (reltuples, scaled to the table's size now, as
  the planner does) minus the exact pending count, split by each state's share of ANALYZE's
  sample. Counting 10,000,000 finished rows exactly would read them all on every scrape;
  a maintained counter would add a write to every job's end.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from vidpoll.models import PENDING

EXACT_ROWS = 100_000
"""A table of at most this many rows is counted exactly, state by state (a few ms)."""
COUNT_CAP_ROWS = 20_000
"""Pending and due rows are counted exactly up to this many: each is an index entry and, on a
page that polls keep changing, a heap visit, as is each dead entry a poll left behind until
the next VACUUM (about 0.5 us each: BENCHMARKS.md, Cheap scrapes)."""
STUCK_WALK_ROWS = 10_000
"""The overview looks for stuck claims among this many of the most overdue rows."""
FINISHED = "finished"
"""The one label of every finished row when PostgreSQL has no statistics of `state` yet."""


@dataclass(frozen=True)
class TableFigures:
    """Rows per state (some estimated), the backlog due now, and where the estimates come
    from."""

    states: dict[str, int]
    estimated: frozenset[str]
    """The states whose figure is an estimate (empty: every figure is exact)."""
    due: int
    due_capped: bool
    """More than `due` rows are due (counting stopped at COUNT_CAP_ROWS)."""
    oldest_late_s: float
    analyzed_at: datetime | None
    """When ANALYZE took the sample the estimates are split by (None: never)."""

    @property
    def total(self) -> int:
        """Every row (an estimate when any state's figure is)."""
        return sum(self.states.values())


class FigureSource(Protocol):
    """What the figures are read from (PgStore)."""

    async def table_estimate(self) -> dict[str, Any]: ...

    async def count_states_upto(self, upto: int) -> dict[str, int] | None: ...

    async def pending_upto(self, upto: int) -> tuple[int, int, float]: ...


async def read_figures(store: FigureSource, exact_rows: int = EXACT_ROWS,
                       cap: int = COUNT_CAP_ROWS) -> TableFigures:
    """Two or three short statements: the catalog's estimate, the pending index's counts,
    and an exact count only when the estimate says the table is small."""
    estimate = await store.table_estimate()
    rows = estimate["rows"]
    exact = None
    if rows is None or rows <= exact_rows:
        exact = await store.count_states_upto(exact_rows)
    pending, due, oldest_late_s = await store.pending_upto(cap)
    return combine(estimate, exact, pending, due, oldest_late_s, cap)


def combine(estimate: dict[str, Any], exact: dict[str, int] | None, pending: int, due: int,
            oldest_late_s: float, cap: int = COUNT_CAP_ROWS) -> TableFigures:
    """The figures from what was read (pure: see read_figures)."""
    due_capped = due > cap
    due = min(due, cap)
    analyzed_at = estimate.get("analyzed_at")
    if exact is not None:
        return TableFigures(exact, frozenset(), due, due_capped, oldest_late_s, None)
    shares = dict(zip(estimate.get("states") or [], estimate.get("shares") or [],
                      strict=True))
    rows = float(estimate.get("rows") or 0.0)
    states: dict[str, int] = {}
    estimated: set[str] = set()
    if pending > cap:  # a backlog too big to count on every scrape
        pending = max(cap + 1, round(rows * shares.get(PENDING, 0.0)))
        estimated.add(PENDING)
    if pending:
        states[PENDING] = pending
    finished = max(0.0, rows - pending)
    finished_shares = {s: f for s, f in shares.items() if s != PENDING and f > 0}
    whole = sum(finished_shares.values())
    if whole > 0:
        for state, share in finished_shares.items():
            n = round(finished * share / whole)
            if n:
                states[state] = n
                estimated.add(state)
    elif finished >= 1:  # vacuumed but never analyzed: no split to go by
        states[FINISHED] = round(finished)
        estimated.add(FINISHED)
    return TableFigures(states, frozenset(estimated), due, due_capped, oldest_late_s,
                        analyzed_at)
