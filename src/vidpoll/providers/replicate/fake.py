"""A stand-in for Replicate's HTTP API (api.replicate.com), served by aiohttp on loopback.

It is written from Replicate's documentation, not from vidpoll's client, so that the client is
tested against Replicate's behaviour rather than against its own expectations. Tags below:
[D] documented, [O] observed in public transcripts, [A] an assumption of this fake.

Sources
- REF: the HTTP API reference, as generated into replicate/replicate-python-beta 48e138a
  (2025-12-18): `resources/predictions.py` (create, get, list, cancel),
  `resources/models/predictions.py`, `types/prediction.py`,
  `types/prediction_create_params.py`, `types/prediction_list_params.py`,
  `resources/webhooks/default/secret.py`.
- RATE: replicate.com/docs/topics/predictions/rate-limits.
- RETAIN: replicate.com/docs/topics/predictions/data-retention.
- DEADLINE: replicate.com/changelog/2025-10-16-prediction-deadlines.
- HOOKS: replicate.com/docs/topics/webhooks/{setup-webhook,receive-webhook,verify-webhook} and
  replicate.com/changelog/2023-02-10-improved-webhook-events-and-event-filtering.
- ERR: the v1 SDK (replicate-python 0110c2c, `exceptions.py`) reads errors as RFC 7807
  problem details; a maintainer's curl transcripts are in replicate/replicate-python#47.

Behaviour and its basis
- Auth `Authorization: Bearer <token>` [D REF]; the legacy `Token <token>` scheme [D older
  reference examples]. No header: 401 `{"title": "Unauthenticated", "detail": "You did not
  pass an authentication token", "status": 401}` [O #47]; a wrong token: the same with "a valid
  authentication token" [O: third-party logs and SDK tests].
- `POST /v1/predictions` takes `version` as a 64-hex id, `owner/name:id` or `owner/name` (the
  latest version) [D REF]; 201 with the prediction [D REF examples check for 201]. Unknown
  version: 422 "Invalid version or not permitted" [O #47]. A missing `version` or a missing or
  non-object `input`: 422 "Input validation failed" with `invalid_fields` [O third-party logs].
  `POST /v1/models/{owner}/{name}/predictions` runs the latest version [D REF]; an unknown
  model answers 404 `{"detail": "Not found."}` [A, Django REST Framework's default, which
  matches Replicate's list and 429 bodies]. An unreadable body: 400 [A].
- Prediction fields `id, model, version, input, logs, output, data_removed, error, status,
  source, created_at, started_at, completed_at, urls{get, cancel, web}, metrics` [D REF];
  `deadline` when a deadline was set [D types/prediction.py]; ids are 26 lower-case
  characters [O REF examples; the alphabet is an assumption]; `metrics.predict_time` and
  `total_time` once ended [D REF], `predict_time` only for a prediction that started (the
  time it ran, what is billed; an aborted one is not charged [D lifecycle docs]);
  `ledger()` sums the predict times reported; `urls.stream` is omitted (the model does not
  stream).
  Timestamps and URLs use this fake's origin instead of api.replicate.com.
- Statuses starting, processing, succeeded, failed, canceled [D REF] and aborted [D DEADLINE].
  Life: starting for `starting_s`, processing for `processing_s` (+ seeded jitter), then an
  outcome drawn from `outcome_mix` [A: the timings; a drawn `aborted` ends, unstarted, when
  the start would have come]. Everything is computed from elapsed time when read.
  `render_times` (none by default) gives a model its own render times instead: each of its
  predictions draws its whole time from the create to the end (`created_at` to
  `completed_at`) from a log-normal `RenderTimes(median_s, sigma)`, on a generator of its own
  (seeded), starting for `starting_s` of it at most [A: for benchmarks of poll schedules].
  Every prediction counts the status reads answered for it (`reads`; `render_log()` lists
  them with each end time) [A: introspection only].
- `Cancel-After` header: aborted if the deadline passes before the start, canceled if after
  [D DEADLINE]. Its format beyond the documented `1m`: Go-style durations (`500ms`, `30s`,
  `1h30m`) or bare seconds [A]; an unreadable value answers 400 [A]. `Prefer: wait` is not
  modelled: every create answers at once, as if the wait ran out [D REF: "returned in a
  starting state"].
- `POST /v1/predictions/{id}/cancel`: the prediction, canceled if it had not ended [D REF].
  `GET /v1/predictions/{id}` of an unknown id: 404 `{"detail": "Not found."}` [A as above].
- `GET /v1/predictions`: newest first, `{"previous", "next", "results"}`, 100 per page,
  `created_after` (inclusive) and `created_before` (exclusive) in ISO 8601 [D REF]; `next` and
  `previous` are absolute URLs with a `cursor` parameter [D: the SDK follows `next` as a URL];
  the cursor is keyset-based, so new predictions do not shift pages [A]; a bad cursor answers
  404 `{"detail": "Invalid cursor"}` and a bad date 400 [A, DRF's CursorPagination].
- Output files are URLs that need the Authorization header [D REF], on `files_base_url` or the
  fake's own origin, `GET`/`HEAD` with `Range` [A: a CDN's usual behaviour]. File reads are not
  rate limited (another host in reality).
- Data removal: `data_retention_s` (default 1 h) after a prediction ends, input, output and
  logs are removed [D RETAIN]; `output` stays as `null` [D REF], `data_removed` is true [D
  REF]; `input` becomes `{}`, `logs` `""`, `error` stays, the files answer 404 [A].
- Rate limits: 600 creates/min and 3000 other requests/min, "short bursts" allowed [D RATE],
  as token buckets whose burst size is an assumption (10 s worth). 429 body
  `{"detail": "Request was throttled. Your rate limit resets in ~Ns."}` [D RATE]. A
  `Retry-After` header is NOT documented (the v1 SDK only honours one if present): sent in
  whole seconds while `send_retry_after` is true (the default) [A].
- Webhooks: the prediction object as body [D HOOKS]; events `start` (at creation), `logs` (at
  the start of processing), `output` (at success), `completed` (at any terminal status),
  each sent only if in `webhook_events_filter` [D HOOKS: the newer pages say `start` and
  `completed` are "always sent regardless of throttling" when requested; the timing of each
  event is an assumption]. Without a filter the docs disagree (REF: new outputs and
  completion; receive-webhook: creation, logs, output, completion); this fake then sends
  `default_webhook_events` (all four) [A]. Retried "a few times" on network problems [D REF]
  (here also on any non-2xx [A]) with the same `webhook-id` [D HOOKS]; redirects are not
  followed [D REF]. Standard Webhooks signature `v1,<base64 HMAC-SHA256("id.ts.body")>`
  keyed with the base64-decoded secret after `whsec_`, several signatures space-separated
  [D HOOKS]; rotation (`webhook_old_secret`) signs with both [A]. `GET
  /v1/webhooks/default/secret` answers `{"key": secret}` [D REF].
- Faults (none by default), per create: `lose_reply` (created and billed, then the connection
  drops), `5xx_after` (created, then 500/502/503/504), `5xx_before` (500/503, nothing
  created), `hang` (created at once, answer held `hang_s`), `hang_then_create` (held `hang_s`,
  created only then, even if the client has gone: `hang_s` bounds the server-side work), `429`
  (nothing created). Lists: `5xx`, `429`, `garbled` (a 200 cut off mid-body), by script or
  by rate (`list_5xx`, `list_429`, `list_garbled`); status reads: 5xx. Gateway 502/503/504
  answers are HTML, as a load balancer's would be [A]. A create is recorded before any await
  that a client disconnect could cancel, or in a shielded task, so a dropped request bills what
  its fault says.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import functools
import hashlib
import hmac
import json
import logging
import math
import random
import re
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import urlencode

import aiohttp
from aiohttp import web

log = logging.getLogger(__name__)

TERMINAL = frozenset({"succeeded", "failed", "canceled", "aborted"})
OUTCOMES = ("succeeded", "failed", "canceled", "aborted")
CREATE_FAULTS = ("lose_reply", "5xx_after", "5xx_before", "hang", "hang_then_create", "429")
LIST_FAULTS = ("5xx", "429", "garbled")
WEBHOOK_EVENTS = ("start", "output", "logs", "completed")
OUTPUT_FILES: dict[str, tuple[str, ...]] = {
    "url": ("output.mp4",),
    "list": ("output_0.mp4", "output_1.mp4"),
    "object": ("output.mp4", "thumbnail.jpg"),
}
"""The files a succeeded prediction has, by `output_shape` (see FakeReplicate._output)."""
DEFAULT_MODEL = "acme/video-gen"
DEFAULT_VERSIONS = [hashlib.sha256(f"{DEFAULT_MODEL}:{n}".encode()).hexdigest() for n in (1, 2)]
DEFAULT_TOKEN = "r8_fake_replicate_test_token"
DEFAULT_WEBHOOK_SECRET = "whsec_" + base64.b64encode(b"vidpoll-fake-replicate-signing!!").decode()
ID_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
NOT_FOUND = {"detail": "Not found."}
BAD_VERSION = ("Invalid version or not permitted",
               "The specified version does not exist (or perhaps you don't have permission "
               "to use it?)")
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class RenderTimes:
    """A model's render times, create to end: log-normal with this median and `sigma` (the
    standard deviation of the log), never below `min_s`."""

    median_s: float
    sigma: float = 0.0
    min_s: float = 0.0

    def draw(self, rng: random.Random) -> float:
        """One render time, seconds."""
        return max(self.min_s, self.median_s * math.exp(rng.gauss(0.0, self.sigma)))


@dataclass
class ReplicateFakeConfig:
    """How the fake behaves; mutable while it runs (rates are read on every request)."""

    api_token: str = DEFAULT_TOKEN
    extra_tokens: list[str] = field(default_factory=list)
    models: dict[str, list[str]] = field(
        default_factory=lambda: {DEFAULT_MODEL: list(DEFAULT_VERSIONS)})
    """Model "owner/name" -> its version ids, oldest first (the last is the latest)."""
    starting_s: float = 0.2
    processing_s: float = 1.0
    processing_jitter_s: float = 0.0
    """Each prediction's processing time is processing_s + uniform(0, jitter) (seeded)."""
    render_times: dict[str, RenderTimes] = field(default_factory=dict)
    """Model "owner/name" -> its render times (create to end), drawn per prediction; a model
    not named here: starting_s + processing_s (+ jitter). Read at each create."""
    outcome_mix: dict[str, float] = field(default_factory=lambda: {"succeeded": 1.0})
    """Weights of the final statuses (OUTCOMES), drawn per prediction (seeded)."""
    error_text: str = "Prediction failed: CUDA out of memory"
    output_shape: str = "url"
    """A succeeded prediction's output: "url" (one URL), "list" (URLs) or "object"
    ({"video": url, "thumbnail": url})."""
    files_base_url: str | None = None
    """Origin of the output files (served by this same app); None: the API's origin."""
    file_bytes: int = 64 * 1024
    data_retention_s: float = 3600.0
    list_page_size: int = 100
    create_rate_per_min: float = 600.0
    create_burst: float = 100.0
    other_rate_per_min: float = 3000.0
    other_burst: float = 500.0
    send_retry_after: bool = True
    latency_s: float = 0.0
    create_fault_rates: dict[str, float] = field(default_factory=dict)
    """Probability of each CREATE_FAULTS entry per create (after the script is used up)."""
    hang_s: float = 30.0
    """How long `hang` holds its answer and `hang_then_create` works before it creates: the
    fake's bound on server-side processing (a shutdown before then drops that create)."""
    list_5xx: float = 0.0
    list_429: float = 0.0
    """Probability a list read answers 429 (Retry-After 1), as a busy account's does."""
    list_garbled: float = 0.0
    """Probability a list read answers 200 with a body cut off mid-JSON [A]."""
    status_5xx: float = 0.0
    webhook_secret: str = DEFAULT_WEBHOOK_SECRET
    webhook_old_secret: str | None = None
    """During a rotation: also sign with this secret (two signatures in the header)."""
    webhook_retry_delays_s: tuple[float, ...] = (0.1, 0.5, 2.0)
    """Pauses before each retry of a webhook that got no 2xx (so 1 + len attempts)."""
    webhook_timeout_s: float = 5.0
    default_webhook_events: tuple[str, ...] = WEBHOOK_EVENTS
    seed: int | None = 0


@dataclass
class FakePrediction:
    """One prediction: what was asked, and when and how it ends."""

    id: str
    seq: int
    model: str
    version: str
    input: dict[str, Any]
    created_us: int
    origin: str
    files_base: str
    output_shape: str
    starting_s: float
    processing_s: float
    outcome: str
    deadline: float | None = None
    webhook: str | None = None
    webhook_events: frozenset[str] = frozenset()
    canceled_at: float | None = None
    reads: int = 0
    """Status reads answered for it (GET /v1/predictions/{id}, 200)."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def created(self) -> float:
        """Creation time, unix seconds."""
        return self.created_us / 1e6

    def ending(self) -> tuple[float, str, float | None]:
        """(when it ends, its final status, when it started or None if it never did)."""
        start = self.created + self.starting_s
        ends = [(start, "aborted") if self.outcome == "aborted"
                else (start + self.processing_s, self.outcome)]
        if self.deadline is not None:
            ends.append((self.deadline, "aborted" if self.deadline <= start else "canceled"))
        if self.canceled_at is not None:
            ends.append((self.canceled_at, "canceled"))
        end, status = min(ends, key=lambda e: e[0])
        started = start if status != "aborted" and end >= start else None
        return end, status, started

    def status_at(self, now: float) -> str:
        """The status a read at `now` sees."""
        end, final, _ = self.ending()
        if now >= end:
            return final
        return "processing" if now >= self.created + self.starting_s else "starting"


@dataclass
class WebhookDelivery:
    """One attempt to deliver a webhook (the fake keeps them all for tests)."""

    prediction_id: str
    event: str
    webhook_id: str
    attempt: int
    status: int | None
    error: str | None = None


class _Bucket:
    """A token bucket: `rate_per_min` refill, `burst` capacity, starting full."""

    def __init__(self) -> None:
        self.tokens: float | None = None
        self.at = time.monotonic()

    def take(self, rate_per_min: float, burst: float) -> float:
        """Take a token; 0 if there was one, else the seconds until there is."""
        now = time.monotonic()
        rate = rate_per_min / 60.0
        if self.tokens is None:
            self.tokens = burst
        self.tokens = min(burst, self.tokens + (now - self.at) * rate)
        self.at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / rate if rate > 0 else 60.0


def iso(t: float) -> str:
    """Unix seconds as Replicate writes times: ISO 8601, microseconds, Z."""
    return (EPOCH + timedelta(microseconds=round(t * 1e6))).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso_us(text: str) -> int:
    """An ISO 8601 time (naive means UTC) as unix microseconds; ValueError if unreadable."""
    moment = datetime.fromisoformat(text)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - EPOCH) // timedelta(microseconds=1)


def parse_duration_s(text: str) -> float:
    """A Cancel-After value (`30s`, `1m`, `1h30m`, `500ms`, or bare seconds) in seconds."""
    text = text.strip()
    with contextlib.suppress(ValueError):
        return float(text)
    if not text or _DURATION.sub("", text):
        raise ValueError(f"not a duration: {text!r}")
    return sum(float(n) * _UNIT_S[unit] for n, unit in _DURATION.findall(text))


def sign(secret: str, msg_id: str, timestamp: str, body: bytes) -> str:
    """One Standard Webhooks signature, `v1,<base64 HMAC-SHA256 of "id.ts.body">`."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def canonical(value: Any) -> str:
    """JSON with sorted keys and no spaces: equal inputs give equal strings."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def problem(status: int, title: str, detail: str, **extra: Any) -> web.Response:
    """An RFC 7807 problem-details answer, as Replicate's API gives."""
    return web.json_response({"title": title, "detail": detail, "status": status, **extra},
                             status=status)


def input_invalid(field_name: str, kind: str, description: str) -> web.Response:
    """422 "Input validation failed" with one invalid field."""
    prefix = f"{field_name}: " if field_name else ""
    return problem(422, "Input validation failed", f"- {prefix}{description}\n",
                   invalid_fields=[{"type": kind, "field": field_name,
                                    "description": description}])


def server_error(status: int) -> web.Response:
    """A 5xx: JSON from the API itself (500), an HTML page from the gateway (502/503/504)."""
    if status == 500:
        return problem(500, "Internal Server Error", "An unexpected error occurred.")
    reason = {502: "Bad Gateway", 503: "Service Unavailable", 504: "Gateway Timeout"}[status]
    return web.Response(status=status, content_type="text/html",
                        text=f"<html><body><h1>{status} {reason}</h1></body></html>")


class FakeReplicate:
    """The fake's state and handlers; serve it with start_fake_replicate()."""

    def __init__(self, config: ReplicateFakeConfig | None = None, *,
                 models: dict[str, list[str]] | None = None) -> None:
        self.config = config or ReplicateFakeConfig()
        if models is not None:
            self.config.models = {name: list(versions) for name, versions in models.items()}
        self.rng = random.Random(self.config.seed)
        # render times draw from their own generator: the seeded sequence of ids and
        # outcomes stays as it was when they are not used
        self._render_rng = random.Random(self.config.seed)
        self.predictions: dict[str, FakePrediction] = {}
        self.webhook_deliveries: list[WebhookDelivery] = []
        self._billed: Counter[tuple[str, str, str]] = Counter()
        self._stats: Counter[str] = Counter()
        self._create_script: deque[str] = deque()
        self._list_script: deque[str] = deque()
        self._buckets = {"create": _Bucket(), "other": _Bucket()}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._files: dict[tuple[str, str, int], bytes] = {}

    # ---- introspection and scripting (no HTTP) ----

    def created_inputs(self) -> Counter[tuple[str, str, str]]:
        """(model, version, canonical JSON of input) -> predictions created (billed)."""
        return Counter(self._billed)

    def ledger(self) -> dict[str, Any]:
        """The predict time the answers report now for ended predictions: `predict_seconds`
        in all (a Decimal, summed from the figures as written), by prediction id (`jobs`),
        and the ids of ended predictions that report none (`unbilled`: aborted, or canceled
        before they started)."""
        now = time.time()
        jobs: dict[str, Decimal] = {}
        unbilled: list[str] = []
        for p in self.predictions.values():
            if now < p.ending()[0]:
                continue
            seconds = self._predict_time(p, now)
            if seconds is None:
                unbilled.append(p.id)
            else:
                jobs[p.id] = Decimal(str(seconds))
        return {"predict_seconds": sum(jobs.values(), Decimal(0)), "jobs": jobs,
                "unbilled": unbilled}

    def stats(self) -> dict[str, int]:
        """Calls by kind: creates, create_requests, lists, list_pages, status_reads,
        cancels, file_reads, throttled, webhooks_sent, webhook_attempts, fault_<name>..."""
        keys = ("creates", "create_requests", "lists", "list_pages", "status_reads",
                "cancels", "file_reads", "throttled", "unauthorized", "webhooks_sent",
                "webhook_attempts", "webhooks_failed")
        return {**dict.fromkeys(keys, 0), **self._stats}

    def script_creates(self, steps: Iterable[str]) -> None:
        """Queue what the next creates do: "ok" or one of CREATE_FAULTS, in order."""
        steps = list(steps)
        unknown = set(steps) - {"ok", *CREATE_FAULTS}
        if unknown:
            raise ValueError(f"unknown create steps: {sorted(unknown)}")
        self._create_script.extend(steps)

    def script_lists(self, steps: Iterable[str]) -> None:
        """Queue what the next list pages do: "ok", "5xx" or "429", in order."""
        steps = list(steps)
        unknown = set(steps) - {"ok", *LIST_FAULTS}
        if unknown:
            raise ValueError(f"unknown list steps: {sorted(unknown)}")
        self._list_script.extend(steps)

    def add_model(self, name: str, versions: list[str]) -> None:
        """Make model "owner/name" known, with its versions (the last is the latest)."""
        self.config.models[name] = list(versions)

    def render_log(self) -> list[dict[str, Any]]:
        """Every prediction: `id`, `model`, `created` and `ended` (unix seconds; `ended` is
        when it ends or will, its `completed_at`), `status` (its final one) and `reads` (the
        status reads answered for it so far), in creation order."""
        out = []
        for p in sorted(self.predictions.values(), key=lambda q: q.seq):
            end, final, _ = p.ending()
            out.append({"id": p.id, "model": p.model, "created": p.created, "ended": end,
                        "status": final, "reads": p.reads})
        return out

    def view(self, prediction_id: str) -> dict[str, Any]:
        """What a GET of this prediction would answer now."""
        return self._body(self.predictions[prediction_id], time.time())

    def expected_file(self, prediction_id: str, name: str) -> bytes:
        """The bytes the fake serves for this output file (deterministic per id and name)."""
        size = self.config.file_bytes
        key = (prediction_id, name, size)
        if key not in self._files:
            seed = f"{prediction_id}/{name}".encode()
            blocks = (hashlib.sha256(seed + i.to_bytes(4, "big")).digest()
                      for i in range(math.ceil(size / 32)))
            self._files[key] = b"".join(blocks)[:size]
        return self._files[key]

    def app(self) -> web.Application:
        """The aiohttp application (routes of the API and of the file host)."""
        app = web.Application()
        app.router.add_post("/v1/predictions", self.create_prediction)
        app.router.add_get("/v1/predictions", self.list_predictions)
        app.router.add_get("/v1/predictions/{id}", self.get_prediction)
        app.router.add_post("/v1/predictions/{id}/cancel", self.cancel_prediction)
        app.router.add_post("/v1/models/{owner}/{name}/predictions", self.create_model_prediction)
        app.router.add_get("/v1/webhooks/default/secret", self.get_webhook_secret)
        app.router.add_get("/files/{id}/{name}", self.serve_file)
        app.on_cleanup.append(self._cleanup)
        return app

    async def close(self) -> None:
        """Cancel webhook and pending-create tasks; close the webhook client."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _cleanup(self, _app: web.Application) -> None:
        await self.close()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ---- shared request handling ----

    def _authorized(self, request: web.Request) -> web.Response | None:
        """None if the request carries a known token, else Replicate's 401."""
        header = request.headers.get("Authorization", "").strip()
        if not header:
            self._stats["unauthorized"] += 1
            return problem(401, "Unauthenticated", "You did not pass an authentication token")
        scheme, _, token = header.partition(" ")
        tokens = {self.config.api_token, *self.config.extra_tokens}
        if scheme.lower() not in ("bearer", "token") or token.strip() not in tokens:
            self._stats["unauthorized"] += 1
            return problem(401, "Unauthenticated",
                           "You did not pass a valid authentication token")
        return None

    def _throttled(self, wait_s: float) -> web.Response:
        """Replicate's 429 (RATE), N the whole seconds until a token."""
        self._stats["throttled"] += 1
        n = max(1, math.ceil(wait_s))
        headers = {"Retry-After": str(n)} if self.config.send_retry_after else None
        return web.json_response(
            {"detail": f"Request was throttled. Your rate limit resets in ~{n}s."},
            status=429, headers=headers)

    async def _enter(self, request: web.Request, bucket: str) -> web.Response | None:
        """Latency, then auth, then the rate limit; an answer to give at once, or None."""
        if self.config.latency_s > 0:
            await asyncio.sleep(self.config.latency_s)
        denied = self._authorized(request)
        if denied is not None:
            return denied
        cfg = self.config
        rate, burst = ((cfg.create_rate_per_min, cfg.create_burst) if bucket == "create"
                       else (cfg.other_rate_per_min, cfg.other_burst))
        wait_s = self._buckets[bucket].take(rate, burst)
        return self._throttled(wait_s) if wait_s > 0 else None

    @staticmethod
    def _origin(request: web.Request) -> str:
        return f"{request.scheme}://{request.host}"

    def _chance(self, p: float) -> bool:
        return p > 0 and self.rng.random() < p

    # ---- the prediction object ----

    def _output(self, p: FakePrediction) -> Any:
        urls = [f"{p.files_base}/files/{p.id}/{name}" for name in OUTPUT_FILES[p.output_shape]]
        if p.output_shape == "url":
            return urls[0]
        if p.output_shape == "object":
            return {"video": urls[0], "thumbnail": urls[1]}
        return urls

    def _body(self, p: FakePrediction, now: float) -> dict[str, Any]:
        """The prediction object as a read at `now` sees it."""
        end, final, started = p.ending()
        ended = now >= end
        status = p.status_at(now)
        removed = ended and now >= end + self.config.data_retention_s
        running = started is not None and now >= started
        logs = "Running prediction...\n" if running else ""
        if ended and final == "succeeded":
            logs += "Done.\n"
        base = f"{p.origin}/v1/predictions/{p.id}"
        body: dict[str, Any] = {
            "id": p.id,
            "model": p.model,
            "version": p.version,
            "input": {} if removed else p.input,
            "logs": "" if removed else logs,
            "output": self._output(p) if ended and final == "succeeded" and not removed
            else None,
            "data_removed": removed,
            "error": self.config.error_text if ended and final == "failed" else None,
            "status": status,
            "source": "api",
            "created_at": iso(p.created),
            "started_at": iso(started) if started is not None and running else None,
            "completed_at": iso(end) if ended else None,
            "urls": {"get": base, "cancel": f"{base}/cancel",
                     "web": f"https://replicate.com/p/{p.id}"},
            "metrics": {},
        }
        if p.deadline is not None:
            body["deadline"] = iso(p.deadline)
        if ended:
            body["metrics"] = {"total_time": round(end - p.created, 6)}
            seconds = self._predict_time(p, now)
            if seconds is not None:
                body["metrics"]["predict_time"] = seconds
        return body

    @staticmethod
    def _predict_time(p: FakePrediction, now: float) -> float | None:
        """The seconds an ended prediction ran (`metrics.predict_time`), as its answers write
        them; None while it runs, and for one that never started (aborted, or canceled
        before its start): nothing to bill."""
        end, _, started = p.ending()
        if now < end or started is None:
            return None
        return round(end - started, 6)

    def _new_id(self) -> str:
        while True:
            pid = "".join(self.rng.choice(ID_ALPHABET) for _ in range(26))
            if pid not in self.predictions:
                return pid

    def _record(self, *, model: str, version: str, input_: dict[str, Any], origin: str,
                deadline_s: float | None, webhook: str | None,
                events: frozenset[str]) -> FakePrediction:
        """Create (and bill) a prediction now. Synchronous on purpose: nothing can cancel it."""
        cfg = self.config
        now = time.time()
        weights = [max(0.0, cfg.outcome_mix.get(o, 0.0)) for o in OUTCOMES]
        outcome = self.rng.choices(OUTCOMES, weights)[0] if sum(weights) > 0 else "succeeded"
        times = cfg.render_times.get(model)
        if times is not None:
            total = times.draw(self._render_rng)
            starting = min(cfg.starting_s, total)
            processing = total - starting
        else:
            jitter = (self.rng.uniform(0, cfg.processing_jitter_s) if cfg.processing_jitter_s
                      else 0)
            starting, processing = cfg.starting_s, cfg.processing_s + jitter
        p = FakePrediction(
            id=self._new_id(), seq=len(self.predictions), model=model, version=version,
            input=input_, created_us=round(now * 1e6), origin=origin,
            files_base=(cfg.files_base_url or origin).rstrip("/"),
            output_shape=cfg.output_shape if cfg.output_shape in OUTPUT_FILES else "url",
            starting_s=starting, processing_s=processing,
            outcome=outcome, deadline=None if deadline_s is None else now + deadline_s,
            webhook=webhook, webhook_events=events)
        self.predictions[p.id] = p
        self._billed[(model, version, canonical(input_))] += 1
        self._stats["creates"] += 1
        if webhook:
            self._spawn(self._webhooks(p))
        return p

    # ---- creates ----

    async def create_prediction(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/predictions."""
        return await self._create(request, None)

    async def create_model_prediction(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/models/{owner}/{name}/predictions: the model's latest version."""
        return await self._create(
            request, f"{request.match_info['owner']}/{request.match_info['name']}")

    def _resolve(self, ref: Any) -> tuple[str, str] | None:
        """(model, version) for a `version` field: id, owner/name:id, or owner/name."""
        if not isinstance(ref, str):
            return None
        name, _, version = ref.partition(":")
        if "/" in name:
            versions = self.config.models.get(name, [])
            if not version:
                return (name, versions[-1]) if versions else None
            return (name, version) if version in versions else None
        for model, versions in self.config.models.items():
            if ref in versions:
                return model, ref
        return None

    def _next_create_fault(self) -> str | None:
        if self._create_script:
            step = self._create_script.popleft()
            return None if step == "ok" else step
        draw, edge = self.rng.random(), 0.0
        for fault in CREATE_FAULTS:
            edge += self.config.create_fault_rates.get(fault, 0.0)
            if draw < edge:
                return fault
        return None

    async def _create(self, request: web.Request, model_path: str | None) -> web.StreamResponse:
        self._stats["create_requests"] += 1
        early = await self._enter(request, "create")
        if early is not None:
            return early
        try:
            payload = await request.json()
        except ValueError:
            return problem(400, "Bad request", "The request body is not valid JSON")
        if not isinstance(payload, dict):
            return input_invalid("", "invalid_type",
                                 "Invalid type. Expected: object, given: "
                                 f"{type(payload).__name__}")
        if model_path is not None:
            versions = self.config.models.get(model_path)
            if not versions:
                return web.json_response(NOT_FOUND, status=404)
            model, version = model_path, versions[-1]
        else:
            if "version" not in payload:
                return input_invalid("", "required", "version is required")
            resolved = self._resolve(payload["version"])
            if resolved is None:
                return problem(422, *BAD_VERSION)
            model, version = resolved
        if "input" not in payload:
            return input_invalid("", "required", "input is required")
        input_ = payload["input"]
        if not isinstance(input_, dict):
            return input_invalid("input", "invalid_type",
                                 "Invalid type. Expected: object, given: "
                                 f"{type(input_).__name__}")
        webhook = payload.get("webhook")
        if webhook is not None and not (isinstance(webhook, str)
                                        and webhook.startswith(("http://", "https://"))):
            return input_invalid("webhook", "format", "Does not match format 'uri'")
        events = payload.get("webhook_events_filter", self.config.default_webhook_events)
        if not (isinstance(events, list | tuple) and set(events) <= set(WEBHOOK_EVENTS)):
            return input_invalid("webhook_events_filter", "enum",
                                 "webhook_events_filter must be a list of "
                                 + ", ".join(WEBHOOK_EVENTS))
        deadline_s = None
        if "Cancel-After" in request.headers:
            try:
                deadline_s = parse_duration_s(request.headers["Cancel-After"])
            except ValueError:
                return problem(400, "Invalid Cancel-After header",
                               "Cancel-After must be a duration such as 30s or 1m")
        record = functools.partial(
            self._record, model=model, version=version, input_=input_,
            origin=self._origin(request), deadline_s=deadline_s, webhook=webhook or None,
            events=frozenset(events))

        fault = self._next_create_fault()
        if fault is not None:
            self._stats[f"fault_{fault}"] += 1
        if fault == "5xx_before":
            return server_error(self.rng.choice((500, 503)))
        if fault == "429":
            return self._throttled(1.0)
        if fault == "hang_then_create":
            # The server goes on working after the client gave up: the create runs in a task
            # of its own, which a disconnect (cancelling this handler) does not cancel.
            pending = self._spawn(self._create_later(record))
            p: FakePrediction = await asyncio.shield(pending)
            return web.json_response(self._body(p, time.time()), status=201)
        p = record()  # billed before any await a disconnect could cancel
        if fault == "lose_reply":
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=201)  # written to a closed connection: never arrives
        if fault == "5xx_after":
            return server_error(self.rng.choice((500, 502, 503, 504)))
        if fault == "hang":
            await asyncio.sleep(self.config.hang_s)
        return web.json_response(self._body(p, time.time()), status=201)

    async def _create_later(self, record: Callable[[], FakePrediction]) -> FakePrediction:
        await asyncio.sleep(self.config.hang_s)
        return record()

    # ---- reads ----

    async def get_prediction(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/predictions/{id}."""
        self._stats["status_reads"] += 1
        early = await self._enter(request, "other")
        if early is not None:
            return early
        if self._chance(self.config.status_5xx):
            self._stats["fault_status_5xx"] += 1
            return server_error(self.rng.choice((500, 502, 503, 504)))
        p = self.predictions.get(request.match_info["id"])
        if p is None:
            return web.json_response(NOT_FOUND, status=404)
        p.reads += 1
        return web.json_response(self._body(p, time.time()))

    async def cancel_prediction(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/predictions/{id}/cancel: canceled unless it had already ended."""
        self._stats["cancels"] += 1
        early = await self._enter(request, "other")
        if early is not None:
            return early
        p = self.predictions.get(request.match_info["id"])
        if p is None:
            return web.json_response(NOT_FOUND, status=404)
        now = time.time()
        if p.status_at(now) not in TERMINAL:
            p.canceled_at = now
            p.changed.set()
        return web.json_response(self._body(p, now))

    async def list_predictions(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/predictions: newest first, keyset cursor pages, created_* filters."""
        query = request.query
        self._stats["list_pages"] += 1
        if "cursor" not in query:
            self._stats["lists"] += 1
        early = await self._enter(request, "other")
        if early is not None:
            return early
        fault = self._list_script.popleft() if self._list_script else self._list_fault()
        if fault == "5xx":
            self._stats["fault_list_5xx"] += 1
            return server_error(self.rng.choice((500, 502, 503, 504)))
        if fault == "429":
            self._stats["fault_list_429"] += 1
            return self._throttled(1.0)
        if fault == "garbled":
            # a reply cut off mid-body by a proxy or a dropped connection: 200, not JSON
            self._stats["fault_list_garbled"] += 1
            return web.Response(body=b'{"previous": null, "next": "ht', status=200,
                                content_type="application/json")
        try:
            after = parse_iso_us(query["created_after"]) if "created_after" in query else None
            before = (parse_iso_us(query["created_before"]) if "created_before" in query
                      else None)
        except ValueError:
            return problem(400, "Bad request", "created_after and created_before must be "
                                               "ISO 8601 date-times")
        cursor: tuple[int, int, bool] | None = None
        if "cursor" in query:
            try:
                raw = json.loads(base64.urlsafe_b64decode(query["cursor"].encode()))
                cursor = (int(raw["k"][0]), int(raw["k"][1]), bool(raw["r"]))
            except (ValueError, KeyError, TypeError, IndexError):
                return web.json_response({"detail": "Invalid cursor"}, status=404)

        def key(p: FakePrediction) -> tuple[int, int]:
            return p.created_us, p.seq

        items = sorted((p for p in self.predictions.values()
                        if (after is None or p.created_us >= after)
                        and (before is None or p.created_us < before)),
                       key=key, reverse=True)
        size = max(1, self.config.list_page_size)
        if cursor is None:
            page, has_prev, has_next = items[:size], False, len(items) > size
        elif not cursor[2]:  # next: older than the key
            older = [p for p in items if key(p) < cursor[:2]]
            page, has_next = older[:size], len(older) > size
            has_prev = len(older) < len(items)
        else:  # previous: newer than the key
            newer = [p for p in items if key(p) > cursor[:2]]
            page, has_prev = newer[-size:], len(newer) > size
            has_next = len(newer) < len(items)

        def link(p: FakePrediction, reverse: bool) -> str:
            token = base64.urlsafe_b64encode(
                canonical({"k": list(key(p)), "r": reverse}).encode()).decode()
            params = {k: query[k] for k in ("created_after", "created_before") if k in query}
            return (f"{self._origin(request)}/v1/predictions?"
                    + urlencode({**params, "cursor": token}))

        now = time.time()
        return web.json_response({
            "previous": link(page[0], True) if page and has_prev else None,
            "next": link(page[-1], False) if page and has_next else None,
            "results": [self._body(p, now) for p in page],
        })

    def _list_fault(self) -> str:
        """A list read's fault, drawn from the configured rates (seeded)."""
        cfg = self.config
        if not (cfg.list_5xx or cfg.list_429 or cfg.list_garbled):
            return "ok"  # no draw: the seeded sequence of a fault-free fake stays as it was
        draw = self.rng.random()
        for fault, rate in (("5xx", cfg.list_5xx), ("429", cfg.list_429),
                            ("garbled", cfg.list_garbled)):
            if draw < rate:
                return fault
            draw -= rate
        return "ok"

    async def get_webhook_secret(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/webhooks/default/secret."""
        early = await self._enter(request, "other")
        if early is not None:
            return early
        return web.json_response({"key": self.config.webhook_secret})

    # ---- the file host ----

    async def serve_file(self, request: web.Request) -> web.StreamResponse:
        """GET/HEAD /files/{id}/{name}: needs the token; honours a single Range."""
        self._stats["file_reads"] += 1
        if self.config.latency_s > 0:
            await asyncio.sleep(self.config.latency_s)
        denied = self._authorized(request)
        if denied is not None:
            return denied
        pid, name = request.match_info["id"], request.match_info["name"]
        p = self.predictions.get(pid)
        body = self._body(p, time.time()) if p is not None else None
        if (p is None or body is None or body["status"] != "succeeded" or body["data_removed"]
                or name not in OUTPUT_FILES[p.output_shape]):
            return web.json_response(NOT_FOUND, status=404)
        data = self.expected_file(pid, name)
        size = len(data)
        headers = {"Accept-Ranges": "bytes",
                   "Content-Type": "image/jpeg" if name.endswith(".jpg") else "video/mp4"}
        spec = request.headers.get("Range")
        if spec is None:
            return web.Response(body=data, headers=headers)
        match = re.fullmatch(r"bytes=(\d*)-(\d*)", spec.strip())
        first: int | None = None
        last = size - 1
        if match and match[1]:
            first = int(match[1])
            if match[2]:
                last = min(int(match[2]), size - 1)
        elif match and match[2]:
            first = max(0, size - int(match[2]))
        if first is None or first > last or first >= size:
            return web.Response(status=416, headers={**headers,
                                                     "Content-Range": f"bytes */{size}"})
        headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        return web.Response(status=206, body=data[first:last + 1], headers=headers)

    # ---- webhooks ----

    def _event_times(self, p: FakePrediction) -> list[tuple[str, float]]:
        """When each event of this prediction happens (as things stand now)."""
        end, final, started = p.ending()
        times = [("start", p.created)]
        if started is not None:
            times.append(("logs", started))
        if final == "succeeded":
            times.append(("output", end))
        times.append(("completed", end))
        return times

    async def _webhooks(self, p: FakePrediction) -> None:
        """Send this prediction's events as they happen, until `completed`."""
        sent: set[str] = set()
        try:
            while "completed" not in sent:
                p.changed.clear()
                now = time.time()
                pending = [(e, t) for e, t in self._event_times(p) if e not in sent]
                for event, at in pending:
                    if at > now:
                        break
                    sent.add(event)
                    if event in p.webhook_events:
                        await self._deliver(p, event)
                else:
                    continue
                next_at = min(t for e, t in self._event_times(p) if e not in sent)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(p.changed.wait(), max(0.0, next_at - time.time()))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("fake Replicate: webhooks of %s failed", p.id)

    async def _deliver(self, p: FakePrediction, event: str) -> None:
        """POST one event, signed; retried with the same webhook-id, redirects not followed."""
        cfg = self.config
        if self._session is None:
            self._session = aiohttp.ClientSession()
        body = json.dumps(self._body(p, time.time())).encode()
        msg_id = "msg_" + "".join(self.rng.choice(ID_ALPHABET) for _ in range(27))
        for attempt, pause in enumerate((0.0, *cfg.webhook_retry_delays_s), start=1):
            if pause:
                await asyncio.sleep(pause)
            timestamp = str(int(time.time()))
            secrets = [cfg.webhook_secret, *([cfg.webhook_old_secret]
                                             if cfg.webhook_old_secret else [])]
            headers = {"Content-Type": "application/json", "webhook-id": msg_id,
                       "webhook-timestamp": timestamp,
                       "webhook-signature": " ".join(sign(s, msg_id, timestamp, body)
                                                     for s in secrets)}
            status: int | None = None
            error: str | None = None
            self._stats["webhook_attempts"] += 1
            try:
                async with self._session.post(
                        str(p.webhook), data=body, headers=headers, allow_redirects=False,
                        timeout=aiohttp.ClientTimeout(total=cfg.webhook_timeout_s)) as resp:
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                error = f"{type(exc).__name__}: {exc}"
            self.webhook_deliveries.append(
                WebhookDelivery(p.id, event, msg_id, attempt, status, error))
            if status is not None and 200 <= status < 300:
                self._stats["webhooks_sent"] += 1
                return
        self._stats["webhooks_failed"] += 1


async def start_fake_replicate(fake: FakeReplicate, host: str = "127.0.0.1",
                               port: int = 0) -> tuple[web.AppRunner, str]:
    """Serve `fake` on a loopback port; returns the runner and its base URL (no /v1)."""
    # handler_cancellation: a client that gives up ends its request here too (the fault
    # paths create before awaiting, or in a shielded task, so billing survives that).
    runner = web.AppRunner(fake.app(), access_log=None, handler_cancellation=True,
                           shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, f"http://{host}:{bound}"
