"""A stand-in for fal.ai's queue, platform and CDN hosts, served by aiohttp on loopback.

It is written from fal's documentation and from what fal's official SDK (fal_client 1.0.3)
sends and reads, not from vidpoll's client, so that the client is tested against fal's
behaviour rather than against its own expectations. Tags below: [D] documented, [O] observed
(issue threads, public implementations, third-party transcripts), [A] an assumption of this fake.

Sources
- QUEUE: docs.fal.ai/documentation/model-apis/inference/queue, docs.fal.ai/model-endpoints/queue,
  fal.ai/docs/inference-api/queue/cancel, docs.fal.ai/model-endpoints/synchronous-requests
  (object lifecycle, start timeout).
- ERR: fal.ai/docs/documentation/model-apis/errors (model errors: `detail` list) and
  .../request-errors (request errors: `{detail, error_type}` + `X-Fal-Error-Type`).
- HIST: docs.fal.ai/platform-apis/v1/models/requests/by-endpoint (and its successor
  /v1/serverless/requests/by-endpoint, which adds nothing used here).
- HOOKS: docs.fal.ai/model-apis/model-endpoints/webhooks ("Verifying Your Webhook") and the
  public verifiers it links to (JWKS at rest.alpha.fal.ai/.well-known/jwks.json, `x` read).
- SDK: fal_client 1.0.3 `client.py` (`_raise_for_status`, `_parse_status`, retry rules) and
  `_headers.py` (X-Fal-Request-Timeout, X-Fal-Request-Timeout-Type, X-Fal-Queue-Priority).
- REF: PROVIDERS.md (project notes) section 5 and its 2026-12-06 "Updates".

Behaviour and its basis
- One app serves every host: the queue (`base_url`, fal's queue.fal.run), the platform API
  (fal's api.fal.ai, path `/v1/...`), the CDN (`cdn_base_url`, path `/files/...`) and the JWKS
  (`/.well-known/jwks.json`, fal's rest.alpha.fal.ai).
- Auth `Authorization: Key <key_id>:<key_secret>` on the queue and the platform [D QUEUE, HIST].
  A wrong key: 401 `{"detail": "No user found for Key ID and Secret"}` [O fal-ai/fal#1068,
  fal-ai/fal-swift#8]; no header: 401 `{"detail": "Missing authorization header"}` [A].
- `POST /{endpoint_id}` (owner/app plus an optional subpath) [D QUEUE] answers 200 [O:
  third-party OpenAPI; the SDK accepts any 2xx] with `request_id`, `gateway_request_id`,
  `status_url`, `response_url`, `cancel_url` and `queue_position` [D QUEUE, HOOKS]; those URLs
  use only owner/app, never the subpath [D QUEUE]. Request ids are UUID4s [O examples].
  An endpoint not in `config.endpoints` (when set) answers 404 `{"detail": "Application not
  found", "error_type": "bad_request"}` [A]; an id with fewer than two segments 404 [A]; a body
  that is not a JSON object 422 with a `detail` list [A, FastAPI's shape as in ERR].
- Optional on the create: `?fal_webhook=<url>` [D HOOKS]; `X-Fal-Queue-Priority` `low` queues
  behind `normal`/`high` [D values: SDK, REF; the ordering is A]; `X-Fal-Request-Timeout`
  (seconds): a request not started by then ends unprocessed [D QUEUE], as COMPLETED with
  `error_type` `request_timeout` and a 504 result carrying `X-Fal-Request-Timeout-Type: user`
  [A: the value; the header name is the SDK's]; an unreadable value answers 400 `bad_request`
  [D ERR: "invalid timeout header"]; `X-Fal-Store-IO: 0` keeps payloads out of the history
  (`json_input`/`json_output` null there) [D REF; null rather than absent is A];
  `X-Fal-Object-Lifecycle-Preference: {"expiration_duration_seconds": N}` sets when the
  request's files expire [D QUEUE] (unreadable: 400 `bad_request` [A]).
- Queue: requests are never rejected for concurrency; at most `concurrency` are IN_PROGRESS,
  the rest wait IN_QUEUE in FIFO order (per priority) with `queue_position` = requests ahead
  (0-based) [D QUEUE, REF]. The create answer also carries `status` [A]. `start_delay_s`
  (a cold start) is the least time a request stays queued [A]. A started request runs
  `processing_s` (+ seeded jitter) [A]. Its outcome is drawn
  from `outcome_mix` (seeded): `ok`, `model_error` (result 422 `{"detail": [error]}` [D ERR,
  REF]) or `request_error` (`{"detail", "error_type"}` + `X-Fal-Error-Type`, status
  `request_error_status` [D ERR]). Everything is computed from elapsed time when read.
- `GET .../requests/{id}/status[?logs=1]` [D QUEUE]: `IN_QUEUE` (+`queue_position`) and
  `IN_PROGRESS` answer 202, `COMPLETED` 200 [D REF]; `logs` is a list when `logs` is 1/true
  (fal_client sends `true`/`false`), else null (the SDK reads the key, so it is always there)
  [A: null; log fields `message, level, source, timestamp` A]; `metrics.inference_time` once
  completed after running [D QUEUE]; a failed request is COMPLETED with `error` and
  `error_type` [D REF] (for a model error `error_type` is the error's `type` [A]). The body
  also carries `request_id`, `response_url`, `status_url`, `cancel_url` [O fal-ai/fal-js#130].
- `GET .../requests/{id}` (the response URL) [D QUEUE]: before completion 400 `{"detail":
  "Request is still in progress"}` [D REF text; the shape A]; after success the model output
  `{"video": {"url", "content_type", "file_name", "file_size"}}` [D: fal's File type, HOOKS];
  after a failure the error answer above. Unknown id (or an id of another app): 404
  `{"detail": "Request not found"}` [A].
- `PUT .../requests/{id}/cancel` [D QUEUE]: 202 `{"status": "CANCELLATION_REQUESTED"}` while
  not completed, 400 `{"status": "ALREADY_COMPLETED"}` after, 404 `{"status": "NOT_FOUND"}`
  for an unknown id [D: statuses; 404 is A]. A queued request is removed at once [D]; a running
  one gets a signal and "the model app decides" [D]: with `cancel_in_progress` (default) it
  stops `cancel_grace_s` later, else it runs on to its outcome [A]. A cancelled request is
  COMPLETED with `error_type` `client_cancelled` and its result answers 499 [A; the type and
  499 are D ERR].
- Faults (none by default), per create: `lose_reply` (created and billed, then the connection
  drops), `5xx_after` (created, then 500/502/503/504), `5xx_before` (nothing created), `hang`
  (created at once, answer held `hang_s`), `hang_then_create` (held `hang_s`, created only then,
  even if the client has gone), `429` (nothing created); the 5xx statuses are configurable.
  A 500 is a request error `internal_error` [D ERR]; 502/503/504 come from the ingress as an
  nginx HTML page [A; it is what fal_client's retry heuristic looks for, so the SDK re-sends
  them]. 429: `{"detail":
  "Rate limit exceeded", "error_type": "rate_limited"}` + `X-Fal-Error-Type`, and `Retry-After`
  while `retry_after_s` is set [A: fal documents no create 429 body]. Status reads:
  `status_5xx`. History pages: `list_5xx`, `list_429`, `list_garbled` (200 with truncated
  JSON) and `script_lists`. A create is recorded before any await a client disconnect could
  cancel, or in a shielded task, so a dropped request bills what its fault says.
- History `GET /v1/models/requests/by-endpoint` [D HIST]: `endpoint_id` required (comma
  separated allowed [D successor]), `start`/`end` ISO 8601 (default the last 24 h; `end`
  exclusive), `status` success|error|user_error (2xx|5xx|4xx [A]), `request_id`, `limit`
  1..100 (default 50; outside: 422 [A]), `cursor` (base64 of the page number [D example
  "Mg=="], so new requests shift pages, as with any offset cursor), `expand=payloads` adds
  `json_input`/`json_output`, `sort_by` ended_at (default) | duration, newest/longest first
  [A: direction; running requests, `ended_at` null, first]. Items: `request_id`,
  `endpoint_id`, `started_at`, `sent_at`, `ended_at`, `status_code`, `duration` [D HIST].
  The time window filters `sent_at` [A]. Whether a request that has not started is listed is
  unconfirmed (the spec marks `started_at` required): `history_lists_queued` (default False:
  never-started requests, queued, cancelled in the queue or timed out, are not listed) [A].
  Answer `{"items", "next_cursor", "has_more"}` [D].
- CDN: public files [D REF], `GET`/`HEAD` with a single `Range` [A: a CDN's usual behaviour],
  at `{cdn_base_url}/files/{request_id}/output.mp4`; every read is recorded with whether it
  carried an Authorization header (`cdn_reads`), never refused for it [A]. Files expire
  `media_expiry_s` (config; None: never) or the request's lifecycle seconds after the request
  ends, then answer 404 [D: per-request lifecycle; the default is unconfirmed].
- Webhooks: on completion POST `{request_id, gateway_request_id, status: "OK"|"ERROR",
  payload, error}` [D HOOKS]; on failure `error` is `"Invalid status code: N"` and `payload` the
  error body [O fal-ai/fal-js#153]; `webhook_unserializable` sends `payload: null` with a
  `payload_error` [D HOOKS]. Signed with Ed25519: headers `X-Fal-Webhook-Request-Id`,
  `X-Fal-Webhook-User-Id`, `X-Fal-Webhook-Timestamp` (unix seconds),
  `X-Fal-Webhook-Signature` (hex) over `request_id\\nuser_id\\ntimestamp\\nsha256hex(body)`
  [D in outline HOOKS, details O public verifiers]. Keys: a JWKS `{"keys": [{"kty": "OKP",
  "crv": "Ed25519", "x": base64url, "kid", "use": "sig", "alg": "EdDSA"}]}` [O: verifiers read
  `x`, some check kty/crv; `use`/`alg` A]; rotation: `add_webhook_key`, sign with
  `config.webhook_signing_kid`. fal "will retry 10 times in the span of 2 hours" [D HOOKS]:
  here after any non-2xx or network error, with `webhook_retry_delays_s`, same request id,
  fresh timestamp and signature per attempt [A].
"""

from __future__ import annotations

import asyncio
import base64
import functools
import hashlib
import json
import logging
import math
import random
import re
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

log = logging.getLogger(__name__)

OUTCOMES = ("ok", "model_error", "request_error")
CREATE_FAULTS = ("lose_reply", "5xx_after", "5xx_before", "hang", "hang_then_create", "429")
LIST_FAULTS = ("5xx", "429", "garbled")
DEFAULT_ENDPOINT = "fal-ai/kling-video/v2/master/text-to-video"
DEFAULT_KEY = "fake-key-id-0001:fake-key-secret-0001"
DEFAULT_USER_ID = "fake-fal-user"
DEFAULT_KID = "fake-fal-webhook-key-1"
OUTPUT_NAME = "output.mp4"
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
DAY_S = 86400.0
NOT_FOUND = {"detail": "Request not found"}
BAD_KEY = {"detail": "No user found for Key ID and Secret"}
NO_KEY = {"detail": "Missing authorization header"}
STILL_RUNNING = {"detail": "Request is still in progress"}
DEFAULT_MODEL_ERROR: dict[str, Any] = {
    "loc": ["body", "prompt"],
    "msg": "The content was flagged by a content checker.",
    "type": "content_policy_violation",
    "url": "https://docs.fal.ai/errors#content_policy_violation",
}
"""One entry of a model error's `detail` list (ERR's documented fields)."""
REQUEST_ERROR_TEXT = {
    "runner_server_error": "Runner encountered an internal server error",
    "runner_disconnected": "Runner disconnected unexpectedly",
    "request_timeout": "Request timed out",
    "internal_error": "Internal server error",
    "client_cancelled": "Request was cancelled",
}


@dataclass
class FalFakeConfig:
    """How the fake behaves; mutable while it runs (read on every request)."""

    api_key: str = DEFAULT_KEY
    extra_keys: list[str] = field(default_factory=list)
    endpoints: list[str] | None = None
    """Endpoint ids that exist; None: any id with at least owner/app."""
    concurrency: int = 2
    """How many requests may be IN_PROGRESS at once (the rest wait IN_QUEUE)."""
    start_delay_s: float = 0.0
    """The least time a request waits IN_QUEUE (a cold start), even with a free slot."""
    processing_s: float = 1.0
    processing_jitter_s: float = 0.0
    """Each request's processing time is processing_s + uniform(0, jitter) (seeded)."""
    outcome_mix: dict[str, float] = field(default_factory=lambda: {"ok": 1.0})
    """Weights of OUTCOMES, drawn per request at creation (seeded)."""
    model_error: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_MODEL_ERROR))
    request_error_type: str = "runner_server_error"
    request_error_status: int = 500
    cancel_in_progress: bool = True
    """A cancel of a running request stops it (after cancel_grace_s); False: it runs on."""
    cancel_grace_s: float = 0.0
    cdn_base_url: str | None = None
    """Origin of the CDN files (served by this same app); None: the queue's origin."""
    file_bytes: int = 64 * 1024
    media_expiry_s: float | None = None
    """Seconds after a request ends that its files answer 404; None: never (unless the
    create asked for a lifecycle)."""
    history_lists_queued: bool = False
    """True: requests that never started are listed too (started_at null)."""
    history_page_size: int = 50
    """Default `limit` of a history page."""
    latency_s: float = 0.0
    create_fault_rates: dict[str, float] = field(default_factory=dict)
    """Probability of each CREATE_FAULTS entry per create (after the script is used up)."""
    hang_s: float = 30.0
    after_5xx_statuses: tuple[int, ...] = (500, 502, 503, 504)
    """What a `5xx_after` answers (drawn, seeded); 500 is fal's JSON, the rest nginx pages."""
    before_5xx_statuses: tuple[int, ...] = (500, 503)
    """What a `5xx_before` answers (drawn, seeded)."""
    status_5xx: float = 0.0
    list_5xx: float = 0.0
    list_429: float = 0.0
    list_garbled: float = 0.0
    retry_after_s: int | None = 1
    """Retry-After (seconds) on a 429; None: no header."""
    user_id: str = DEFAULT_USER_ID
    webhook_signing_kid: str = DEFAULT_KID
    webhook_retry_delays_s: tuple[float, ...] = (0.1, 0.5, 2.0)
    """Pauses before each retry of a webhook that got no 2xx (so 1 + len attempts); fal's
    own are 10 retries over 2 hours."""
    webhook_timeout_s: float = 5.0
    webhook_unserializable: bool = False
    """Webhooks carry `payload: null` and a `payload_error` (as for non-JSON output)."""
    seed: int | None = 0


@dataclass
class FakeFalRequest:
    """One queued request: what was asked and how it goes (times are unix seconds)."""

    id: str
    seq: int
    endpoint_id: str
    app: str
    input: dict[str, Any]
    created: float
    origin: str
    cdn_base: str
    processing_s: float
    outcome: str
    priority: str = "normal"
    store_io: bool = True
    start_deadline: float | None = None
    lifecycle_s: float | None = None
    webhook: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    end_kind: str | None = None
    """ok, model_error, request_error, cancelled or start_timeout, once ended."""
    cancel_at: float | None = None

    @property
    def end_due(self) -> float:
        """When a running request ends (its processing, or a cancel that stops it)."""
        assert self.started_at is not None
        due = self.started_at + self.processing_s
        return min(due, self.cancel_at) if self.cancel_at is not None else due


@dataclass
class WebhookDelivery:
    """One attempt to deliver a webhook (the fake keeps them all for tests)."""

    request_id: str
    attempt: int
    status: int | None
    kid: str
    error: str | None = None


@dataclass
class CdnRead:
    """One request to the CDN, and whether it carried an Authorization header."""

    path: str
    method: str
    authorization: bool
    status: int


def iso(t: float) -> str:
    """Unix seconds as ISO 8601 with microseconds and Z."""
    return (EPOCH + timedelta(microseconds=round(t * 1e6))).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_iso(text: str) -> float:
    """An ISO 8601 date or date-time (naive means UTC) as unix seconds; ValueError if not."""
    moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return (moment - EPOCH) / timedelta(seconds=1)


def canonical(value: Any) -> str:
    """JSON with sorted keys and no spaces: equal inputs give equal strings."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def b64url(data: bytes) -> str:
    """base64url without padding (JWK's encoding)."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def signed_message(request_id: str, user_id: str, timestamp: str, body: bytes) -> bytes:
    """What fal signs: `request_id\\nuser_id\\ntimestamp\\nsha256hex(body)`, UTF-8."""
    return "\n".join((request_id, user_id, timestamp,
                      hashlib.sha256(body).hexdigest())).encode()


def request_error(status: int, error_type: str, detail: str | None = None,
                  headers: dict[str, str] | None = None) -> web.Response:
    """A request error (ERR): `{detail, error_type}` plus X-Fal-Error-Type."""
    text = detail or REQUEST_ERROR_TEXT.get(error_type, error_type)
    return web.json_response({"detail": text, "error_type": error_type}, status=status,
                             headers={"X-Fal-Error-Type": error_type, **(headers or {})})


def server_error(status: int) -> web.Response:
    """A 5xx: fal's own 500 (a request error), or the ingress's nginx page (502/503/504)."""
    if status == 500:
        return request_error(500, "internal_error")
    reason = {502: "Bad Gateway", 503: "Service Temporarily Unavailable",
              504: "Gateway Time-out"}[status]
    return web.Response(status=status, content_type="text/html",
                        text=f"<html><head><title>{status} {reason}</title></head><body>"
                             f"<center><h1>{status} {reason}</h1></center><hr>"
                             "<center>nginx</center></body></html>")


def _validation_error(loc: list[str], msg: str, kind: str) -> web.Response:
    return web.json_response({"detail": [{"loc": loc, "msg": msg, "type": kind}]}, status=422)


def _truthy(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("1", "true", "yes", "on")


class FakeFal:
    """The fake's state and handlers; serve it with start_fake_fal()."""

    def __init__(self, config: FalFakeConfig | None = None) -> None:
        self.config = config or FalFakeConfig()
        self.rng = random.Random(self.config.seed)
        self.requests: dict[str, FakeFalRequest] = {}
        self.webhook_deliveries: list[WebhookDelivery] = []
        self.cdn_reads: list[CdnRead] = []
        self.webhook_keys: dict[str, Ed25519PrivateKey] = {}
        self.add_webhook_key(self.config.webhook_signing_kid)
        self._billed: Counter[tuple[str, str]] = Counter()
        self._stats: Counter[str] = Counter()
        self._create_script: deque[str] = deque()
        self._list_script: deque[str] = deque()
        self._queue: list[FakeFalRequest] = []
        self._running: list[FakeFalRequest] = []
        self._sim_t = 0.0
        self._tasks: set[asyncio.Task[Any]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._files: dict[tuple[str, int], bytes] = {}

    # ---- introspection and scripting (no HTTP) ----

    def created_inputs(self) -> Counter[tuple[str, str]]:
        """(endpoint_id, canonical JSON of input) -> requests created (billed)."""
        return Counter(self._billed)

    def billed(self, endpoint_id: str, input_: Any) -> int:
        """How many requests were created for this endpoint and input."""
        return self._billed[(endpoint_id, canonical(input_))]

    def stats(self) -> dict[str, int]:
        """Calls by kind: creates, create_requests, status_reads, result_reads, cancels, lists,
        list_pages, cdn_reads, cdn_reads_with_auth, unauthorized, throttled, started,
        webhooks_sent, webhook_attempts, webhooks_failed, fault_<name>..."""
        keys = ("creates", "create_requests", "status_reads", "result_reads", "cancels",
                "lists", "list_pages", "cdn_reads", "cdn_reads_with_auth", "unauthorized",
                "throttled", "started", "webhooks_sent", "webhook_attempts", "webhooks_failed")
        self._advance(time.time())
        return {**dict.fromkeys(keys, 0), **self._stats}

    def script_creates(self, steps: Iterable[str]) -> None:
        """Queue what the next creates do: "ok" or one of CREATE_FAULTS, in order."""
        steps = list(steps)
        unknown = set(steps) - {"ok", *CREATE_FAULTS}
        if unknown:
            raise ValueError(f"unknown create steps: {sorted(unknown)}")
        self._create_script.extend(steps)

    def script_lists(self, steps: Iterable[str]) -> None:
        """Queue what the next history pages do: "ok" or one of LIST_FAULTS, in order."""
        steps = list(steps)
        unknown = set(steps) - {"ok", *LIST_FAULTS}
        if unknown:
            raise ValueError(f"unknown list steps: {sorted(unknown)}")
        self._list_script.extend(steps)

    def view(self, request_id: str) -> dict[str, Any]:
        """What a status read (with logs) of this request would answer now."""
        now = time.time()
        self._advance(now)
        return self._status_body(self.requests[request_id], now, logs=True)

    def phase(self, request_id: str) -> str:
        """IN_QUEUE, IN_PROGRESS or COMPLETED, now."""
        self._advance(time.time())
        return self._phase(self.requests[request_id])

    def end_kind(self, request_id: str) -> str | None:
        """How the request ended (ok, model_error, request_error, cancelled, start_timeout)."""
        self._advance(time.time())
        return self.requests[request_id].end_kind

    def expected_file(self, request_id: str) -> bytes:
        """The bytes the CDN serves for this request's output (deterministic per id)."""
        size = self.config.file_bytes
        key = (request_id, size)
        if key not in self._files:
            blocks = (hashlib.sha256(request_id.encode() + i.to_bytes(4, "big")).digest()
                      for i in range(math.ceil(size / 32)))
            self._files[key] = b"".join(blocks)[:size]
        return self._files[key]

    def add_webhook_key(self, kid: str) -> None:
        """Publish another signing key (deterministic from the seed and kid) in the JWKS."""
        seed = hashlib.sha256(f"{self.config.seed}:{kid}".encode()).digest()
        self.webhook_keys[kid] = Ed25519PrivateKey.from_private_bytes(seed)

    def remove_webhook_key(self, kid: str) -> None:
        """Stop publishing a key (the end of a rotation)."""
        del self.webhook_keys[kid]

    def jwks(self) -> dict[str, Any]:
        """The JWKS document: every published key."""
        keys = []
        for kid, key in self.webhook_keys.items():
            raw = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
            keys.append({"kty": "OKP", "crv": "Ed25519", "x": b64url(raw), "kid": kid,
                         "use": "sig", "alg": "EdDSA"})
        return {"keys": keys}

    def app(self) -> web.Application:
        """The aiohttp application: platform, JWKS, CDN and queue routes (in that order, so
        the platform's paths win over the queue's `{owner}/{app}/requests/{id}`)."""
        app = web.Application()
        app.router.add_get("/v1/models/requests/by-endpoint", self.list_requests)
        app.router.add_get("/.well-known/jwks.json", self.get_jwks)
        app.router.add_get("/files/{rid}/{name}", self.serve_file)
        app.router.add_get("/{owner}/{app}/requests/{rid}/status", self.get_status)
        app.router.add_put("/{owner}/{app}/requests/{rid}/cancel", self.cancel)
        app.router.add_get("/{owner}/{app}/requests/{rid}", self.get_result)
        app.router.add_post("/{endpoint:.+}", self.create)
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

    # ---- the queue, simulated from elapsed time ----

    def _phase(self, r: FakeFalRequest) -> str:
        if r.ended_at is not None:
            return "COMPLETED"
        return "IN_PROGRESS" if r.started_at is not None else "IN_QUEUE"

    def _eligible_at(self, r: FakeFalRequest) -> float:
        return r.created + self.config.start_delay_s

    def _fill(self, t: float) -> None:
        """Start queued requests (in order) into free slots at time t."""
        free = max(0, self.config.concurrency) - len(self._running)
        for r in list(self._queue):
            if free <= 0:
                break
            if self._eligible_at(r) <= t:
                self._queue.remove(r)
                r.started_at = t
                self._running.append(r)
                self._stats["started"] += 1
                free -= 1

    def _end(self, r: FakeFalRequest, at: float, kind: str) -> None:
        r.ended_at, r.end_kind = at, kind

    def _advance(self, now: float) -> None:
        """Play the queue's events (ends, start deadlines, starts) up to `now`."""
        while True:
            self._fill(self._sim_t)
            times = [r.end_due for r in self._running]
            times += [r.start_deadline for r in self._queue if r.start_deadline is not None]
            if len(self._running) < max(0, self.config.concurrency):
                times += [e for r in self._queue
                          if (e := self._eligible_at(r)) > self._sim_t]
            nxt = min(times, default=None)
            if nxt is None or nxt > now:
                break
            self._sim_t = max(self._sim_t, nxt)
            for r in [r for r in self._running if r.end_due <= self._sim_t]:
                self._running.remove(r)
                assert r.started_at is not None
                stopped = r.cancel_at is not None and r.cancel_at < r.started_at + r.processing_s
                self._end(r, r.end_due, "cancelled" if stopped else r.outcome)
            for r in [r for r in self._queue
                      if r.start_deadline is not None and r.start_deadline <= self._sim_t]:
                self._queue.remove(r)
                self._end(r, r.start_deadline or self._sim_t, "start_timeout")
        self._sim_t = max(self._sim_t, now)
        self._fill(self._sim_t)

    def _queue_position(self, r: FakeFalRequest) -> int:
        return self._queue.index(r) if r in self._queue else 0

    def _enqueue(self, r: FakeFalRequest) -> None:
        rank = 1 if r.priority == "low" else 0
        at = len(self._queue)
        for i, other in enumerate(self._queue):
            if (1 if other.priority == "low" else 0) > rank:
                at = i
                break
        self._queue.insert(at, r)

    # ---- shared request handling ----

    def _authorized(self, request: web.Request) -> web.Response | None:
        header = request.headers.get("Authorization", "").strip()
        if not header:
            self._stats["unauthorized"] += 1
            return web.json_response(NO_KEY, status=401)
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "key" or key.strip() not in {self.config.api_key,
                                                          *self.config.extra_keys}:
            self._stats["unauthorized"] += 1
            return web.json_response(BAD_KEY, status=401)
        return None

    async def _enter(self, request: web.Request) -> web.Response | None:
        if self.config.latency_s > 0:
            await asyncio.sleep(self.config.latency_s)
        return self._authorized(request)

    def _throttled(self) -> web.Response:
        self._stats["throttled"] += 1
        after = self.config.retry_after_s
        return request_error(429, "rate_limited", "Rate limit exceeded",
                             headers={"Retry-After": str(after)} if after is not None else None)

    def _chance(self, p: float) -> bool:
        return p > 0 and self.rng.random() < p

    @staticmethod
    def _origin(request: web.Request) -> str:
        return f"{request.scheme}://{request.host}"

    def _urls(self, r: FakeFalRequest) -> dict[str, str]:
        base = f"{r.origin}/{r.app}/requests/{r.id}"
        return {"status_url": f"{base}/status", "response_url": base,
                "cancel_url": f"{base}/cancel"}

    def _lookup(self, request: web.Request) -> FakeFalRequest | None:
        r = self.requests.get(request.match_info["rid"])
        app = f"{request.match_info['owner']}/{request.match_info['app']}"
        return r if r is not None and r.app == app else None

    # ---- bodies ----

    def _output(self, r: FakeFalRequest) -> dict[str, Any]:
        return {"video": {"url": f"{r.cdn_base}/files/{r.id}/{OUTPUT_NAME}",
                          "content_type": "video/mp4", "file_name": OUTPUT_NAME,
                          "file_size": self.config.file_bytes}}

    def _error_of(self, r: FakeFalRequest) -> tuple[str, str] | None:
        """(error, error_type) of a failed request, for the status body."""
        kind = r.end_kind
        if kind == "model_error":
            return (str(self.config.model_error.get("msg", "Model error")),
                    str(self.config.model_error.get("type", "model_error")))
        if kind == "request_error":
            et = self.config.request_error_type
            return REQUEST_ERROR_TEXT.get(et, et), et
        if kind == "cancelled":
            return REQUEST_ERROR_TEXT["client_cancelled"], "client_cancelled"
        if kind == "start_timeout":
            return REQUEST_ERROR_TEXT["request_timeout"], "request_timeout"
        return None

    def _result(self, r: FakeFalRequest) -> tuple[int, Any, dict[str, str]]:
        """(status, body, headers) of the response URL for an ended request."""
        kind = r.end_kind
        if kind == "ok":
            return 200, self._output(r), {}
        if kind == "model_error":
            return 422, {"detail": [dict(self.config.model_error)]}, {"X-Fal-Retryable": "false"}
        if kind == "request_error":
            et = self.config.request_error_type
            return (self.config.request_error_status,
                    {"detail": REQUEST_ERROR_TEXT.get(et, et), "error_type": et},
                    {"X-Fal-Error-Type": et})
        if kind == "cancelled":
            return (499, {"detail": REQUEST_ERROR_TEXT["client_cancelled"],
                          "error_type": "client_cancelled"},
                    {"X-Fal-Error-Type": "client_cancelled"})
        return (504, {"detail": REQUEST_ERROR_TEXT["request_timeout"],
                      "error_type": "request_timeout"},
                {"X-Fal-Error-Type": "request_timeout", "X-Fal-Request-Timeout-Type": "user"})

    def _logs(self, r: FakeFalRequest, now: float) -> list[dict[str, Any]]:
        logs: list[dict[str, Any]] = []
        if r.started_at is not None:
            logs.append({"message": "Generating video...", "level": "INFO",
                         "source": "user", "timestamp": iso(r.started_at)})
        if r.ended_at is not None and r.end_kind == "ok":
            logs.append({"message": "Done.", "level": "INFO", "source": "user",
                         "timestamp": iso(r.ended_at)})
        return logs

    def _status_body(self, r: FakeFalRequest, now: float, *, logs: bool) -> dict[str, Any]:
        phase = self._phase(r)
        body: dict[str, Any] = {"status": phase, "request_id": r.id, **self._urls(r)}
        if phase == "IN_QUEUE":
            body["queue_position"] = self._queue_position(r)
            return body
        body["logs"] = self._logs(r, now) if logs else None
        if phase == "COMPLETED":
            body["metrics"] = ({"inference_time": round(r.ended_at - r.started_at, 6)}
                               if r.started_at is not None and r.ended_at is not None else {})
            err = self._error_of(r)
            if err is not None:
                body["error"], body["error_type"] = err
        return body

    # ---- creates ----

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

    def _record(self, *, endpoint_id: str, input_: dict[str, Any], origin: str,
                priority: str, store_io: bool, start_timeout_s: float | None,
                lifecycle_s: float | None, webhook: str | None) -> FakeFalRequest:
        """Create (and bill) a request now. Synchronous on purpose: nothing can cancel it."""
        cfg = self.config
        now = time.time()
        self._advance(now)
        weights = [max(0.0, cfg.outcome_mix.get(o, 0.0)) for o in OUTCOMES]
        outcome = self.rng.choices(OUTCOMES, weights)[0] if sum(weights) > 0 else "ok"
        jitter = self.rng.uniform(0, cfg.processing_jitter_s) if cfg.processing_jitter_s else 0
        rid = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
        owner, app = endpoint_id.split("/")[:2]
        r = FakeFalRequest(
            id=rid, seq=len(self.requests), endpoint_id=endpoint_id, app=f"{owner}/{app}",
            input=input_, created=now, origin=origin,
            cdn_base=(cfg.cdn_base_url or origin).rstrip("/"),
            processing_s=cfg.processing_s + jitter, outcome=outcome, priority=priority,
            store_io=store_io,
            start_deadline=None if start_timeout_s is None else now + start_timeout_s,
            lifecycle_s=lifecycle_s, webhook=webhook)
        self.requests[rid] = r
        self._enqueue(r)
        self._advance(now)
        self._billed[(endpoint_id, canonical(input_))] += 1
        self._stats["creates"] += 1
        if webhook:
            self._spawn(self._webhook(r))
        return r

    def _created_body(self, r: FakeFalRequest) -> dict[str, Any]:
        self._advance(time.time())
        body: dict[str, Any] = {"status": self._phase(r), "request_id": r.id,
                                "gateway_request_id": r.id, **self._urls(r)}
        if r in self._queue:
            body["queue_position"] = self._queue_position(r)
        return body

    async def _create_later(self, record: Callable[[], FakeFalRequest]) -> FakeFalRequest:
        await asyncio.sleep(self.config.hang_s)
        return record()

    async def create(self, request: web.Request) -> web.StreamResponse:
        """POST /{endpoint_id}: queue a request."""
        self._stats["create_requests"] += 1
        early = await self._enter(request)
        if early is not None:
            return early
        endpoint_id = request.match_info["endpoint"].strip("/")
        parts = endpoint_id.split("/")
        known = self.config.endpoints
        if len(parts) < 2 or not all(parts) or (known is not None and endpoint_id not in known):
            return request_error(404, "bad_request", "Application not found")
        try:
            payload = await request.json()
        except ValueError:
            return _validation_error(["body"], "Input should be a valid JSON object",
                                     "json_invalid")
        if not isinstance(payload, dict):
            return _validation_error(["body"], "Input should be a valid dictionary",
                                     "dict_type")
        headers = request.headers
        start_timeout_s: float | None = None
        if "X-Fal-Request-Timeout" in headers:
            try:
                start_timeout_s = float(headers["X-Fal-Request-Timeout"])
                if not start_timeout_s > 0 or math.isinf(start_timeout_s):
                    raise ValueError(start_timeout_s)
            except ValueError:
                return request_error(400, "bad_request", "Invalid X-Fal-Request-Timeout header")
        lifecycle_s: float | None = None
        if "X-Fal-Object-Lifecycle-Preference" in headers:
            try:
                pref = json.loads(headers["X-Fal-Object-Lifecycle-Preference"])
                lifecycle_s = float(pref["expiration_duration_seconds"])
            except (ValueError, KeyError, TypeError):
                return request_error(400, "bad_request",
                                     "Invalid X-Fal-Object-Lifecycle-Preference header")
        webhook = request.query.get("fal_webhook") or None
        record = functools.partial(
            self._record, endpoint_id=endpoint_id, input_=payload, origin=self._origin(request),
            priority=headers.get("X-Fal-Queue-Priority", "normal").strip().lower(),
            store_io=headers.get("X-Fal-Store-IO", "1").strip() != "0",
            start_timeout_s=start_timeout_s, lifecycle_s=lifecycle_s, webhook=webhook)

        fault = self._next_create_fault()
        if fault is not None:
            self._stats[f"fault_{fault}"] += 1
        if fault == "5xx_before":
            return server_error(self.rng.choice(self.config.before_5xx_statuses))
        if fault == "429":
            return self._throttled()
        if fault == "hang_then_create":
            # The server goes on working after the client gave up: the create runs in a task
            # of its own, which a disconnect (cancelling this handler) does not cancel.
            pending = self._spawn(self._create_later(record))
            later: FakeFalRequest = await asyncio.shield(pending)
            return web.json_response(self._created_body(later))
        r = record()  # billed before any await a disconnect could cancel
        if fault == "lose_reply":
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=200)  # written to a closed connection: never arrives
        if fault == "5xx_after":
            return server_error(self.rng.choice(self.config.after_5xx_statuses))
        if fault == "hang":
            await asyncio.sleep(self.config.hang_s)
        return web.json_response(self._created_body(r))

    # ---- status, result, cancel ----

    async def get_status(self, request: web.Request) -> web.StreamResponse:
        """GET /{owner}/{app}/requests/{id}/status[?logs=1]."""
        self._stats["status_reads"] += 1
        early = await self._enter(request)
        if early is not None:
            return early
        if self._chance(self.config.status_5xx):
            self._stats["fault_status_5xx"] += 1
            return server_error(self.rng.choice((500, 502, 503, 504)))
        r = self._lookup(request)
        if r is None:
            return web.json_response(NOT_FOUND, status=404)
        now = time.time()
        self._advance(now)
        body = self._status_body(r, now, logs=_truthy(request.query.get("logs")))
        return web.json_response(body, status=200 if body["status"] == "COMPLETED" else 202)

    async def get_result(self, request: web.Request) -> web.StreamResponse:
        """GET /{owner}/{app}/requests/{id}: the output, or why there is none."""
        self._stats["result_reads"] += 1
        early = await self._enter(request)
        if early is not None:
            return early
        r = self._lookup(request)
        if r is None:
            return web.json_response(NOT_FOUND, status=404)
        self._advance(time.time())
        if r.ended_at is None:
            return web.json_response(STILL_RUNNING, status=400)
        status, body, headers = self._result(r)
        return web.json_response(body, status=status, headers=headers)

    async def cancel(self, request: web.Request) -> web.StreamResponse:
        """PUT /{owner}/{app}/requests/{id}/cancel."""
        self._stats["cancels"] += 1
        early = await self._enter(request)
        if early is not None:
            return early
        r = self._lookup(request)
        if r is None:
            return web.json_response({"status": "NOT_FOUND"}, status=404)
        now = time.time()
        self._advance(now)
        if r.ended_at is not None:
            return web.json_response({"status": "ALREADY_COMPLETED"}, status=400)
        if r in self._queue:
            self._queue.remove(r)
            self._end(r, now, "cancelled")
            self._advance(now)
        elif self.config.cancel_in_progress and r.cancel_at is None:
            r.cancel_at = now + max(0.0, self.config.cancel_grace_s)
            self._advance(now)
        return web.json_response({"status": "CANCELLATION_REQUESTED"}, status=202)

    # ---- the platform: request history ----

    def _listed(self, r: FakeFalRequest) -> bool:
        return r.started_at is not None or self.config.history_lists_queued

    def _status_code(self, r: FakeFalRequest) -> int | None:
        return None if r.ended_at is None else self._result(r)[0]

    def _item(self, r: FakeFalRequest, payloads: bool) -> dict[str, Any]:
        code = self._status_code(r)
        item: dict[str, Any] = {
            "request_id": r.id,
            "endpoint_id": r.endpoint_id,
            "started_at": iso(r.started_at) if r.started_at is not None else None,
            "sent_at": iso(r.created),
            "ended_at": iso(r.ended_at) if r.ended_at is not None else None,
            "status_code": code,
            "duration": (round(r.ended_at - r.started_at, 6)
                         if r.ended_at is not None and r.started_at is not None else None),
        }
        if payloads:
            item["json_input"] = r.input if r.store_io else None
            item["json_output"] = (self._result(r)[1] if r.store_io and code is not None
                                   else None)
        return item

    async def list_requests(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/models/requests/by-endpoint."""
        query = request.query
        self._stats["list_pages"] += 1
        if "cursor" not in query:
            self._stats["lists"] += 1
        early = await self._enter(request)
        if early is not None:
            return early
        cfg = self.config
        if self._list_script:
            fault = self._list_script.popleft()
        else:
            fault = ("5xx" if self._chance(cfg.list_5xx) else
                     "429" if self._chance(cfg.list_429) else
                     "garbled" if self._chance(cfg.list_garbled) else "ok")
        if fault != "ok":
            self._stats[f"fault_list_{fault}"] += 1
        if fault == "5xx":
            return server_error(self.rng.choice((500, 502, 503, 504)))
        if fault == "429":
            return self._throttled()
        endpoint_ids = {e.strip() for v in query.getall("endpoint_id", [])
                        for e in v.split(",") if e.strip()}
        if not endpoint_ids:
            return _validation_error(["query", "endpoint_id"], "Field required", "missing")
        now = time.time()
        try:
            start = parse_iso(query["start"]) if "start" in query else now - DAY_S
            end = parse_iso(query["end"]) if "end" in query else math.inf
        except ValueError:
            return _validation_error(["query", "start"], "Input should be a valid datetime",
                                     "datetime_parsing")
        try:
            limit = int(query.get("limit", cfg.history_page_size))
            page = int(base64.b64decode(query["cursor"], validate=True)) if (
                "cursor" in query) else 1
        except ValueError:
            return _validation_error(["query", "cursor"], "Invalid cursor or limit", "value_error")
        if not 1 <= limit <= 100:
            return _validation_error(["query", "limit"],
                                     "Input should be less than or equal to 100", "less_than_equal")
        status_filter = query.get("status")
        if status_filter not in (None, "success", "error", "user_error"):
            return _validation_error(["query", "status"],
                                     "Input should be 'success', 'error' or 'user_error'", "enum")
        sort_by = query.get("sort_by", "ended_at")
        expand = {e.strip() for v in query.getall("expand", []) for e in v.split(",")}
        self._advance(now)

        def status_ok(r: FakeFalRequest) -> bool:
            code = self._status_code(r)
            if status_filter is None:
                return True
            if code is None:
                return False
            return {"success": 200 <= code < 300, "error": code >= 500,
                    "user_error": 400 <= code < 500}[status_filter]

        items = [r for r in self.requests.values()
                 if r.endpoint_id in endpoint_ids and self._listed(r)
                 and start <= r.created < end and status_ok(r)
                 and query.get("request_id") in (None, r.id)]
        if sort_by == "duration":
            items.sort(key=lambda r: ((r.ended_at or now) - (r.started_at or r.created),
                                      r.seq), reverse=True)
        else:
            items.sort(key=lambda r: (r.ended_at is None, r.ended_at or 0.0, r.seq),
                       reverse=True)
        chunk = items[(page - 1) * limit: page * limit]
        has_more = len(items) > page * limit
        body = {"items": [self._item(r, "payloads" in expand) for r in chunk],
                "next_cursor": base64.b64encode(str(page + 1).encode()).decode()
                if has_more else None,
                "has_more": has_more}
        if fault == "garbled":
            text = json.dumps(body)
            return web.Response(status=200, content_type="application/json",
                                text=text[: max(1, len(text) // 2)])
        return web.json_response(body)

    async def get_jwks(self, request: web.Request) -> web.StreamResponse:
        """GET /.well-known/jwks.json: the public webhook keys (no auth)."""
        return web.json_response(self.jwks())

    # ---- the CDN ----

    def _expires_at(self, r: FakeFalRequest) -> float:
        life = r.lifecycle_s if r.lifecycle_s is not None else self.config.media_expiry_s
        if life is None or r.ended_at is None:
            return math.inf
        return r.ended_at + life

    async def serve_file(self, request: web.Request) -> web.StreamResponse:
        """GET/HEAD /files/{id}/{name}: public; a single Range; 404 once expired."""
        if self.config.latency_s > 0:
            await asyncio.sleep(self.config.latency_s)
        self._stats["cdn_reads"] += 1
        has_auth = "Authorization" in request.headers
        if has_auth:
            self._stats["cdn_reads_with_auth"] += 1
        response = self._file_response(request)
        self.cdn_reads.append(CdnRead(request.path, request.method, has_auth, response.status))
        return response

    def _file_response(self, request: web.Request) -> web.Response:
        rid, name = request.match_info["rid"], request.match_info["name"]
        r = self.requests.get(rid)
        now = time.time()
        self._advance(now)
        if (r is None or name != OUTPUT_NAME or r.end_kind != "ok"
                or now >= self._expires_at(r)):
            return web.Response(status=404, content_type="text/plain", text="Not Found")
        data = self.expected_file(rid)
        size = len(data)
        headers = {"Accept-Ranges": "bytes", "Content-Type": "video/mp4"}
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

    def _webhook_body(self, r: FakeFalRequest) -> dict[str, Any]:
        status, result, _ = self._result(r)
        ok = r.end_kind == "ok"
        body: dict[str, Any] = {"request_id": r.id, "gateway_request_id": r.id,
                                "status": "OK" if ok else "ERROR", "payload": result,
                                "error": None if ok else f"Invalid status code: {status}"}
        if self.config.webhook_unserializable:
            body["payload"] = None
            body["payload_error"] = ("Response payload is not JSON serializable. Either return "
                                     "a JSON serializable object or use the queue endpoint to "
                                     "retrieve the response.")
        return body

    async def _webhook(self, r: FakeFalRequest) -> None:
        """Wait for the request to end, then deliver its webhook."""
        try:
            while True:
                self._advance(time.time())
                if r.ended_at is not None:
                    break
                wait = 0.05
                if r.started_at is not None:
                    wait = min(wait, max(0.001, r.end_due - time.time()))
                await asyncio.sleep(wait)
            await self._deliver(r)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("fake fal: webhook of %s failed", r.id)

    def sign(self, kid: str, request_id: str, timestamp: str, body: bytes) -> str:
        """The hex Ed25519 signature fal would send, with key `kid`."""
        message = signed_message(request_id, self.config.user_id, timestamp, body)
        return self.webhook_keys[kid].sign(message).hex()

    async def _deliver(self, r: FakeFalRequest) -> None:
        cfg = self.config
        if self._session is None:
            self._session = aiohttp.ClientSession()
        body = json.dumps(self._webhook_body(r)).encode()
        for attempt, pause in enumerate((0.0, *cfg.webhook_retry_delays_s), start=1):
            if pause:
                await asyncio.sleep(pause)
            timestamp = str(int(time.time()))
            kid = cfg.webhook_signing_kid
            headers = {"Content-Type": "application/json",
                       "X-Fal-Webhook-Request-Id": r.id,
                       "X-Fal-Webhook-User-Id": cfg.user_id,
                       "X-Fal-Webhook-Timestamp": timestamp,
                       "X-Fal-Webhook-Signature": self.sign(kid, r.id, timestamp, body)}
            status: int | None = None
            error: str | None = None
            self._stats["webhook_attempts"] += 1
            try:
                async with self._session.post(
                        str(r.webhook), data=body, headers=headers, allow_redirects=False,
                        timeout=aiohttp.ClientTimeout(total=cfg.webhook_timeout_s)) as resp:
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                error = f"{type(exc).__name__}: {exc}"
            self.webhook_deliveries.append(WebhookDelivery(r.id, attempt, status, kid, error))
            if status is not None and 200 <= status < 300:
                self._stats["webhooks_sent"] += 1
                return
        self._stats["webhooks_failed"] += 1


async def start_fake_fal(fake: FakeFal, host: str = "127.0.0.1",
                         port: int = 0) -> tuple[web.AppRunner, str]:
    """Serve `fake` on a loopback port; returns the runner and its base URL, which is the
    queue host, the platform host (`/v1/...`), the CDN (`/files/...`) and the JWKS host."""
    # handler_cancellation: a client that gives up ends its request here too (the fault
    # paths create before awaiting, or in a shielded task, so billing survives that).
    runner = web.AppRunner(fake.app(), access_log=None, handler_cancellation=True,
                           shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, f"http://{host}:{bound}"
