"""Learned schedules in a running worker: the render-time summary, read at most once a
minute and only while some read needs it, turned into one `Plan` per group and floor.

The worker asks `Schedules.for_job` on every read of a provider that gives no hint; the
answer is a `Plan` (`vidpoll.schedule`), or a text saying why there is none yet (fewer than
`LEARN_AFTER_JOBS` finished jobs, the account's `poll_schedule = "fixed"`), which the row's
`poll_reason` shows. `run` refreshes the summary while such reads happen (a worker whose
provider always hints, or that has nothing to read, never queries it: an idle fleet's cost
is unchanged).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Protocol

from vidpoll.aio import honour_cancel
from vidpoll.config import AccountTiming
from vidpoll.errors import DatabaseUnavailable
from vidpoll.models import ClaimedJob
from vidpoll.schedule import (
    ANY_KEY,
    LEARN_AFTER_JOBS,
    Durations,
    Plan,
    plan,
)

log = logging.getLogger("vidpoll.learned")

DEFAULT_TIMING = AccountTiming()
REFRESH_S = 60.0
"""How often a worker that needs the summary reads it again."""


class DurationsStore(Protocol):
    """What the schedules read: the render-time summary."""

    async def render_stats(self, max_age_s: float = ...,
                           now: datetime | None = ...) -> list[Durations]: ...


class Schedules:
    """Plans by (account, provider, model, duration key), from the latest summary."""

    def __init__(self, store: DurationsStore, timings: Mapping[str, AccountTiming] | None = None,
                 *, providers: Mapping[str, str] | None = None, fallback_s: float = 15.0,
                 first_read_s: float = 15.0, refresh_s: float = REFRESH_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.store = store
        self.timings = dict(timings or {})
        self.providers = dict(providers or {})
        """account -> its provider (the summary's groups name both)."""
        self.fallback_s = fallback_s
        self.first_poll_s = first_read_s
        self.refresh_s = refresh_s
        self._clock = clock
        self._groups: dict[tuple[str, str, str], Durations] = {}
        self._plans: dict[tuple[str, str, str, str, float], Plan] = {}
        self._wanted = asyncio.Event()
        self._loaded_at: float | None = None
        self.refreshes = 0

    def timing(self, account: str) -> AccountTiming:
        """The account's settings (the defaults for one not given)."""
        return self.timings.get(account, DEFAULT_TIMING)

    def load(self, groups: list[Durations]) -> None:
        """Take a summary (`store.render_stats`); plans are made again as asked for."""
        # an account has one provider: a group is found by account, model and key (the
        # provider's name is checked where it is known, so an account moved to another
        # provider does not plan from the old one's renders)
        self._groups = {}
        for d in sorted(groups, key=lambda g: g.jobs):
            wanted = self.providers.get(d.account)
            if wanted is None or wanted == d.provider:
                self._groups[(d.account, d.model, d.duration_key)] = d
        self._plans.clear()
        self._loaded_at = self._clock()

    def for_job(self, job: ClaimedJob, floor_s: float) -> Plan | str:
        """The plan of the job's group, or why it has none (for the row's `poll_reason`)."""
        return self.plan_of(job.account, job.model, job.duration_key, floor_s)

    def plan_of(self, account: str, model: str | None, duration_key: str | None,
                floor_s: float) -> Plan | str:
        """The plan of a group: its duration key's if that has enough history, else its
        model's over every key; or why there is none."""
        timing = self.timing(account)
        if timing.schedule != "learned":
            return "the account's poll_schedule is fixed"
        self._wanted.set()
        if self._loaded_at is None:
            return "render times not read yet"
        model = model or ""
        key = duration_key or ""
        best: Durations | None = None
        for group in ((account, model, key), (account, model, ANY_KEY)):
            d = self._groups.get(group)
            if d is not None and d.jobs >= LEARN_AFTER_JOBS:
                best = d
                break
            if best is None and d is not None:
                best = d
        if best is None:
            return (f"no finished job of {model or '(no model)'} yet; {LEARN_AFTER_JOBS} "
                    f"are needed to learn")
        if best.jobs < LEARN_AFTER_JOBS:
            return (f"{best.jobs} finished jobs of {best.shown()}; {LEARN_AFTER_JOBS} are "
                    f"needed to learn")
        cache = (best.account, best.provider, best.model, best.duration_key, floor_s)
        made = self._plans.get(cache)
        if made is None:
            made = plan(best, target_s=timing.detect_p95_s, floor_s=floor_s,
                        fallback_s=self.fallback_s, first_read_s=self.first_poll_s)
            self._plans[cache] = made
        return made

    def first_read_s(self, account: str, model: str | None, duration_key: str | None,
                     floor_s: float, first_poll_s: float) -> float | None:
        """Seconds from the create to a new job's first read by its group's plan: never
        later than `first_poll_s` unless no render of the group ended that soon (then at
        the shortest), never before `floor_s`; None without a plan (`first_poll_s` then)."""
        made = self.plan_of(account, model, duration_key, floor_s)
        if not isinstance(made, Plan):
            return None
        latest = max(first_poll_s, made.durations.quantiles[0])
        return max(floor_s, min(made.first_read().delay_s, latest))

    async def refresh(self) -> None:
        """Read the summary now (refreshing it first when it is stale, fleet-wide)."""
        self.load(await self.store.render_stats())
        self.refreshes += 1

    async def run(self) -> None:
        """Read the summary when a read first needs it, then every `refresh_s` while reads
        keep needing it; until cancelled (the worker's shutdown)."""
        while True:
            honour_cancel()
            await self._wanted.wait()
            self._wanted.clear()
            try:
                await self.refresh()
            except DatabaseUnavailable as exc:
                log.debug("render times not read: %s", exc)
            except Exception:  # never the end of learned schedules for this process
                log.exception("render times not read; trying again in %gs", self.refresh_s)
            await asyncio.sleep(self.refresh_s)
