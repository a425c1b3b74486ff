"""A stand-in for Google Veo on the Gemini Developer API (generativelanguage.googleapis.com),
served by aiohttp on loopback. Shared pieces (operations, outcomes, faults, Google's error
envelope, RS256 JWTs) are reused by the Vertex AI fake in `vidpoll.providers.vertex.fake`.

It is written from Google's documentation and from what the official SDK (google-genai 2.34)
sends and parses, not from vidpoll's client, so the client is tested against Google's behaviour
rather than against its own expectations. Tags below: [D] documented (docs or the SDK's
code), [O] observed in public transcripts or third-party material, [A] an assumption.

Sources
- SDK: google-genai 2.34.0 — `models.py` (`_generate_videos`, `_GenerateVideosConfig_to_mldev`,
  `_GenerateVideosOperation_from_mldev`, `_GenerateVideosResponse_from_mldev`,
  `_Video_from_mldev`), `operations.py` (`get`), `files.py` (`download`),
  `_transformers.py` (`t_file_name`), `_api_client.py` (`_build_request`, auth headers),
  `errors.py`, `types.py` (`WebhookConfig`), `_gaos/webhooks.py` and
  `_gaos/types/webhooks/*` (the webhook registry).
- VIDEO: ai.google.dev/gemini-api/docs/video (REST samples: `x-goog-api-key`, `curl -L`
  download, "videos are stored on the server for 2 days").
- HOOKS: ai.google.dev/gemini-api/docs/webhooks (static project webhooks with a signing secret
  returned once; dynamic per-request `webhookConfig`); hookdeck/webhook-skills
  `skills/gemini-webhooks/references/{overview,verification}.md` (third-party).
- PROV: PROVIDERS.md (project notes) section 2a and "Updates (2026-12-06)".
- ERR: Google's JSON error envelope `{"error": {code, message, status, details}}` (AIP-193),
  with bodies as seen in many public transcripts of this API.

Behaviour and its basis
- `POST /v1beta/models/{model}:predictLongRunning` [D SDK], body `{"instances": [{"prompt",
  "image"?, ...}], "parameters": {"aspectRatio", "durationSeconds", "sampleCount", ...},
  "webhookConfig"?}` [D SDK: number_of_videos is sent as `sampleCount`; `numberOfVideos` is
  also accepted, A]. Answers `{"name": "models/{model}/operations/{id}"}` [D PROV, js-genai#1074];
  ids are 12 lower-case letters and digits [A]. A model outside `config.models` answers 404
  NOT_FOUND "models/x is not found for API version v1beta, or is not supported for
  predictLongRunning..." [O]. A body that is not JSON, has no instance object, or a
  `sampleCount` outside 1..`max_samples` answers 400 INVALID_ARGUMENT [A: messages].
- Auth [D SDK: it sends `x-goog-api-key`; `?key=` is the general Google API form]: no key:
  403 PERMISSION_DENIED "Method doesn't allow unregistered callers..." [O, PROV]; a wrong key:
  400 INVALID_ARGUMENT "API key not valid. Please pass a valid API key." with an
  `ErrorInfo` detail, reason API_KEY_INVALID, domain googleapis.com [O, PROV].
- `GET /v1beta/{name}` [D SDK operations.get]: `{"name"}` while running (`done` absent [D
  PROV]); then `done: true` with one of (drawn per operation from `outcome_mix`, seeded [A]):
  success: `response: {"@type": ".../PredictLongRunningResponse", "generateVideoResponse":
  {"generatedSamples": [{"video": {"uri"}}]}}` [D SDK; the @type is O]; error: `error:
  {"code": <gRPC number>, "message"}` and no `status` string [D PROV Updates]; filtered: the
  same response with no samples and `raiMediaFilteredCount` / `raiMediaFilteredReasons` [D
  SDK, PROV]. With `partial_filter_rate`, a success of N>1 requested videos may lose some to
  the filter (both fields then sit next to the samples) [A]. Unknown operation: 404 NOT_FOUND
  [A: message]. Timing: `processing_s` + uniform(0, `processing_jitter_s`), computed from
  elapsed time at each read [A].
- `GET /v1beta/models/{model}/operations` [D PROV: in the API description]:
  `{"operations": [{"name", "done"?}], "nextPageToken"?}`, newest first, `pageSize` /
  `pageToken` [A]; a listed operation carries no request and no creation time [D PROV] (and
  here neither response nor error [A]).
- Files: a sample's `video.uri` is `{origin}/v1beta/files/{id}:download?alt=media` [O: the
  shape of Google's URIs]. google-genai's `files.download` keeps only the id, and only from
  an `https://` URI (`t_file_name`), then GETs `files/{id}:download?alt=media` on its own
  base URL with the API key header [D SDK]; `files_base_url` therefore lets a test report
  URIs on Google's real origin while the SDK fetches from this fake. Download needs the key
  (header or `key=`) [D VIDEO]; Range is honoured [A]. The docs' `curl -L` hints at a
  redirect: with `download_redirect` the download answers 302 to a key-less, signed
  `/storage/{id}` URL on this app [A]. Files expire `file_retention_s` (default 2 days)
  after the operation ends [D VIDEO] and then answer 404 NOT_FOUND [A: 404 rather than 403].
- Webhooks. Static ones [D HOOKS, SDK `_gaos` types]: `POST /v1beta/webhooks`
  `{"uri", "subscribed_events", "name"?}` answers the Webhook with `new_signing_secret`
  (`whsec_` + base64, returned only here) [D HOOKS; the `whsec_` form is O third-party];
  `GET /v1beta/webhooks`, `GET`/`DELETE /v1beta/webhooks/{id}` [D SDK]. Each operation end
  fires `video.generated` [D: the event name] (also for errors and filtered ends [A]) to every
  enabled webhook subscribed to it, signed the Standard Webhooks way: headers `webhook-id`,
  `webhook-timestamp`, `webhook-signature: v1,<base64 HMAC-SHA256(secret, "id.ts.body")>`
  keyed with the base64-decoded secret after `whsec_` [O third-party: hookdeck, classmethod;
  Google's own page says "Standard Webhooks"]. Dynamic ones [D SDK: `webhookConfig: {"uris",
  "userMetadata"}` on the create, in place of the registered ones]: the same headers, but
  `webhook-signature` is an RS256 JWT whose `kid` names a key in
  `/.well-known/jwks.json`, `aud` is the receiving URI [O third-party]; its other claims
  (`iss`, `iat`, `exp`, `webhook_id`, `body_sha256`) are assumptions [A]. Body [O
  third-party, thin payload]: `{"type": "video.generated", "version": "v1", "timestamp",
  "data": {"id": <operation name>, "user_metadata"?, "error_code"?, "error_message"?}}` [A
  beyond `type`/`data.id`]. Retried on a network error or non-2xx with the same `webhook-id`
  (`webhook_retry_delays_s`) [O third-party: at-least-once; delays A].
- Faults (none by default), per create: `lose_reply` (created and billed, then the connection
  drops), `5xx_after` (created, then 500/502/503/504), `5xx_before` (500/503, nothing
  created), `hang` (created at once, answer held `hang_s`), `hang_then_create` (held `hang_s`,
  created only then, even if the client has gone), `429` (nothing created). Reads:
  `status_5xx`, `status_429` rates. 429 is RESOURCE_EXHAUSTED with `google.rpc.RetryInfo`
  `retryDelay: "Ns"` in the body and no Retry-After header [D PROV Updates]. 500 INTERNAL and
  503 UNAVAILABLE are JSON [O]; 502 is Google's front-end HTML page [O]; 504
  DEADLINE_EXCEEDED JSON [A]. A create is recorded before any await a client disconnect could
  cancel, or in a shielded task, so a dropped request bills what its fault says.
"""

from __future__ import annotations

import asyncio
import base64
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
from datetime import UTC, datetime
from typing import Any, ClassVar
from urllib.parse import quote

import aiohttp
from aiohttp import web
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa

log = logging.getLogger(__name__)

OUTCOMES = ("success", "error", "filtered")
CREATE_FAULTS = ("lose_reply", "5xx_after", "5xx_before", "hang", "hang_then_create", "429")
DEFAULT_MODELS = ("veo-fake-3.1-generate", "veo-fake-3.1-fast-generate")
DEFAULT_API_KEY = "AIzaSyFake-vidpoll-veo-0123456789abcdef"
GEMINI_RESPONSE_TYPE = ("type.googleapis.com/"
                        "google.ai.generativelanguage.v1beta.PredictLongRunningResponse")
VIDEO_EVENT = "video.generated"
WEBHOOK_EVENTS = ("batch.succeeded", "batch.expired", "batch.failed",
                  "interaction.requires_action", "interaction.completed",
                  "interaction.failed", VIDEO_EVENT)
DEFAULT_FILTER_REASON = ("Unable to generate videos because the prompt may violate our "
                         "policies. You will not be charged for blocked videos.")
ID_ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789"
TWO_DAYS_S = 2 * 24 * 3600.0


# ---- small shared helpers (also used by the Vertex fake) ----

def canonical(value: Any) -> str:
    """JSON with sorted keys and no spaces: equal bodies give equal strings."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def iso(t: float) -> str:
    """Unix seconds as Google writes timestamps (RFC 3339, Z)."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def google_error(code: int, status: str, message: str,
                 details: list[dict[str, Any]] | None = None) -> web.Response:
    """Google's JSON error envelope (AIP-193)."""
    error: dict[str, Any] = {"code": code, "message": message, "status": status}
    if details:
        error["details"] = details
    return web.json_response({"error": error}, status=code)


def error_info(reason: str, domain: str = "googleapis.com",
               **metadata: str) -> dict[str, Any]:
    """A `google.rpc.ErrorInfo` detail."""
    info: dict[str, Any] = {"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                            "reason": reason, "domain": domain}
    if metadata:
        info["metadata"] = metadata
    return info


def server_error(status: int, messages: dict[int, str] | None = None) -> web.Response:
    """A 5xx as Google answers it: JSON from the service, HTML from the front end (502)."""
    if status == 502:
        return web.Response(
            status=502, content_type="text/html",
            text="<!DOCTYPE html><html lang=en><title>Error 502 (Server Error)!!1</title>"
                 "<p><b>502.</b> <ins>That's an error.</ins><p>The server encountered a "
                 "temporary error and could not complete your request.<p>Please try again "
                 "in 30 seconds. <ins>That's all we know.</ins></html>")
    texts = {500: "Internal error encountered.",
             503: "The service is currently unavailable.",
             504: "Deadline expired before operation could complete.", **(messages or {})}
    codes = {500: "INTERNAL", 503: "UNAVAILABLE", 504: "DEADLINE_EXCEEDED"}
    return google_error(status, codes[status], texts[status])


def sign_standard(secret: str, msg_id: str, timestamp: str, body: bytes) -> str:
    """One Standard Webhooks signature, `v1,<base64 HMAC-SHA256 of "id.ts.body">`."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode()


def new_rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def jwt_encode(claims: dict[str, Any], key: rsa.RSAPrivateKey, kid: str) -> str:
    """An RS256 JWT."""
    header = {"alg": "RS256", "typ": "JWT", "kid": kid}
    signing_input = (b64url(canonical(header).encode()) + "."
                     + b64url(canonical(claims).encode()))
    signature = key.sign(signing_input.encode(), padding.PKCS1v15(), hashes.SHA256())
    return signing_input + "." + b64url(signature)


def jwt_decode(token: str, keys: dict[str, rsa.RSAPublicKey]) -> tuple[dict[str, Any],
                                                                      dict[str, Any]]:
    """(header, claims) of an RS256 JWT signed by one of `keys` (by kid, or any if the header
    has no kid); ValueError if malformed or the signature does not verify."""
    parts = token.split(".")
    if len(parts) != 3:
        raise ValueError("not a JWT")
    try:
        header = json.loads(b64url_decode(parts[0]))
        claims = json.loads(b64url_decode(parts[1]))
        signature = b64url_decode(parts[2])
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError("malformed JWT") from exc
    if not isinstance(header, dict) or not isinstance(claims, dict):
        raise ValueError("malformed JWT")
    if header.get("alg") != "RS256":
        raise ValueError("not RS256")
    kid = header.get("kid")
    candidates = [keys[kid]] if isinstance(kid, str) and kid in keys else (
        list(keys.values()) if kid is None else [])
    signing_input = f"{parts[0]}.{parts[1]}".encode()
    for public in candidates:
        try:
            public.verify(signature, signing_input, padding.PKCS1v15(), hashes.SHA256())
        except Exception:  # cryptography's InvalidSignature
            continue
        return header, claims
    raise ValueError("bad signature")


def jwk(public: rsa.RSAPublicKey, kid: str) -> dict[str, str]:
    """The public key as a JWK (RFC 7517)."""
    numbers = public.public_numbers()

    def whole(n: int) -> str:
        return b64url(n.to_bytes((n.bit_length() + 7) // 8, "big"))

    return {"kty": "RSA", "alg": "RS256", "use": "sig", "kid": kid,
            "n": whole(numbers.n), "e": whole(numbers.e)}


def video_bytes_for(key: str, size: int) -> bytes:
    """Deterministic stand-in bytes of a generated video."""
    blocks = (hashlib.sha256(f"{key}#{i}".encode()).digest() for i in range(math.ceil(size / 32)))
    return b"".join(blocks)[:size]


def serve_bytes(request: web.Request, data: bytes, content_type: str) -> web.Response:
    """200 with the bytes, or 206/416 for a single `Range: bytes=` spec."""
    size = len(data)
    headers = {"Accept-Ranges": "bytes", "Content-Type": content_type}
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
        return web.Response(status=416, headers={**headers, "Content-Range": f"bytes */{size}"})
    headers["Content-Range"] = f"bytes {first}-{last}/{size}"
    return web.Response(status=206, body=data[first:last + 1], headers=headers)


# ---- configuration and state ----

@dataclass
class GoogleFakeConfig:
    """What the Gemini and Vertex fakes share; mutable while they run."""

    models: list[str] = field(default_factory=lambda: list(DEFAULT_MODELS))
    processing_s: float = 1.0
    processing_jitter_s: float = 0.0
    """Each operation runs processing_s + uniform(0, jitter) (seeded)."""
    outcome_mix: dict[str, float] = field(default_factory=lambda: {"success": 1.0})
    """Weights of OUTCOMES ("success", "error", "filtered"), drawn per operation (seeded)."""
    partial_filter_rate: float = 0.0
    """Chance that a success of N>1 requested videos loses 1..N-1 of them to the filter."""
    error_code: int = 13
    error_message: str = "Video generation failed due to an internal error."
    filtered_reasons: list[str] = field(default_factory=lambda: [DEFAULT_FILTER_REASON])
    max_samples: int = 4
    file_bytes: int = 64 * 1024
    latency_s: float = 0.0
    create_fault_rates: dict[str, float] = field(default_factory=dict)
    """Probability of each CREATE_FAULTS entry per create (after the script is used up)."""
    hang_s: float = 30.0
    """How long `hang` holds its answer and `hang_then_create` works before it creates."""
    status_5xx: float = 0.0
    status_429: float = 0.0
    retry_delay_s: int = 30
    """The `retryDelay` a 429 carries (google.rpc.RetryInfo)."""
    seed: int | None = 0


@dataclass
class VeoFakeConfig(GoogleFakeConfig):
    """The Gemini API fake's configuration."""

    api_key: str = DEFAULT_API_KEY
    extra_api_keys: list[str] = field(default_factory=list)
    file_retention_s: float = TWO_DAYS_S
    files_base_url: str | None = None
    """Origin written into sample URIs; None: this fake's own origin. The files are always
    served by this app (the SDK only keeps the id of an https:// URI)."""
    download_redirect: bool = False
    """Answer a download with 302 to a key-less signed /storage URL on this app."""
    list_page_size: int = 50
    webhook_retry_delays_s: tuple[float, ...] = (0.1, 0.5, 2.0)
    webhook_timeout_s: float = 5.0
    webhook_jwt_issuer: str = "https://generativelanguage.googleapis.com"


@dataclass
class FakeOperation:
    """One long-running operation: what was asked, and when and how it ends."""

    id: str
    name: str
    seq: int
    model: str
    body: dict[str, Any]
    created: float
    processing_s: float
    outcome: str
    requested: int
    samples: int
    filtered: int
    error_code: int
    error_message: str
    filtered_reasons: list[str]
    storage_uri: str | None = None
    file_ids: list[str] = field(default_factory=list)
    webhook_uris: list[str] | None = None
    user_metadata: dict[str, Any] | None = None

    @property
    def done_at(self) -> float:
        return self.created + self.processing_s

    def done(self, now: float) -> bool:
        return now >= self.done_at


@dataclass
class WebhookDelivery:
    """One attempt to deliver a webhook (kept for tests)."""

    operation: str
    uri: str
    webhook_id: str
    attempt: int
    status: int | None
    scheme: str
    """"hmac" (a registered webhook) or "jwt" (a dynamic one)."""
    error: str | None = None


@dataclass
class RegisteredWebhook:
    id: str
    uri: str
    subscribed_events: list[str]
    secret: str
    created: float
    display_name: str | None = None
    state: str = "enabled"

    def resource(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id, "name": self.display_name or f"webhooks/{self.id}",
            "uri": self.uri, "subscribed_events": list(self.subscribed_events),
            "state": self.state, "create_time": iso(self.created),
            "update_time": iso(self.created),
            "signing_secrets": [{"truncated_secret": self.secret[:10] + "..."}]}
        return body


class GoogleFakeBase:
    """Operations, outcomes, faults and billing shared by the Gemini and Vertex fakes."""

    server_messages: ClassVar[dict[int, str]] = {}
    quota_message: ClassVar[str] = "Quota exceeded."

    def __init__(self, config: GoogleFakeConfig) -> None:
        self.base_config = config
        self.rng = random.Random(config.seed)
        self.operations: dict[str, FakeOperation] = {}
        self._billed: Counter[tuple[str, str]] = Counter()
        self._stats: Counter[str] = Counter()
        self._create_script: deque[str] = deque()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._video_cache: dict[tuple[str, int], bytes] = {}
        self._seq = 0
        self.base_url: str | None = None
        """Set by the start function: the origin the fake is served on."""

    # ---- introspection and scripting (no HTTP) ----

    def created_bodies(self) -> Counter[tuple[str, str]]:
        """(model, canonical JSON of the create body) -> operations created (billed)."""
        return Counter(self._billed)

    def stats(self) -> dict[str, int]:
        """Calls by kind: creates, create_requests, status_reads, list_reads, file_reads,
        throttled, unauthorized, webhooks_sent, webhook_attempts, webhooks_failed,
        token_requests, tokens_issued, tokens_refused, fault_<name>..."""
        keys = ("creates", "create_requests", "status_reads", "list_reads", "file_reads",
                "throttled", "unauthorized", "webhooks_sent", "webhook_attempts",
                "webhooks_failed", "token_requests", "tokens_issued", "tokens_refused")
        return {**dict.fromkeys(keys, 0), **self._stats}

    def script_creates(self, steps: Iterable[str]) -> None:
        """Queue what the next creates do: "ok" or one of CREATE_FAULTS, in order."""
        steps = list(steps)
        unknown = set(steps) - {"ok", *CREATE_FAULTS}
        if unknown:
            raise ValueError(f"unknown create steps: {sorted(unknown)}")
        self._create_script.extend(steps)

    def operation(self, name: str) -> FakeOperation:
        return self.operations[name]

    def video_bytes(self, key: str) -> bytes:
        """The bytes served for the video stored under `key` (a Gemini file id, or a Vertex
        "{operation id}/sample_{i}"), deterministic."""
        size = self.base_config.file_bytes
        cached = self._video_cache.get((key, size))
        if cached is None:
            cached = self._video_cache[(key, size)] = video_bytes_for(key, size)
        return cached

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

    def _chance(self, p: float) -> bool:
        return p > 0 and self.rng.random() < p

    def _new_id(self, n: int = 12) -> str:
        return "".join(self.rng.choice(ID_ALPHABET) for _ in range(n))

    @staticmethod
    def _origin(request: web.Request) -> str:
        return f"{request.scheme}://{request.host}"

    # ---- errors ----

    def _server_error(self, status: int) -> web.Response:
        return server_error(status, self.server_messages)

    def _throttled(self) -> web.Response:
        self._stats["throttled"] += 1
        return google_error(429, "RESOURCE_EXHAUSTED", self.quota_message, [
            {"@type": "type.googleapis.com/google.rpc.RetryInfo",
             "retryDelay": f"{max(0, int(self.base_config.retry_delay_s))}s"}])

    def _read_fault(self) -> web.Response | None:
        """The status-read faults (`status_5xx`, `status_429`), or None."""
        if self._chance(self.base_config.status_5xx):
            self._stats["fault_status_5xx"] += 1
            return self._server_error(self.rng.choice((500, 503)))
        if self._chance(self.base_config.status_429):
            return self._throttled()
        return None

    # ---- operations ----

    def _draw(self, requested: int) -> tuple[str, int, int, float]:
        """(outcome, samples, filtered count, processing seconds) of a new operation."""
        cfg = self.base_config
        mix = {k: w for k, w in cfg.outcome_mix.items() if k in OUTCOMES and w > 0}
        if not mix:
            raise ValueError(f"outcome_mix needs a positive weight on one of {OUTCOMES}")
        outcome = self.rng.choices(list(mix), weights=list(mix.values()))[0]
        samples, filtered = 0, 0
        if outcome == "success":
            samples = requested
            if requested > 1 and self._chance(cfg.partial_filter_rate):
                samples = self.rng.randint(1, requested - 1)
                filtered = requested - samples
        elif outcome == "filtered":
            filtered = requested
        processing = cfg.processing_s + (self.rng.uniform(0, cfg.processing_jitter_s)
                                         if cfg.processing_jitter_s > 0 else 0.0)
        return outcome, samples, filtered, processing

    def _new_operation(self, *, op_id: str, name: str, model: str, body: dict[str, Any],
                       requested: int) -> FakeOperation:
        outcome, samples, filtered, processing = self._draw(requested)
        self._seq += 1
        cfg = self.base_config
        return FakeOperation(
            id=op_id, name=name, seq=self._seq, model=model, body=body, created=time.time(),
            processing_s=processing, outcome=outcome, requested=requested, samples=samples,
            filtered=filtered, error_code=cfg.error_code, error_message=cfg.error_message,
            filtered_reasons=list(cfg.filtered_reasons))

    def _store(self, op: FakeOperation) -> FakeOperation:
        """Record (bill) a created operation. Never awaits."""
        self.operations[op.name] = op
        self._billed[(op.model, canonical(op.body))] += 1
        self._stats["creates"] += 1
        return op

    def _next_create_fault(self) -> str | None:
        if self._create_script:
            step = self._create_script.popleft()
            return None if step == "ok" else step
        for fault, rate in self.base_config.create_fault_rates.items():
            if fault in CREATE_FAULTS and self._chance(rate):
                return fault
        return None

    async def _create_with_faults(self, request: web.Request,
                                  record: Callable[[], FakeOperation],
                                  answer: Callable[[FakeOperation], web.StreamResponse]
                                  ) -> web.StreamResponse:
        """Apply the next create fault around `record` (which bills) and `answer`."""
        fault = self._next_create_fault()
        if fault is not None:
            self._stats[f"fault_{fault}"] += 1
        if fault == "5xx_before":
            return self._server_error(self.rng.choice((500, 503)))
        if fault == "429":
            return self._throttled()
        if fault == "hang_then_create":
            # The server goes on working after the client gave up: the create runs in a task
            # of its own, which a disconnect (cancelling this handler) does not cancel.
            pending = self._spawn(self._create_later(record))
            op: FakeOperation = await asyncio.shield(pending)
            return answer(op)
        op = record()  # billed before any await a disconnect could cancel
        if fault == "lose_reply":
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=200)  # written to a closed connection: never arrives
        if fault == "5xx_after":
            return self._server_error(self.rng.choice((500, 502, 503, 504)))
        if fault == "hang":
            await asyncio.sleep(self.base_config.hang_s)
        return answer(op)

    async def _create_later(self, record: Callable[[], FakeOperation]) -> FakeOperation:
        await asyncio.sleep(self.base_config.hang_s)
        return record()

    @staticmethod
    def _requested(body: dict[str, Any], max_samples: int) -> int | str:
        """The number of videos asked for, or an error message."""
        params = body.get("parameters", {})
        if not isinstance(params, dict):
            return "Invalid value at 'parameters', must be an object"
        value = params.get("sampleCount", params.get("numberOfVideos", 1))
        if isinstance(value, bool) or not isinstance(value, int):
            return "Invalid value at 'parameters.sample_count', must be an integer"
        if not 1 <= value <= max_samples:
            return f"sampleCount must be between 1 and {max_samples}, got {value}."
        return value

    @staticmethod
    def _instances_problem(body: Any) -> str | None:
        if not isinstance(body, dict):
            return "Invalid JSON payload received. Expected an object."
        instances = body.get("instances")
        if not (isinstance(instances, list) and instances and isinstance(instances[0], dict)):
            return "* GenerateVideoRequest.instances: at least one instance is required.\n"
        return None


async def serve_app(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Serve `app` on `host:port` (0: any free port); returns the runner and base URL."""
    # handler_cancellation: a client that gives up ends its request here too (the fault
    # paths create before awaiting, or in a shielded task, so billing survives that).
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True,
                           shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, f"http://{host}:{bound}"


class FakeVeo(GoogleFakeBase):
    """The Gemini API fake's state and handlers; serve it with start_fake_veo()."""

    server_messages: ClassVar[dict[int, str]] = {
        500: "An internal error has occurred. Please retry or report in "
             "https://developers.generativeai.google/guide/troubleshooting",
        503: "The model is overloaded. Please try again later.",
    }
    quota_message: ClassVar[str] = (
        "You exceeded your current quota, please check your plan and billing details. For "
        "more information on this error, head to: "
        "https://ai.google.dev/gemini-api/docs/rate-limits.")

    def __init__(self, config: VeoFakeConfig | None = None) -> None:
        self.config = config or VeoFakeConfig()
        super().__init__(self.config)
        self.files: dict[str, tuple[str, int]] = {}
        """File id -> (operation name, sample index)."""
        self.webhooks: dict[str, RegisteredWebhook] = {}
        self.webhook_deliveries: list[WebhookDelivery] = []
        self._webhook_key: rsa.RSAPrivateKey | None = None
        self.webhook_key_id = "fake-veo-webhook-key-1"
        self._storage_tokens: dict[str, str] = {}

    # ---- helpers for tests (no HTTP) ----

    def register_webhook(self, uri: str, events: Iterable[str] = (VIDEO_EVENT,),
                         name: str | None = None) -> RegisteredWebhook:
        """Register a static webhook as POST /v1beta/webhooks would; returns it (with the
        signing secret)."""
        hook = RegisteredWebhook(
            id=self._new_id(), uri=uri, subscribed_events=list(events),
            secret="whsec_" + base64.b64encode(self.rng.randbytes(24)).decode(),
            created=time.time(), display_name=name)
        self.webhooks[hook.id] = hook
        return hook

    @property
    def webhook_signing_key(self) -> rsa.RSAPrivateKey:
        """The RSA key that signs dynamic webhooks (its public half is in the JWKS)."""
        if self._webhook_key is None:
            self._webhook_key = new_rsa_key()
        return self._webhook_key

    def jwks(self) -> dict[str, Any]:
        return {"keys": [jwk(self.webhook_signing_key.public_key(), self.webhook_key_id)]}

    def file_id(self, operation_name: str, index: int = 0) -> str:
        return self.operations[operation_name].file_ids[index]

    def view(self, operation_name: str) -> dict[str, Any]:
        """What a GET of this operation would answer now."""
        return self._body(self.operations[operation_name], time.time(), self.base_url or "")

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application()
        r = app.router
        r.add_post("/v1beta/models/{model:[^/:]+}:predictLongRunning", self.create)
        r.add_get("/v1beta/models/{model:[^/:]+}/operations", self.list_operations)
        r.add_get("/v1beta/models/{model:[^/:]+}/operations/{opid:[^/:]+}", self.get_operation)
        r.add_get("/v1beta/files/{fid:[a-z0-9]+}:download", self.download)
        r.add_get("/storage/{fid:[a-z0-9]+}", self.storage)
        r.add_post("/v1beta/webhooks", self.create_webhook)
        r.add_get("/v1beta/webhooks", self.list_webhooks)
        r.add_get("/v1beta/webhooks/{wid}", self.get_webhook)
        r.add_delete("/v1beta/webhooks/{wid}", self.delete_webhook)
        r.add_get("/.well-known/jwks.json", self.get_jwks)
        app.on_cleanup.append(self._cleanup)
        return app

    # ---- auth ----

    def _authorized(self, request: web.Request) -> web.Response | None:
        key = request.headers.get("x-goog-api-key") or request.query.get("key")
        if not key:
            self._stats["unauthorized"] += 1
            return google_error(
                403, "PERMISSION_DENIED",
                "Method doesn't allow unregistered callers (callers without established "
                "identity). Please use API Key or other form of API consumer identity to call "
                "this API.")
        if key.strip() not in {self.config.api_key, *self.config.extra_api_keys}:
            self._stats["unauthorized"] += 1
            message = "API key not valid. Please pass a valid API key."
            return google_error(400, "INVALID_ARGUMENT", message, [
                error_info("API_KEY_INVALID",
                           service="generativelanguage.googleapis.com"),
                {"@type": "type.googleapis.com/google.rpc.LocalizedMessage",
                 "locale": "en-US", "message": message}])
        return None

    async def _enter(self, request: web.Request) -> web.Response | None:
        if self.config.latency_s > 0:
            await asyncio.sleep(self.config.latency_s)
        return self._authorized(request)

    # ---- the operation object ----

    def _files_origin(self, origin: str) -> str:
        return (self.config.files_base_url or origin).rstrip("/")

    def _body(self, op: FakeOperation, now: float, origin: str) -> dict[str, Any]:
        body: dict[str, Any] = {"name": op.name}
        if not op.done(now):
            return body
        body["done"] = True
        if op.outcome == "error":
            body["error"] = {"code": op.error_code, "message": op.error_message}
            return body
        files = self._files_origin(origin)
        result: dict[str, Any] = {}
        if op.samples:
            result["generatedSamples"] = [
                {"video": {"uri": f"{files}/v1beta/files/{fid}:download?alt=media"}}
                for fid in op.file_ids]
        if op.filtered:
            result["raiMediaFilteredCount"] = op.filtered
            result["raiMediaFilteredReasons"] = list(op.filtered_reasons)
        body["response"] = {"@type": GEMINI_RESPONSE_TYPE, "generateVideoResponse": result}
        return body

    def _record(self, *, model: str, body: dict[str, Any], requested: int,
                webhook_uris: list[str] | None,
                user_metadata: dict[str, Any] | None) -> FakeOperation:
        op_id = self._new_id()
        op = self._new_operation(op_id=op_id, name=f"models/{model}/operations/{op_id}",
                                 model=model, body=body, requested=requested)
        for index in range(op.samples):
            fid = self._new_id()
            op.file_ids.append(fid)
            self.files[fid] = (op.name, index)
        op.webhook_uris = webhook_uris
        op.user_metadata = user_metadata
        self._store(op)
        targets = self._webhook_targets(op)
        if targets:
            self._spawn(self._notify_when_done(op, targets))
        return op

    # ---- handlers ----

    async def create(self, request: web.Request) -> web.StreamResponse:
        """POST /v1beta/models/{model}:predictLongRunning."""
        self._stats["create_requests"] += 1
        early = await self._enter(request)
        if early is not None:
            return early
        model = request.match_info["model"]
        if model not in self.config.models:
            return google_error(
                404, "NOT_FOUND",
                f"models/{model} is not found for API version v1beta, or is not supported "
                "for predictLongRunning. Call ListModels to see the list of available models "
                "and their supported methods.")
        try:
            body = await request.json()
        except ValueError:
            return google_error(400, "INVALID_ARGUMENT",
                                "Invalid JSON payload received. Unexpected token.")
        problem = self._instances_problem(body)
        if problem is not None:
            return google_error(400, "INVALID_ARGUMENT", problem)
        requested = self._requested(body, self.config.max_samples)
        if isinstance(requested, str):
            return google_error(400, "INVALID_ARGUMENT", requested)
        hook_cfg = body.get("webhookConfig")
        uris: list[str] | None = None
        metadata: dict[str, Any] | None = None
        if hook_cfg is not None:
            raw_uris = hook_cfg.get("uris") if isinstance(hook_cfg, dict) else None
            if not (isinstance(raw_uris, list) and raw_uris
                    and all(isinstance(u, str) and u.startswith(("http://", "https://"))
                            for u in raw_uris)):
                return google_error(400, "INVALID_ARGUMENT",
                                    "webhookConfig.uris must be a list of http(s) URIs.")
            uris = list(raw_uris)
            raw_meta = hook_cfg.get("userMetadata", hook_cfg.get("user_metadata"))
            metadata = raw_meta if isinstance(raw_meta, dict) else None

        def record() -> FakeOperation:
            return self._record(model=model, body=body, requested=requested,
                                webhook_uris=uris, user_metadata=metadata)

        return await self._create_with_faults(
            request, record, lambda op: web.json_response({"name": op.name}))

    async def get_operation(self, request: web.Request) -> web.StreamResponse:
        """GET /v1beta/models/{model}/operations/{id}."""
        self._stats["status_reads"] += 1
        early = await self._enter(request)
        if early is not None:
            return early
        fault = self._read_fault()
        if fault is not None:
            return fault
        name = f"models/{request.match_info['model']}/operations/{request.match_info['opid']}"
        op = self.operations.get(name)
        if op is None:
            return google_error(404, "NOT_FOUND", f"Operation {name} not found.")
        return web.json_response(self._body(op, time.time(), self._origin(request)))

    async def list_operations(self, request: web.Request) -> web.StreamResponse:
        """GET /v1beta/models/{model}/operations: names (and done), newest first."""
        self._stats["list_reads"] += 1
        early = await self._enter(request)
        if early is not None:
            return early
        fault = self._read_fault()
        if fault is not None:
            return fault
        model = request.match_info["model"]
        try:
            size = int(request.query.get("pageSize", self.config.list_page_size))
            start = (int(b64url_decode(request.query["pageToken"]).decode())
                     if request.query.get("pageToken") else 0)
        except (ValueError, UnicodeDecodeError):
            return google_error(400, "INVALID_ARGUMENT", "Invalid page token or page size.")
        size = max(1, min(size, self.config.list_page_size))
        ops = sorted((op for op in self.operations.values() if op.model == model),
                     key=lambda op: op.seq, reverse=True)
        now = time.time()
        page = ops[start:start + size]
        body: dict[str, Any] = {"operations": [
            {"name": op.name, **({"done": True} if op.done(now) else {})} for op in page]}
        if start + size < len(ops):
            body["nextPageToken"] = b64url(str(start + size).encode())
        return web.json_response(body)

    def _file_problem(self, fid: str) -> web.Response | None:
        entry = self.files.get(fid)
        op = self.operations.get(entry[0]) if entry else None
        now = time.time()
        if (op is None or not op.done(now)
                or now >= op.done_at + self.config.file_retention_s):
            return google_error(404, "NOT_FOUND", f"File files/{fid} not found.")
        return None

    async def download(self, request: web.Request) -> web.StreamResponse:
        """GET/HEAD /v1beta/files/{id}:download: needs the key; Range; optional redirect."""
        self._stats["file_reads"] += 1
        early = await self._enter(request)
        if early is not None:
            return early
        fid = request.match_info["fid"]
        missing = self._file_problem(fid)
        if missing is not None:
            return missing
        if self.config.download_redirect:
            token = self._storage_tokens.setdefault(fid, self._new_id(32))
            raise web.HTTPFound(f"{self._origin(request)}/storage/{fid}?sig={quote(token)}")
        return serve_bytes(request, self.video_bytes(fid), "video/mp4")

    async def storage(self, request: web.Request) -> web.StreamResponse:
        """GET /storage/{id}?sig=...: the redirect target; the signature is the credential."""
        fid = request.match_info["fid"]
        token = self._storage_tokens.get(fid)
        if token is None or not hmac.compare_digest(request.query.get("sig", ""), token):
            return web.Response(status=403, text="Access denied.")
        missing = self._file_problem(fid)
        if missing is not None:
            return missing
        return serve_bytes(request, self.video_bytes(fid), "video/mp4")

    # ---- webhook registry ----

    async def create_webhook(self, request: web.Request) -> web.StreamResponse:
        """POST /v1beta/webhooks: the Webhook with `new_signing_secret` (only here)."""
        early = await self._enter(request)
        if early is not None:
            return early
        try:
            body = await request.json()
        except ValueError:
            return google_error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
        uri = body.get("uri") if isinstance(body, dict) else None
        events = body.get("subscribed_events") if isinstance(body, dict) else None
        if not (isinstance(uri, str) and uri.startswith(("http://", "https://"))):
            return google_error(400, "INVALID_ARGUMENT", "uri must be an http(s) URI.")
        if not (isinstance(events, list) and events and set(events) <= set(WEBHOOK_EVENTS)):
            return google_error(400, "INVALID_ARGUMENT",
                                "subscribed_events must list events of: "
                                + ", ".join(WEBHOOK_EVENTS))
        name = body.get("name")
        hook = self.register_webhook(uri, events, name if isinstance(name, str) else None)
        return web.json_response({**hook.resource(), "new_signing_secret": hook.secret})

    async def list_webhooks(self, request: web.Request) -> web.StreamResponse:
        early = await self._enter(request)
        if early is not None:
            return early
        return web.json_response({"webhooks": [h.resource() for h in self.webhooks.values()]})

    async def get_webhook(self, request: web.Request) -> web.StreamResponse:
        early = await self._enter(request)
        if early is not None:
            return early
        hook = self.webhooks.get(request.match_info["wid"])
        if hook is None:
            return google_error(404, "NOT_FOUND", "Webhook not found.")
        return web.json_response(hook.resource())

    async def delete_webhook(self, request: web.Request) -> web.StreamResponse:
        early = await self._enter(request)
        if early is not None:
            return early
        if self.webhooks.pop(request.match_info["wid"], None) is None:
            return google_error(404, "NOT_FOUND", "Webhook not found.")
        return web.json_response({})

    async def get_jwks(self, _request: web.Request) -> web.StreamResponse:
        return web.json_response(self.jwks())

    # ---- webhook delivery ----

    def _webhook_targets(self, op: FakeOperation) -> list[tuple[str, str | None]]:
        """(uri, HMAC secret or None for a JWT-signed dynamic hook) for this operation."""
        if op.webhook_uris:
            return [(uri, None) for uri in op.webhook_uris]
        return [(h.uri, h.secret) for h in self.webhooks.values()
                if h.state == "enabled" and VIDEO_EVENT in h.subscribed_events]

    def event_body(self, op: FakeOperation) -> dict[str, Any]:
        """The `video.generated` event for this (ended) operation."""
        data: dict[str, Any] = {"id": op.name}
        if op.user_metadata is not None:
            data["user_metadata"] = op.user_metadata
        if op.outcome == "error":
            data["error_code"] = op.error_code
            data["error_message"] = op.error_message
        return {"type": VIDEO_EVENT, "version": "v1", "timestamp": iso(op.done_at),
                "data": data}

    async def _notify_when_done(self, op: FakeOperation,
                                targets: list[tuple[str, str | None]]) -> None:
        try:
            await asyncio.sleep(max(0.0, op.done_at - time.time()))
            body = json.dumps(self.event_body(op)).encode()
            await asyncio.gather(*(self._deliver(op, uri, secret, body)
                                   for uri, secret in targets))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("fake Veo: webhooks of %s failed", op.name)

    def _signature(self, uri: str, secret: str | None, msg_id: str, timestamp: str,
                   body: bytes) -> str:
        if secret is not None:
            return sign_standard(secret, msg_id, timestamp, body)
        now = int(timestamp)
        claims = {"iss": self.config.webhook_jwt_issuer, "aud": uri, "iat": now,
                  "exp": now + 300, "webhook_id": msg_id,
                  "body_sha256": b64url(hashlib.sha256(body).digest())}
        return jwt_encode(claims, self.webhook_signing_key, self.webhook_key_id)

    async def _deliver(self, op: FakeOperation, uri: str, secret: str | None,
                       body: bytes) -> None:
        """POST one event; retried with the same webhook-id; redirects not followed."""
        cfg = self.config
        if self._session is None:
            self._session = aiohttp.ClientSession()
        msg_id = "msg_" + self._new_id(27)
        for attempt, pause in enumerate((0.0, *cfg.webhook_retry_delays_s), start=1):
            if pause:
                await asyncio.sleep(pause)
            timestamp = str(int(time.time()))
            headers = {"Content-Type": "application/json", "webhook-id": msg_id,
                       "webhook-timestamp": timestamp,
                       "webhook-signature": self._signature(uri, secret, msg_id, timestamp,
                                                            body)}
            status: int | None = None
            error: str | None = None
            self._stats["webhook_attempts"] += 1
            try:
                async with self._session.post(
                        uri, data=body, headers=headers, allow_redirects=False,
                        timeout=aiohttp.ClientTimeout(total=cfg.webhook_timeout_s)) as resp:
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                error = f"{type(exc).__name__}: {exc}"
            self.webhook_deliveries.append(WebhookDelivery(
                op.name, uri, msg_id, attempt, status, "hmac" if secret else "jwt", error))
            if status is not None and 200 <= status < 300:
                self._stats["webhooks_sent"] += 1
                return
        self._stats["webhooks_failed"] += 1


async def start_fake_veo(fake: FakeVeo, host: str = "127.0.0.1",
                         port: int = 0) -> tuple[web.AppRunner, str]:
    """Serve `fake` on a loopback port; returns the runner and its base URL (no /v1beta)."""
    runner, url = await serve_app(fake.app(), host, port)
    fake.base_url = url
    return runner, url

