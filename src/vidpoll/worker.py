"""The polling loop: claim due rows, read their status, record the outcome.

It knows neither psycopg nor aiohttp: the database and the provider come in through the `Store` and
`StatusReader` protocols, so the loop is the same against PostgreSQL, PgBouncer or a test double.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import json
import logging
import math
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol, TypeVar

from vidpoll import metrics
from vidpoll.aio import cancel_and_wait, honour_cancel, wait_event
from vidpoll.config import AccountTiming
from vidpoll.errors import DatabaseUnavailable
from vidpoll.health import Health, Misroute, add_pause, bucket_pause
from vidpoll.learned import DurationsStore, Schedules
from vidpoll.logs import event
from vidpoll.models import (
    DEFAULT_ACCOUNT,
    PENDING,
    ClaimedJob,
    ClaimedResult,
    ClaimMode,
    ErrorClass,
    HttpAnswer,
    Notice,
    Outcome,
    WorkerStats,
)
from vidpoll.policy import (
    AuthPause,
    Budget,
    Misrouted,
    PollPolicy,
    backoff_delay,
    decide,
    is_not_api,
    probe_verdict,
    provider_error_code,
    server_pause_s,
)
from vidpoll.providers.base import Cost, Rules
from vidpoll.results import ResultFetcher, ResultStore
from vidpoll.runner import (
    DB_BACKOFF_MAX_S,
    IDLE_MAX_S,
    SHUTDOWN_TIMEOUT_S,
    BudgetStore,
    MinutesStore,
    NoticeStore,
    Runner,
    check_lease,
    default_worker_id,
    settle_budget,
    take_budget,
    utc_now,
)
from vidpoll.spend import NO_SPEND, AccountSpend

T = TypeVar("T")

log = logging.getLogger(__name__)

RESULTS_TURN = 8
"""Every this many claim turns, result fetches get their share first even if none were seen."""
BUSY_RETRY_S = 0.25
"""Floor of the sleep when rows are due but all locked by others: never a hot loop."""
DRAIN_RECHECK_S = 0.5
"""With --drain, the longest sleep between looks at whether anything is left: rows other
workers hold finish without a notification, and their lease (or the 30 s idle cap) is far
longer than the wait for them (a drain could sleep 30 s past its last row)."""
WAKE_CHANNELS = ("vidpoll_jobs", "vidpoll_drained")
"""What a poller listens to: rows inserted or made due (the payload names the transaction that
did it, from migration 0012 on), and other workers' claims that took every due row."""
DRAINED_CHANNEL = WAKE_CHANNELS[1]
HERD_STAGGER_S = 0.25
"""In a fleet, an idle worker answers a NOTIFY after a random delay of up to this; a worker
whose claim covered the notification tells the others (DRAINED_CHANNEL), and they stay asleep
instead of twenty of them claiming one new row."""
HERD_MEMORY_S = 300.0
"""A worker staggers while it heard from another worker within this long (an announcement,
a presence notice, or an empty claim after a NOTIFY); a lone worker answers at once."""
PRESENCE_EVERY_S = HERD_MEMORY_S / 3
"""A listening worker tells the others it is there this often (one statement): so the fleet
staggers from its first NOTIFY on, and stops staggering within HERD_MEMORY_S when alone."""
MAX_COVERED = 100
"""An announcement names at most this many notifications (NOTIFY payloads stay small)."""
WRITE_INTERVAL_S = 0.02
"""At most one outcome write per this interval: under load a write carries every read of the
last 20 ms (one commit, one WAL flush for dozens of rows); a lone read is written at once."""
WRITE_MARGIN_S = 0.5
"""Lease a read must leave for its write, beyond the HTTP timeout: the batched write (up to
WRITE_INTERVAL_S plus the database's time) must land before another worker may claim the row,
or that worker could read it earlier than the hint the answer carried."""
PROBE_PREFIX = "vidpoll-probe-"
"""The job id a misrouted account's probe reads: one that cannot exist, so the provider's own
"not found" proves the URL right again."""
DEFAULT_VACUUM_EVERY_ROWS = 5_000
"""Dead row versions a worker lets pile up before it vacuums the job table (with its index
pass forced: the vacuum_jobs query): about a second of a busy worker's writes (two per poll).
50,000 let a 10,000-row table grow 6.57x in 1M polls (target 3x) and the hot index 5x larger
at 5M finished rows (BENCHMARKS.md, "Vacuum at 5M rows")."""


def late_at_read(job: ClaimedJob) -> float:
    """How late a read starting now is: the claim's lateness (the database's clock) plus the
    time the row then waited in this worker for a slot (monotonic: no clock skew)."""
    if not job.claimed_mono:
        return job.late_s
    return job.late_s + max(0.0, time.monotonic() - job.claimed_mono)


class LockedBatchLike(Protocol):
    """Rows claimed in lock mode, recorded inside the same transaction."""

    jobs: list[ClaimedJob]

    async def record(self, outcomes: Sequence[Outcome]) -> set[str]:
        """Write outcomes before the transaction commits."""

    async def release(self, jobs: Sequence[ClaimedJob]) -> set[str]:
        """Clear the claims of rows read without an outcome, before the commit."""


class Store(MinutesStore, BudgetStore, NoticeStore, ResultStore, DurationsStore, Protocol):
    """What the worker needs from the job table (and the fleet's rate budget)."""

    async def claim(self, limit: int, lease_s: float, worker_id: str,
                    account: str = ...) -> list[ClaimedJob]:
        """Lease-mode claim of one account's rows, committed at once."""

    def lock_batch(self, limit: int, worker_id: str, account: str = ...
                   ) -> AbstractAsyncContextManager[LockedBatchLike]:
        """Lock-mode claim, locks held until the block ends."""

    async def record(self, outcomes: Sequence[Outcome]) -> set[str]:
        """Fenced writes of outcomes; returns the ids that landed."""

    async def release(self, jobs: Sequence[ClaimedJob]) -> set[str]:
        """Give rows back unread."""

    async def next_work_due_in(self, accounts: Sequence[str] = ..., results: bool = ...
                               ) -> tuple[float | None, float | None]:
        """(seconds until the next row is due, the same for result fetches)."""

    async def can_vacuum_jobs(self) -> bool:
        """Whether this role may VACUUM the job table."""

    async def vacuum_jobs(self) -> bool:
        """VACUUM the job table; False if another vacuum held it (skipped)."""

    async def has_pending(self, accounts: Sequence[str] = ..., results: bool = ...) -> bool:
        """Whether any row is still pending (or, with `results`, has a result to fetch)."""

    async def has_queued_intents(self, accounts: Sequence[str] = ...) -> bool:
        """Whether any submission intent still waits to be sent."""

    async def announce_drained(self, payload: str) -> None:
        """NOTIFY the fleet (DRAINED_CHANNEL) that a claim took every due row."""


class StatusReader(Protocol):
    """What the worker needs from an account's provider client (vidpoll.providers.base.Client
    has it all). A reader may also have `shown_status_url(job_id)`, the URL a read of
    `job_id` goes to as logs may show it: the worker names it when something other than the
    provider answers."""

    @property
    def rules(self) -> Rules:
        """The provider's rules, applied to this reader's answers."""

    async def read_status(self, job_id: str) -> HttpAnswer:
        """Read one job's status; failures come back as answers, never raised. A job with a
        handle (ClaimedJob.handle) is read with `read_status(job_id, handle)`."""

    async def read_result(self, job_id: str) -> HttpAnswer:
        """Read a completed job's result; failures come back as answers, never raised."""


@dataclass(frozen=True)
class WorkerConfig:
    """How one worker process runs."""

    concurrency: int = 50
    claim_mode: ClaimMode = ClaimMode.LEASE
    lease_s: float = 25.0
    batch_size: int = 100
    lock_lanes: int = 3
    drain: bool = False
    drain_waits_for_intents: bool = False
    listen: bool = True
    idle_max_s: float = IDLE_MAX_S
    policy: PollPolicy = field(default_factory=PollPolicy)
    worker_id: str = field(default_factory=default_worker_id)
    accounts: tuple[str, ...] = (DEFAULT_ACCOUNT,)
    """The accounts this worker polls (it has their keys); others' rows are left alone."""
    budgets: Mapping[str, Budget] = field(default_factory=dict)
    """Status-read budgets by account, shared by the fleet; an account without one is unlimited."""
    poll_floors: Mapping[str, float] = field(default_factory=dict)
    """The floor between two reads of one job, by account (`min_poll_s` in the accounts
    file); an account without one has its provider's (`Rules.min_poll_s`), and never less
    than the policy's `min_poll_s`."""
    vacuum_every_rows: int = DEFAULT_VACUUM_EVERY_ROWS
    """VACUUM video_jobs after this many row versions written by this worker (claims and
    records); 0 leaves it to autovacuum alone. See the vacuum_jobs query for why."""
    fetch_results: bool = True
    """Fetch each completed job's result (GET .../result), drawing on the same read budget:
    up to a quarter of a claim's tokens when results are due, and whatever is left over."""
    shutdown_timeout_s: float | None = SHUTDOWN_TIMEOUT_S
    """After stop(), reads still in flight this close to the timeout (see
    runner.shutdown_reserve_s) are stopped, their rows left to their leases (claimed rows not
    yet read are released at once); None waits for them."""
    herd_stagger_s: float = HERD_STAGGER_S
    """In a fleet, the longest random delay before an idle worker answers a NOTIFY (0: at
    once, always)."""
    spends: Mapping[str, AccountSpend] = field(default_factory=dict)
    """Prices by account (vidpoll.spend): converts a provider's cost figure to money."""
    timings: Mapping[str, AccountTiming] = field(default_factory=dict)
    """By account: a learned or a fixed schedule for jobs whose provider gives no hint, the
    detection target, the overdue factor (vidpoll.learned); an account not given: learned,
    5 s, 2."""
    providers: Mapping[str, str] = field(default_factory=dict)
    """By account: its provider's name (the render times' groups name it); empty: any."""
    read_timeout_s: float = 0.0
    """How long one status read may take (the HTTP client's timeout). In lease mode a claimed
    row is read only while that much of its lease is left, so a worker that fell behind
    (paused, starved of CPU, rows waiting in the claimed-ahead buffer) leaves the row to its
    lease instead of reading a row that another worker may hold by then. 0: the lease alone."""

    def __post_init__(self) -> None:
        # result fetches are leased in either claim mode
        leased = self.claim_mode is ClaimMode.LEASE or self.fetch_results
        if leased and self.read_timeout_s > 0:
            check_lease(self.lease_s, self.read_timeout_s, "a read")


class Worker(Runner):
    """One process's poller: many concurrent reads, few database connections."""

    def __init__(self, store: Store, reader: StatusReader | Mapping[str, StatusReader],
                 config: WorkerConfig, rng: random.Random | None = None,
                 clock: Callable[[], datetime] = utc_now,
                 schedules: Schedules | None = None) -> None:
        super().__init__(config.policy, rng, clock)
        self.store = store
        # one reader (one API key) per account; a single reader serves the default account
        self.readers: Mapping[str, StatusReader] = (
            reader if isinstance(reader, Mapping) else {DEFAULT_ACCOUNT: reader})
        self.config = config
        self.stats = WorkerStats()
        self._pauses: dict[str, tuple[float, bool]] = {}
        self._budget_wait: float | None = None
        self._turn = 0
        self._policies: dict[str, PollPolicy] = {}
        self._outbox: list[Outcome] = []
        self._outbox_ready = asyncio.Event()
        self._last_write = float("-inf")
        self._written_since_vacuum = 0
        self._vacuum_allowed: bool | None = None  # asked once, on the first vacuum
        # not one of _tasks: a stop cancels it instead of waiting for it
        self._vacuum_task: asyncio.Task[None] | None = None
        self._release: list[ClaimedJob] = []
        self._lanes = asyncio.Semaphore(max(1, config.lock_lanes))
        self._seen_words: set[str] = set()
        self._db_down_since: float | None = None
        self._answered_at = -math.inf
        """When a statement of the main loop last succeeded (loop time)."""
        self._writer_may_exit = False
        self.results = ResultFetcher(store, config.policy, self.stats)
        """Result fetches: claimed within this worker's read tokens, read with its clients."""
        # claimed ahead, waiting for a slot
        self._ready: collections.deque[ClaimedJob] = collections.deque()
        self._prefetch = (min(config.batch_size, config.concurrency) // 2
                          if config.claim_mode is ClaimMode.LEASE else 0)
        self._refill_min = max(1, self._prefetch // 2)
        self._saturated = False
        # the thundering-herd guard (see _on_notice)
        self._fleet_seen_at: float | None = None
        self._idle_sleeping = False
        self._pending_notes: set[str] = set()
        self._stagger: asyncio.TimerHandle | None = None
        self._since_claim: set[str] = set()
        self._peers: set[str] = set()
        self._presence_due = asyncio.Event()
        self.schedules = schedules or Schedules(
            store, config.timings, providers=config.providers,
            fallback_s=config.policy.default_poll_s, first_read_s=config.policy.default_poll_s)
        """Learned schedules of the jobs whose provider gives no hint (vidpoll.learned)."""
        self.health = Health(config.policy, self._rng)
        """Each account's pauses: a refused key, status reads answered by something other
        than the provider (a wrong base URL, a proxy: paused until a probe reaches it)."""
        self.url_probes = 0
        """Probe reads sent for misrouted accounts."""
        self.misroute_pauses = 0
        """Pauses begun for answers that were not the provider's (one per episode)."""

    # -- control --------------------------------------------------------------------------
    def stop(self) -> None:
        """Stop claiming; in-flight reads finish and are recorded, then run() returns."""
        if not self._stopping.is_set():
            log.info("worker %s stopping: finishing %d in-flight reads",
                     self.config.worker_id, self._inflight)
        super().stop()

    async def run(self) -> None:
        """Poll until stop() (or, with drain, until no row is pending)."""
        cfg = self.config
        log.info("worker %s started: claim=%s concurrency=%d lease=%gs listen=%s",
                 cfg.worker_id, cfg.claim_mode.value, cfg.concurrency, cfg.lease_s, cfg.listen)
        helpers = [asyncio.create_task(self._writer(), name="vidpoll-writer"),
                   asyncio.create_task(self._minutes_flusher(self.store, True),
                                       name="vidpoll-minutes"),
                   asyncio.create_task(self.schedules.run(), name="vidpoll-schedules")]
        if cfg.listen:
            helpers.append(asyncio.create_task(self._listener(), name="vidpoll-listener"))
            if cfg.herd_stagger_s > 0:
                helpers.append(asyncio.create_task(self._presence(), name="vidpoll-presence"))
        try:
            await self._main_loop()
        finally:
            self._stopping.set()
            await self._stop_vacuum()
            if self._ready:  # claimed, never read: back with their old due time
                ready = list(self._ready)
                self._ready.clear()
                with contextlib.suppress(DatabaseUnavailable):  # else their leases end
                    await self.store.release(ready)
            cancelled = await self._finish_tasks(cfg.shutdown_timeout_s)
            if cancelled:
                log.warning("worker %s: %d reads still in flight at the shutdown timeout "
                            "(%gs) were stopped; their rows come due when their leases end "
                            "(an answer may have been on its way)",
                            cfg.worker_id, cancelled, cfg.shutdown_timeout_s)
            # only now can no new result appear: every read task has ended
            self._writer_may_exit = True
            self._outbox_ready.set()
            await helpers[0]
            for task in helpers[1:]:
                await cancel_and_wait(task)
            await self._flush_minutes(self.store)  # what the last reads counted
            await self.signals.pulse()
            st = self.stats
            log.info("worker %s stopped: reads=%d finished=%d errors=%s fenced_out=%d "
                     "claims=%d probes=%d url_pauses=%d url_probes=%d notify_wakeups=%d "
                     "empty_notify_wakeups=%d staggered=%d herd_skips=%d drained_sent=%d",
                     cfg.worker_id, st.reads, st.finished,
                     ",".join(f"{k}:{v}" for k, v in sorted(st.errors.items())) or "0",
                     st.fenced_out,
                     st.claims, st.probes, self.misroute_pauses, self.url_probes,
                     st.notify_wakeups, st.empty_notify_wakeups,
                     st.staggered, st.herd_skips, st.drained_sent)

    # -- main loop --------------------------------------------------------------------------
    async def _main_loop(self) -> None:
        cfg = self.config
        db_failures = 0
        # True after an idle sleep ran out with nothing known to be due: look (one cheap
        # statement) before claiming, so an idle worker costs one statement per idle_max_s
        probe_first = False
        while not self._stopping.is_set():
            honour_cancel()
            # cleared before every decision to sleep, so a wake-up that was already handled
            # cannot turn each later sleep into a spin
            self._wake.clear()
            self.stats.loop_turns += 1
            paused_for = self.health.all_paused_for(cfg.accounts, self._now())
            if paused_for > 0:  # every account's key was refused: nothing to do until a probe
                await self._sleep(paused_for)
                continue
            # lease mode keeps a few claimed rows ready for the next free slots, so at
            # capacity a claim fetches a batch instead of a row per freed slot, and no slot
            # waits for a claim
            room = cfg.concurrency - self._inflight + self._prefetch - len(self._ready)
            if room <= 0 or (self._saturated and room < self._refill_min):
                await self._sleep(cfg.idle_max_s)  # slots freeing up or the buffer running
                continue                           # low wake this loop
            limit = min(room, cfg.batch_size)
            claimed = 0
            notified = self._take_notified()
            claim_on_timeout = True
            asked_at = asyncio.get_running_loop().time()  # proof of a recovery starts here
            try:
                delay = 0.0
                if probe_first and not notified:
                    self.stats.probes += 1
                    probed = await self._idle_delay(0, probing=True)
                    if probed is None:
                        return  # --drain: nothing left
                    delay = probed
                if delay == 0.0:
                    covered = self._claim_starts()
                    claimed = await self._claim_and_dispatch(limit)
                    if notified:
                        self.stats.notify_wakeups += 1
                        if claimed == 0:
                            self.stats.empty_notify_wakeups += 1
                            self._fleet_seen_at = self._now()  # someone else was quicker
                        elif claimed < limit:
                            await self._announce_drained(covered)
                    if claimed:
                        self.backlog_seen = True
                    self._saturated = claimed == limit
                    if claimed == limit and not self.health.any_key_refused():
                        if self._answered_at >= asked_at:  # the claim's rows came from it
                            self._db_recovered(asked_at)
                        db_failures = 0
                        probe_first = False
                        continue  # more may be due: claim again as soon as there is room
                    after = await self._idle_delay(claimed)
                    if after is None:
                        return  # --drain: nothing left
                    delay = after
                # only a statement of this turn that succeeded proves the database is back
                # (a turn whose accounts were all blocked asked it nothing)
                if self._answered_at >= asked_at:
                    self._db_recovered(asked_at)
                db_failures = 0
                # a sleep shorter than the cap waits for something known (a due row, a
                # token, a busy retry, a probe of a paused key): claim when it ends
                claim_on_timeout = delay < cfg.idle_max_s
            except DatabaseUnavailable as exc:
                db_failures += 1
                self._db_unavailable(exc)
                delay = backoff_delay(db_failures, cfg.policy, self._rng, DB_BACKOFF_MAX_S)
            self.idle = claimed == 0
            self._idle_sleeping = self._inflight == 0 and not self._ready
            await self.signals.pulse()
            try:
                woken = await self._sleep(delay)
            finally:
                self._idle_sleeping = False
            probe_first = not woken and not claim_on_timeout

    # -- NOTIFY in a fleet: no thundering herd --------------------------------------------
    def _herd_mode(self) -> bool:
        seen = self._fleet_seen_at
        return (self.config.herd_stagger_s > 0 and seen is not None
                and self._now() - seen < HERD_MEMORY_S)

    def _on_notice(self, note: Notice) -> bool:
        """A NOTIFY of a row made due wakes a lone worker at once. In a fleet (this worker saw
        another answer one lately), an idle worker waits a random part of herd_stagger_s
        first, and stays asleep if meanwhile another worker announces that its claim, begun
        after that notification reached it, took every due row of this worker's accounts: a
        notification is sent after its transaction commits, so such a claim saw its rows. A
        notification without a transaction id (older triggers) is never taken as covered."""
        if note.channel == DRAINED_CHANNEL:
            self._on_drained(note.payload)
            return False
        if len(self._since_claim) >= MAX_COVERED:  # a subset is still true, just less useful
            self._since_claim.clear()
        self._since_claim.add(note.payload)
        if not (self._idle_sleeping and self._herd_mode()):
            return True
        self._pending_notes.add(note.payload)
        if self._stagger is None:
            self.stats.staggered += 1
            delay = self._rng.uniform(0.1, 1.0) * self.config.herd_stagger_s
            self._stagger = asyncio.get_running_loop().call_later(delay, self._stagger_ends)
        return False

    async def _presence(self) -> None:
        """Tell the fleet this worker listens (an announcement that covers nothing), on start
        and every PRESENCE_EVERY_S: a worker that hears one staggers its answers."""
        cfg = self.config
        payload = json.dumps({"by": cfg.worker_id, "accounts": [], "results": False,
                              "covered": []}, separators=(",", ":"))
        while True:
            await self.signals.wait_for(lambda: self.listening, HERD_MEMORY_S * 1000)
            self._presence_due.clear()
            with contextlib.suppress(DatabaseUnavailable):  # only a hint
                await self.store.announce_drained(payload)
            await asyncio.sleep(1.0)  # at most one a second, whoever asks
            # a newcomer asks for one sooner
            await wait_event(self._presence_due, PRESENCE_EVERY_S - 1.0)

    def _stagger_ends(self) -> None:
        self._stagger = None
        if self._pending_notes:
            self._notified = True
            self._wake.set()

    def _on_drained(self, payload: str) -> None:
        try:
            news = json.loads(payload)
            by, accounts = str(news["by"]), set(news["accounts"])
            results, covered = bool(news["results"]), set(news["covered"])
        except (ValueError, KeyError, TypeError):
            return  # not ours to read: a hint at most
        if by == self.config.worker_id:
            return
        self._fleet_seen_at = self._now()
        if by not in self._peers:  # a newcomer did not hear this worker's last notice
            if len(self._peers) > 10_000:
                self._peers.clear()
            self._peers.add(by)
            self._presence_due.set()
        if (self._stagger is not None and self._pending_notes
                and "" not in self._pending_notes and self._pending_notes <= covered
                and set(self.config.accounts) <= accounts
                and (results or not self.config.fetch_results)):
            self._stagger.cancel()
            self._stagger = None
            self._pending_notes.clear()
            self.stats.herd_skips += 1

    def _claim_starts(self) -> set[str]:
        """The notifications this claim covers: those that reached this worker before it."""
        covered, self._since_claim = self._since_claim, set()
        self._pending_notes.clear()
        if self._stagger is not None:
            self._stagger.cancel()
            self._stagger = None
        return covered

    async def _announce_drained(self, covered: set[str]) -> None:
        """After a claim that a NOTIFY started and that took every due row it could (fewer
        than it asked for, every account, none held back by a budget or a refused key): tell
        the fleet which notifications it covered, so their staggered answers are skipped."""
        cfg = self.config
        if (not self._herd_mode() or not covered or "" in covered or len(covered) > MAX_COVERED
                or self._budget_wait is not None or self.health.any_key_refused()
                or len(self.health.unpaused(cfg.accounts, self._now())) < len(cfg.accounts)):
            return
        payload = json.dumps({"by": cfg.worker_id, "accounts": sorted(cfg.accounts),
                              "results": cfg.fetch_results, "covered": sorted(covered)},
                             separators=(",", ":"))
        try:
            await self.store.announce_drained(payload)
            self.stats.drained_sent += 1
        except DatabaseUnavailable:
            pass  # only a hint: the others answer their notifications themselves

    async def _idle_delay(self, claimed: int, probing: bool = False) -> float | None:
        """How long to sleep after a claim that did not fill the batch; None ends a drain.
        `probing`: no claim was made (an idle sleep ran out); 0.0 means claim now."""
        delay = await self._idle_delay_for(claimed, probing)
        if delay is not None and self.config.drain:
            return min(delay, DRAIN_RECHECK_S)
        return delay

    async def _answered(self, statement: Awaitable[T]) -> T:
        """Await a statement; its success proves the database answers (`_answered_at`)."""
        result = await statement
        self._answered_at = asyncio.get_running_loop().time()
        return result

    async def _idle_delay_for(self, claimed: int, probing: bool) -> float | None:
        """`_idle_delay` before a drain's cap."""
        cfg = self.config
        # intents first: a submission commits its job row as its intent leaves the queue, so
        # "no queued intent" followed by "no pending job" cannot miss a job in between
        accounts = cfg.accounts
        if (cfg.drain and claimed == 0 and self._inflight == 0 and not self._outbox
                and not self._ready
                and not (cfg.drain_waits_for_intents
                         and await self.store.has_queued_intents(accounts))
                and not await self._answered(self.store.has_pending(
                    accounts, results=cfg.fetch_results))):
            log.info("drain: no pending row left")
            self._stopping.set()
            return None
        if claimed:
            if self._budget_wait is not None:  # the budget, not the rows, ran out
                return min(cfg.idle_max_s, max(BUSY_RETRY_S / 5, self._budget_wait))
            return 0.0 if self._inflight < cfg.concurrency else cfg.idle_max_s
        # rows of an account whose key is refused wait for its probe, not for this loop
        now = self._now()
        unpaused = self.health.unpaused(accounts, now)
        probe_in = self.health.probe_in(now, cfg.idle_max_s)
        due_in: float | None = None
        if unpaused:
            # one statement for both (issue 16: an idle worker's transactions are counted)
            poll_in, result_in = await self._answered(self.store.next_work_due_in(
                unpaused, results=cfg.fetch_results))
            due_in = min((d for d in (poll_in, result_in) if d is not None), default=None)
        if due_in is None:
            return min(cfg.idle_max_s, probe_in)
        if due_in <= 0:
            self.backlog_seen = True
            if probing:
                return 0.0
            if self._budget_wait is not None:
                # due rows wait for the fleet's budget: ask again when a token is due
                return min(cfg.idle_max_s, max(BUSY_RETRY_S / 5, self._budget_wait))
            return BUSY_RETRY_S  # due rows exist but others hold them (or a server pause)
        return min(cfg.idle_max_s, probe_in, due_in + 0.005)

    async def _claim_and_dispatch(self, limit: int) -> int:
        """Claim up to `limit` rows, one account at a time (a different one first each turn,
        so none starves), each within its fleet-wide budget and never while its key is
        refused (a refused key gets one probe read per pause)."""
        cfg = self.config
        self._budget_wait = None
        accounts = self.health.unpaused(cfg.accounts, self._now())
        self._turn += 1
        claimed = 0
        for i in range(len(accounts)):
            account = accounts[(self._turn + i) % len(accounts)]
            want = limit - claimed
            if want <= 0 or self._stopping.is_set():
                break
            if self.health.blocked(account):
                self._probe(account)  # no row is read until the provider answers again
                continue
            if self.health.on_trial(account):
                want = 1
            claimed += await self._claim_account(account, want)
        return claimed

    async def _claim_account(self, account: str, want: int) -> int:
        cfg = self.config
        budget = cfg.budgets.get(account)
        lane = cfg.claim_mode is ClaimMode.LOCK
        if lane:
            # the lane first: tokens taken now are spent now, not after waiting for a lane
            await self._lanes.acquire()
        try:
            take = await take_budget(self.store, account, "status", want, budget)
            granted = take.granted
            n = 0
            if (cfg.fetch_results and granted and not self._stopping.is_set()
                    and (self.results.seen(account) or self._turn % RESULTS_TURN == 0)):
                # a share first, so a status backlog that eats every token cannot starve them
                # (a single token goes to results every other turn only)
                share = granted // 4 or self._turn % 2
                if share:
                    n = await self._claim_results(account, share)
            if granted > n and not self._stopping.is_set():
                owns_lane, lane = lane, False  # from here the locked batch releases it
                n += await self._claim_some(account, granted - n, owns_lane)
            if cfg.fetch_results and n < granted and not self._stopping.is_set():
                # tokens left over: result fetches share the account's read budget
                n += await self._claim_results(account, granted - n)
        finally:
            if lane:
                self._lanes.release()
        wait_s = await settle_budget(self.store, take, n)
        if wait_s is not None:
            # the budget, not the due rows, held this account back (with nothing granted
            # the idle path only sleeps this long if rows are due)
            self._budget_wait = min(self._budget_wait or wait_s, wait_s)
        return n

    async def _claim_some(self, account: str, limit: int, locked_lane: bool) -> int:
        cfg = self.config
        if not locked_lane:
            jobs = await self.store.claim(limit, cfg.lease_s, cfg.worker_id, account)
            self._count_claim(len(jobs))
            if self._stopping.is_set():  # stop() arrived during the claim: give them back
                await self.store.release(jobs)
                return len(jobs)
            for job in jobs:
                if self._inflight < cfg.concurrency:
                    self._inflight += 1
                    self._spawn(self._read_leased(job))
                else:
                    self._ready.append(job)  # read as soon as a slot frees
            return len(jobs)
        claimed: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._spawn(self._locked_batch(limit, account, claimed))
        return await claimed

    async def _claim_results(self, account: str, limit: int) -> int:
        claims = await self.results.claim(account, limit, self.config.lease_s)
        for claim in claims:
            self._inflight += 1
            self._spawn(self._fetch_result(claim))
        return len(claims)

    async def _fetch_result(self, claim: ClaimedResult) -> None:
        try:
            answer = await self.results.fetch(claim, self.readers[claim.account],
                                              self._clock(), self._rng)
            if answer is not None:
                self._note_server_pause(claim.account, answer)
        except DatabaseUnavailable as exc:
            self._db_unavailable(exc)  # the lease ends and the fetch is due again
        finally:
            self._inflight -= 1
            self._wake.set()
            await self.signals.pulse()

    def _count_claim(self, n: int) -> None:
        self._answered_at = asyncio.get_running_loop().time()  # a claim statement succeeded
        self._wrote(n)
        metrics.CLAIM_BATCH.observe(n)
        self.stats.claims += 1
        self.stats.claimed_rows += n

    # -- reading ----------------------------------------------------------------------------
    def _policy_of(self, account: str) -> PollPolicy:
        """The poll policy of `account`: the worker's, its floor raised to the account's own
        (`poll_floors`) or its provider's (`Rules.min_poll_s`: Veo's documented 10 s)."""
        found = self._policies.get(account)
        if found is None:
            policy = self.config.policy
            floor = self.config.poll_floors.get(account)
            if floor is None:
                floor = float(getattr(self.readers[account].rules, "min_poll_s", 0.0) or 0.0)
            floor = min(policy.max_poll_s, max(policy.min_poll_s, floor))
            found = self._policies[account] = (
                policy if floor == policy.min_poll_s else dataclasses.replace(
                    policy, min_poll_s=floor,
                    default_poll_s=max(policy.default_poll_s, floor)))
        return found

    async def _read(self, job: ClaimedJob) -> Outcome | None:
        """One status read and its decision; None means 'give the row back unread'."""
        started = self._clock()
        loop = asyncio.get_running_loop()
        began = loop.time()
        late_s = late_at_read(job)
        metrics.IN_FLIGHT.inc()
        try:
            reader = self.readers[job.account]
            # a handle only where the job has one: a provider that needs none never sees it
            answer = await (reader.read_status(job.job_id) if job.handle is None
                            else reader.read_status(job.job_id, job.handle))  # type: ignore[call-arg]
        except Exception as exc:  # the reader promises answers, not exceptions; be safe
            log.exception("job %s: status read raised", job.job_id)
            answer = HttpAnswer(None, transport_error=ErrorClass.CONNECTION,
                                detail=type(exc).__name__)
        finally:
            metrics.IN_FLIGHT.dec()
        answered = time.monotonic()
        read_s = loop.time() - began
        self.stats.reads += 1
        self.stats.max_late_s = max(self.stats.max_late_s, late_s)
        self._note_server_pause(job.account, answer)
        try:
            policy = self._policy_of(job.account)
            decision = decide(job, answer, self._clock(), policy, self._rng,
                              self.readers[job.account].rules,
                              lambda: self.schedules.for_job(job, policy.min_poll_s),
                              self.schedules.timing(job.account).overdue_factor)
        except Exception as exc:
            # never release such a row (it would be due at once: a hot loop); back off instead
            log.exception("job %s: could not interpret the answer", job.job_id)
            decision = Outcome(job.job_id, job.claim_token, PENDING,
                               backoff_delay(job.consecutive_errors + 1, self.config.policy,
                                             self._rng),
                               read_ok=False, http_status=answer.status,
                               error_class=ErrorClass.MALFORMED,
                               error=f"could not interpret the answer: {type(exc).__name__}",
                               account=job.account)
        misrouted = isinstance(decision, Misrouted)
        if isinstance(decision, Misrouted):  # (isinstance again: mypy narrows on it)
            if self.health.is_suspect(job.job_id):
                # The provider answers this account's other reads: only this row's URL is
                # refused (a proxy rule, say), so it backs off on its own
                decision = decision.row_outcome
            else:
                metrics.observe_poll(self.minutes, started, job.account,
                                     ErrorClass.CLIENT_ERROR.value, late_s, read_s)
                if self._misrouted_read(job, decision):
                    self.stats.count_error(ErrorClass.CLIENT_ERROR)
                return None
        if isinstance(decision, AuthPause):
            metrics.observe_poll(self.minutes, started, job.account, ErrorClass.AUTH.value,
                                 late_s, read_s)
            if self._key_refused(job.account, decision, "polling"):
                self.stats.count_error(ErrorClass.AUTH)
            return None
        metrics.observe_poll(self.minutes, started, job.account,
                             decision.error_class.value if decision.error_class is not None
                             else "final" if decision.is_final else "not_ready",
                             late_s, read_s)
        if not misrouted:  # no proof either way: the provider never saw this read
            self._key_accepted(job.account, "polling")
        if decision.read_ok or decision.error_class is ErrorClass.NOT_FOUND:
            self._provider_answered(job.account, job.job_id)
        if decision.read_ok:  # (first: a read that went well is parsed once, in decide)
            if self.health.not_api:
                self._not_api_ends(job.account)
        elif is_not_api(answer):
            self._not_api_answer(job, answer)
        elif provider_error_code(answer.body, self.readers[job.account].rules) is not None:
            self._not_api_ends(job.account)
        if decision.error_class is not None:
            self.stats.count_error(decision.error_class)
            # the first failure of a run is an event; the repeats are in the counters
            log.log(logging.INFO if job.consecutive_errors == 0 else logging.DEBUG,
                    "job %s: read failed: %s (next try in %.1fs)", job.job_id, decision.error,
                    decision.delay_s,
                    extra=event(job_id=job.job_id, account=job.account,
                                outcome=decision.error_class.value,
                                http_status=decision.http_status,
                                request_id=decision.request_id))
        elif not decision.is_final:
            self.stats.not_ready += 1
            word = (decision.provider_status or "").split(" (", 1)[0]
            if word and decision.unknown_word and word not in self._seen_words:
                self._seen_words.add(word)
                log.warning("The provider sent an unknown non-terminal status %r; polling on",
                            word)
        if decision.is_final and decision.body is not None:
            decision = self._costed(decision)
        return dataclasses.replace(decision, answered_mono=answered)

    def _costed(self, decision: Outcome) -> Outcome:
        """A final outcome with what the provider says the job cost (`Rules.cost`), in the
        account's currency where it prices the provider's unit; without a figure the store
        keeps the estimate reserved for the job."""
        rules = self.readers[decision.account].rules
        cost_of = getattr(rules, "cost", None)
        if not callable(cost_of) or decision.outcome is None:
            return decision
        try:
            cost = cost_of(decision.body, decision.outcome)
        except Exception:  # a provider's figure never costs a job its ending
            log.exception("job %s: could not read its cost", decision.job_id)
            return decision
        if not isinstance(cost, Cost):
            return decision
        spend = self.config.spends.get(decision.account, NO_SPEND)
        return dataclasses.replace(decision, cost=spend.money(cost),
                                   provider_cost=cost.amount, provider_cost_unit=cost.unit)

    # -- reads answered by something other than the provider -------------------------------
    def _shown_url(self, account: str, job_id: str) -> str:
        shown = getattr(self.readers.get(account), "shown_status_url", None)
        if callable(shown):
            with contextlib.suppress(Exception):
                return str(shown(job_id))
        return f"the status URL of job {job_id!r}"

    def _misrouted_read(self, job: ClaimedJob, pause: Misrouted) -> bool:
        """Pause the account after an answer that was not the provider's (its row is given
        back untouched); False if its pause had begun already (logged once per pause)."""
        account = job.account
        delay = self.health.misrouted(account, self._now(),
                                      lambda: self._shown_url(account, job.job_id), job.job_id)
        episode = self.health.episode(account)
        if delay is None or episode is None:
            return False
        self.misroute_pauses += 1
        metrics.MISROUTE_PAUSES.labels(account, "poll").inc()
        log.error("account %r: a status read got %s from %s, not the provider's error "
                  "envelope: the base URL looks wrong, or a proxy answers in the provider's "
                  "place. Polling of this account is paused, its rows untouched (never counted "
                  "as not found), and probed again with backoff (first in %.1fs); `vidpoll "
                  "doctor` checks the URL", account, pause.detail, episode.url, delay,
                  extra=event(job_id=job.job_id, account=account, outcome="misrouted",
                              http_status=pause.http_status))
        return True

    def _not_api_answer(self, job: ClaimedJob, answer: HttpAnswer) -> None:
        """A read answered by a redirect or a 2xx that is no JSON object: the row backs off on
        its own (policy.decide); NOT_API_STREAK of them in a row for an account, none answered
        by the provider, log one ERROR naming the URL (Health.not_api_answer). No pause."""
        streak = self.health.not_api_answer(job.account, job.job_id)
        if streak is None:
            return
        status = answer.status
        what = "a redirect" if status is not None and 300 <= status < 400 else (
            "a body that is not a JSON object")
        log.error("account %r: the last %d status reads (%d rows) were answered with %s, "
                  "never by the provider (the last: HTTP %s from %s): the base URL is "
                  "probably wrong (`vidpoll doctor` checks it). Polling goes on, each such row "
                  "backing off on its own", job.account, streak.count, len(streak.rows), what,
                  status, self._shown_url(job.account, job.job_id),
                  extra=event(job_id=job.job_id, account=job.account, outcome="not_api",
                              http_status=status))

    def _not_api_ends(self, account: str) -> None:
        """The provider answered one of the account's reads: a streak of answers that were
        not the API's ends (said at INFO if it was logged)."""
        streak = self.health.api_answered(account)
        if streak is not None:
            log.info("account %r: the provider answers status reads again after %d answers "
                     "that were not its own", account, streak.count)

    def _probe(self, account: str) -> None:
        """Send one probe read for a misrouted account whose pause ran out (at most one at a
        time; the account stays paused until its answer)."""
        episode = self.health.probe_starts(account, self._now())
        if episode is not None:
            self._spawn(self._probe_url(account, episode))

    async def _probe_url(self, account: str, episode: Misroute) -> None:
        probe_id = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
        try:
            answer = await self.readers[account].read_status(probe_id)
        except Exception as exc:  # the reader promises answers, not exceptions; be safe
            answer = HttpAnswer(None, transport_error=ErrorClass.CONNECTION,
                                detail=type(exc).__name__)
        finally:
            self.health.probe_over(episode)
        self.url_probes += 1
        verdict = probe_verdict(answer, self.readers[account].rules)
        after = self.health.probe_answered(account, episode, verdict, self._now())
        if after is None:
            pass  # a row's read reached the provider meanwhile: polling resumed already
        elif after.resumed:  # (a refused key is the rows' to report)
            self._url_works(account, episode, "a probe")
        else:
            log.debug("account %r: probe answered %s (%s); still paused, next probe in %.1fs",
                      account, answer.status or answer.transport_error, verdict, after.delay_s)
        self._wake.set()
        await self.signals.pulse()

    def _provider_answered(self, account: str, job_id: str) -> None:
        """A read of `job_id` reached the provider: the row is no suspect, and a pause of its
        account for answers that were not the provider's ends."""
        episode = self.health.read_answered(account, job_id)
        if episode is not None:
            self._url_works(account, episode, "a status read")

    def _url_works(self, account: str, episode: Misroute, how: str) -> None:
        """The provider answers the account's reads again (Health.url_works ended `episode`):
        polling resumes."""
        log.info("account %r: the provider answers status reads again (%s); polling resumed "
                 "after %.1fs (a row refused again that way while the others are answered "
                 "backs off on its own)", account, how, self._now() - episode.since)
        self._wake.set()

    def _note_server_pause(self, account: str, answer: HttpAnswer) -> None:
        """Queue the server's pause for the fleet's bucket (written by the writer, batched;
        health.bucket_pause says which answers pause it)."""
        pause = bucket_pause(server_pause_s(answer, self._clock(), self.config.policy),
                             answer.status, account in self.config.budgets)
        if pause is None:
            return
        add_pause(self._pauses, account, pause)
        self._outbox_ready.set()

    async def _read_leased(self, job: ClaimedJob) -> None:
        try:
            outcome = None
            if self.health.blocked(job.account):
                self._release.append(job)  # unread: its account waits for a probe
            elif self._lease_fits_a_read(job):
                outcome = await self._read(job)
                if outcome is None:
                    self._release.append(job)
        except asyncio.CancelledError:
            # the shutdown timeout stopped it. Its row keeps its lease, as after a kill: the
            # request went out, and the provider may have answered with a hint this worker never
            # read
            # (released due as before, another worker read such a row 0.84 s sooner than that
            # hint in a chaos run); the lease is the schedule
            raise
        except Exception:
            log.exception("unexpected error reading job %s; its lease will expire", job.job_id)
        else:
            if outcome is not None:
                self._outbox.append(outcome)
        finally:
            self._inflight -= 1
            if self._ready and not self._stopping.is_set():
                self._inflight += 1
                self._spawn(self._read_leased(self._ready.popleft()))
                if len(self._ready) < self._refill_min:
                    self._wake.set()  # time to claim the next batch
        self._outbox_ready.set()

    def _lease_fits_a_read(self, job: ClaimedJob) -> bool:
        """Whether one whole read (the HTTP timeout) and its write still fit in the lease.

        If not, the lease could end before the answer is recorded, and another worker could
        read the row at the same moment, earlier than the hint the answer carried. The row is
        then left alone: its lease, nearly over, makes it due again (a release would make it
        due at once, and a worker whose claims keep arriving late would spin on it).
        """
        cfg = self.config
        if not job.sent_mono:
            return True  # a store that does not stamp its claims: nothing to go by
        left_s = job.sent_mono + cfg.lease_s - time.monotonic()
        if left_s > cfg.read_timeout_s + WRITE_MARGIN_S:
            return True
        self.stats.too_late_to_read += 1
        if self.stats.too_late_to_read == 1 or self.stats.too_late_to_read % 1000 == 0:
            log.warning("%d claimed rows had too little lease left for one read (%.1fs left, "
                        "%gs needed); they are read after their lease ends. Claims arrive "
                        "late or this worker is starved: a longer --lease-seconds, or fewer "
                        "rows claimed ahead (--batch-size), helps", self.stats.too_late_to_read,
                        left_s, cfg.read_timeout_s + WRITE_MARGIN_S)
        return False

    async def _locked_batch(self, limit: int, account: str,
                            claimed: asyncio.Future[int]) -> None:
        n = 0
        try:
            async with self.store.lock_batch(limit, self.config.worker_id, account) as batch:
                n = len(batch.jobs)
                self._inflight += n
                self._count_claim(n)
                claimed.set_result(n)
                results = await asyncio.gather(*(self._read(j) for j in batch.jobs))
                outcomes = [o for o in results if o is not None]
                applied = await batch.record(outcomes)
                # read without an outcome (a refused key): no claim may be left behind
                await batch.release([j for j, o in zip(batch.jobs, results, strict=True)
                                     if o is None])
            self._wrote(len(applied))
            self._account(outcomes, applied)
        except DatabaseUnavailable as exc:
            if not claimed.done():
                claimed.set_exception(exc)
            else:
                self.stats.db_errors += 1
                log.warning("lost the database during a locked batch; its %d rows stay due: %s",
                            n, exc)
        except BaseException as exc:
            if not claimed.done():
                claimed.set_exception(exc)
            raise
        finally:
            self._inflight -= n
            self._lanes.release()
            self._wake.set()
        await self.signals.pulse()

    # -- recording --------------------------------------------------------------------------
    def _account(self, outcomes: Sequence[Outcome], applied: set[str]) -> None:
        for outcome in outcomes:
            if outcome.job_id not in applied:
                self.stats.fenced_out += 1
                metrics.FENCED_OUT.inc()
                log.warning("job %s: result dropped, another worker owns the row now",
                            outcome.job_id)
                continue
            self.stats.recorded += 1
            if outcome.is_final:
                self.stats.finished += 1
                log.info("job %s finished: %s", outcome.job_id, outcome.state,
                         extra=event(job_id=outcome.job_id, account=outcome.account,
                                     outcome=outcome.state, http_status=outcome.http_status,
                                     request_id=outcome.request_id))

    # -- vacuum ---------------------------------------------------------------------------
    def _wrote(self, rows: int) -> None:
        """Count row versions written; past the threshold, vacuum (one at a time)."""
        every = self.config.vacuum_every_rows
        self._written_since_vacuum += rows
        if (every > 0 and self._written_since_vacuum >= every
                and (self._vacuum_task is None or self._vacuum_task.done())
                and self._vacuum_allowed is not False and not self._stopping.is_set()):
            self._written_since_vacuum = 0
            self._vacuum_task = asyncio.create_task(self._vacuum(), name="vidpoll-vacuum")

    async def _vacuum(self) -> None:
        try:
            if self._vacuum_allowed is None:
                self._vacuum_allowed = await self.store.can_vacuum_jobs()
                if not self._vacuum_allowed:
                    log.info("this role may not VACUUM video_jobs; its dead rows are left to "
                             "autovacuum (its owner may; so may MAINTAIN on PostgreSQL 17+)")
                    return
            started = asyncio.get_running_loop().time()
            if await self.store.vacuum_jobs():
                self.stats.vacuums += 1
                log.debug("vacuumed video_jobs in %.3fs",
                          asyncio.get_running_loop().time() - started)
            else:
                self.stats.vacuums_skipped += 1  # autovacuum or another worker was at it
        except DatabaseUnavailable as exc:  # the next threshold tries again
            log.debug("vacuum not run: %s", exc)
        except Exception as exc:  # not an outage: say so once and leave it to autovacuum
            self._vacuum_allowed = False
            log.warning("VACUUM of video_jobs failed (%s: %s); leaving the table to "
                        "autovacuum from now on", type(exc).__name__, exc)
        await self.signals.pulse()

    async def _stop_vacuum(self) -> None:
        """A stop does not wait for a VACUUM (minutes on a big table): cancel it."""
        await cancel_and_wait(self._vacuum_task)

    async def _writer(self) -> None:
        """Writes queued outcomes in batches: one statement for everything read meanwhile."""
        failures = 0
        while True:
            if not self._outbox and not self._release and not self._pauses:
                if self._writer_may_exit:
                    return
                self._outbox_ready.clear()
                await self._outbox_ready.wait()
                continue
            loop_time = asyncio.get_running_loop().time
            if not self._writer_may_exit and self._last_write + WRITE_INTERVAL_S > loop_time():
                await asyncio.sleep(self._last_write + WRITE_INTERVAL_S - loop_time())
            self._last_write = loop_time()
            batch, self._outbox = self._outbox, []
            release, self._release = self._release, []
            pauses, self._pauses = self._pauses, {}
            asked_at = loop_time()
            try:
                for account, (seconds, refused) in pauses.items():
                    await self.store.pause_bucket(account, "status", seconds, refused)
                    self.stats.server_pauses += 1
                    metrics.SERVER_PAUSES.labels(account).inc()
                applied = await self.store.record(batch) if batch else set()
                if release:
                    await self.store.release(release)
            except DatabaseUnavailable as exc:
                failures += 1
                self._db_unavailable(exc)
                self._outbox[:0] = batch
                self._release[:0] = release
                for account, pause in pauses.items():
                    add_pause(self._pauses, account, pause)
                if self._writer_may_exit:
                    log.error("stopping with %d unrecorded results; their rows come due again "
                              "when their leases end", len(self._outbox))
                    return
                await asyncio.sleep(backoff_delay(failures, self.config.policy, self._rng,
                                                  DB_BACKOFF_MAX_S))
                continue
            except Exception:
                # not an outage (policy keeps bodies storable, so this is a bug): drop the
                # batch rather than the writer; the rows come due again when leases end
                log.exception("could not record %d results; their rows will be re-read",
                              len(batch))
                continue
            failures = 0
            if pauses or batch or release:  # a statement ran and succeeded
                self._db_recovered(asked_at)
            self._wrote(len(applied) + len(release))
            self._account(batch, applied)
            self._wake.set()
            await self.signals.pulse()

    # -- wake-ups -------------------------------------------------------------------------
    def _notifications(self) -> AsyncIterator[Notice]:
        return self.store.notifications(WAKE_CHANNELS)

    def _db_unavailable(self, exc: DatabaseUnavailable) -> None:
        self.stats.db_errors += 1
        metrics.DB_ERRORS.inc()
        loop_time = asyncio.get_running_loop().time()
        if self._db_down_since is None:
            self._db_down_since = loop_time
            log.error("database unavailable, retrying with backoff (no row is lost; claimed "
                      "rows come due again): %s", str(exc).splitlines()[0])

    def _db_recovered(self, asked_at: float) -> None:
        """A statement begun at `asked_at` (loop time) succeeded. The database is reachable
        again only if it began after the outage was seen: one begun before may have finished
        on a connection that outlived the failure another task saw."""
        if self._db_down_since is not None and asked_at >= self._db_down_since:
            down = asyncio.get_running_loop().time() - self._db_down_since
            self._db_down_since = None
            log.warning("database reachable again after %.1fs", down)

