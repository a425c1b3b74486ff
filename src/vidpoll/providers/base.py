"""What every provider implements: the one seam between vidpoll's core and a provider.

The core (worker, submitter, deliveries, store, the generic rules in `policy`) imports this
module and never a provider's own: a provider is found by name (`registry.load`) from an
account's configuration. A provider is one folder, `vidpoll/providers/<name>/`, whose
`__init__.py` defines `PROVIDER`, an object with the attributes of `Provider` below.

What differs between providers, and where it is said:
- creating: `Client.create_video` (request shape, headers) and `Rules.idempotency_header` (whether a
  create may be sent again with the same key; None: it may not, an unknown create is
  reconciled from the provider's own records, never re-sent blindly);
- reading a job: `Client.read_status` (the HTTP) and `Rules.read_status` (what a 2xx body
  says: `Pending` with the provider's hint, `Terminal` with its word and a neutral outcome, or
  `Unreadable`), `Rules.error_code` (the provider's own error envelope: a 4xx without one was
  sent by something else, a wrong URL or a proxy, and pauses the account instead of ending a
  job);
- results: `Rules.result_source` (inline in the status body, or a separate call after success,
  `Client.read_result`, with `Rules.result_not_ready` for the provider's "not yet");
- media: `Client.media_headers` (what a download from the API's own origin must carry);
- webhooks: `Provider.webhooks` (verify a delivery and name its job), None when it has none;
- rate limits: `Rules.rate_limit_headers`; polling: `Rules.min_poll_s`, the default floor;
  `Provider.default_rates`, the fleet-wide budgets an account gets unless it sets its own;
- reconciling: a client that is also a `Reconciler` (`list_created`, with
  `Rules.match_created`) lets an unknown create of a provider without an idempotency key be
  looked up in the provider's own records (adopted, or proven absent and sent again) instead
  of parked for an operator.

Optional members, looked up with getattr (a provider without them loses nothing):
`Client.list_created` and `list_scope` (above, with `Rules.match_created`);
`Rules.model_problem(model) -> str | None` (why `submit --model` cannot name a model of the
provider, checked before the intent is recorded);
`Rules.result_problem(result) -> str | None` (why a succeeded job's media can never be
downloaded, e.g. the provider deleted them: the download fails at once with that reason
instead of retrying); `Rules.created_handle(body, model) -> dict | None` (what a 2xx answer
to a create, with the intent's model, holds beyond the job id that later reads must use, e.g.
fal's status and result URLs, Kling's endpoint: stored with the job (`video_jobs.handle`) and
passed to `Client.read_status` / `read_result` as `handle`);
`Rules.payload_problem(payload, model) -> str | None` (why a request body cannot be sent for
that model: Luma's body naming another model; checked before the intent is recorded);
`Client.find_created(model, key) -> CreatedPage` (the create made with an intent's key, looked
up by the id the provider keeps for it, Kling's `external_task_id`: one entry when found, none
when the provider says there is none; an unknown create is then adopted or sent again with
the same key); `Client.fresh_media(job_id, handle) -> list[str] | HttpAnswer` (a job's media
URLs read again just before a download, signed query strings and all, never stored: Runway's
expire within a day or two and each read of the task signs them anew);
`Webhooks.signed` (False: the provider's deliveries carry no signature, Luma's callbacks;
served without a secret, rate-limited per source, only ever a hint);
`Webhooks.secret_problem(secret) -> str | None` (why a configured
webhook secret cannot be the provider's: `serve` refuses to start, never showing it);
`Webhooks.account_secret(webhook_secret, options) -> str` (what `serve` verifies an account's
deliveries with in place of its webhook secret: fal's JWKS URL, from the account's `jwks_url`);
`Webhooks.refresh_keys(secret, *, refused=False) -> bool` (async, for deliveries checked with
public keys fetched over HTTP, fal's JWKS at the URL `secret`: the route awaits it before
`verify`, and again with `refused=True` after a `signature` refusal, verifying once more when
it answers True; the provider fetches at most once a minute per URL whatever arrives, and a
failed fetch keeps the old keys);
`Provider.account_options` (a mapping of field name -> `AccountOption`: the provider's own
fields in an `[accounts.NAME]` table, handed to `client()` in `ProviderOptions.extra`;
`default_base_url` may name them, `https://{location}-aiplatform.googleapis.com`);
`Rules.cost(body, outcome) -> Cost | None` (what an ended job cost, by the provider's own
figure in its final status answer: Sume's `usage`, Replicate's `metrics.predict_time`,
Runway's `cost` in credits; `Cost(0, ...)` when the provider charges nothing for this end, a
refunded failure; None when the answer says nothing, and the estimate is kept) with
`Provider.cost_units` (a mapping of each unit `cost` may name -> what it is, for the
account's `[accounts.NAME.unit_prices]`: a unit priced there is converted to money, one that
is not is recorded and never mixed into money);
`Rules.duration_key(payload, model) -> str | None` (what of a create request changes how long
its render takes, as a short key that learned poll schedules group renders by: the clip length
and, where the provider has one, the resolution or mode, `5s`, `8s 1080p`, `5s pro`; equal
requests give equal keys (`5`, `"5"`, `"5s"` all `5s`); at most 32 characters, never a prompt
or any value that is not a short scalar; None when the request names none);
`Rules.render_seconds(body) -> float | None` (how long a render took by the provider's own
clock, from a final status answer that carries both a start and an end time: Replicate's
`created_at` to `completed_at`, Kling's `created_at` to `updated_at`; None when it does not,
or when the span is unreadable, negative or above 7 days; pure and cheap, never raises:
`vidpoll.providers.render_time` has the parsing both share);
`Provider.key_setting` (`"api_key_env"` unless the account's credential is something else:
Vertex AI's `"credentials_file"`, a service-account key file whose path is then the
account's `api_key`, read by the client).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from types import TracebackType
from typing import Any, Literal, Protocol

from vidpoll.models import SUCCEEDED as SUCCEEDED
from vidpoll.models import HttpAnswer

NeutralOutcome = Literal["succeeded", "failed", "canceled", "expired"]
"""How a render ended, in every provider's terms: what results, deliveries, hooks, metrics and
the dashboard go by. `state` keeps the provider's own word, lower-cased."""
NEUTRAL_OUTCOMES: tuple[NeutralOutcome, ...] = ("succeeded", "failed", "canceled", "expired")


class ResultSource(enum.StrEnum):
    """Where a succeeded job's result (its media links and metadata) comes from."""

    INLINE = "inline"
    """The status answer that said the job succeeded holds it: no further call."""
    SEPARATE = "separate"
    """A call of its own after success (`Client.read_result`)."""


@dataclass(frozen=True, slots=True)
class Pending:
    """Not finished: read again after the provider's hint (raw, as it came; None: none)."""

    word: str | None
    hint: Any = None
    known: bool = True
    """False for a word the provider is not known to send while a job runs (the worker logs
    each such word once, and keeps polling)."""
    detail: str | None = None
    """What the provider says of the wait beyond its word (fal's queue position: `position
    3`), shown beside the word as the row's `provider_status` (`in_queue (position 3)`)."""


@dataclass(frozen=True, slots=True)
class Terminal:
    """Finished: `word` is the provider's own word (lower-cased, kept as `state`)."""

    word: str
    outcome: NeutralOutcome
    detail: str | None = None
    """Why it ended without a video, in the provider's words (Veo's error or the safety
    filters' reasons, fal's error): kept as the row's `last_error`."""


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A 2xx answer that says nothing usable: an error of the row, retried with backoff."""

    why: str


StatusView = Pending | Terminal | Unreadable

CURRENCY = "currency"
"""The unit of a `Cost` already in money, in the account's own currency (`currency` in the
accounts file); only ever used for an amount of 0 (nothing charged), as a provider's answer
never says which currency an account is billed in."""


@dataclass(frozen=True, slots=True)
class Cost:
    """What a provider says an ended job cost (`Rules.cost`), in its own unit: `credit`
    (Sume, Runway), `predict_second` (Replicate), ... as the provider's `cost_units` name
    them; CURRENCY for money. An amount of 0 means the provider charged nothing (a refunded
    failure): the job's reservation is released."""

    amount: Decimal
    unit: str


class Rules(Protocol):
    """A provider's answers and words. Pure: no I/O, cheap (runs on every read)."""

    @property
    def result_source(self) -> ResultSource: ...
    @property
    def idempotency_header(self) -> str | None:
        """The header that makes a create safe to send again with the same key; None when
        the provider documents none."""
    @property
    def takes_model(self) -> bool:
        """Whether a create names a model (`submit --model`): required when True, refused
        when False (a provider whose request body says everything)."""
    @property
    def min_poll_s(self) -> float:
        """The default floor between two reads of one job."""
    @property
    def rate_limit_headers(self) -> tuple[str, str]:
        """The headers (remaining, reset) the provider sends about its rate limit."""
    @property
    def words(self) -> Mapping[str, NeutralOutcome]:
        """Every terminal word the provider is known to send, and its outcome. `migrate`
        writes them to `vidpoll_outcome_words`, so rows finished by a writer that sets no
        outcome (the seed's own loop, an older worker) get one."""

    def read_status(self, body: dict[str, Any]) -> StatusView:
        """What a 2xx status answer (a JSON object) says."""

    def error_code(self, body: dict[str, Any] | None) -> tuple[str | None, str | None]:
        """(code, message) of the provider's own error envelope; (None, None) when the body
        is not one (then a 4xx came from something else: a wrong URL, a proxy)."""

    def created_job_id(self, body: dict[str, Any] | None) -> str | None:
        """The job id in a 2xx answer to a create; None when it holds none."""

    def result_not_ready(self, answer: HttpAnswer, code: str | None) -> bool:
        """Whether a result call's non-2xx answer means "not yet" (try again later)."""

    def media_urls(self, result: Any) -> list[str]:
        """The media files' URLs in a succeeded job's result, in order, without repeats
        (vidpoll.media.media_urls finds those under `url`-like keys)."""


class Client(Protocol):
    """One account's HTTP to its provider. Every failure comes back as an HttpAnswer, never
    raised; bodies come back scrubbed of the key (and status bodies of signed links)."""

    base_url: str
    key_problem: str | None
    """Why the key cannot be sent (then every call answers so without sending); None."""
    @property
    def rules(self) -> Rules:
        """The provider's rules, which the loops apply to this client's answers."""

    async def __aenter__(self) -> Client: ...
    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None: ...
    async def close(self) -> None: ...

    async def read_status(self, job_id: str,
                          handle: Mapping[str, Any] | None = None) -> HttpAnswer:
        """Read one job. `handle`: what `Rules.created_handle` kept of the create's answer
        (or the provider's records gave on adoption), passed only for a job that has one."""
    async def read_result(self, job_id: str,
                          handle: Mapping[str, Any] | None = None) -> HttpAnswer: ...
    async def create_video(self, payload: dict[str, Any], idempotency_key: str,
                           model: str | None = None) -> HttpAnswer:
        """The paid call (the key goes in `rules.idempotency_header` when there is one;
        `model` as `submit --model` named it, for a provider whose creates name one)."""

    def shown_status_url(self, job_id: str) -> str:
        """A read's URL as logs show it: scheme, host, port and path only."""

    def shown_create_url(self) -> str: ...

    def media_headers(self) -> Mapping[str, str]:
        """Headers a media download from the API's own origin (or a `media_auth_hosts` host)
        must carry (the provider's auth when its file URLs need it); never sent to any other
        host."""

    def media_auth_hosts(self) -> frozenset[str]:
        """Hosts besides the API's origin that get `media_headers`, over https only: the
        provider's own file host (a name matches itself and its subdomains); empty: none."""


@dataclass(frozen=True, slots=True)
class WebhookHint:
    """A verified webhook delivery: which job to read now, and the value it is known by
    (a repeat carries the same one)."""

    job_id: str
    event_id: str
    dedupe: str


class Webhooks(Protocol):
    """A provider's webhook deliveries: only ever a hint to read a job now."""

    def verify(self, headers: Mapping[str, str], body: bytes, secret: str, now_s: float,
               tolerance_s: float) -> WebhookHint:
        """Raise `vidpoll.webhook.WebhookRejected` unless the delivery is provably the
        provider's and recent."""


@dataclass(frozen=True, slots=True)
class CreateLookup:
    """What a provider's own records say about the creates of one input in a time window.

    `matches`: jobs whose recorded model and input are the intent's (the fields it sent, with
    their values); `unsure`: jobs of the same model whose input can no longer be compared
    (removed, or rewritten by the provider): they can be neither adopted nor ruled out.
    `complete`: every record of the window was read (all pages); False with `failure` set when
    a call failed (then nothing is proven either way)."""

    complete: bool
    matches: tuple[str, ...] = ()
    unsure: tuple[str, ...] = ()
    calls: int = 0
    """List requests sent by the walk that served this lookup (shared with others)."""
    failure: HttpAnswer | None = None
    detail: str = ""
    """Why the lookup is incomplete, for the intent's last_error (no secret, no query)."""
    handles: Mapping[str, dict[str, Any]] = field(default_factory=dict)
    """By job id: what later reads of a matched job need beyond its id (its handle)."""
    proves_absence: bool = True
    """A complete walk with no match proves no create was made only if the records list
    every create sent by then (`CreatedPage.listed_through`); False: not yet."""


@dataclass(frozen=True, slots=True)
class Created:
    """One create in the provider's records, as a page of them lists it."""

    job_id: str | None
    """None: listed without a usable id (a record of the intent's input then leaves the
    look-up unproven)."""
    entry: Any
    """The record as the provider wrote it, for `Rules.match_created`."""
    created_at: datetime | None = None
    """When the provider recorded it (None: unknown: it counts as inside every window)."""
    handle: dict[str, Any] | None = None
    """What later reads of the job need beyond its id, if it is adopted (`created_handle`)."""


@dataclass(frozen=True, slots=True)
class CreatedPage:
    """One page of the provider's records of creates, or why it could not be read.

    A failed page (`failure` set, or `detail` without `failure`: an answer that is not a page)
    is tried again in place by the core (`vidpoll.reconcile`): a 429 after its wait, a 5xx, a
    dropped connection or a garbled page a few times quickly; `final` says no retry can help
    (a next page on another origin, too many pages)."""

    entries: tuple[Created, ...] = ()
    next_cursor: str | None = None
    """What reads the next page (opaque to the core); None: this was the last."""
    failure: HttpAnswer | None = None
    detail: str = ""
    """Why the page could not be read, for the intent's last_error (no secret, no query)."""
    final: bool = False
    calls: int = 1
    """Requests the page cost: 0 when nothing was sent (a key no header can carry)."""
    listed_through: datetime | None = None
    """None: every create is listed as soon as it is made (Replicate). Else the records are
    known complete only for creates made before this time: fal lists a request once it has
    started, and its queue starts requests in order, so the newest started request listed
    proves every earlier one listed; absence is proven only for an intent whose creates were
    all sent before it."""


class Reconciler(Protocol):
    """A client that can list the creates the provider recorded for the account, page by page;
    `Rules.match_created(entry, payload, model) -> "same" | "unsure" | "other"` compares each
    with an intent. The core (`vidpoll.reconcile`) walks the pages once for every unknown
    create of one scope that is due, retrying a failed page in place and resuming from it."""

    def list_scope(self, model: str | None) -> str:
        """Which intents one listing serves: those whose model gives the same scope ("" for a
        provider whose list holds every model's creates; fal's is per endpoint)."""

    async def list_created(self, model: str | None, since: datetime, until: datetime,
                           cursor: str | None) -> CreatedPage:
        """One page of the creates recorded between `since` and `until` (the provider's
        clock) for `model`'s scope: the first page when `cursor` is None, else the page it
        names. Never raises for an HTTP failure (`CreatedPage(failure=answer)`)."""


@dataclass(frozen=True, slots=True)
class ProviderOptions:
    """What an account may say to its provider beyond the URL and the key (the accounts
    file); a provider ignores what it has no use for."""

    webhook_url: str | None = None
    """Where the provider should call when a job ends (creates ask for it)."""
    extra: Mapping[str, str] = field(default_factory=dict)
    """The provider's own account fields (`Provider.account_options`), checked, with their
    defaults filled in (a `secret_env` field: the variable's name)."""
    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    """By `secret_env` field (Kling's `secret_key_env`): the value of the variable it names,
    empty when unset. Redacted from logs like the key."""


@dataclass(frozen=True, slots=True)
class AccountOption:
    """A field an account of one provider may set in the accounts file besides the common
    ones (`platform_url` for fal, `project` for Vertex AI): checked when the file is read."""

    kind: Literal["url", "text", "path", "seconds", "secret_env"]
    """`url`: checked as a base URL is (https, or http to loopback); `text`: a short
    printable word (no `/`, no spaces); `path`: a file that must exist and be readable;
    `seconds`: a number from 1 to 86400, kept as its text (`"600"`); `secret_env`: the name
    of an environment variable holding a second secret (Kling's secret key), whose value the
    client gets in `ProviderOptions.secrets`."""
    default: str | None = None
    """None: required (an account without it is refused, naming the field); "": optional,
    absent unless set."""
    example: str = ""


class Provider(Protocol):
    """A provider, as an account names it (`provider = "<name>"`)."""

    @property
    def name(self) -> str: ...
    @property
    def title(self) -> str:
        """The name as people write it, for messages ("Sume")."""
    @property
    def default_base_url(self) -> str: ...
    @property
    def env_prefix(self) -> str:
        """The prefix of the settings that work without a config file: `<PREFIX>_API_KEY`,
        `<PREFIX>_BASE_URL`, `<PREFIX>_API_KEY_<ACCOUNT>`, `<PREFIX>_WEBHOOK_SECRET`."""
    @property
    def rules(self) -> Rules: ...
    @property
    def webhooks(self) -> Webhooks | None: ...
    @property
    def default_rates(self) -> tuple[float | None, float | None]:
        """(status reads, creates) a minute an account is paced at, fleet-wide, unless it
        sets its own (`status_rate_per_min`, `submit_rate_per_min`): the provider's published
        limits; None: unlimited."""

    def client(self, base_url: str, api_key: str, *, timeout_s: float,
               max_connections: int, options: ProviderOptions = ...) -> Client:
        """A client for one account (entered with `async with`)."""
