"""Prometheus metrics of this process, and per-minute counters flushed to `vidpoll_minutes`.

The loops call the `observe_*` functions; nothing here does I/O. The metrics are served by
`vidpoll worker --metrics-port` and `vidpoll serve` (vidpoll.web). Labels are bounded: an
account, an outcome word, a consumer name; never a job id, never a URL or a key.

`vidpoll worker --processes N --metrics-port P` serves the children's metrics from the
supervisor alone, through prometheus_client's multiprocess mode: each child is started with
PROMETHEUS_MULTIPROC_DIR naming one directory (its values live in files there), and the
supervisor's /metrics sums them (`serve_processes`): counters and histograms over every child
that ever ran (a restarted child's counts are kept), the in-flight gauge over the live ones.
"""

from __future__ import annotations

import atexit
import bisect
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily

from vidpoll.models import LOCAL_TERMINAL_STATES, PENDING

REGISTRY = CollectorRegistry(auto_describe=True)
"""This process's metrics (not prometheus_client's global registry)."""


class _FlushFirst:
    """Registered first in REGISTRY, so every collection (a scrape, get_sample_value) begins
    by adding the status reads counted since the last flush (`_PollTally`)."""

    def collect(self) -> Iterator[Any]:
        POLL_TALLY.flush()
        return iter(())

    def describe(self) -> Iterator[Any]:
        return iter(())


REGISTRY.register(_FlushFirst())

POLLS = Counter("vidpoll_polls_total", "Status reads by outcome: not_ready, final, or the "
                "error class.", ["account", "outcome"], registry=REGISTRY)
READ_SECONDS = Histogram(
    "vidpoll_status_read_duration_seconds", "Time one status read took, answer or failure.",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 30), registry=REGISTRY)
LATENESS = Histogram(
    "vidpoll_poll_lateness_seconds", "Seconds between a row's next_poll_at and its read.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900),
    registry=REGISTRY)
CLAIM_BATCH = Histogram("vidpoll_claim_batch_size", "Rows per claim statement.",
                        buckets=(0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000),
                        registry=REGISTRY)
IN_FLIGHT = Gauge("vidpoll_reads_in_flight", "Status reads waiting for the provider now.",
                  registry=REGISTRY, multiprocess_mode="livesum")
SUBMISSIONS = Counter("vidpoll_submissions_total", "POSTs of intents by outcome: submitted, "
                      "queued (retried later), unknown (refused or unanswered after a lost "
                      "reply: retried slowly) or rejected.", ["account", "outcome"],
                      registry=REGISTRY)
RECONCILIATIONS = Counter("vidpoll_reconciliations_total", "Look-ups of an unknown create in "
                          "the provider's own records (a provider without an idempotency key) "
                          "by result: adopted (its job found), resent (proven absent: sent "
                          "again), parked (`unknown`, for an operator), retry (the look-up "
                          "failed or came too soon).", ["account", "result"],
                          registry=REGISTRY)
LIST_CALLS = Counter("vidpoll_reconcile_list_calls_total", "List requests sent by look-ups.",
                     ["account"], registry=REGISTRY)
RESULT_FETCHES = Counter("vidpoll_result_fetches_total", "Result fetches by outcome.",
                         ["outcome"], registry=REGISTRY)
DELIVERIES = Counter("vidpoll_deliveries_total", "Downloads and hook runs by outcome.",
                     ["consumer", "outcome"], registry=REGISTRY)
TOKENS = Counter("vidpoll_rate_tokens_granted_total", "Tokens taken from the fleet's rate "
                 "budget.", ["account", "kind"], registry=REGISTRY)
BUDGET_WAITS = Counter("vidpoll_rate_budget_waits_total", "Claims that got fewer tokens than "
                       "they wanted (the budget, not the rows, held them back).",
                       ["account", "kind"], registry=REGISTRY)
SERVER_PAUSES = Counter("vidpoll_server_pauses_total", "Pauses the provider asked for (429, "
                        "RateLimit-Remaining: 0).", ["account"], registry=REGISTRY)
MISROUTE_PAUSES = Counter("vidpoll_misroute_pauses_total", "Pauses of an account begun "
                          "because something other than the provider answered (a 4xx without its "
                          "error envelope: a wrong base URL, a proxy), by loop: poll, submit.",
                          ["account", "loop"], registry=REGISTRY)
FENCED_OUT = Counter("vidpoll_fenced_out_total", "Writes refused because another worker "
                     "owns the row now.", registry=REGISTRY)
DB_ERRORS = Counter("vidpoll_database_errors_total", "Database calls that failed (outage).",
                    registry=REGISTRY)
WEBHOOKS_REJECTED = Counter("vidpoll_webhooks_rejected_total", "Webhook deliveries refused, "
                           "by reason (a fixed set: unsigned, timestamp, signature, too_large, "
                           "malformed). Exported by `vidpoll serve`; the log shows at most one "
                           "line per reason a minute.", ["reason"], registry=REGISTRY)
TABLE_REGISTRY = CollectorRegistry(auto_describe=True)
"""The table's own figures, exported by `vidpoll serve` only: every worker exporting them too
would multiply them in any sum over instances (and read the table once per worker). Which of
them are estimates: vidpoll.web.figures."""
JOBS = Gauge("vidpoll_jobs", "Rows of video_jobs by state, read at most every 5 s. pending is "
             "exact (counted through its partial index up to 20,000; an estimate beyond). "
             "The finished states are exact while the table holds at most 100,000 rows and "
             "ESTIMATES beyond that: PostgreSQL's row estimate (reltuples scaled to the "
             "table's size) minus pending, split by ANALYZE's sample, or one 'finished' "
             "figure if the table was never analyzed. vidpoll_jobs_estimated says which. "
             "A state word vidpoll does not know (a provider's own) is counted as 'other'.",
             ["state"], registry=TABLE_REGISTRY)
JOBS_ESTIMATED = Gauge("vidpoll_jobs_estimated", "1 where vidpoll_jobs{state} is an estimate "
                       "now, 0 where it is an exact count.", ["state"],
                       registry=TABLE_REGISTRY)
STATISTICS_AGE = Gauge("vidpoll_jobs_statistics_age_seconds", "Age of the ANALYZE sample "
                       "that splits the estimated vidpoll_jobs figures by state (NaN: never "
                       "analyzed, or no figure is an estimate).", registry=TABLE_REGISTRY)
DUE = Gauge("vidpoll_due_rows", "Pending rows due now: exact, counted through the partial "
            "index up to 20,000 (20,000 means at least that many; vidpoll_oldest_due_seconds "
            "tells how far behind).", registry=TABLE_REGISTRY)
OLDEST_DUE = Gauge("vidpoll_oldest_due_seconds", "How late the most overdue pending row is "
                   "(exact).", registry=TABLE_REGISTRY)



class _SpendTotals:
    """vidpoll_spend_total{account,model}: what ended jobs cost, in each account's currency,
    since the ledger began (a counter: it only grows, but for a prune of the ledger, which
    vidpoll never does), read from the ledger at scrape time like the table's figures."""

    def __init__(self) -> None:
        self.spent: dict[tuple[str, str], float] = {}

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "vidpoll_spend", "What ended jobs cost, in the account's currency (the provider's "
            "figure where the account prices its unit, else the estimate), since the ledger "
            "began.", labels=["account", "model"])
        for (account, model), value in sorted(self.spent.items()):
            family.add_metric([account, model], value)
        yield family

    def describe(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily("vidpoll_spend", "", labels=["account", "model"])


SPEND_TOTAL = _SpendTotals()
TABLE_REGISTRY.register(SPEND_TOTAL)
SPEND_RESERVED = Gauge("vidpoll_spend_reserved", "Estimates reserved by creates whose jobs "
                       "have not ended (or whose outcome is unknown), in the account's "
                       "currency.", ["account"], registry=TABLE_REGISTRY)
INTENTS_HELD = Gauge("vidpoll_intents_held", "Intents a cap holds now, by account and cap "
                     "(cap_per_day, cap_per_month, cap_per_key_prefix:PREFIX, "
                     "max_creates_per_hour, price).", ["account", "cap"],
                     registry=TABLE_REGISTRY)


def export_spend(totals: Iterable[Mapping[str, Any]], held: Iterable[Mapping[str, Any]]
                 ) -> None:
    """The ledger's figures (vidpoll.store.spend) into the three spend metrics."""
    rows = list(totals)
    SPEND_TOTAL.spent = {(r["account"], r["model"]): float(r["spent"]) for r in rows}
    reserved: dict[str, float] = {}
    for r in rows:
        reserved[r["account"]] = reserved.get(r["account"], 0.0) + float(r["reserved"])
    SPEND_RESERVED.clear()
    for account, value in reserved.items():
        SPEND_RESERVED.labels(account).set(value)
    INTENTS_HELD.clear()
    for r in held:
        INTENTS_HELD.labels(r["account"], r["cap"] or "unknown").set(int(r["n"]))


STATE_LABELS: set[str] = {PENDING, *LOCAL_TERMINAL_STATES, "finished"}
"""The values of a `state` label: the states vidpoll knows (pending, the terminal words of
every provider loaded (`know_states`, called by vidpoll.providers.registry), its own gave_up
and not_found, and `finished`, the estimate's one word for every finished row before
ANALYZE), and OTHER_STATE for the rest. A provider that answers `terminal: true` with words
of its choosing must not mint a time series per word."""


def know_states(words: Iterable[str]) -> None:
    """Add a provider's terminal words to the state labels (at most 64 words a provider)."""
    STATE_LABELS.update(list(words)[:64])
OTHER_STATE = "other"


def state_label(state: str) -> str:
    """The label value of a job's state: the state itself if vidpoll knows it, else `other`."""
    return state if state in STATE_LABELS else OTHER_STATE


def counts_by_state_label(counts: dict[str, int]) -> dict[str, int]:
    """Rows per state label: the states vidpoll does not know summed under `other`."""
    labelled: dict[str, int] = {}
    for state, n in counts.items():
        label = state_label(state)
        labelled[label] = labelled.get(label, 0) + n
    return labelled


@dataclass
class _Cell:
    n: int = 0
    late_sum_s: float = 0.0
    late_max_s: float = 0.0


MinuteKey = tuple[datetime, str, str, str]
"""(minute, kind, account, outcome)."""


class Minutes:
    """Counters per minute, kind, account and outcome, kept in memory until a flush."""

    def __init__(self) -> None:
        self._cells: dict[MinuteKey, _Cell] = {}
        self._lock = threading.Lock()  # sync hooks' threads never touch it; cheap anyway
        self._minute: tuple[float, datetime] = (float("nan"), datetime.min)

    def add(self, at: datetime, kind: str, account: str, outcome: str,
            late_s: float = 0.0, n: int = 1) -> None:
        """Count `n` events (with their lateness) in the minute of `at`."""
        # the minute of the last call again, most of the time (a read a few µs cheaper)
        number = at.timestamp() // 60
        seen, minute = self._minute
        if number != seen or minute.tzinfo is not at.tzinfo:
            minute = at.replace(second=0, microsecond=0)
            self._minute = (number, minute)
        key = (minute, kind, account, outcome)
        with self._lock:
            cell = self._cells.get(key)
            if cell is None:
                cell = self._cells[key] = _Cell()
            cell.n += n
            cell.late_sum_s += late_s
            cell.late_max_s = max(cell.late_max_s, late_s)

    def drain(self) -> list[tuple[MinuteKey, int, float, float]]:
        """Everything counted since the last drain, and forget it."""
        with self._lock:
            cells, self._cells = self._cells, {}
        return [(key, c.n, c.late_sum_s, c.late_max_s) for key, c in cells.items()]

    def restore(self, rows: list[tuple[MinuteKey, int, float, float]]) -> None:
        """Put back what a failed flush drained (the next flush adds it)."""
        for (minute, kind, account, outcome), n, late_sum, late_max in rows:
            with self._lock:
                cell = self._cells.setdefault((minute, kind, account, outcome), _Cell())
                cell.n += n
                cell.late_sum_s += late_sum
                cell.late_max_s = max(cell.late_max_s, late_max)


TALLY_FLUSH_S = 1.0
"""Status reads are added to the Prometheus objects at most this late (and at every scrape):
in a child of `worker --processes`, what the supervisor's /metrics shows lags by this much."""


class _PollTally:
    """Status reads counted in plain Python between two flushes (`observe_poll`, issue 31):
    the Prometheus objects take a lock for each change, four changes a read (and, in a child
    of `worker --processes`, a write to a shared file each), which cost a saturated worker
    about 3 % of its CPU. Here a read is a dict increment and two bucket increments; a flush
    adds them all, at each scrape and at least every TALLY_FLUSH_S. Fixed-size: the counts
    are per label pair, the histograms per bucket."""

    def __init__(self) -> None:
        self.late_bounds = list(LATENESS._upper_bounds)
        self.read_bounds = list(READ_SECONDS._upper_bounds)
        self.flush_at = time.monotonic() + TALLY_FLUSH_S
        self._reset()

    def _reset(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}
        self.late = [0] * len(self.late_bounds)
        self.late_sum = 0.0
        self.read = [0] * len(self.read_bounds)
        self.read_sum = 0.0

    def add(self, account: str, outcome: str, late_s: float, read_s: float) -> None:
        key = (account, outcome)
        self.counts[key] = self.counts.get(key, 0) + 1
        # the first bound at or above the value: the bucket Histogram.observe picks
        self.late[bisect.bisect_left(self.late_bounds, late_s)] += 1
        self.late_sum += late_s
        self.read[bisect.bisect_left(self.read_bounds, read_s)] += 1
        self.read_sum += read_s
        if time.monotonic() >= self.flush_at:
            self.flush()

    def flush(self) -> None:
        """Add everything counted since the last flush to the Prometheus objects."""
        self.flush_at = time.monotonic() + TALLY_FLUSH_S
        if not self.counts:
            return
        counts, late, late_sum, read, read_sum = (self.counts, self.late, self.late_sum,
                                                  self.read, self.read_sum)
        self._reset()
        for (account, outcome), n in counts.items():
            POLLS.labels(account, outcome).inc(n)
        for histogram, buckets, total in ((LATENESS, late, late_sum),
                                          (READ_SECONDS, read, read_sum)):
            # Histogram.observe's own two steps (a bucket, the sum), n at a time
            # (prometheus_client pinned in constraints.txt; the test suite scrapes these)
            for i, n in enumerate(buckets):
                if n:
                    histogram._buckets[i].inc(n)
            histogram._sum.inc(total)


POLL_TALLY = _PollTally()
atexit.register(POLL_TALLY.flush)  # a child of --processes: its last second's reads too


def observe_poll(minutes: Minutes, at: datetime, account: str, outcome: str,
                 late_s: float, read_s: float) -> None:
    """One status read: its outcome, how late it started, how long it took (in Prometheus
    at the next scrape, or within TALLY_FLUSH_S: `_PollTally`)."""
    late = late_s if late_s > 0.0 else 0.0
    POLL_TALLY.add(account, outcome, late, read_s)
    minutes.add(at, "poll", account, outcome, late)


def observe_submission(minutes: Minutes, at: datetime, account: str, outcome: str) -> None:
    """One POST of an intent and its outcome."""
    SUBMISSIONS.labels(account, outcome).inc()
    minutes.add(at, "submit", account, outcome)


class _Families:
    """A collector that passes on only the named families of another (the children's files
    hold the table's gauges too, at their defaults: a worker never exports those)."""

    def __init__(self, inner: Any, names: set[str]) -> None:
        self.inner = inner
        self.names = names

    def collect(self) -> Iterator[Any]:
        for family in self.inner.collect():
            if family.name in self.names:
                yield family


def serve_processes(path: str) -> None:
    """Make REGISTRY (what a worker's /metrics exports) the sum of the worker processes whose
    values live in `path` (their PROMETHEUS_MULTIPROC_DIR), in the supervisor of `worker
    --processes`, which records nothing of its own."""
    from prometheus_client.multiprocess import MultiProcessCollector

    global REGISTRY
    names = {family.name for family in REGISTRY.collect()}  # every family a process counts
    merged = CollectorRegistry(auto_describe=True)
    merged.register(_Families(MultiProcessCollector(None, path), names))  # type: ignore[no-untyped-call]
    REGISTRY = merged


def process_ended(pid: int, path: str) -> None:
    """A worker process of `serve_processes` ended: its live gauges (reads in flight) no
    longer count; its counters do."""
    from prometheus_client.multiprocess import mark_process_dead

    mark_process_dead(pid, path)  # type: ignore[no-untyped-call]


def _process_collectors() -> tuple[Any, ...]:
    """Every collector of REGISTRY: what a process counts itself."""
    return (POLLS, READ_SECONDS, LATENESS, CLAIM_BATCH, IN_FLIGHT, SUBMISSIONS,
            RECONCILIATIONS, LIST_CALLS, RESULT_FETCHES, DELIVERIES, TOKENS, BUDGET_WAITS,
            SERVER_PAUSES, MISROUTE_PAUSES, FENCED_OUT, DB_ERRORS, WEBHOOKS_REJECTED)


def metric_names() -> Iterator[str]:
    """Every metric family this module defines (for docs and tests)."""
    for collector in (*_process_collectors(), JOBS, JOBS_ESTIMATED, STATISTICS_AGE, DUE,
                      OLDEST_DUE, SPEND_TOTAL, SPEND_RESERVED, INTENTS_HELD):
        yield from (m.name for m in collector.describe())
