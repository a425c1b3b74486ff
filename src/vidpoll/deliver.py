"""Deliveries: what runs after a job's terminal state is committed, at least once.

Two kinds of consumer, each tracked per job in `vidpoll_deliveries` (queued by a trigger in the
same transaction as the terminal transition, so no crash can skip one):

- `download`: a completed job's media files into `--download-dir` (vidpoll.download), each
  URL through vidpoll.fetch_guard's rules (a URL they refuse, or a file too large, fails the
  delivery at once: DownloadRefused; anything else retries);
- `hook:<module:function>`: a user function called with the finished `Job` (its result, and
  its files when downloads are on, since hooks wait for the download).

Each delivery is leased (the lease is the schedule) and extended while it runs, so a crash
makes it due again and a long download is never taken over; every write is fenced on the
lease's token. A hook never runs beside itself: an attempt whose lease could not be extended
stops before the lease can lapse (by this process's clock), and a sync hook's thread, which
cannot be stopped, is ended with its process (LeaseFence) before another worker can claim it.
Failures retry with backoff up to MAX_DELIVERY_ATTEMPTS, then the delivery is marked failed
(kept, shown by `vidpoll deliveries`, re-queued by `vidpoll deliveries retry`).
Deliveries run in their own tasks with their own limit: a slow hook never stalls polling.

Shutdown fits a grace period (`shutdown_timeout_s`, 25 s by default: under Kubernetes' 30).
After stop() nothing more is claimed (a claim already in flight is handed straight back);
what runs may finish, and is recorded as usual, until a short reserve (`runner.shutdown_reserve_s`,
at most 3 s) before the period ends. Then whatever still runs is handed back: its lease is
released, due again at once, without spending a try of its retry budget (being stopped is no
fault of the delivery), so another worker takes it. Never two runs at once: a download or an
async hook is cancelled first and released only once it has ended. A sync hook's thread
cannot be stopped, and to wait for it would break the grace period, so its delivery is
released due UNSTOPPABLE_HANDBACK_DELAY_S (4 s) ahead and the process ends at once
(`os._exit(LOST_LEASE_EXIT_CODE)`, 75), the thread with it, before anyone can claim it; the
fence holds the shortened lease meanwhile, so even a blocked event loop or a release that
never answers cannot let the hook outlive it. An async hook that ignores its cancellation is
treated the same. A sync hook already past `hook_timeout_s` is handed back with its try
counted (a hook that hangs must still reach its retry limit). Ending the process also ends
the poller and submitter beside the deliverer; by then they have had all but the reserve of
the same grace period (stop() reaches every runner at once). A release that fails (the
database unreachable) leaves the lease to lapse as after a crash: what it covered was stopped
first, or its process has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import itertools
import logging
import os
import random
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from vidpoll import metrics
from vidpoll.aio import honour_cancel
from vidpoll.config import HOOK_PATH_VARIABLE, hook_path
from vidpoll.errors import (
    ConfigError,
    DatabaseUnavailable,
    DiskError,
    DownloadError,
    DownloadRefused,
    UrlExpired,
)
from vidpoll.logs import event
from vidpoll.media import MAX_MEDIA_URLS, redact_urls
from vidpoll.models import (
    DOWNLOAD,
    ClaimedDelivery,
    DeliveryOutcome,
    Job,
    MediaFile,
    Notice,
    WorkerStats,
)
from vidpoll.policy import PollPolicy, backoff_delay
from vidpoll.providers import registry
from vidpoll.runner import (
    DB_BACKOFF_MAX_S,
    IDLE_MAX_S,
    SHUTDOWN_TIMEOUT_S,
    NoticeStore,
    Runner,
    default_worker_id,
    shutdown_reserve_s,
    utc_now,
)

log = logging.getLogger(__name__)

Hook = Callable[[Job], Awaitable[None] | None]
"""A completion hook: called with the finished job; may be sync (run in a thread) or async."""

MAX_DELIVERY_ATTEMPTS = 20
"""Tries before a delivery is marked failed (about half a day of backoff); kept and retryable."""
DELIVERY_BACKOFF_MAX_S = 3600.0
EXPIRED_LINK_RETRY_S = 1.0
"""After an expired media link, the retry waits for the fresh result, then this long."""
MAX_ERROR_TEXT = 500
BUSY_RETRY_S = 0.25
"""Floor of the sleep when deliveries are due but were not claimed: never a hot loop."""
FENCE_MARGIN_MAX_S = 2.0
"""An attempt whose lease was not extended in time stops this long (at most a sixth of the
lease) before the lease could lapse; a hook still running half of it before, ends the process."""
EXTEND_RETRY_S = 1.0
"""After a failed heartbeat the next one is tried this soon (at most a third of the lease)."""
LOST_LEASE_EXIT_CODE = 75
"""The status of a process that ended itself under a hook it could not stop (EX_TEMPFAIL: a
supervisor should restart it): the fence, before a lease it could not extend lapsed, or a
shutdown whose grace period ended first, after handing the delivery back."""
CANCEL_WAIT_MIN_S = 0.05
"""A delivery cancelled at the hand-back gets at least this long to end (then: unstoppable)."""
UNSTOPPABLE_HANDBACK_DELAY_S = 4.0
"""A delivery handed back while its hook still runs (a sync hook's thread) is due again this
long after its release; the process ends at once, and (the fence) at the latest a second or
two before then. Longer than the reserve, so it is due after the grace period too."""


def fence_margin_s(lease_s: float) -> float:
    """How long before its lease could lapse an attempt that could not extend it stops."""
    return min(FENCE_MARGIN_MAX_S, lease_s / 6)


@dataclass
class HeldLease:
    """A running delivery's lease as this process counts it: the database cannot end it before
    `ends_at` (time.monotonic(), read before the statement that set it was sent)."""

    ends_at: float


class LeaseFence:
    """Ends the process before a lease lapses under a hook that still runs.

    A worker cut off from the database can neither extend its lease nor tell anyone its hook
    still runs, and a thread cannot be stopped: once the lease lapses, another worker starts
    the same hook beside it. So every running hook is held here with its lease; one that still
    runs when its unextended lease is about to lapse ends the process (`os._exit`, which ends
    the thread), before another worker can claim it. Its own thread, so a blocked event loop
    cannot delay it; it runs only while something is held.
    """

    def __init__(self, margin_s: float, exit_process: Callable[[int], Any] = os._exit) -> None:
        self._margin_s = margin_s
        self._exit = exit_process
        self._cond = threading.Condition()
        self._held: dict[int, tuple[HeldLease, str]] = {}
        self._ids = itertools.count()
        self._watchdog: threading.Thread | None = None

    def hold(self, lease: HeldLease, what: str) -> Callable[[], None]:
        """Watch `lease` while `what` runs; call the function returned once it has ended (a
        second call is harmless)."""
        with self._cond:
            key = next(self._ids)
            self._held[key] = (lease, what)
            if self._watchdog is None:
                self._watchdog = threading.Thread(target=self._watch, daemon=True,
                                                  name="vidpoll-lease-fence")
                self._watchdog.start()
            self._cond.notify()

        def release() -> None:
            with self._cond:
                self._held.pop(key, None)
                self._cond.notify()

        return release

    @contextlib.contextmanager
    def holding(self, lease: HeldLease, what: str) -> Iterator[None]:
        """Hold `lease` while the block runs."""
        release = self.hold(lease, what)
        try:
            yield
        finally:
            release()

    def _watch(self) -> None:
        with self._cond:
            while self._held:
                # ends_at only moves later (each heartbeat): a stale minimum wakes early, no harm
                lease, what = min(self._held.values(), key=lambda held: held[0].ends_at)
                left = lease.ends_at - self._margin_s / 2 - time.monotonic()
                if left > 0:
                    self._cond.wait(left)
                    continue
                # said from a thread of its own, waited for briefly: a log that blocks (a full
                # stderr pipe) must not hold the exit past the lease
                said = threading.Thread(target=log.critical, daemon=True, args=(
                    "%s still runs, and its lease could not be extended (is the database "
                    "reachable?): ending this process (exit %d) before the lease lapses, so "
                    "that no other worker runs it beside this one", what,
                    LOST_LEASE_EXIT_CODE))
                said.start()
                said.join(self._margin_s / 4)
                self._exit(LOST_LEASE_EXIT_CODE)
                break  # only an injected exit returns
            self._watchdog = None


def hook_consumer(name: str) -> str:
    """The consumer name of a hook."""
    return f"hook:{name}"


def hook_name(fn: Callable[..., Any]) -> str:
    """`module:qualname` of a function: the default name its deliveries are tracked under."""
    return f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"


def load_hook(spec: str, path: Sequence[str] | None = None) -> Hook:
    """Import `module:function` from sys.path, then from `path` (default: VIDPOLL_HOOK_PATH).

    The working directory is not searched unless asked (VIDPOLL_HOOK_PATH=., or PYTHONPATH):
    put first on sys.path, any `json.py` or `aiohttp.py` lying where the worker was started
    (a download directory, /tmp) would be imported in place of the real module. The
    directories asked for go last, so they cannot shadow an installed module either."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--on-terminal wants module:function, got {spec!r}")
    for directory in hook_path(os.environ) if path is None else path:
        if directory not in sys.path:
            sys.path.append(directory)
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name == module_name.split(".")[0]:
            hint = (f" (the working directory is not searched: set {HOOK_PATH_VARIABLE}=. "
                    "or PYTHONPATH, or install the module)")
        raise ConfigError(f"cannot import {module_name!r} for --on-terminal: {exc}{hint}"
                          ) from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ConfigError(f"{module_name!r} has no {attr!r} for --on-terminal") from exc
    if not callable(obj):
        raise ConfigError(f"{spec!r} is not callable")
    hook: Hook = obj
    return hook


class DeliveryStore(NoticeStore, Protocol):
    """What deliveries need from the database."""

    async def register_consumer(self, name: str) -> bool:
        """Record that deliveries are wanted for `name`; True if it is new."""

    async def claim_deliveries(self, consumer: str, limit: int, lease_s: float
                               ) -> list[ClaimedDelivery]:
        """Lease up to `limit` due deliveries of one consumer."""

    async def extend_delivery(self, claim: ClaimedDelivery, lease_s: float) -> bool:
        """Push a running delivery's lease out; False if it is no longer ours."""

    async def record_delivery(self, outcome: DeliveryOutcome) -> bool:
        """Write one attempt's outcome, fenced."""

    async def release_delivery(self, claim: ClaimedDelivery, delay_s: float,
                               error: str | None = None) -> bool:
        """Hand a running delivery back (its worker is stopping): due in `delay_s`, its try
        given back unless `error` says why it counts; fenced; False if no longer ours."""

    async def next_delivery_due_in(self, consumers: Sequence[str]) -> float | None:
        """Seconds until the next claimable delivery; None if none is pending."""

    async def pending_deliveries(self, consumers: Sequence[str], within_s: float
                                 ) -> tuple[int, int]:
        """(pending, due within `within_s`) for a drain."""


class MediaDownloader(Protocol):
    """What downloads need from the file side (vidpoll.download.Downloader)."""

    async def download(self, job_id: str, urls: list[str], account: str) -> list[MediaFile]:
        """Download every URL of one job of `account` (whose fetch rules apply); raises
        DownloadError subclasses (DownloadRefused: for good)."""

    def check_directory(self) -> None:
        """Raise if the directory cannot take files."""


@dataclass(frozen=True)
class DeliveryConfig:
    """How one process runs deliveries."""

    hooks: Mapping[str, Hook] = field(default_factory=dict)
    """Hooks by name (their deliveries are tracked as `hook:<name>`)."""
    concurrency: int = 4
    """Deliveries run at once, per consumer."""
    hook_timeout_s: float = 300.0
    lease_s: float = 30.0
    """Each lease is extended every third of this while the delivery runs; after a crash the
    delivery is due again within it."""
    max_attempts: int = MAX_DELIVERY_ATTEMPTS
    drain: bool = False
    listen: bool = True
    idle_max_s: float = IDLE_MAX_S
    policy: PollPolicy = field(default_factory=PollPolicy)
    worker_id: str = field(default_factory=default_worker_id)
    channels: tuple[str, ...] = ("vidpoll_job_done",)
    shutdown_timeout_s: float = SHUTDOWN_TIMEOUT_S
    """After stop(), run() returns within this (or, with a sync hook still running, the
    process ends): deliveries that cannot finish in it are handed back to other workers."""


class Deliverer(Runner):
    """Runs downloads and hooks for finished jobs, beside (never inside) the polling loop."""

    def __init__(self, store: DeliveryStore, config: DeliveryConfig,
                 downloader: MediaDownloader | None = None, rng: random.Random | None = None,
                 clock: Callable[[], datetime] = utc_now,
                 exit_process: Callable[[int], Any] = os._exit) -> None:
        super().__init__(config.policy, rng, clock)
        self.store = store
        self.config = config
        self.downloader = downloader
        self.stats = WorkerStats()
        self.producers_done = asyncio.Event()
        """Set when no poller in this process can finish more jobs (ends a drain)."""
        self.task: asyncio.Task[None] | None = None
        """The task running run(), when the API started it."""
        self.consumers = ([DOWNLOAD] if downloader is not None else []) + [
            hook_consumer(n) for n in config.hooks]
        self._running: dict[str, int] = dict.fromkeys(self.consumers, 0)
        self._attempts: dict[asyncio.Task[DeliveryOutcome], str] = {}
        self._prepared = False
        # sync hooks get threads of their own: a hung hook never starves the file I/O that
        # downloads do in the default executor
        self._hook_threads = ThreadPoolExecutor(
            max_workers=max(1, config.concurrency * len(config.hooks)),
            thread_name_prefix="vidpoll-hook")
        self._exit = exit_process
        self._fence = LeaseFence(fence_margin_s(config.lease_s), exit_process)
        self._abandoned: set[asyncio.Task[Any]] = set()
        """Statements given up on while in flight (held here until they end)."""
        self._stop_asked_at: float | None = None
        """time.monotonic() of the first stop(): the grace period counts from it."""
        self._handback = asyncio.Event()
        """Set when the grace period is about to end: what still runs is handed back."""
        self._threads: dict[uuid.UUID, tuple[Future[Any], float]] = {}
        """Sync hooks' threads that still run, by their claim's token, with when they began."""
        self._unstoppable: dict[str, Callable[[], bool]] = {}
        """Handed back while still running (what: does it still run?): the process ends."""
        self.handed_back = 0
        """Deliveries this process handed back at shutdown."""
        if not self.consumers:
            raise ConfigError("a Deliverer needs a hook or a download directory")
        if not config.shutdown_timeout_s > 0:
            raise ConfigError(f"the shutdown timeout must be positive, got "
                              f"{config.shutdown_timeout_s:g}s")

    def _notifications(self) -> AsyncIterator[Notice]:
        return self.store.notifications(self.config.channels)

    def stop(self) -> None:
        """Stop claiming; what runs may finish within `shutdown_timeout_s`, and is recorded;
        what cannot is handed back to other workers before it ends (see the module)."""
        if self._stop_asked_at is None:
            self._stop_asked_at = time.monotonic()
        super().stop()

    async def prepare(self) -> None:
        """Check the download directory and register the consumers (run() does it too); from
        its return on, every job that ends gets a delivery."""
        if self._prepared:
            return
        if self.downloader is not None:
            # an unusable directory fails here, loudly, before anything is claimed
            await asyncio.to_thread(self.downloader.check_directory)
        for consumer in self.consumers:
            if await self.store.register_consumer(consumer):
                log.info("deliveries for %s start now: every job that ends from here on gets "
                         "one", consumer)
        self._prepared = True

    def producers_finished(self) -> None:
        """No poller in this process will finish more jobs: a drain may end once nothing is
        left to deliver (wakes the loop, which may be sleeping until its next check)."""
        self.producers_done.set()
        self._wake.set()

    async def drained(self) -> None:
        """Wait until run() returned (with drain: nothing left to deliver now); re-raises
        what ended it."""
        assert self.task is not None, "started by Vidpoll.deliveries()"
        await asyncio.shield(self.task)

    async def run(self) -> None:
        """Deliver until stop() (or, with drain, until nothing is left to deliver now).

        On stop, what runs may finish until shortly before `shutdown_timeout_s`; then what
        still runs is handed back (stopped, its lease released for another worker) and run()
        returns, within the timeout; if a sync hook's thread still runs, the process ends
        instead (LOST_LEASE_EXIT_CODE), since a thread cannot be stopped."""
        await self.prepare()
        listener = (asyncio.create_task(self._listener(), name="vidpoll-delivery-listener")
                    if self.config.listen else None)
        loop = asyncio.create_task(self._loop(), name="vidpoll-delivery-loop")
        try:
            await self._until_stopped(loop)
        finally:
            self._stopping.set()
            await self._shut_down(listener)

    def _deadline(self) -> float:
        """When the grace period ends (time.monotonic()); it starts at the first stop()."""
        if self._stop_asked_at is None:  # ended otherwise (a drain, an error): from now
            self._stop_asked_at = time.monotonic()
        return self._stop_asked_at + self.config.shutdown_timeout_s

    def _reserve_s(self) -> float:
        return shutdown_reserve_s(self.config.shutdown_timeout_s)

    async def _until_stopped(self, loop: asyncio.Task[None]) -> None:
        """Wait for the claim loop; once stop() is asked, no later than the hand-back (a
        statement hung on a dead connection must not hold the shutdown: it is abandoned, and
        a claim it may have made is due again when that lease ends)."""
        stopping = asyncio.create_task(self._stopping.wait())
        try:
            await asyncio.wait({loop, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not loop.done():
                await asyncio.wait({loop}, timeout=max(
                    0.0, self._deadline() - self._reserve_s() - time.monotonic()))
        finally:
            stopping.cancel()
            if not loop.done():
                loop.cancel()
                self._abandon(loop)
        if loop.done() and not loop.cancelled():
            loop.result()  # what ended it, re-raised

    async def _shut_down(self, listener: asyncio.Task[None] | None) -> None:
        """Let what runs finish until the hand-back, hand back the rest, then end: return,
        or end the process if something handed back still runs."""
        deadline, reserve = self._deadline(), self._reserve_s()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=max(
                0.0, deadline - reserve - time.monotonic()))
        if self._tasks:
            log.warning("stopping: %d deliveries still run %.1fs before the grace period "
                        "ends; handing them back to other workers", len(self._tasks),
                        max(0.0, deadline - time.monotonic()))
            self._handback.set()
            await asyncio.wait(self._tasks, timeout=max(
                0.0, deadline - reserve / 4 - time.monotonic()))
            for task in list(self._tasks):  # stuck on a statement: left, unread
                task.cancel()
        if listener is not None:
            listener.cancel()
            await asyncio.wait({listener}, timeout=max(0.0, deadline - time.monotonic()))
            if not listener.done():
                self._abandon(listener)
        self._hook_threads.shutdown(wait=False, cancel_futures=True)
        await self.signals.pulse()
        self._end_if_still_running()

    def _end_if_still_running(self) -> None:
        """End the process if a delivery handed back still runs (a sync hook's thread): its
        delivery is due again in seconds, and must not run twice at once."""
        running = [what for what, runs in self._unstoppable.items() if runs()]
        if not running:
            return
        # said from a thread of its own, waited for briefly, as the fence does
        said = threading.Thread(target=log.critical, daemon=True, args=(
            "stopping: %s still runs and cannot be stopped; handed back to other workers, so "
            "this process ends now (exit %d), the hook with it, before another worker can "
            "take it", "; ".join(running), LOST_LEASE_EXIT_CODE))
        said.start()
        said.join(0.5)
        self._exit(LOST_LEASE_EXIT_CODE)

    def _abandon(self, task: asyncio.Task[Any]) -> None:
        """Leave `task` to end on its own time, its outcome unread."""
        self._abandoned.add(task)
        task.add_done_callback(self._forget_abandoned)

    async def _loop(self) -> None:
        cfg = self.config
        db_failures = 0
        while not self._stopping.is_set():
            honour_cancel()
            self._wake.clear()
            try:
                claimed = await self._claim()
                db_failures = 0
                delay = await self._idle_delay(claimed)
                if delay is None:
                    return
            except DatabaseUnavailable as exc:
                db_failures += 1
                metrics.DB_ERRORS.inc()
                log.warning("deliveries: database unavailable (%s); retrying", exc)
                delay = backoff_delay(db_failures, cfg.policy, self._rng, DB_BACKOFF_MAX_S)
            self.idle = self._inflight == 0
            await self.signals.pulse()
            await self._sleep(delay)

    async def _claim(self) -> int:
        claimed = 0
        for consumer in self.consumers:
            free = self.config.concurrency - self._running[consumer]
            if free <= 0 or self._stopping.is_set():
                continue
            sent = time.monotonic()  # before the claim left: its lease ends no sooner than this
            for claim in await self.store.claim_deliveries(consumer, free,
                                                           self.config.lease_s):
                if self._stopping.is_set():  # stop() came while the claim was in flight
                    await self._release(claim, 0.0)
                    continue
                claimed += 1
                self._running[consumer] += 1
                self._inflight += 1
                self._spawn(self._deliver(claim, HeldLease(sent + self.config.lease_s)))
        return claimed

    async def _idle_delay(self, claimed: int) -> float | None:
        cfg = self.config
        free = [c for c in self.consumers if self._running[c] < cfg.concurrency]
        if not free:
            return cfg.idle_max_s  # every slot busy: a finishing delivery wakes the loop
        if claimed:
            return 0.0  # there was room and work: look again at once
        due_in = await self.store.next_delivery_due_in(free)
        if (cfg.drain and self.producers_done.is_set() and self._inflight == 0
                and (due_in is None or due_in > cfg.idle_max_s)):
            pending, _ = await self.store.pending_deliveries(self.consumers, 0)
            if pending:
                log.warning("drain: %d deliveries left for a running worker (backing off, "
                            "or waiting for a result)", pending)
            self._stopping.set()
            return None
        if due_in is None:
            return cfg.idle_max_s
        # due yet not claimed: another worker's claim holds them for a moment; never a spin
        return min(cfg.idle_max_s, max(due_in + 0.005, BUSY_RETRY_S))

    # -- one delivery -----------------------------------------------------------------------
    async def _deliver(self, claim: ClaimedDelivery, lease: HeldLease) -> None:
        """One attempt under a lease that a heartbeat extends; if the lease is lost, or could
        not be extended in time (a database outage, say), the attempt is cancelled before the
        lease can lapse and nothing is recorded."""
        job_id = claim.job.job_id
        attempt = asyncio.create_task(self._attempt(claim, lease))
        self._attempts[attempt] = claim.consumer
        keeper = asyncio.create_task(self._keep_lease(claim, lease))
        handback = asyncio.create_task(self._handback.wait())
        try:
            await asyncio.wait({attempt, keeper, handback},
                               return_when=asyncio.FIRST_COMPLETED)
            if not attempt.done() and keeper.done():  # the lease is, or may soon be, lost
                attempt.cancel()
                await asyncio.wait({attempt})
                log.warning("job %s: the lease of %s %s; this attempt was stopped and its "
                            "outcome dropped (due again when the lease ends)", job_id,
                            claim.consumer, keeper.result())
                return
            keeper.cancel()  # from here on (a record, a hand-back) the lease is not extended
            if not attempt.done():  # the grace period is about to end
                await self._hand_back(claim, attempt)
                return
            if attempt.cancelled():
                return  # cancelled from outside: due again when the lease ends
            await self._record(claim, attempt.result())
        except DatabaseUnavailable as exc:
            log.warning("job %s: could not record %s (%s); it is due again when its lease "
                        "ends", job_id, claim.consumer, exc)
        except Exception as exc:
            log.error("job %s: unexpected error in %s (%s); retried when its lease ends",
                      job_id, claim.consumer, type(exc).__name__)
        finally:
            for task in (attempt, keeper, handback):
                task.cancel()
            self._attempts.pop(attempt, None)
            self._running[claim.consumer] -= 1
            self._inflight -= 1
            self._wake.set()
            await asyncio.wait({attempt, keeper})
            await self.signals.pulse()

    async def _record(self, claim: ClaimedDelivery, outcome: DeliveryOutcome) -> None:
        landed = await self.store.record_delivery(outcome)
        metrics.DELIVERIES.labels(claim.consumer,
                                  outcome.state if landed else "fenced_out").inc()
        if not landed:
            log.warning("job %s: %s outcome dropped, another worker owns it now",
                        claim.job.job_id, claim.consumer)
        elif outcome.state == "done":
            self.stats.deliveries_done += 1
        elif outcome.state == "failed":
            self.stats.deliveries_failed += 1
        else:
            self.stats.delivery_retries += 1

    async def _hand_back(self, claim: ClaimedDelivery, attempt: asyncio.Task[DeliveryOutcome]
                         ) -> None:
        """The grace period is about to end and this delivery still runs: stop it if it can
        be stopped and release its lease, due at once; if it cannot (a sync hook's thread),
        release it due UNSTOPPABLE_HANDBACK_DELAY_S ahead, for the process to end before."""
        what = f"job {claim.job.job_id}: {claim.consumer}"
        started = self._threads.get(claim.token)
        attempt.cancel()
        # a cancelled coroutine ends within a turn or two of the loop, unless it ignores it
        await asyncio.wait({attempt}, timeout=max(self._reserve_s() / 4, CANCEL_WAIT_MIN_S))
        if attempt.done() and not attempt.cancelled():
            await self._record(claim, attempt.result())  # it ended as it was being stopped
            return
        thread = started[0] if started is not None else None

        def runs() -> bool:
            return not attempt.done() or (thread is not None and not thread.done())

        if not runs():
            await self._release(claim, 0.0)
            return
        # it cannot be stopped: the fence ends the process before the release's due time
        # even if this loop is blocked or the release never answers (the statement cannot
        # take effect before `sent`); normally the process ends as soon as run() has handed
        # everything back
        sent = time.monotonic()
        unhold = self._fence.hold(HeldLease(sent + UNSTOPPABLE_HANDBACK_DELAY_S),
                                  f"{what} (handed back at shutdown)")
        self._unstoppable[what] = runs
        for running in (attempt, thread):
            if running is not None:
                running.add_done_callback(lambda _: None if runs() else unhold())
        error = None
        if started is not None and sent - started[1] > self.config.hook_timeout_s:
            # a hook that hangs spends its tries, so it reaches its retry limit in the end
            error = (f"the hook ran longer than {self.config.hook_timeout_s:g}s and still "
                     "ran when its worker stopped")
        await self._release(claim, UNSTOPPABLE_HANDBACK_DELAY_S, error)

    async def _release(self, claim: ClaimedDelivery, delay_s: float, error: str | None = None
                       ) -> None:
        """Hand `claim` back: due in `delay_s` for any worker, its try given back unless
        `error`; never raises but CancelledError (an unreleased lease simply lapses)."""
        what = f"job {claim.job.job_id}: {claim.consumer}"
        try:
            released = await self.store.release_delivery(claim, delay_s, error)
        except Exception as exc:
            log.warning("%s could not be handed back (%s: %s); it is due again when its "
                        "lease ends", what, type(exc).__name__, exc)
            return
        metrics.DELIVERIES.labels(claim.consumer,
                                  "handed_back" if released else "fenced_out").inc()
        if not released:
            log.warning("%s: not handed back, another worker owns it now", what)
            return
        self.handed_back += 1
        log.info("%s handed back to other workers (due again in %gs)", what, delay_s,
                 extra=event(job_id=claim.job.job_id, account=claim.job.account,
                             consumer=claim.consumer, outcome="handed_back"))

    async def _keep_lease(self, claim: ClaimedDelivery, lease: HeldLease) -> str:
        """Extend the lease every third of it; return (why) only when it is lost, or when no
        extension got through and it could lapse within fence_margin_s: the attempt must
        stop then, since another worker may claim it the moment it lapses."""
        lease_s = self.config.lease_s
        beat_s = lease_s / 3
        next_beat = lease.ends_at - lease_s + beat_s
        extending: asyncio.Task[bool] | None = None
        sent = 0.0
        try:
            while True:
                stop_at = lease.ends_at - fence_margin_s(lease_s)
                now = time.monotonic()
                if now >= stop_at:
                    return (f"could not be extended for {now - lease.ends_at + lease_s:.1f}s "
                            "and was about to lapse")
                if extending is None:
                    if now < next_beat:
                        await asyncio.sleep(min(next_beat, stop_at) - now)
                        continue
                    sent = time.monotonic()
                    extending = asyncio.create_task(self.store.extend_delivery(claim, lease_s))
                # waited for, never past stop_at, and not by cancelling it: a statement on a
                # dead connection can hang, and psycopg's cancellation itself waits seconds
                await asyncio.wait({extending}, timeout=stop_at - time.monotonic())
                if not extending.done():
                    continue
                done, extending = extending, None
                try:
                    kept = done.result()
                except Exception as exc:  # a blip: try again soon, while the lease lasts
                    log.warning("job %s: could not extend the lease of %s (%s)",
                                claim.job.job_id, claim.consumer, type(exc).__name__)
                    next_beat = time.monotonic() + min(beat_s, EXTEND_RETRY_S)
                    continue
                if not kept:
                    return "was lost (another worker holds it, or it was removed)"
                lease.ends_at = sent + lease_s
                next_beat = sent + beat_s
        finally:
            if extending is not None:  # left to end on its own time, its outcome unread
                extending.cancel()
                self._abandon(extending)

    def _forget_abandoned(self, task: asyncio.Task[Any]) -> None:
        self._abandoned.discard(task)
        if not task.cancelled():
            task.exception()  # read, so it is not reported as never retrieved

    async def _attempt(self, claim: ClaimedDelivery, lease: HeldLease) -> DeliveryOutcome:
        """Run the delivery once and say what to record; never raises but CancelledError."""
        if claim.attempts > self.config.max_attempts:
            # past its tries without ever recording one (it crashed the process each time?)
            return self._outcome(claim, "failed", error=f"gave up after {claim.attempts - 1} "
                                 "tries that never reported back (did the process die?)")
        try:
            if claim.consumer == DOWNLOAD:
                return await self._download(claim)
            return await self._run_hook(claim, lease)
        except Exception as exc:
            return self._retry(claim, f"{type(exc).__name__}: {exc}")

    async def _run_hook(self, claim: ClaimedDelivery, lease: HeldLease) -> DeliveryOutcome:
        name = claim.consumer.removeprefix("hook:")
        hook = self.config.hooks[name]
        job = claim.job
        timeout_s = self.config.hook_timeout_s
        deadline: asyncio.Timeout | None = None
        what = f"job {job.job_id}: hook {name}"
        try:
            if inspect.iscoroutinefunction(hook):
                # held while it runs: one that ignores its cancellation (or blocks the event
                # loop) past its lease ends the process too
                with self._fence.holding(lease, what):
                    async with asyncio.timeout(timeout_s) as deadline:
                        await hook(job)
            else:
                returned = await self._in_thread(hook, claim, lease, what)
                if inspect.isawaitable(returned):
                    with self._fence.holding(lease, what):
                        async with asyncio.timeout(timeout_s) as deadline:
                            await returned
        except TimeoutError as exc:
            if deadline is not None and deadline.expired():
                return self._retry(claim, f"the hook ran longer than {timeout_s:g}s")
            return self._hook_failed(claim, name, exc)
        except Exception as exc:
            return self._hook_failed(claim, name, exc)
        log.info("job %s: hook %s done (%s)", job.job_id, name, job.state,
                 extra=event(job_id=job.job_id, account=job.account, consumer=claim.consumer,
                             outcome="done"))
        return self._outcome(claim, "done")

    async def _in_thread(self, hook: Hook, claim: ClaimedDelivery, lease: HeldLease,
                         what: str) -> Any:
        """Call a sync hook in a thread of its own, held in the fence until the thread itself
        ends (not this coroutine: it may be cancelled while the thread runs on). A thread
        cannot be stopped: past the timeout it is reported and waited for (lease kept), since
        a second run beside it would be worse."""
        timeout_s = self.config.hook_timeout_s
        release = self._fence.hold(lease, f"{what} (in its thread)")
        try:
            thread = self._hook_threads.submit(hook, claim.job)
        except BaseException:
            release()
            raise
        self._threads[claim.token] = (thread, time.monotonic())

        def ended(_: Future[Any]) -> None:
            self._threads.pop(claim.token, None)
            release()

        thread.add_done_callback(ended)
        running = asyncio.wrap_future(thread)
        try:
            done, _ = await asyncio.wait({running}, timeout=timeout_s)
            if not done:
                log.error("%s still running after %gs; waiting for it (a thread cannot be "
                          "stopped)", what, timeout_s)
            return await running
        except asyncio.CancelledError:
            # still waiting for a free thread: it never starts (a hook that started late,
            # after its attempt was given up, would run with no lease kept for it)
            thread.cancel()
            if not thread.done():
                log.warning("%s still runs in its thread and its lease is no longer extended: "
                            "unless it ends first, this process ends before the lease can "
                            "lapse", what)
            raise

    def _hook_failed(self, claim: ClaimedDelivery, name: str, exc: Exception
                     ) -> DeliveryOutcome:
        # the message only, URLs shown bare: a traceback's text could carry a signed URL
        log.warning("job %s: hook %s raised %s (try %d): %s", claim.job.job_id, name,
                    type(exc).__name__, claim.attempts, redact_urls(str(exc))[:MAX_ERROR_TEXT])
        return self._retry(claim, f"{type(exc).__name__}: {exc}")

    async def _download(self, claim: ClaimedDelivery) -> DeliveryOutcome:
        job = claim.job
        assert self.downloader is not None
        if not job.succeeded or job.result is None or job.result_state != "fetched":
            why = ("its result could not be fetched" if job.result_state == "failed"
                   else "it has no result")
            return self._outcome(claim, "failed", error=f"nothing to download: {why}")
        rules = registry.load(job.provider or registry.DEFAULT_PROVIDER).rules
        result_problem = getattr(rules, "result_problem", None)  # optional (providers/base.py)
        gone = result_problem(job.result) if callable(result_problem) else None
        if gone:
            # the provider deleted the files (its retention ran out): no retry brings them back
            log.error("job %s: %s", job.job_id, gone,
                      extra=event(job_id=job.job_id, account=job.account, consumer=DOWNLOAD,
                                  outcome="failed"))
            return self._outcome(claim, "failed", error=str(gone)[:MAX_ERROR_TEXT])
        urls = rules.media_urls(job.result)
        if len(urls) > MAX_MEDIA_URLS:
            return self._outcome(claim, "failed", error=f"the result lists {len(urls)} media "
                                                        f"URLs (more than {MAX_MEDIA_URLS})")
        if not urls:
            log.warning("job %s: its result carries no media URL; nothing downloaded",
                        job.job_id)
        try:
            files = await self.downloader.download(job.job_id, urls, job.account)
        except UrlExpired as exc:
            log.info("job %s: %s; fetching the result again for a fresh link", job.job_id, exc)
            return self._retry(claim, str(exc), refresh_result=True,
                               delay_s=EXPIRED_LINK_RETRY_S)
        except DiskError as exc:
            log.error("job %s: %s; the download is kept pending and retried", job.job_id, exc)
            return self._retry(claim, str(exc))
        except DownloadRefused as exc:
            # the URL (or where it leads) is not one this worker may fetch, or the file is
            # too large: no retry can change that (`deliveries retry` after a fix can)
            log.error("job %s: %s; the download failed for good", job.job_id,
                      redact_urls(str(exc)))
            return self._outcome(claim, "failed", error=redact_urls(str(exc))[:MAX_ERROR_TEXT])
        except DownloadError as exc:
            return self._retry(claim, str(exc))
        log.info("job %s: downloaded %d file(s), %d bytes", job.job_id, len(files),
                 sum(f.size for f in files),
                 extra=event(job_id=job.job_id, account=job.account, consumer=DOWNLOAD,
                             outcome="done"))
        detail = {"files": [{"path": f.path, "size": f.size, "sha256": f.sha256,
                             "url": f.url} for f in files]}
        return self._outcome(claim, "done", detail=detail)

    @staticmethod
    def _outcome(claim: ClaimedDelivery, state: str, *, delay_s: float = 0.0,
                 error: str | None = None, detail: Any = None,
                 refresh_result: bool = False) -> DeliveryOutcome:
        return DeliveryOutcome(claim.job.job_id, claim.consumer, claim.token, state, delay_s,
                               error=error, detail=detail, refresh_result=refresh_result,
                               generation=claim.generation)

    def _retry(self, claim: ClaimedDelivery, error: str, *, refresh_result: bool = False,
               delay_s: float | None = None) -> DeliveryOutcome:
        error = redact_urls(error)[:MAX_ERROR_TEXT]
        if claim.attempts >= self.config.max_attempts:
            log.error("job %s: %s failed %d times, given up (vidpoll deliveries retry): %s",
                      claim.job.job_id, claim.consumer, claim.attempts, error)
            return self._outcome(claim, "failed",
                                 error=f"gave up after {claim.attempts} tries: {error}")
        delay = delay_s if delay_s is not None else backoff_delay(
            claim.attempts, self.config.policy, self._rng, DELIVERY_BACKOFF_MAX_S)
        return self._outcome(claim, "pending", delay_s=delay, error=error,
                             refresh_result=refresh_result)
