"""The submitter: sends recorded intents to the provider, each under its own Idempotency-Key.

An intent is committed to PostgreSQL before anything is sent. A submitter claims due intents
the way workers claim jobs (SKIP LOCKED, the lease is the schedule, every write fenced on the
claim token), POSTs each once, and records the answer: on 202 the job row is inserted and the
intent marked submitted in one transaction; on an unknown outcome the intent stays queued and
is sent again later with the *same* key, so the provider answers with the job it already started;
on a rejection in the provider's own words the intent is rejected for good, unless an earlier
attempt's outcome was unknown: then a render may be billed, and the intent is `unknown`, sent
again with the same key at most 2 minutes apart (even while the account is paused for
credits) until the provider answers with its job or an operator settles it (`intents resolve`).

Like the worker, it knows neither psycopg nor aiohttp: both come in through Protocols.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from vidpoll import metrics
from vidpoll.aio import cancel_and_wait, honour_cancel
from vidpoll.config import DEFAULT_FIRST_POLL_S, DEFAULT_MAX_ACTIVE
from vidpoll.errors import DatabaseUnavailable
from vidpoll.health import CREATE_429_PAUSE_MAX_S as CREATE_429_PAUSE_MAX_S
from vidpoll.health import CREATE_PAUSE_MAX_S as CREATE_PAUSE_MAX_S
from vidpoll.health import Health, Misroute, bucket_pause
from vidpoll.learned import Schedules
from vidpoll.logs import event
from vidpoll.models import (
    DEFAULT_ACCOUNT,
    PARKED_S,
    QUEUED,
    RECONCILING,
    REJECTED,
    SUBMITTED,
    UNKNOWN,
    Claim,
    ClaimedIntent,
    ErrorClass,
    HttpAnswer,
    Notice,
    SubmitOutcome,
)
from vidpoll.policy import (
    KEY_REFUSED,
    PROVIDER,
    AuthPause,
    Budget,
    MisroutedCreate,
    PollPolicy,
    backoff_delay,
    decide_submit,
    parse_retry_after,
    probe_verdict,
)
from vidpoll.providers import registry
from vidpoll.providers.base import CreatedPage, CreateLookup, Rules
from vidpoll.reconcile import Lookups, Wanted
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

log = logging.getLogger(__name__)

RECHECK_S = 2.0
"""Sleep when intents are due but none could be claimed (all slots taken, or another
submitter holds them); a finishing job's NOTIFY usually wakes the submitter sooner."""
RELEASE_DELAY_S = 1.0
"""An intent given back unsent is due again after this long, never at once (no spinning)."""
WAKE_CHANNELS = ("vidpoll_intents", "vidpoll_job_done")
LOOKBACK_S = 3600.0
"""How far back a look-up searches for an intent parked before its window was recorded (by a
release before 0015): the providers' records keep inputs about an hour."""
RECONCILE_RETRY_MAX_S = 5.0
"""The longest a failed look-up waits before the next (unless the provider names a longer
wait): the walk already retried each page in place, and the provider's records of inputs
expire (Replicate's after an hour), so a long backoff only loses them."""
RECONCILE_WAIT_MAX_S = 60.0
"""The longest wait a look-up honours from the provider's Retry-After."""
PROBE_PREFIX = "vidpoll-probe-"
"""The job id a misrouted account's probe reads (a status read, never a POST): one that cannot
exist, so the provider's own "not found" proves the base URL right again."""


class IntentStore(MinutesStore, BudgetStore, NoticeStore, Protocol):
    """What the submitter needs from PostgreSQL."""

    async def claim_intents(self, limit: int, lease_s: float, worker_id: str,
                            max_active: int | None, key: str | None = None,
                            account: str = ...) -> list[ClaimedIntent]:
        """Claim one account's due intents within its admission cap, committed at once."""

    async def claim_unknown_intents(self, limit: int, lease_s: float, worker_id: str,
                                    account: str = ...) -> list[ClaimedIntent]:
        """Claim only one account's due `unknown` intents, committed at once."""

    async def claim_checked(self, limit: int, lease_s: float, worker_id: str,
                            max_active: int | None, key: str | None = None,
                            account: str = ..., now: datetime | None = None, *,
                            spend: AccountSpend | None = None,
                            spend_now: datetime | None = None) -> Claim:
        """Claim like claim_intents, each create's estimate reserved within the account's
        caps; those that do not fit are held (vidpoll.store.spend)."""

    async def wake_held(self, accounts: Sequence[str]) -> int:
        """Make the held intents of `accounts` due now (their caps may have been raised)."""

    async def record_submit(self, outcome: SubmitOutcome, first_poll_s: float = ...) -> bool:
        """Write one POST's outcome, fenced; False if another owner has the intent now."""

    async def release_intent(self, intent: ClaimedIntent, delay_s: float) -> bool:
        """Give an intent back unsent."""

    async def jobs_of_ids(self, ids: Sequence[str]) -> dict[str, str | None]:
        """Which of `ids` are tracked already, with the intent key holding each (None: none)."""

    async def next_intent_due_in(self, accounts: Sequence[str] = ...,
                                 unknown_accounts: Sequence[str] = ...) -> float | None:
        """Seconds until the earliest queued or unknown intent of `accounts`, or unknown one
        of `unknown_accounts`, is due."""

    async def has_queued_intents(self, accounts: Sequence[str] = ...) -> bool:
        """Whether any intent still waits to be sent."""



class VideoCreator(Protocol):
    """What the submitter needs from the provider: the paid call. A creator may also have
    `read_status(job_id)` and `shown_create_url()` (SumeClient has both): the submitter then
    probes a misrouted account with a status read and names the URL it POSTed to."""

    @property
    def rules(self) -> Rules:
        """The provider's rules, applied to this creator's answers."""

    async def create_video(self, payload: dict[str, Any], idempotency_key: str,
                           model: str | None = None) -> HttpAnswer:
        """POST a new render; failures come back as answers, never raised."""


@dataclass(frozen=True)
class SubmitterConfig:
    """How one process sends intents."""

    concurrency: int = 4
    max_active: int | None = DEFAULT_MAX_ACTIVE
    lease_s: float = 25.0
    http_timeout_s: float = 15.0
    first_poll_s: float = DEFAULT_FIRST_POLL_S
    drain: bool = False
    listen: bool = True
    idle_max_s: float = IDLE_MAX_S
    shutdown_timeout_s: float | None = SHUTDOWN_TIMEOUT_S
    """After stop(), POSTs still in flight this close to the timeout (runner.shutdown_reserve_s)
    are abandoned: each intent keeps its lease and comes back after it as an unknown outcome,
    resolved with the same idempotency key (never a blind second create). None waits."""
    policy: PollPolicy = field(default_factory=PollPolicy)
    worker_id: str = field(default_factory=default_worker_id)
    accounts: tuple[str, ...] = (DEFAULT_ACCOUNT,)
    """The accounts this submitter sends for (it has their keys)."""
    budgets: Mapping[str, Budget] = field(default_factory=dict)
    """Create budgets by account, shared by the fleet; an account without one is unlimited."""
    spends: Mapping[str, AccountSpend] = field(default_factory=dict)
    """Prices and caps by account (vidpoll.spend); an account without is unlimited."""
    spend_clock: Callable[[], datetime] | None = None
    """The clock the caps' windows are counted by; None: the database's (the fleet's one
    clock). Tests turn the day with it."""
    resend_unknown: frozenset[str] = frozenset()
    """Accounts whose provider has neither an idempotency key nor records to look a create up
    in, and which chose `on_unknown_create = "resend"`: an unknown create is sent again after
    the settle time instead of parked for an operator (it may bill twice)."""

    def __post_init__(self) -> None:
        check_lease(self.lease_s, self.http_timeout_s, "a POST")


@dataclass(slots=True)
class SubmitStats:
    """Counters a submitter keeps about itself."""

    claims: int = 0
    posts: int = 0
    submitted: int = 0
    rejected: int = 0
    unknown: int = 0
    """Refusals (or silences) recorded as `unknown`: after an unknown outcome, a render may
    be billed."""
    retries: dict[str, int] = field(default_factory=dict)
    released: int = 0
    fenced_out: int = 0
    db_errors: int = 0
    probes: int = 0
    """Idle checks of what is due next made instead of a claim."""
    url_pauses: int = 0
    """Pauses of an account's submissions begun for a create answered by something other
    than the provider (a wrong base URL, a proxy): one per episode."""
    url_probes: int = 0
    """Status reads sent to see whether the provider answers a misrouted account again."""
    lookups: int = 0
    """Look-ups of unknown creates in the provider's records (no idempotency key)."""
    list_calls: int = 0
    """List requests those look-ups sent."""
    adopted: int = 0
    resent: int = 0
    """Intents whose earlier creates the provider's records proved absent: sent again."""
    parked: int = 0
    """Intents parked as `unknown` by a look-up (ambiguous, or the records unreadable)."""
    held: int = 0
    """Intents a cap held (vidpoll.spend), counted each time one is held."""


class Submitter(Runner):
    """Sends queued intents, at most `concurrency` POSTs at once, within `max_active`."""

    def __init__(self, store: IntentStore, creator: VideoCreator | Mapping[str, VideoCreator],
                 config: SubmitterConfig, rng: random.Random | None = None,
                 clock: Callable[[], datetime] = utc_now,
                 schedules: Schedules | None = None) -> None:
        super().__init__(config.policy, rng, clock)
        self.store = store
        self.schedules = schedules
        """The poller's learned schedules, when one runs in this process: a new job's first
        read comes when its model's plan says (never later than `first_poll_s` unless no
        render of its model ended that soon); None: `first_poll_s`."""
        self.creators: Mapping[str, VideoCreator] = (
            creator if isinstance(creator, Mapping) else {DEFAULT_ACCOUNT: creator})
        self._budget_wait: float | None = None
        self._turn = 0
        self.config = config
        self.stats = SubmitStats()
        self.health = Health(config.policy, self._rng, confirm_by_create=True)
        """Each account's pauses: a refused key, an empty account (402), creates answered by
        something other than the provider (probed with a status read, never a POST), 429s."""
        self.lookups = Lookups(self._rng, on_calls=self._count_list_calls)
        self._looking = 0
        """Look-ups in flight (counted in `_inflight` too, but taking no POST slot)."""
        """The shared walks of the provider's records (vidpoll.reconcile)."""
        self._one_shot = False
        self._spends_generation = 0
        """Reloads of the prices and caps so far (a claim under older ones re-wakes)."""
        self._reloading: asyncio.Task[None] | None = None
        """The wake of held intents after a reload (SIGHUP), kept from the collector."""
        """submit_now's: one POST whose caller reports a wrong URL itself (no ERROR here)."""

    async def run(self) -> None:
        """Send intents until stop() (or, with drain, until none is queued)."""
        cfg = self.config
        log.info("submitter %s started: concurrency=%d max_active=%s lease=%gs", cfg.worker_id,
                 cfg.concurrency, cfg.max_active, cfg.lease_s)
        listener = asyncio.create_task(self._listener()) if cfg.listen else None
        flusher = asyncio.create_task(self._minutes_flusher(self.store, False))
        try:
            # a cap raised (or removed) before this start: what it held is checked again now
            await self._wake_held()
            await self._main_loop()
        finally:
            self._stopping.set()
            abandoned = await self._finish_tasks(cfg.shutdown_timeout_s)
            if abandoned:
                log.warning("submitter %s: %d POSTs still in flight at the shutdown timeout "
                            "(%gs) were abandoned; their intents come back when their leases "
                            "end, as unknown outcomes, sent again with the same key",
                            cfg.worker_id, abandoned, cfg.shutdown_timeout_s)
            for helper in (listener, flusher):
                await cancel_and_wait(helper)
            await self._flush_minutes(self.store)
            await self.signals.pulse()
            retries = ",".join(f"{k}:{v}" for k, v in sorted(self.stats.retries.items()))
            log.info("submitter %s stopped: posts=%d submitted=%d rejected=%d unknown=%d "
                     "retries=%s url_pauses=%d url_probes=%d", cfg.worker_id,
                     self.stats.posts, self.stats.submitted, self.stats.rejected,
                     self.stats.unknown, retries or "0", self.stats.url_pauses,
                     self.stats.url_probes)

    async def _main_loop(self) -> None:
        cfg = self.config
        loop = asyncio.get_running_loop()
        db_failures = 0
        # True after an idle sleep ran out with nothing known to be due: look (one cheap
        # statement) before claiming (a claim takes the admission lock: a transaction more)
        probe_first = False
        while not self._stopping.is_set():
            honour_cancel()
            self._wake.clear()
            notified = self._take_notified()
            paused_for = self.health.all_paused_for(cfg.accounts, self._now())
            if paused_for > 0 and not self._credit_paused_accounts():
                # every account is paused (key refused, or out of credits: then its unknown
                # intents still go out, so only a refused key everywhere sleeps here)
                await self._sleep(paused_for)
                continue
            # look-ups (no POST: the shared walk of the provider's records) take no POST slot:
            # those claimed while a walk runs all join the next one
            free = cfg.concurrency - (self._inflight - self._looking)
            if free <= 0:
                await self._sleep(cfg.idle_max_s)  # a finishing POST wakes us
                continue
            limit = free
            claim_on_timeout = True
            try:
                if probe_first and not notified:
                    self.stats.probes += 1
                    probed = await self._idle_delay(0, probing=True)
                    if probed is None:
                        return
                    if probed > 0:
                        db_failures = 0
                        self.idle = self._inflight == 0
                        await self.signals.pulse()
                        woken = await self._sleep(probed)
                        probe_first = not woken and probed >= cfg.idle_max_s
                        continue
                # taken before the claim: the lease guard must count any wait inside it
                claimed_at = loop.time()
                intents = await self._claim(limit)
                db_failures = 0
                self.stats.claims += 1
                if self._stopping.is_set():  # stop() arrived during the claim: give them back
                    for intent in intents:
                        await self._release(intent, 0.0)
                    return
                for intent in intents:
                    self._spawn_send(intent, claimed_at)
                if len(intents) == limit and limit == free:
                    continue
                idle_delay = await self._idle_delay(len(intents))
                if idle_delay is None:
                    return
                delay = idle_delay
                claim_on_timeout = delay < cfg.idle_max_s
            except DatabaseUnavailable as exc:
                db_failures += 1
                self.stats.db_errors += 1
                metrics.DB_ERRORS.inc()
                log.warning("submitter: database unavailable (%s); retrying",
                            str(exc).splitlines()[0])
                delay = backoff_delay(db_failures, cfg.policy, self._rng, DB_BACKOFF_MAX_S)
            self.idle = self._inflight == 0
            await self.signals.pulse()
            woken = await self._sleep(delay)
            probe_first = not woken and not claim_on_timeout

    async def _claim(self, limit: int) -> list[ClaimedIntent]:
        """Each account in turn (a different one first each time), within its create budget."""
        cfg = self.config
        self._budget_wait = None
        self._turn += 1
        credit_paused = self._credit_paused_accounts()
        unpaused = self.health.unpaused(cfg.accounts, self._now())
        accounts = [a for a in cfg.accounts if a in unpaused or a in credit_paused]
        claimed: list[ClaimedIntent] = []
        for i in range(len(accounts)):
            account = accounts[(self._turn + i) % len(accounts)]
            want = limit - len(claimed)
            if want <= 0:
                break
            if self.health.blocked(account):
                self._probe(account)  # nothing is POSTed until the provider answers
                continue
            unknown_only = account in credit_paused
            if not unknown_only and self.health.on_trial(account):
                want = 1  # one probe per pause
            try:
                claimed += await self._claim_account(account, want, unknown_only)
            except DatabaseUnavailable:
                if not claimed:
                    raise
                break  # send what is claimed already; it is committed and leased to us
        return claimed

    async def _claim_account(self, account: str, want: int,
                             unknown_only: bool = False) -> list[ClaimedIntent]:
        cfg = self.config
        take = await take_budget(self.store, account, "create", want,
                                 cfg.budgets.get(account))
        want = take.granted
        if want == 0:
            got: list[ClaimedIntent] = []
        elif unknown_only:
            got = await self.store.claim_unknown_intents(want, cfg.lease_s, cfg.worker_id,
                                                         account=account)
        else:
            spend = cfg.spends.get(account, NO_SPEND)
            generation = self._spends_generation
            claim = await self.store.claim_checked(
                want, cfg.lease_s, cfg.worker_id, cfg.max_active, account=account,
                spend=spend, spend_now=None if cfg.spend_clock is None else cfg.spend_clock())
            got = claim.intents
            self._note_held(account, claim)
            if claim.held and generation != self._spends_generation:
                # the caps were reloaded while this claim ran with the old ones (its wake
                # may have gone first): what it held is checked again under the new ones
                await self._wake_held()
        # (a held intent sent nothing: its token goes back)
        wait_s = await settle_budget(self.store, take, len(got))
        if wait_s is not None:
            # the budget, not the queue, held this account back (with nothing granted, the
            # idle path only sleeps this long if intents are due)
            self._budget_wait = min(self._budget_wait or wait_s, wait_s)
        return got

    def _note_held(self, account: str, claim: Claim) -> None:
        """Log what a cap held (each intent once per hold) and the fleet's first 80 %
        warning of a window."""
        for warning in claim.warnings:
            log.warning("spend: %s", warning, extra=event(account=account))
        for held in claim.held:
            self.stats.held += 1
            # said once at INFO; held again after a wake that freed too little: DEBUG
            log.log(logging.DEBUG if held.again else logging.INFO, "intent %s held: %s",
                    held.key, held.reason,
                    extra=event(key=held.key, account=account, outcome="held"))

    def reload_spends(self, spends: Mapping[str, AccountSpend]) -> None:
        """New prices and caps (SIGHUP re-read the accounts file): the held intents of this
        submitter's accounts are checked again at once against them."""
        self.config = replace(self.config, spends=spends)
        self._spends_generation += 1
        self._reloading = asyncio.get_running_loop().create_task(self._wake_held())

    async def _wake_held(self) -> None:
        try:
            woken = await self.store.wake_held(self.config.accounts)
        except DatabaseUnavailable as exc:
            log.warning("held intents not woken after a reload (%s): they resume at their "
                        "window's turn, or at the next reload", exc)
            return
        if woken:
            log.info("%d held intents checked again against the caps", woken)
            self._wake.set()

    async def _idle_delay(self, claimed: int, probing: bool = False) -> float | None:
        """How long to sleep after a claim; None ends a drain. `probing`: no claim was made
        (an idle sleep ran out); 0.0 means claim now."""
        cfg = self.config
        budget_wait = None if self._budget_wait is None else min(
            cfg.idle_max_s, max(0.05, self._budget_wait))  # when the next token is due
        if claimed or self._inflight:
            if budget_wait is not None:
                return budget_wait
            # more may be due but held back by the cap: a finishing POST or job wakes us
            return RECHECK_S if not claimed else cfg.idle_max_s
        if cfg.drain and not await self.store.has_queued_intents(cfg.accounts):
            log.info("drain: no queued intent left")
            self._stopping.set()
            return None
        now = self._now()
        probe_in = self.health.probe_in(now, cfg.idle_max_s)  # a paused account's probe
        credit_paused = self._credit_paused_accounts()
        due_in = await self.store.next_intent_due_in(
            [a for a in self.health.unpaused(cfg.accounts, now) if a not in credit_paused],
            credit_paused)
        if due_in is None:
            return min(cfg.idle_max_s, probe_in)
        if due_in <= 0:
            if probing:
                return 0.0
            return budget_wait if budget_wait is not None else RECHECK_S
        return min(cfg.idle_max_s, probe_in, due_in + 0.005)

    def _spawn_send(self, intent: ClaimedIntent, claimed_at: float) -> None:
        self._inflight += 1
        looking = self._is_lookup(intent)
        self._looking += looking
        self._spawn(self._send_and_count(intent, claimed_at, looking))

    def _is_lookup(self, intent: ClaimedIntent) -> bool:
        """Whether sending `intent` is a look-up in the provider's records, not a POST."""
        creator = self.creators.get(intent.account)
        return bool(creator is not None and creator.rules.idempotency_header is None
                    and (intent.unsettled or intent.state == UNKNOWN)
                    and can_look_up(creator))

    async def _send_and_count(self, intent: ClaimedIntent, claimed_at: float,
                              looking: bool = False) -> None:
        try:
            await self.send(intent, claimed_at)
        except Exception:
            log.exception("intent %s: unexpected error; its lease will expire and it is sent "
                          "again with the same key", intent.key)
        finally:
            self._inflight -= 1
            self._looking -= looking
            self._wake.set()
        await self.signals.pulse()

    # -- one intent ---------------------------------------------------------------------------
    async def send(self, intent: ClaimedIntent, claimed_at: float | None = None
                   ) -> SubmitOutcome | AuthPause | None:
        """POST one claimed intent and record the answer.

        Returns the recorded outcome, an AuthPause (the intent was given back untouched), or
        None when it was not sent at all (its lease was too short to wait for an answer).
        """
        cfg = self.config
        loop = asyncio.get_running_loop()
        if claimed_at is not None and loop.time() - claimed_at + cfg.http_timeout_s > cfg.lease_s:
            # the lease could end before the answer arrives, and then another submitter may
            # send the same key at the same moment: give it back instead
            await self._release(intent, RELEASE_DELAY_S)
            return None
        creator = self.creators[intent.account]
        if creator.rules.idempotency_header is None and (intent.unsettled
                                                          or intent.state == UNKNOWN):
            # an earlier create may have billed a render and no key makes a second one safe:
            # the provider's own records settle it, or an operator does; never a blind re-send
            # (unless the account chose one, for a provider with no records to look in)
            if not (intent.account in cfg.resend_unknown
                    and not can_look_up(creator)
                    and intent.state != UNKNOWN):
                # the walk stops in time for its answer to land within the lease
                started = claimed_at if claimed_at is not None else loop.time()
                outcome = await self._reconcile(intent, creator,
                                                started + cfg.lease_s - cfg.http_timeout_s)
                await self._record(outcome, intent)
                return outcome
            self.stats.resent += 1
            metrics.RECONCILIATIONS.labels(intent.account, "resent").inc()
            log.warning("intent %s: an earlier create's outcome is unknown and cannot be looked "
                        "up; sent again as the account's on_unknown_create = \"resend\" says "
                        "(this may bill a second render)", intent.key,
                        extra=event(key=intent.key, account=intent.account, outcome="resent"))
        self.stats.posts += 1
        try:
            answer = await (creator.create_video(intent.payload, intent.key, intent.model)
                            if intent.model is not None
                            else creator.create_video(intent.payload, intent.key))
        except Exception as exc:  # the client promises answers; be safe anyway
            log.exception("intent %s: create call raised", intent.key)
            answer = HttpAnswer(None, transport_error=ErrorClass.CONNECTION,
                                detail=type(exc).__name__)
        pause = bucket_pause(self._create_pause_s(intent.account, answer), answer.status,
                             intent.account in cfg.budgets)
        if pause is not None:
            # as for reads: "Remaining: 0" pauses only an account the fleet does not pace
            # the fleet stops creating for this account until the server's reset
            with contextlib.suppress(DatabaseUnavailable):
                await self.store.pause_bucket(intent.account, "create", *pause)
        rules = self.creators[intent.account].rules
        decision = decide_submit(intent, answer, self._clock(), cfg.policy, self._rng, rules)
        if isinstance(decision, MisroutedCreate):
            # the request never reached the provider's create: given back untouched, its attempt not
            # counted and no unknown outcome recorded (policy.MisroutedCreate says why)
            self._create_misrouted(intent.account, decision)
            await self._release(intent, max(0.0, self.health.all_paused_for(
                [intent.account], self._now())))
            return decision
        if answer.status is not None and probe_verdict(answer, rules) in (PROVIDER, KEY_REFUSED):
            self._create_answered(intent.account, "a POST")
        if isinstance(decision, AuthPause):
            self._key_refused(intent.account, decision, "submitting (intents stay queued)")
            await self._release(intent, max(0.0, self.health.all_paused_for(
                [intent.account], self._now())))
            return decision
        self._key_accepted(intent.account, "submitting")
        await self._record(decision, intent)
        return decision

    def _create_pause_s(self, account: str, answer: HttpAnswer) -> float | None:
        """How long the fleet holds `account`'s creates after this answer (None: not at all;
        Health.create_hold_s)."""
        return self.health.create_hold_s(account, answer, self._clock())

    async def _reconcile(self, intent: ClaimedIntent, creator: VideoCreator,
                         deadline: float = float("inf")) -> SubmitOutcome:
        """Settle a create whose outcome is unknown from the provider's own records (a provider
        without an idempotency key): adopt the one job they hold for this input, send again
        when they prove there is none, or park the intent as `unknown` for an operator."""
        policy = self.config.policy
        key, token = intent.key, intent.claim_token

        def park(why: str, status: int | None = None) -> SubmitOutcome:
            self.stats.parked += 1
            metrics.RECONCILIATIONS.labels(intent.account, "parked").inc()
            return SubmitOutcome(key, token, UNKNOWN, PARKED_S, http_status=status,
                                 error_class=ErrorClass.CONNECTION,
                                 error=f"{why}; not sent again (the provider's creates have no "
                                       f"idempotency key): settle it with `vidpoll intents "
                                       f"resolve {key} --job-id ID | --not-billed`")

        if not can_look_up(creator):
            return park("an earlier create's outcome is unknown and this provider's records "
                        "cannot be searched")
        now = self._clock()
        window_from = intent.window_from or now - timedelta(seconds=LOOKBACK_S)
        sent_by = intent.window_to or now
        age_s = (now - window_from).total_seconds()
        settle_left = policy.reconcile_settle_s - (now - sent_by).total_seconds()
        if intent.state != UNKNOWN and settle_left > 0:
            # too early (a crash mid-POST found at once): the list may not show it yet
            metrics.RECONCILIATIONS.labels(intent.account, "retry").inc()
            return SubmitOutcome(key, token, RECONCILING, settle_left,
                                 error="waiting for the provider's records to settle")
        self.stats.lookups += 1
        skew = timedelta(seconds=policy.reconcile_skew_s)
        # a server may make the create after its client gave up (up to the settle time, as
        # `until` allows): records that list only started creates (fal) prove it absent only
        # once they are complete past that, not past the attempt's end
        recorded_by = sent_by + timedelta(seconds=policy.reconcile_settle_s)
        wanted = Wanted(key, intent.payload, intent.model, window_from - skew,
                        recorded_by + skew, recorded_by)
        finder = getattr(creator, "find_created", None)
        lookup = (await self._find_by_key(intent, finder, window_from - skew) if callable(finder)
                  else await self.lookups.find(intent.account, creator,  # type: ignore[arg-type]
                                               creator.rules,  # type: ignore[arg-type]
                                               wanted, deadline))
        if not lookup.complete:
            failure = lookup.failure
            status = failure.status if failure is not None else None
            if intent.state == UNKNOWN or age_s > policy.reconcile_deadline_s:
                return park(f"the provider's records could not be read for {age_s:.0f}s "
                            f"({lookup.detail})", status)
            hinted = parse_retry_after(failure.retry_after if failure else None, now)
            # short while the provider's retention clock runs (its records of inputs go):
            # the walk already tried each page again in place, and resumes where it stopped
            delay = (min(RECONCILE_WAIT_MAX_S, max(policy.min_poll_s, hinted))
                     if hinted is not None
                     else min(RECONCILE_RETRY_MAX_S,
                              backoff_delay(intent.consecutive_errors + 1, policy, self._rng)))
            metrics.RECONCILIATIONS.labels(intent.account, "retry").inc()
            return SubmitOutcome(key, token, RECONCILING, delay, http_status=status,
                                 error_class=(failure.transport_error if failure else None)
                                 or ErrorClass.SERVER_ERROR,
                                 error=f"looking up the create in the provider's records "
                                       f"failed ({lookup.detail}); tried again in {delay:.0f}s")
        if callable(finder) and lookup.unsure:
            # the provider's id for this key names a task made before this intent's first
            # create: another system's, or an older use of the key; never adopted blindly
            return park(f"the provider holds a task under this key's id made before this "
                        f"intent was first sent ({', '.join(lookup.unsure[:3])}): another "
                        f"system's, or an older use of the key")
        if (callable(finder) and lookup.complete and not lookup.matches
                and intent.last_http_status == 409):
            # the provider refused the id as taken, yet no task of this model carries it: one
            # at another endpoint, or another system's. Sent again, it would be refused again
            return park("the provider refused this key's id as already used, and the look-up "
                        "finds no task carrying it here (one of another endpoint, or another "
                        "system's)", 409)
        found = [*lookup.matches, *lookup.unsure]
        known = await self.store.jobs_of_ids(found) if found else {}
        mine = [j for j in found if j in known and known[j] == key]
        # a job another intent holds is that intent's, never this one's (identical inputs
        # sent on purpose stay two jobs); one added by hand (no key) may be this one's
        matches = [j for j in lookup.matches if known.get(j, key) in (key, None)]
        unsure = [j for j in lookup.unsure if known.get(j, key) in (key, None)]
        job_id = mine[0] if mine else matches[0] if len(matches) == 1 and not unsure else None
        if job_id is not None:
            self.stats.adopted += 1
            metrics.RECONCILIATIONS.labels(intent.account, "adopted").inc()
            return SubmitOutcome(key, token, SUBMITTED, job_id=job_id, adopted=True,
                                 handle=lookup.handles.get(job_id),
                                 error=f"adopted from the provider's records ({lookup.calls} "
                                       f"list calls)")
        if not matches and not unsure and not lookup.proves_absence:
            # the records list creates only once they have started (fal's queue): one still
            # queued would not show yet, so "not listed" is no proof until they pass it
            if age_s > policy.reconcile_deadline_s:
                return park(f"the provider's records do not list this input, but they do not "
                            f"yet list every create sent by {sent_by:%H:%M:%S} UTC either "
                            f"(a request still queued is not listed) after {age_s:.0f}s")
            metrics.RECONCILIATIONS.labels(intent.account, "retry").inc()
            return SubmitOutcome(key, token, RECONCILING, RECONCILE_RETRY_MAX_S,
                                 error="not in the provider's records yet, which list a create "
                                       "only once it has started; looked up again until they "
                                       "pass the attempt")
        if not matches and not unsure:
            self.stats.resent += 1
            metrics.RECONCILIATIONS.labels(intent.account, "resent").inc()
            return SubmitOutcome(key, token, QUEUED, settled=True,
                                 error=f"the provider's records hold no create of this input "
                                       f"since {window_from:%H:%M:%S} UTC ({lookup.calls} list "
                                       f"calls): sent again")
        shown = ", ".join([*matches, *unsure][:5])
        return park(f"the provider's records hold {len(matches)} job(s) of this exact input "
                    f"and {len(unsure)} whose input can no longer be compared ({shown})")

    async def _find_by_key(self, intent: ClaimedIntent,
                           finder: Callable[..., Awaitable[CreatedPage]],
                           since: datetime) -> CreateLookup:
        """Look the intent's create up by the id the provider keeps for the key it was sent
        with (Kling's `external_task_id`): one read, no list, no input to compare. A task
        recorded before `since` (the intent's first create, less the clock skew) is `unsure`:
        the id was used before, by another system or an older use of the key."""
        try:
            page = await finder(intent.model, intent.key)
        except Exception as exc:  # the client promises pages; be safe anyway
            log.exception("intent %s: the look-up by key raised", intent.key)
            page = CreatedPage(failure=HttpAnswer(None, transport_error=ErrorClass.CONNECTION,
                                                  detail=type(exc).__name__),
                               detail=f"the look-up raised {type(exc).__name__}")
        self._count_list_calls(intent.account, page.calls)
        if page.failure is not None or page.detail:
            return CreateLookup(False, calls=page.calls, failure=page.failure,
                                detail=page.detail or "the look-up failed")
        found = tuple(c.job_id for c in page.entries if c.job_id is not None)
        if len(found) < len(page.entries):  # listed without an id: nothing is proven
            return CreateLookup(False, calls=page.calls,
                                detail="the provider lists the key's create without an id")
        early = tuple(c.job_id for c in page.entries if c.job_id is not None
                      and c.created_at is not None and c.created_at < since)
        return CreateLookup(True, matches=tuple(j for j in found if j not in early),
                            unsure=early, calls=page.calls,
                            handles={c.job_id: c.handle for c in page.entries
                                     if c.job_id is not None and c.handle})

    def _count_list_calls(self, account: str, calls: int) -> None:
        self.stats.list_calls += calls
        metrics.LIST_CALLS.labels(account).inc(calls)

    def _first_read_s(self, intent: ClaimedIntent) -> float:
        """Seconds from the create to the new job's first read."""
        if self.schedules is None:
            return self.config.first_poll_s
        rules = self.creators[intent.account].rules
        policy = self.config.policy
        # the floor the poller's plan of this account uses (its policy's, raised to the
        # provider's; an account's own min_poll_s is the poller's alone: a plan of its own)
        floor = min(policy.max_poll_s,
                    max(policy.min_poll_s, float(getattr(rules, "min_poll_s", 0.0) or 0.0)))
        planned = self.schedules.first_read_s(
            intent.account, intent.model,
            registry.rules_duration_key(rules, intent.payload, intent.model), floor,
            self.config.first_poll_s)
        return self.config.first_poll_s if planned is None else planned

    async def _record(self, outcome: SubmitOutcome, intent: ClaimedIntent) -> None:
        """Write the outcome, retrying through a database outage.

        A 202 lives only in memory until this commits; if the process dies first, the intent
        comes due again when its lease ends and the same key brings back the same job.
        """
        account = intent.account
        first_read_s = self._first_read_s(intent)
        failures = 0
        while True:
            try:
                landed = await self.store.record_submit(outcome, first_read_s)
                break
            except DatabaseUnavailable as exc:
                failures += 1
                self.stats.db_errors += 1
                metrics.DB_ERRORS.inc()
                if self._stopping.is_set() and failures > 3:
                    log.error("intent %s: could not record %s (job %s) before stopping: %s; "
                              "it is sent again with the same key once its lease ends",
                              outcome.key, outcome.state, outcome.job_id, exc)
                    return
                await asyncio.sleep(backoff_delay(failures, self.config.policy, self._rng,
                                                  DB_BACKOFF_MAX_S))
        if not landed:
            self.stats.fenced_out += 1
            log.warning("intent %s: outcome dropped, another submitter owns it now (its answer "
                        "for the same key is the same)", outcome.key)
            return
        self._count(outcome, account)

    def _count(self, outcome: SubmitOutcome, account: str) -> None:
        fields = event(key=outcome.key, job_id=outcome.job_id, account=account,
                       outcome=outcome.state, http_status=outcome.http_status,
                       request_id=outcome.request_id,
                       error_class=outcome.error_class.value if outcome.error_class else None)
        if outcome.adopted or outcome.settled or outcome.state == RECONCILING:
            # a look-up or its wait, not a POST
            if outcome.adopted:
                self.stats.submitted += 1
                log.info("intent %s: its create was found in the provider's records: job %s "
                         "adopted (%s)", outcome.key, outcome.job_id, outcome.error,
                         extra=fields)
            elif outcome.settled:
                log.info("intent %s: %s", outcome.key, outcome.error, extra=fields)
            else:
                log.info("intent %s (reconciling): %s", outcome.key, outcome.error,
                         extra=fields)
            return
        metrics.observe_submission(self.minutes, self._clock(), account, outcome.state)
        if outcome.state == SUBMITTED:
            self.stats.submitted += 1
            if self.health.credits_back(account):
                # The provider accepted a create: the account has credits again, its pause ends
                self._wake.set()
            log.info("intent %s submitted: job %s", outcome.key, outcome.job_id, extra=fields)
        elif outcome.state == REJECTED:
            self.stats.rejected += 1
            log.error("intent %s rejected by the provider: HTTP %s %s: %s; "
                      "`vidpoll intents retry KEY` sends it again", outcome.key,
                      outcome.http_status, outcome.error_code, outcome.error_message,
                      extra=fields)
            if outcome.http_status == 402:
                self._pause_for_credits(account)
        elif outcome.state == UNKNOWN:
            self.stats.unknown += 1
            if outcome.delay_s >= PARKED_S:
                log.warning("intent %s parked as unknown: %s", outcome.key, outcome.error,
                            extra=fields)
            elif outcome.error_code is not None:
                log.warning("intent %s: the provider refused it (HTTP %s %s: %s), but an earlier "
                            "attempt's outcome is unknown, so a render may be billed: kept "
                            "as `unknown`, sent again with the same key in %.0fs; settle it "
                            "with `vidpoll intents resolve KEY --job-id ID | --not-billed`",
                            outcome.key, outcome.http_status, outcome.error_code,
                            outcome.error_message, outcome.delay_s, extra=fields)
            else:
                log.info("intent %s (unknown): no clear answer again (%s); sent again with "
                         "the same key in %.0fs", outcome.key, outcome.error, outcome.delay_s,
                         extra=fields)
            if outcome.http_status == 402 and not self._credit_paused(account):
                self._pause_for_credits(account)
        else:
            assert outcome.state == QUEUED and outcome.error_class is not None
            name = outcome.error_class.value
            self.stats.retries[name] = self.stats.retries.get(name, 0) + 1
            log.info("intent %s: outcome unknown (%s); sent again with the same key in %.1fs",
                     outcome.key, outcome.error, outcome.delay_s, extra=fields)

    async def _release(self, intent: ClaimedIntent, delay_s: float) -> None:
        self.stats.released += 1
        # nothing was sent; if the database is down the lease ends and it is due again anyway
        with contextlib.suppress(DatabaseUnavailable):
            await self.store.release_intent(intent, delay_s)

    # -- creates answered by something other than the provider ------------------------------
    def _create_url(self, account: str) -> str:
        shown = getattr(self.creators.get(account), "shown_create_url", None)
        if callable(shown):
            with contextlib.suppress(Exception):
                return str(shown())
        return "the create URL"

    def _create_misrouted(self, account: str, pause: MisroutedCreate) -> None:
        """Pause the account's submissions after a create answered by something other than
        The provider: one ERROR per episode naming the URL (never the key or a query string)."""
        delay = self.health.misrouted(account, self._now(), lambda: self._create_url(account))
        episode = self.health.episode(account)
        if delay is None or episode is None:
            return  # the same pause (POSTs that were in flight together): counted once
        if episode.failures == 1:
            self.stats.url_pauses += 1
            metrics.MISROUTE_PAUSES.labels(account, "submit").inc()
            if self._one_shot:  # `vidpoll submit`, Vidpoll.send(): the caller says it once
                log.info("account %r: POST %s got %s, not the provider's error envelope: "
                         "the base URL "
                         "looks wrong; the intent stays queued", account, episode.url,
                         pause.detail)
                return
            log.error("account %r: POST %s got %s, not the provider's error envelope: "
                         "the base URL "
                      "looks wrong, or a proxy answers in the provider's place. "
                      "Submitting for this "
                      "account is paused (its intents stay queued, sent later under their "
                      "same keys), probed with a status read with backoff (first in %.1fs); "
                      "`vidpoll doctor` checks the URL", account, episode.url, pause.detail,
                      delay, extra=event(account=account, outcome="misrouted",
                                         http_status=pause.http_status))
        elif not episode.warned_create:
            # a status read reached the provider, the POST still did not: the create path is wrong
            episode.warned_create = True
            log.warning("account %r: the provider answers status reads, but POST %s still "
                        "got %s: "
                        "the create path looks wrong; submitting stays paused (next "
                        "try in %.1fs)", account, episode.url, pause.detail, delay)

    def _probe(self, account: str) -> None:
        """One status read (never a POST: a probe must not risk a billed create) for a
        misrouted account whose pause ran out; the account stays paused until its answer."""
        reader = getattr(self.creators.get(account), "read_status", None)
        if not callable(reader):  # a creator without reads: one intent is the probe
            self.health.probe_instead(account)
            return
        episode = self.health.probe_starts(account, self._now())
        if episode is not None:
            self._spawn(self._probe_url(account, episode, reader))

    async def _probe_url(self, account: str, episode: Misroute,
                         reader: Callable[[str], Any]) -> None:
        try:
            answer = await reader(f"{PROBE_PREFIX}{uuid.uuid4().hex}")
            if not isinstance(answer, HttpAnswer):
                raise TypeError(type(answer).__name__)
        except Exception as exc:  # the reader promises answers, not exceptions; be safe
            answer = HttpAnswer(None, transport_error=ErrorClass.CONNECTION,
                                detail=type(exc).__name__)
        finally:
            self.health.probe_over(episode)
        self.stats.url_probes += 1
        verdict = probe_verdict(answer, self.creators[account].rules)
        after = self.health.probe_answered(account, episode, verdict, self._now())
        if after is None:
            pass  # a POST reached the provider meanwhile
        elif after.resumed:  # (a refused key is the POSTs' to report)
            log.info("account %r: the provider answers at the base URL again (a status read); "
                     "submitting resumed after %.1fs, one intent first", account,
                     self._now() - episode.since)
        else:
            log.debug("account %r: probe answered %s (%s); submitting still paused, next "
                      "probe in %.1fs", account, answer.status or answer.transport_error,
                      verdict, after.delay_s)
        self._wake.set()
        await self.signals.pulse()

    def _create_answered(self, account: str, how: str) -> None:
        """The provider answered a POST of the account: a pause for misrouted creates ends."""
        episode = self.health.url_works(account, unpause=False)
        if episode is None:
            return
        if not episode.cleared:  # never said at a probe (a creator without reads)
            log.info("account %r: the provider answers at the base URL again (%s); "
                     "submitting resumed "
                     "after %.1fs", account, how, self._now() - episode.since)
        self._wake.set()

    def _credit_paused(self, account: str) -> bool:
        """Paused because the provider reported no credits (not a refused key): the account's
        `unknown` intents still go out on their slow schedule, nothing else of it does."""
        return self.health.credit_paused(account, self._now())

    def _credit_paused_accounts(self) -> list[str]:
        return [a for a in self.config.accounts if self._credit_paused(a)]

    def _pause_for_credits(self, account: str) -> None:
        # the next intents would most likely be refused too; each refusal is final, so pause
        # instead of turning a whole queue into rejections
        delay = self.health.out_of_credits(account, self._now())
        log.error("The provider reports insufficient credits for account %r; its submitting paused "
                  "for %.0fs", account, delay)

    # -- wake-ups -------------------------------------------------------------------------
    def _notifications(self) -> AsyncIterator[Notice]:
        # new or re-queued intents, and finished jobs (a slot under the cap frees up)
        return self.store.notifications(WAKE_CHANNELS)


def can_look_up(creator: object) -> bool:
    """Whether a provider's records can settle an unknown create: a list of its creates to
    search (`list_created`), or a look-up by the id it keeps for the create's key
    (`find_created`)."""
    return (callable(getattr(creator, "list_created", None))
            or callable(getattr(creator, "find_created", None)))


async def submit_now(store: IntentStore, creator: VideoCreator, config: SubmitterConfig,
                     key: str, account: str = DEFAULT_ACCOUNT
                     ) -> SubmitOutcome | AuthPause | None:
    """Claim one intent by key (if its turn has come under the cap) and send it once.

    Returns the recorded outcome, an AuthPause, or None if it could not be claimed now (the
    cap is reached, intents are ahead of it, it is not due, the account's create budget has
    no token left, or a spend cap held it: then it is `held`); it then waits for a running
    worker.
    """
    budget = config.budgets.get(account)
    if budget is not None and (await store.take_tokens(account, "create", 1, budget)).granted < 1:
        return None
    claimed_at = asyncio.get_running_loop().time()
    claim = await store.claim_checked(
        1, config.lease_s, config.worker_id, config.max_active, key=key, account=account,
        spend=config.spends.get(account, NO_SPEND),
        spend_now=None if config.spend_clock is None else config.spend_clock())
    claimed = claim.intents
    submitter = Submitter(store, {account: creator}, config)
    submitter._note_held(account, claim)
    if not claimed:
        if budget is not None:
            await store.refund_tokens(account, "create", 1)
        return None
    submitter._one_shot = True
    return await submitter.send(claimed[0], claimed_at)
