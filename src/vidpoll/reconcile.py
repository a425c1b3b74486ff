"""Looking unknown creates up in a provider's own records, one walk of its pages for many.

A provider without an idempotency key (Replicate, fal, Luma) bills every create that reaches
it, so a create whose outcome is unknown is looked up in the account's list of recent jobs,
never sent again blindly (`Submitter._reconcile` decides from what this module finds). A busy
account's list is many pages, and its reads fail now and then (5xx, 429, a garbled page), so:

- **one walk serves every unknown create of a scope that is due** (an account, or one fal
  endpoint): lookups that arrive while a walk runs wait for the next one, which serves them
  all; the window walked is the union of theirs, and each intent is matched only against the
  records inside its own window;
- **a failed page is tried again in place**: a 429 after the wait it names (up to
  `MAX_PAGE_WAIT_S`; a longer one ends the walk for now), a 5xx, a dropped connection or a
  garbled page up to `PAGE_TRIES` times, quickly; only then is the walk left incomplete;
- **an incomplete walk resumes from the page that failed**, not from page one, when the same
  intents (or some of them) come back for it; what was read before is kept;
- the records may prove a create absent only as far as the provider lists them
  (`CreatedPage.listed_through`: fal lists a request once it has started).

Like the submitter, it knows neither psycopg nor aiohttp.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Protocol

from vidpoll.models import HttpAnswer
from vidpoll.policy import parse_retry_after
from vidpoll.providers.base import CreatedPage, CreateLookup, Reconciler
from vidpoll.runner import utc_now

log = logging.getLogger(__name__)

PAGE_TRIES = 4
"""Tries of one page that failed with a 5xx, no answer or a garbled body (the first and three
more), a moment apart: a busy list's faults pass within a second or two."""
QUICK_RETRY_S = (0.2, 0.5, 1.0)
"""The pauses before those tries (with jitter)."""
MAX_THROTTLED_TRIES = 4
"""Waits for one page's 429 before the walk stops for now (it resumes from that page)."""
MAX_PAGE_WAIT_S = 30.0
"""The longest 429 wait taken in place; a longer one ends the walk for now."""
DEFAULT_THROTTLE_WAIT_S = 1.0
"""A 429 that names no wait is tried again after this long (doubling each time)."""
MAX_PAGES = 50
"""One walk reads at most this many pages (5,000 Replicate predictions): a busier window
is not proven either way (such a walk is not resumed: it starts again next time)."""


class MatchRules(Protocol):
    """The provider's rules, as far as matching a record with an intent goes."""

    def match_created(self, entry: Any, payload: dict[str, Any],
                      model: str | None) -> str: ...


@dataclass(frozen=True, slots=True)
class Wanted:
    """One unknown create to look up: its intent's input and the window it was sent in,
    widened for clock skew and for a create the server recorded after the client gave up."""

    key: str
    payload: dict[str, Any]
    model: str | None
    since: datetime
    until: datetime
    sent_by: datetime
    """The latest its creates may have been sent: absence is proven only where the records
    are complete past it (`CreatedPage.listed_through`)."""


@dataclass(slots=True)
class _Walk:
    """A walk of one scope's pages: what was read, and where it stopped."""

    since: datetime
    until: datetime
    keys: frozenset[str]
    cursor: str | None = None
    entries: list[Any] = field(default_factory=list)
    pages: int = 0
    calls: int = 0
    listed_through: datetime | None = None
    through_said: bool = False
    complete: bool = False
    failure: HttpAnswer | None = None
    detail: str = ""
    resumable: bool = True


@dataclass(slots=True)
class _Batch:
    """Lookups of one scope waiting for the next walk."""

    reconciler: Reconciler
    rules: MatchRules
    wanted: list[tuple[Wanted, asyncio.Future[CreateLookup]]] = field(default_factory=list)
    deadline: float = float("inf")


class Lookups:
    """The shared walks of one submitter, by (account, scope)."""

    def __init__(self, rng: random.Random | None = None,
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 on_calls: Callable[[str, int], None] | None = None) -> None:
        self._rng = rng or random.Random()
        self._sleep = sleep
        self._on_calls = on_calls
        self._walks: dict[tuple[str, str], _Walk] = {}
        self._batches: dict[tuple[str, str], _Batch] = {}
        self._running: dict[tuple[str, str], asyncio.Task[None]] = {}
        self.walks = 0
        """Walks begun or resumed (each serves every lookup of its batch)."""
        self.resumed = 0
        self.page_retries = 0

    async def find(self, account: str, reconciler: Reconciler, rules: MatchRules,
                   wanted: Wanted, deadline: float = float("inf")) -> CreateLookup:
        """What the provider's records hold for `wanted`, read by the next walk of its scope
        (one walk for every lookup of the scope that arrives before it starts). `deadline`
        (the event loop's clock): the walk stops by then (its claim's lease), resumable."""
        scope = (account, reconciler.list_scope(wanted.model))
        batch = self._batches.get(scope)
        if batch is None:
            batch = self._batches[scope] = _Batch(reconciler, rules)
        done: asyncio.Future[CreateLookup] = asyncio.get_running_loop().create_future()
        batch.wanted.append((wanted, done))
        batch.deadline = min(batch.deadline, deadline)
        if scope not in self._running:
            self._running[scope] = asyncio.create_task(self._serve(scope),
                                                       name=f"lookup-{account}")
        return await done

    async def _serve(self, scope: tuple[str, str]) -> None:
        try:
            # the lookups claimed together arrive within a few ticks of each other: one walk
            await asyncio.sleep(0.01)
            while (batch := self._batches.pop(scope, None)) is not None:
                try:
                    found = await self._walk(scope, batch)
                except Exception as exc:  # a client promises pages, not exceptions
                    log.exception("looking creates up for %s raised", scope[0])
                    found = [CreateLookup(False, detail=type(exc).__name__)
                             for _ in batch.wanted]
                for (_, done), lookup in zip(batch.wanted, found, strict=True):
                    if not done.done():
                        done.set_result(lookup)
        finally:
            self._running.pop(scope, None)
            batch = self._batches.pop(scope, None)
            for _, done in batch.wanted if batch is not None else ():
                if not done.done():
                    done.set_result(CreateLookup(False, detail="the look-up was stopped"))

    async def _walk(self, scope: tuple[str, str], batch: _Batch) -> list[CreateLookup]:
        wanted = [w for w, _ in batch.wanted]
        since = min(w.since for w in wanted)
        until = max(w.until for w in wanted)
        keys = frozenset(w.key for w in wanted)
        walk = self._walks.pop(scope, None)
        if (walk is not None and walk.resumable and keys <= walk.keys
                and walk.since <= since and until <= walk.until):
            self.resumed += 1  # the same intents again: on from the page that failed
            walk.failure, walk.detail = None, ""
        else:
            walk = _Walk(since, until, keys)
        self.walks += 1
        model = wanted[0].model
        loop = asyncio.get_running_loop()
        calls_before = walk.calls
        while not walk.complete:
            if walk.pages >= MAX_PAGES:
                walk.detail = (f"more than {MAX_PAGES} pages of records in the window; not all "
                               f"were read")
                walk.resumable = False
                break
            page = await self._page(batch.reconciler, model, walk, batch.deadline, loop)
            if page is None:
                break
            walk.pages += 1
            walk.entries.extend(page.entries)
            if page.listed_through is not None:
                walk.through_said = True
                if walk.listed_through is None or page.listed_through > walk.listed_through:
                    walk.listed_through = page.listed_through
            walk.cursor = page.next_cursor
            walk.complete = page.next_cursor is None
        if self._on_calls is not None and walk.calls > calls_before:
            self._on_calls(scope[0], walk.calls - calls_before)
        if not walk.complete and walk.resumable:
            self._walks[scope] = walk
        return [self._verdict(walk, w, batch.rules) for w in wanted]

    async def _page(self, reconciler: Reconciler, model: str | None, walk: _Walk,
                    deadline: float, loop: asyncio.AbstractEventLoop) -> CreatedPage | None:
        """The next page, tried again in place; None (with the walk's failure set) when it
        could not be read this time."""
        quick = throttled = 0
        wait = DEFAULT_THROTTLE_WAIT_S
        while True:
            try:
                page = await reconciler.list_created(model, walk.since, walk.until,
                                                     walk.cursor)
                if not isinstance(page, CreatedPage):
                    raise TypeError(type(page).__name__)
            except Exception as exc:  # the client promises pages; be safe anyway
                log.exception("listing the provider's records raised")
                page = CreatedPage(detail=f"listing raised {type(exc).__name__}")
            walk.calls += page.calls
            failure = page.failure
            if failure is None and not page.detail:
                walk.failure, walk.detail = None, ""
                return page
            walk.failure, walk.detail = failure, page.detail or (
                f"HTTP {failure.status}" if failure is not None else "no answer")
            if page.final:
                # what it read still counts (a match is a match), but the walk ends here
                walk.entries.extend(page.entries)
                walk.resumable = False
                return None
            status = failure.status if failure is not None else None
            if status == 429:
                throttled += 1
                hinted = parse_retry_after(failure.retry_after if failure else None,
                                           utc_now())
                pause = hinted if hinted is not None else wait
                wait = min(MAX_PAGE_WAIT_S, wait * 2)
                if throttled > MAX_THROTTLED_TRIES or pause > MAX_PAGE_WAIT_S:
                    return None
            elif status is None or status >= 500 or 200 <= status < 300 or status == 408:
                # no answer, the server's fault, or a page that is not one: a passing fault
                if quick >= len(QUICK_RETRY_S) or quick + 1 >= PAGE_TRIES:
                    return None
                pause = QUICK_RETRY_S[quick] * (0.5 + self._rng.random())
                quick += 1
            else:
                return None  # any other refusal: no retry of this page can change it
            if loop.time() + pause > deadline:
                return None
            self.page_retries += 1
            await self._sleep(pause)

    @staticmethod
    def _verdict(walk: _Walk, wanted: Wanted, rules: MatchRules) -> CreateLookup:
        matches: dict[str, None] = {}
        unsure: dict[str, None] = {}
        handles: dict[str, dict[str, Any]] = {}
        unusable = False
        for created in walk.entries:
            at = created.created_at
            if at is not None and not wanted.since <= at <= wanted.until:
                continue
            verdict = rules.match_created(created.entry, wanted.payload, wanted.model)
            if verdict not in ("same", "unsure"):
                continue
            if created.job_id is None:
                unusable = True
                continue
            (matches if verdict == "same" else unsure).setdefault(created.job_id)
            if created.handle:
                handles[created.job_id] = created.handle
        if unusable:
            return CreateLookup(False, tuple(matches), tuple(unsure), walk.calls,
                                detail="a record of this input has no usable id")
        proves_absence = walk.complete and (
            not walk.through_said or (walk.listed_through is not None
                                      and walk.listed_through >= wanted.sent_by))
        return CreateLookup(walk.complete, tuple(matches), tuple(unsure), walk.calls,
                            walk.failure, walk.detail, handles=handles,
                            proves_absence=proves_absence)

