"""What the poller and the submitter share: a stop flag, a wake-up event that NOTIFY or a
finished task sets, test signals, and a listener that turns notifications into wake-ups."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from vidpoll import metrics
from vidpoll.aio import honour_cancel, wait_event
from vidpoll.config import key_variable
from vidpoll.errors import ConfigError, DatabaseUnavailable
from vidpoll.health import Health
from vidpoll.metrics import Minutes
from vidpoll.models import Notice
from vidpoll.policy import (
    AuthPause,
    Budget,
    Grant,
    PollPolicy,
    backoff_delay,
)

log = logging.getLogger(__name__)

MIN_LEASE_MARGIN_S = 1.0
"""A lease must outlast the HTTP timeout by at least this much."""


def check_lease(lease_s: float, timeout_s: float, call: str) -> None:
    """Raise ConfigError unless a lease outlasts one HTTP call (`call`: "a read", "a POST")
    by MIN_LEASE_MARGIN_S: a call that outlives its lease can overlap another worker's."""
    if lease_s < timeout_s + MIN_LEASE_MARGIN_S:
        raise ConfigError(f"the lease ({lease_s:g}s) must be longer than the HTTP timeout "
                          f"({timeout_s:g}s) by at least {MIN_LEASE_MARGIN_S:g}s, or {call} "
                          f"could outlive its lease")

SHUTDOWN_TIMEOUT_S = 25.0
"""After stop(), run() returns within this by default (under Kubernetes' 30 s grace period)."""
SHUTDOWN_RESERVE_MAX_S = 3.0
"""Work still in flight this long (at most a fifth of the timeout) before the shutdown timeout
is cancelled and handed back: time left to write what finished and release the rest."""


def shutdown_reserve_s(timeout_s: float) -> float:
    """The part of a shutdown timeout kept for the writes after in-flight work is stopped."""
    return min(SHUTDOWN_RESERVE_MAX_S, timeout_s / 5)


IDLE_MAX_S = 30.0
"""An idle loop checks the table at least this often even if no NOTIFY arrives."""
DB_BACKOFF_MAX_S = 2.0
"""The longest wait between two tries of a loop that lost the database. A try during an
outage waits in the pool's queue (up to its timeout) for a connection the pool's own
reconnect (every 2 s at most: store/pool.py) provides, so a short wait costs no connection
attempt; at 30 s a loop could sleep that long after the database was back (issue 31)."""
MINUTES_FLUSH_S = 10.0
"""How often a loop adds its per-minute counters to vidpoll_minutes (one statement; none
when nothing was counted)."""
FORGET_EVERY_S = 3600.0
"""How often a loop that writes counters deletes those older than a week."""


class MinutesStore(Protocol):
    """Where the per-minute counters go."""

    async def add_minutes(self, rows: Sequence[Any]) -> None:
        """Add counters to their minutes."""

    async def forget_old_minutes(self) -> None:
        """Delete counters older than a week."""

    async def due_backlog_sample(self) -> tuple[int, float]:
        """(rows due now, seconds the oldest is late)."""


class BudgetStore(Protocol):
    """The fleet's rate budget: a row per account and kind of call (vidpoll_rate_buckets)."""

    async def take_tokens(self, account: str, kind: str, want: int, budget: Budget) -> Grant:
        """Take up to `want` tokens (fewer when the budget has fewer)."""

    async def refund_tokens(self, account: str, kind: str, n: int) -> None:
        """Give back tokens taken but not spent."""

    async def pause_bucket(self, account: str, kind: str, seconds: float,
                           refused: bool = False) -> None:
        """Pause every process's calls of this kind for the account (a 429 also slows it)."""


class NoticeStore(Protocol):
    """The database's notifications (one shared LISTEN connection a store)."""

    def notifications(self, channels: Sequence[str] = ...) -> AsyncIterator[Notice]:
        """One item once listening, then one per NOTIFY on `channels`."""


@dataclass(slots=True)
class Take:
    """One claim's tokens from an account's budget for one kind of call (`take_budget`)."""

    account: str
    kind: str
    want: int
    granted: int
    budgeted: bool
    wait_s: float | None = None
    """When fewer than `want` were granted: seconds until the next token is due."""


async def take_budget(store: BudgetStore, account: str, kind: str, want: int,
                      budget: Budget | None) -> Take:
    """Take tokens for a claim of up to `want` rows (all of them when `budget` is None): the
    one place the poller, the submitter and the result fetches draw on a budget."""
    if budget is None:
        return Take(account, kind, want, want, budgeted=False)
    grant = await store.take_tokens(account, kind, want, budget)
    take = Take(account, kind, want, grant.granted, budgeted=True)
    if grant.granted < want:
        metrics.BUDGET_WAITS.labels(account, kind).inc()
        take.wait_s = grant.wait_s
    return take


async def settle_budget(store: BudgetStore, take: Take, used: int) -> float | None:
    """After the claim: give back the tokens it did not use. Returns the wait until the next
    token when the budget, not the rows, held the claim back (every token used, fewer granted
    than wanted); None otherwise."""
    if not take.budgeted:
        return None
    metrics.TOKENS.labels(take.account, take.kind).inc(min(used, take.granted))
    if used < take.granted:
        await store.refund_tokens(take.account, take.kind, take.granted - used)
        return None
    return take.wait_s


def default_worker_id() -> str:
    """host:pid:random, so claimed_by tells an operator which process holds a row."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


class Signals:
    """Lets tests and the demo wait for what a loop did, instead of sleeping."""

    def __init__(self) -> None:
        self._cond = asyncio.Condition()

    async def pulse(self) -> None:
        """Wake everyone waiting; they re-check their condition."""
        async with self._cond:
            self._cond.notify_all()

    async def wait_for(self, predicate: Callable[[], bool], within_s: float) -> None:
        """Return once `predicate()` holds; raise TimeoutError after `within_s` seconds."""
        async with asyncio.timeout(within_s), self._cond:
            await self._cond.wait_for(predicate)


class Runner:
    """The control surface of one loop: stop(), wake-ups, `idle`/`listening` for observers."""

    def __init__(self, policy: PollPolicy, rng: random.Random | None,
                 clock: Callable[[], datetime]) -> None:
        self.signals = Signals()
        self.idle = False
        self.listening = False
        self._policy = policy
        self._rng = rng or random.Random()
        self._clock = clock
        self._stopping = asyncio.Event()
        self._stop_asked_at: float | None = None
        self._wake = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._inflight = 0
        self.health = Health(policy, self._rng)
        """Each account's pauses (vidpoll.health): a refused key pauses its own account only."""
        self.minutes = Minutes()
        """Counters per minute, flushed to vidpoll_minutes by _minutes_flusher."""
        self._sampled_minute: datetime | None = None
        self._forgot_at: datetime | None = None
        self._flush_failing = False
        self.backlog_seen = True
        """Whether this loop saw rows due (or claimed some) since the last backlog sample: an
        idle worker neither samples nor writes an empty minute (issue 16's idle cost)."""
        self._notified = False
        """A NOTIFY arrived since the loop last looked (the listener sets it)."""

    def stop(self) -> None:
        """Stop claiming; work in flight finishes and is recorded, then run() returns."""
        if self._stop_asked_at is None:
            with contextlib.suppress(RuntimeError):  # no loop: run() never started
                self._stop_asked_at = self._now()
        self._stopping.set()
        self._wake.set()

    def in_flight(self) -> int:
        """Work this loop has under way right now (reads, POSTs or deliveries)."""
        return self._inflight

    async def _finish_tasks(self, timeout_s: float | None) -> int:
        """Wait for the tasks in flight; those still running `shutdown_reserve_s` before
        `timeout_s` after stop() are cancelled (each hands its work back as it ends).
        Returns how many were cancelled."""
        if not self._tasks:
            return 0
        within: float | None = None
        if timeout_s is not None:
            started = self._stop_asked_at if self._stop_asked_at is not None else self._now()
            within = max(0.0, started + timeout_s - shutdown_reserve_s(timeout_s) - self._now())
        _, pending = await asyncio.wait(set(self._tasks), timeout=within)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)
        if self._tasks:  # spawned meanwhile (none should be, once stopping)
            await asyncio.gather(*self._tasks, return_exceptions=True)
        return len(pending)

    async def _sleep(self, seconds: float) -> bool:
        """Sleep until `seconds` pass, a wake-up arrives, or stop(); False if the time ran
        out without a wake-up."""
        honour_cancel()
        if seconds <= 0 or self._stopping.is_set():
            return True
        return await wait_event(self._wake, seconds)

    def _take_notified(self) -> bool:
        """Whether a NOTIFY arrived since the last call."""
        notified, self._notified = self._notified, False
        return notified

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run `coro` as a task this loop waits for when it stops."""
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # -- accounts paused by a refused key (the runners' other pauses: vidpoll.health) -------
    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _key_refused(self, account: str, pause: AuthPause, doing: str) -> bool:
        """Pause `account` after a 401/403, longer each time; False if already paused (the
        other answers of the same pause: counted and logged once)."""
        delay = self.health.key_refused(account, self._now())
        if delay is None:
            return False
        # the pause's detail already starts "HTTP 401..." (policy): never "HTTP 401: HTTP 401"
        detail = (pause.detail if pause.detail.startswith(f"HTTP {pause.http_status}")
                  else f"HTTP {pause.http_status}: {pause.detail}")
        log.error("The provider rejected the API key of account %r (%s); its %s paused for %.0fs, "
                  "nothing touched. Check its key (%s, or the variable its api_key_env names, "
                  "or its credentials_file, in the accounts file).", account, detail, doing,
                  delay, key_variable(account))
        return True

    def _key_accepted(self, account: str, doing: str) -> None:
        """An answer other than 401/403 for `account`: its pauses end."""
        if self.health.key_accepted(account):
            log.warning("The provider accepts the API key of account %r again; %s resumes", account,
                        doing)
            self._wake.set()

    def _notifications(self) -> AsyncIterator[Notice]:
        raise NotImplementedError

    def _on_notice(self, note: Notice) -> bool:
        """A NOTIFY arrived: True wakes the loop now (the default)."""
        return True

    # -- counters over time -----------------------------------------------------------------
    async def _minutes_flusher(self, store: MinutesStore, sample_backlog: bool) -> None:
        """Flush the counters every MINUTES_FLUSH_S until cancelled (the owner flushes once
        more after its last task); once a minute, sample the due backlog too."""
        while True:
            await asyncio.sleep(MINUTES_FLUSH_S)
            await self._flush_minutes(store, sample_backlog)

    async def _flush_minutes(self, store: MinutesStore, sample_backlog: bool = False) -> None:
        """One flush. Never raises but CancelledError: on any failure (an outage, a missing
        grant) the counters are kept for the next flush, and a cancelled flush keeps them
        too (its owner flushes once more as it stops)."""
        now = self._clock()
        minute = now.replace(second=0, microsecond=0)
        rows = self.minutes.drain()
        written = False
        try:
            if sample_backlog and minute != self._sampled_minute and self.backlog_seen:
                due, oldest_s = await store.due_backlog_sample()
                rows.append(((minute, "backlog", "*", "due"), due, oldest_s, oldest_s))
                self._sampled_minute = minute
                self.backlog_seen = due > 0
            if rows and (self._forgot_at is None
                         or now - self._forgot_at >= timedelta(seconds=FORGET_EVERY_S)):
                await store.forget_old_minutes()
                self._forgot_at = now
            await store.add_minutes(rows)
            written = True
            self._flush_failing = False
        except DatabaseUnavailable:
            pass  # the loop itself says so; the counters wait for the database
        except Exception as exc:
            if not self._flush_failing:
                self._flush_failing = True
                log.warning("could not write the per-minute counters (%s: %s); kept in "
                            "memory and retried, polling goes on", type(exc).__name__, exc)
        finally:
            if not written:
                self.minutes.restore([r for r in rows if r[0][1] != "backlog"])

    async def _listener(self) -> None:
        """Turns NOTIFYs into wake-ups; reconnects with backoff. Only a hint."""
        failures = 0
        while not self._stopping.is_set():
            try:
                async for note in self._notifications():
                    failures = 0
                    if note.channel and not self._on_notice(note):
                        await self.signals.pulse()  # observers see what it changed
                        continue  # taken care of (or to be, a little later)
                    if note.channel:
                        self._notified = True
                    self._wake.set()  # the first item: (re)listening, so look once anyway
                    if not self.listening:
                        self.listening = True
                        await self.signals.pulse()
            except Exception as exc:  # only a hint: never let it take the loop down
                self.listening = False
                failures += 1
                log.debug("listener lost its connection (%s); retrying", exc)
                await asyncio.sleep(backoff_delay(failures, self._policy, self._rng,
                                                  DB_BACKOFF_MAX_S))


def utc_now() -> datetime:
    """The default clock of every loop."""
    return datetime.now(UTC)
