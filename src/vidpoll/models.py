"""Plain data shared by every layer: frozen dataclasses and enums, no I/O."""

from __future__ import annotations

import enum
import uuid
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

DEFAULT_ACCOUNT = "default"
"""The account of every row nobody assigned to another; its key is SUME_API_KEY."""

PENDING = "pending"
"""The one state that is polled; every other state is final."""

NOT_FOUND = "not_found"
"""Local terminal state: the provider kept answering 404 past the configured tries and age."""

GAVE_UP = "gave_up"
"""Local terminal state: still not terminal after the max polling age; `jobs resume` revives it."""

LOCAL_TERMINAL_STATES = frozenset({NOT_FOUND, GAVE_UP})

SUCCEEDED = "succeeded"
"""The neutral outcome of a render that produced a video, whatever the provider's word (its
result is fetched, its media downloaded, `wait` exits 0): see vidpoll.providers.base."""

QUEUED = "queued"
"""An intent not yet accepted by the provider: never sent, or sent with an unknown outcome."""

SUBMITTED = "submitted"
"""An intent the provider answered 202: its job row exists and is linked."""

REJECTED = "rejected"
"""An intent the provider refused for good (402, 422, ...): never retried automatically."""

UNKNOWN = "unknown"
"""An intent the provider refused after an earlier attempt's outcome was unknown (a lost reply): a
render may be billed, so it is sent again with the same key on a slow schedule until the provider
answers with a job or an operator settles it (`intents resolve`)."""

RECONCILING = "reconciling"
"""An intent of a provider without an idempotency key whose create's outcome is unknown: not sent
again, but looked up in the provider's own records (`Reconciler.list_created`) until it is
adopted (`submitted`), proven absent (`queued`, sent again) or parked (`unknown`)."""

HELD = "held"
"""An intent a cap held (issue 30): not sent, waiting for its window to turn, budget to free
(a refunded failure), the cap to be raised, or an operator (`intents release`); `held_reason`
says which cap, what is spent and reserved, and when it resumes."""

INTENT_STATES = (QUEUED, HELD, RECONCILING, UNKNOWN, SUBMITTED, REJECTED)
"""Every state of an intent."""

PARKED_S = 10 * 365 * 86400.0
"""An `unknown` intent of a provider whose creates have no idempotency key is parked this long:
sending it again could bill a second render, so it waits for an operator (`intents resolve`)
or for the provider's own records to settle it."""

UNKNOWN_RESEND_MAX_S = 120.0
"""An `unknown` intent is sent again at least this often (a top-up then brings its job back)."""


class ClaimMode(enum.StrEnum):
    """How a worker owns the rows it reads."""

    LEASE = "lease"
    LOCK = "lock"


class ErrorClass(enum.StrEnum):
    """Why a status read did not produce an answer; each is counted separately."""

    RATE_LIMITED = "rate_limited"
    UNAVAILABLE = "unavailable"
    SERVER_ERROR = "server_error"
    TIMEOUT = "timeout"
    CONNECTION = "connection"
    MALFORMED = "malformed"
    NOT_FOUND = "not_found"
    AUTH = "auth"
    CLIENT_ERROR = "client_error"
    CONFLICT = "conflict"


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    """A row a worker owns until its lease ends (or its transaction does)."""

    job_id: str
    claim_token: uuid.UUID
    due_at: datetime
    polling_since: datetime
    polls: int
    consecutive_errors: int
    not_found_count: int
    account: str = "default"
    late_s: float = 0.0
    """How late the claim was (the database's now minus next_poll_at)."""
    sent_mono: float = 0.0
    """time.monotonic() when the lease claim was sent (no later than the lease's start)."""
    claimed_mono: float = 0.0
    """time.monotonic() when the claim's rows arrived (about when `late_s` was measured): the
    time a row then waits for a free slot is added to its lateness at the read's start."""
    handle: dict[str, Any] | None = None
    """What the provider's reads of this job need beyond its id (fal's URLs); None: nothing."""
    created_at: datetime | None = None
    """When the row was made (after the create's answer): a learned schedule's age counts
    from it. None: as `polling_since`."""
    model: str | None = None
    duration_key: str | None = None
    """The request's model and duration key (0018): which render times plan its reads."""


@dataclass(frozen=True, slots=True)
class ClaimedResult:
    """A completed job whose result a worker fetches until its lease ends."""

    job_id: str
    token: uuid.UUID
    attempts: int
    account: str = "default"
    handle: dict[str, Any] | None = None
    """As ClaimedJob.handle."""


@dataclass(frozen=True, slots=True)
class ResultOutcome:
    """What to write for one result fetch: fetched, failed, or pending again after delay_s."""

    job_id: str
    token: uuid.UUID
    state: str
    delay_s: float = 0.0
    result: dict[str, Any] | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class ClaimedIntent:
    """A submission intent a submitter owns until its lease ends."""

    key: str
    claim_token: uuid.UUID
    payload: dict[str, Any]
    attempts: int
    consecutive_errors: int
    account: str = "default"
    state: str = QUEUED
    """QUEUED or UNKNOWN (a refused intent whose earlier outcome was unknown)."""
    outcome_unknown: bool = False
    """An earlier attempt's outcome was unknown: a refusal now is no proof nothing was billed."""
    model: str | None = None
    """The model the create runs (`submit --model`), for a provider whose creates name one."""
    unsettled: bool = False
    """A create of it may have reached the provider and was neither answered nor looked up
    since: the previous claim's attempt was never recorded (the process died mid-POST), or it
    is `reconciling`. A provider without an idempotency key then gets a look-up, never a POST."""
    window_from: datetime | None = None
    """When the earliest unsettled create may have been sent (the database's clock)."""
    window_to: datetime | None = None
    """The latest an unsettled create may have been sent (its outcome recorded as unknown,
    or this claim for a dead claim's POST), by the database's clock."""
    last_http_status: int | None = None
    """The status of its last answer (kept while it is looked up): a 409 is a create the
    provider refused as a repeat of one it holds."""


@dataclass(frozen=True, slots=True)
class Intent:
    """One recorded submission, as `vidpoll submit`, the API and `intents show` report it."""

    key: str
    state: str
    payload: dict[str, Any]
    priority: int
    attempts: int
    job_id: str | None
    created_at: datetime
    next_attempt_at: datetime
    submitted_at: datetime | None = None
    last_http_status: int | None = None
    last_error_class: str | None = None
    last_error: str | None = None
    last_request_id: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    account: str = "default"
    unknown_outcome_at: datetime | None = None
    """When an attempt's outcome was first unknown (None: every answer so far was clear)."""
    resolution: str | None = None
    """How an operator settled it: 'job' (billed, job_id) or 'not_billed'; None if not."""
    resolved_at: datetime | None = None
    provider: str | None = None
    """The provider of its account when it was recorded (None: a release before 0014)."""
    model: str | None = None
    """The model its create runs (`submit --model`); None for a provider that takes none."""
    tags: dict[str, str] | None = None
    """`submit --tag name=value`: kept with the intent, its job and its reservation."""
    held_reason: str | None = None
    """Why a `held` intent waits: the cap, what is spent and reserved, when it resumes."""
    held_cap: str | None = None
    past_cap: bool = False
    """An operator sent it past its cap (`intents release`)."""
    estimate: Decimal | None = None
    """What its create was expected to cost when it was sent (None: not sent, or no price)."""
    spend_status: str | None = None
    """Its reservation: reserved, spent or released (None: none)."""


@dataclass(frozen=True, slots=True)
class Held:
    """A claimed intent a cap did not let go (vidpoll.store.spend)."""

    key: str
    claim_token: uuid.UUID
    cap: str
    """cap_per_day, cap_per_month, cap_per_key_prefix:<prefix>, max_creates_per_hour, price."""
    reason: str
    until: datetime
    again: bool = False
    """It was held already (its window turned, or budget freed, and it still does not fit)."""


@dataclass(frozen=True)
class Claim:
    """What one claim of intents took: those to send, and those a cap held (with the 80 %
    warnings this claim was the first of the fleet to reach)."""

    intents: list[ClaimedIntent]
    held: list[Held] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class SubmitOutcome:
    """What to write for one POST attempt; produced by policy, applied by the store.

    `state` is SUBMITTED (with job_id), REJECTED (with error_code/error_message), QUEUED
    (retry the same key after `delay_s`), UNKNOWN (refused, or unanswered again, after an
    earlier unknown outcome: sent again with the same key after `delay_s`), or RECONCILING (a
    provider without an idempotency key: looked up in its records after `delay_s`). With
    `adopted`, a SUBMITTED job was found in the provider's records, not answered to a POST;
    with `settled`, a QUEUED intent's earlier creates were proven absent (its window ends).
    """

    key: str
    claim_token: uuid.UUID
    state: str
    delay_s: float = 0.0
    job_id: str | None = None
    http_status: int | None = None
    error_class: ErrorClass | None = None
    error: str | None = None
    error_code: str | None = None
    error_message: str | None = None
    request_id: str | None = None
    adopted: bool = False
    settled: bool = False
    handle: dict[str, Any] | None = None
    """With SUBMITTED: what the provider's later reads of the job need beyond its id (the
    create's answer, or the provider's records, said it: `Rules.created_handle`)."""


@dataclass(frozen=True, slots=True)
class HttpAnswer:
    """What came back from one HTTP call to the provider, before any interpretation."""

    status: int | None
    body: bytes = b""
    retry_after: str | None = None
    request_id: str | None = None
    transport_error: ErrorClass | None = None
    detail: str = ""
    ratelimit_remaining: str | None = None
    ratelimit_reset: str | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What to write for one claimed job; produced by policy, applied by the store."""

    job_id: str
    claim_token: uuid.UUID
    state: str
    delay_s: float
    read_ok: bool
    http_status: int | None = None
    error_class: ErrorClass | None = None
    error: str | None = None
    provider_status: str | None = None
    body: dict[str, Any] | None = None
    request_id: str | None = None
    account: str = DEFAULT_ACCOUNT
    answered_mono: float = 0.0
    """time.monotonic() when the answer arrived: the store counts the hint, finished_at and
    last_polled_at from then, not from when the write (or, in lock mode, the claim's
    transaction) began. 0: from the write."""
    outcome: str | None = None
    """The neutral outcome of a final state (`succeeded`, `failed`, `canceled`, `expired`,
    `not_found`, `gave_up`: vidpoll.providers.base), None while pending."""
    unknown_word: bool = False
    """A pending answer's word the provider is not known to send while a job runs."""
    inline_result: bool = False
    """The answer (`body`) is the succeeded job's result too: a provider whose results come
    inline (vidpoll.providers.base.ResultSource.INLINE); no result call follows."""
    cost: Decimal | None = None
    """A final outcome's cost in the account's currency (the provider's figure converted;
    None: none known, the store keeps the estimate reserved for the job)."""
    provider_cost: Decimal | None = None
    provider_cost_unit: str | None = None
    """The provider's own figure and unit (`Rules.cost`), recorded as given."""
    poll_reason: str | None = None
    """Why the next read is when it is (a pending outcome): the provider's hint, a learned
    schedule's step, the fixed interval, a backoff. Shown by `jobs show`."""
    overdue_after_s: float | None = None
    """Age (from the row's creation) past which the job is overdue: its group's p99 times
    the account's factor; None: keep what the row has."""
    render_s: float | None = None
    """A final answer's render time by the provider's own clock (`Rules.render_seconds`)."""

    @property
    def is_final(self) -> bool:
        """True when this outcome takes the row out of polling."""
        return self.state != PENDING

    @property
    def succeeded(self) -> bool:
        """True when the render ended with a video (its result is then fetched)."""
        return self.outcome == SUCCEEDED


@dataclass(frozen=True, slots=True)
class Job:
    """A tracked job as the API reports it."""

    job_id: str
    state: str
    provider_status: str | None
    polls: int
    created_at: datetime
    finished_at: datetime | None
    idempotency_key: str | None
    account: str = DEFAULT_ACCOUNT
    result: dict[str, Any] | None = field(default=None, repr=False)
    """The provider's answer to GET .../result once fetched (media URLs, signed: never log them, so
    it is left out of repr())."""
    result_state: str | None = None
    """None (not completed), pending (to fetch), fetched or failed."""
    files: tuple[MediaFile, ...] = ()
    """The media files downloaded for it (workers with --download-dir)."""
    outcome: str | None = None
    """The neutral outcome (`succeeded`, `failed`, ...: vidpoll.providers.base), None while
    pending; `state` keeps the provider's own word."""
    provider: str | None = None
    cost: Decimal | None = None
    """What it cost in its account's currency once ended: the provider's figure converted,
    else the estimate reserved for it; 0 when the provider charged nothing; None: no price."""
    provider_cost: Decimal | None = None
    provider_cost_unit: str | None = None
    """The provider's own figure and unit (kept even when the account prices no such unit)."""
    tags: dict[str, str] | None = None

    @property
    def is_final(self) -> bool:
        """True once the job is no longer polled."""
        return self.state != PENDING

    @property
    def succeeded(self) -> bool:
        """True when the render ended with a video, whatever the provider's word for it."""
        return self.outcome == SUCCEEDED

    @property
    def result_settled(self) -> bool:
        """True once a completed job's result was fetched or given up on (or none is due)."""
        return self.is_final and self.result_state != PENDING


@dataclass(frozen=True, slots=True)
class MediaFile:
    """One downloaded media file: written in full, fsynced, then renamed to `path`."""

    path: str
    size: int
    sha256: str
    url: str
    """Where it came from, without the query string (signed URLs never leave memory)."""


DOWNLOAD = "download"
"""The consumer name of media downloads; hooks are named `hook:<module:function>`."""


@dataclass(frozen=True, slots=True)
class ClaimedDelivery:
    """One delivery (a download or a hook run) leased by a worker."""

    job: Job
    consumer: str
    token: uuid.UUID
    attempts: int
    detail: Any = None
    generation: int = 0
    """Bumped when the job ends again while the delivery runs (see record_delivery)."""


@dataclass(frozen=True, slots=True)
class DeliveryOutcome:
    """What to write for one delivery attempt: done, pending (retry after delay_s) or failed.

    `refresh_result` re-queues the job's result fetch first (a media link expired)."""

    job_id: str
    consumer: str
    token: uuid.UUID
    state: str
    delay_s: float = 0.0
    error: str | None = None
    detail: Any = None
    refresh_result: bool = False
    generation: int = 0


@dataclass(frozen=True, slots=True)
class Notice:
    """One NOTIFY (channel and payload); ("", "") means "now listening"."""

    channel: str
    payload: str


@dataclass(slots=True)
class WorkerStats:
    """Counters a worker keeps about itself, for the demo view and tests."""

    loop_turns: int = 0
    claims: int = 0
    claimed_rows: int = 0
    reads: int = 0
    not_ready: int = 0
    finished: int = 0
    recorded: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    fenced_out: int = 0
    too_late_to_read: int = 0
    """Claimed rows left unread: too little of their lease was left for one read and write."""
    max_late_s: float = 0.0
    """The latest any read started after its row was due (claim lateness + wait for a slot)."""
    db_errors: int = 0
    probes: int = 0
    """Idle checks of what is due next (one statement each) made instead of a claim."""
    notify_wakeups: int = 0
    """Claims made because a NOTIFY woke the loop."""
    empty_notify_wakeups: int = 0
    """Of those, the claims that found nothing (another worker was quicker)."""
    staggered: int = 0
    """NOTIFYs answered after a random delay (a fleet is listening: see Worker._on_notice)."""
    herd_skips: int = 0
    """Staggered NOTIFYs not answered at all: another worker's claim covered them."""
    drained_sent: int = 0
    """Claims after a NOTIFY that took every due row, announced to the fleet."""
    server_pauses: int = 0
    results_fetched: int = 0
    result_retries: int = 0
    deliveries_done: int = 0
    deliveries_failed: int = 0
    delivery_retries: int = 0
    vacuums: int = 0
    vacuums_skipped: int = 0

    def count_error(self, error_class: ErrorClass) -> None:
        """Add one to the counter of this error class."""
        self.errors[error_class.value] = self.errors.get(error_class.value, 0) + 1
