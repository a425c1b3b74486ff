"""A stand-in for Runway's developer API (api.dev.runwayml.com), served by aiohttp on loopback,
with the signed CloudFront URLs of its outputs served by the same app.

It is written from Runway's documentation and from what the official SDK (runwayml 5.24.0)
sends and parses, not from vidpoll's client, so a client is tested against Runway's behaviour
rather than against its own expectations. Tags below: [D] documented (Runway's docs or the
SDK's code), [O] observed in public transcripts or third-party material, [A] an assumption.

Sources
- SDK: runwayml 5.24.0 — `_client.py` (`auth_headers`: `Authorization: Bearer <key>`;
  `default_headers`: `X-Runway-Version`, default "2024-11-06"), `_base_client.py`
  (`_idempotency_header = None`; retries on connection errors, 408, 409, 429 and >= 500;
  honours `Retry-After`), `resources/tasks.py` (`retrieve`, `delete` and its docstring),
  `types/task_retrieve_response.py`, `types/*_create_params.py`, `types/*_create_response.py`,
  `types/generate/video_create_response.py`, `types/organization_retrieve_response.py`,
  `lib/polling.py` (`wait_for_task_output`).
- ERR: docs.dev.runwayml.com/api-details/errors (400 "Expect a JSON response with an error
  member"; 401; 404; 405; 429; 502/503 "shedding load"; 504).
- TIERS: docs.dev.runwayml.com/usage/tiers (limits per model per project; over the concurrency
  limit tasks are THROTTLED and "enqueued in approximately the order that they were submitted
  in"; no requests-per-minute limit; over the daily generations a create answers 429).
- FAIL: docs.dev.runwayml.com/api-details/task-failures (`failureCode` families SAFETY.*,
  INTERNAL.BAD_OUTPUT.*, INPUT_PREPROCESSING.*).
- PROV: vidpoll's PROVIDERS.md section 3 and "Updates (2026-12-06)".
- CAPT: a third party's captures of the live API (public notes, 2026-08-26): the 400 body
  `{"error": "Validation of body failed", "issues": [...], "docUrl"}`, DELETE answering 204,
  signed output URLs on a cloudfront.net host with a `_jwt` query.
- ISSUES: runwayml/sdk-python#23 (a 429 body `{"error": "Your daily task limit has been
  reached."}`); a public report of the 400 for a bad `X-Runway-Version`; multica-ai/multica#2397
  (an expired CloudFront signed URL answering 403 `<Error><Code>AccessDenied</Code>...`).

Behaviour and its basis
- Auth [D SDK]: `Authorization: Bearer <key>`; no or a wrong key answers 401 `{"error"}` [D
  ERR: 401; the message is A]. Then `X-Runway-Version` [D SDK, PROV]: absent, or not in
  `config.versions`, answers 400 `{"error", "docUrl"}` [D PROV Updates; the bad-version
  message is O ISSUES, the missing-header message A]. Auth is checked first [A].
- Creates [D SDK]: `POST /v1/{endpoint}` for each of `config.endpoints` (image_to_video,
  text_to_video, video_to_video, video_upscale, character_performance, generate/video); other
  paths under /v1 answer 404 `{"error"}` [A]. The body must be a JSON object; each endpoint's
  required fields are checked by type only (`model` a string everywhere but generate/video,
  plus `promptImage` / `promptText` / `videoUri` / `character` and `reference` /
  `configId` and `input`) [D SDK `Required[...]`]; nothing else is validated (ratio, duration
  ...). A bad body answers 400 `{"error": "Validation of body failed", "issues": [{"code",
  "path", "message", ...}], "docUrl"}` [O CAPT; the issue messages mimic zod's, A]. With
  `config.models` set, another model answers that 400 with an `invalid_union` issue [O CAPT].
  A create answers 200 `{"id": <uuid>, "estimatedCost": {"credits"}}` [D SDK, PROV Updates];
  generate/video answers `{"id", "routing": {...}}` with the routed model `router_model` [D
  SDK; values A]. estimatedCost = `credits_per_second` x the body's integer `duration` (5 when
  absent) [A].
- `GET /v1/tasks/{id}` [D SDK]: `{id, status, createdAt}` plus, while PENDING / THROTTLED /
  RUNNING, `estimatedCost` (and RUNNING's `progress`, 0..1) [D SDK, O CAPT]; ended tasks carry
  `cost: {"credits": int}` and no `estimatedCost` [D SDK, O CAPT]: SUCCEEDED `output: [url]`,
  FAILED `failure` and `failureCode` [D SDK]. A task is PENDING for `pending_s`, then RUNNING
  if its model has a free slot (`concurrency` per model per organisation [D PROV Updates,
  TIERS]), else THROTTLED until one frees, taken in submission order [D TIERS]; it runs
  `processing_s` + uniform(0, `jitter_s`) (seeded), all computed from elapsed time when read
  [A]. The outcome is drawn per task from `outcome_mix` (seeded) [A]. Final cost [A, after the
  SDK's delete docstring]: SUCCEEDED the estimate; FAILED 0 (refunded); CANCELLED 0 if it never
  ran, the estimate if cancelled while RUNNING ("If that check observes RUNNING, cancellation
  does not refund credits" [D SDK]). An unknown id answers 404 `{"error": "Could not find
  Task"}` [D PROV Updates, O CAPT].
- `DELETE /v1/tasks/{id}` [D SDK]: answers 204 with no body [O CAPT]. A PENDING, THROTTLED or
  RUNNING task is cancelled (it then reads CANCELLED); any other task is deleted (later reads
  answer 404) [D SDK docstring]. The SDK's docstring also says "Aborted and deleted tasks will
  not be able to be fetched again", and a third party saw a cancelled PENDING task read 404 at
  once [O CAPT]: `cancel_deletes=True` does that (default False: the task reads CANCELLED).
- Outputs: `output` holds `output_count` URLs `{origin}/cdn/{task_id}/{n}.mp4?_jwt=<JWT>`,
  a stand-in for Runway's CloudFront URLs signed with a `_jwt` query [D PROV Updates, O CAPT];
  the JWT (HS256, this fake's own key [A]) expires after `output_ttl_s` (24 h; Runway says
  "within 24-48 hours" [D SDK]). Each read of the task mints new URLs (a new `_jwt`) [D SDK:
  "fetch the task again to get fresh URLs"]. No API key is needed there [A: a signed URL].
  `expire_outputs(task_id=None)` expires every URL handed out so far (for one task, or all);
  then, as for a missing, malformed or foreign `_jwt`, the URL answers 403 with CloudFront's
  XML `AccessDenied` body [O: CloudFront's denial of a bad or expired signature; that Runway's
  `_jwt` check answers the same is A]. GET and HEAD; one `Range: bytes=` spec answers 206
  with Content-Range (416 if unsatisfiable) [A]. The bytes are deterministic per task and
  output, `media_bytes` long, starting with an mp4 `ftyp` box [A]. Every read is recorded in
  `media_reads` (path without the query, whether the signature was valid, the status, whether
  an Authorization header came along).
- Limits [D TIERS]: no requests-per-minute limit; concurrency makes tasks THROTTLED, never an
  error. `daily_cap` creates per model in a rolling 24 h [D TIERS: "per model, per project",
  "in a 24-hour window"; SDK `maxDailyGenerations` is per model]; beyond it a create answers
  429 `{"error": "Your daily task limit has been reached."}` [O ISSUES] with no Retry-After
  (none documented); `daily_cap_retry_after_s` adds one [A]. `reset_daily_cap()` forgets the
  counts.
- `GET /v1/organization` [D SDK types]: `{creditBalance, tier: {maxMonthlyCreditSpend, models:
  {model: {maxConcurrentGenerations, maxDailyGenerations}}}, usage: {models: {model:
  {dailyGenerations}}}}`; the balance is `credit_balance` less what tasks hold or were charged
  [A].
- Faults, none by default, queued with `script_creates([...])` and consumed one per create that
  passed auth, version, validation and the daily cap (None or "ok": a normal create):
  `lose_reply` (created and billed, then the connection drops with no answer), `5xx_after`
  (created and billed, then `fivexx_status`), `5xx_before` (nothing created, `fivexx_status`),
  `hang` (created at once, the answer held `hang_s`), `hang_then_create` (held `hang_s`, created
  only then, even if the client has gone), `429` (nothing created; the daily-cap answer).
  `status_5xx` (config, then the `status_5xx` attribute) fails that many next task reads with
  `fivexx_status`. 5xx bodies are JSON `{"error"}` [A: messages after ERR]. A create is
  recorded (billed) before any await a client disconnect could cancel, or in a shielded task.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import re
import secrets
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import jwt
from aiohttp import web

DEFAULT_KEY = "key_" + "0123456789abcdef" * 8
"""The fake's API key: Runway's shape, `key_` and 128 hex digits."""
DEFAULT_VERSION = "2024-11-06"
DEFAULT_ENDPOINTS = ("image_to_video", "text_to_video", "video_to_video", "video_upscale",
                     "character_performance", "generate/video")
DOC_URL = "https://docs.dev.runwayml.com/api"
OUTCOMES = ("SUCCEEDED", "FAILED", "CANCELLED")
ACTIVE = ("PENDING", "THROTTLED", "RUNNING")
CREATE_FAULTS = ("lose_reply", "5xx_after", "5xx_before", "hang", "hang_then_create", "429")
DAILY_CAP_MESSAGE = "Your daily task limit has been reached."
NOT_FOUND_MESSAGE = "Could not find Task"
BAD_VERSION_MESSAGE = ("The API version that was provided in the X-Runway-Version header is "
                       "not valid.")
MISSING_VERSION_MESSAGE = "The X-Runway-Version header is required."
INVALID_KEY_MESSAGE = "The API key that was provided is not valid."
DAY_S = 24 * 3600.0
FTYP_BOX = b"\x00\x00\x00\x18ftypisom\x00\x00\x02\x00isommp42"
ACCESS_DENIED_XML = ('<?xml version="1.0" encoding="UTF-8"?>\n'
                     "<Error><Code>AccessDenied</Code><Message>Access denied</Message></Error>")
SERVER_MESSAGES = {
    500: "An unexpected error occurred.",
    502: "Runway is shedding load. Please retry.",
    503: "Runway is shedding load. Please retry.",
    504: "Runway is overloaded and could not satisfy the request.",
}
# Required fields per create endpoint (SDK `types/*_create_params.py`), checked by JSON type.
REQUIRED_FIELDS: dict[str, tuple[tuple[str, tuple[type, ...], str], ...]] = {
    "image_to_video": (("model", (str,), "string"),
                       ("promptImage", (str, list), "string or array")),
    "text_to_video": (("model", (str,), "string"), ("promptText", (str,), "string")),
    "video_to_video": (("model", (str,), "string"), ("videoUri", (str,), "string")),
    "video_upscale": (("model", (str,), "string"), ("videoUri", (str,), "string")),
    "character_performance": (("model", (str,), "string"), ("character", (dict,), "object"),
                              ("reference", (dict,), "object")),
    "generate/video": (("configId", (str,), "string"), ("input", (dict,), "object")),
}


def iso_ms(t: float) -> str:
    """Unix seconds as Runway writes `createdAt`: ISO 8601, milliseconds, Z."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def runway_error(status: int, message: str, **extra: Any) -> web.Response:
    """Runway's error body, `{"error": message, ...}`."""
    return web.json_response({"error": message, **extra}, status=status)


def json_type(value: Any) -> str:
    """The JSON name of a value's type, as a validator reports it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else "undefined"


def media_bytes_for(key: str, size: int) -> bytes:
    """Deterministic stand-in bytes of an output: an mp4 `ftyp` box, then hash blocks."""
    blocks = (hashlib.sha256(f"{key}#{i}".encode()).digest()
              for i in range(math.ceil(max(0, size - len(FTYP_BOX)) / 32)))
    return (FTYP_BOX + b"".join(blocks))[:max(size, 0)]


def serve_bytes(request: web.Request, data: bytes) -> web.Response:
    """200 with the bytes, or 206/416 for a single `Range: bytes=` spec (GET and HEAD)."""
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
        return web.Response(status=416, headers={**headers, "Content-Range": f"bytes */{size}"})
    headers["Content-Range"] = f"bytes {first}-{last}/{size}"
    return web.Response(status=206, body=data[first:last + 1], headers=headers)


# ---- configuration and state ----

@dataclass
class RunwayFakeConfig:
    """The fake's knobs; mutable while it runs."""

    api_key: str = DEFAULT_KEY
    versions: set[str] = field(default_factory=lambda: {DEFAULT_VERSION})
    endpoints: tuple[str, ...] = DEFAULT_ENDPOINTS
    models: list[str] | None = None
    """Models a create may name; None: any string."""
    router_model: str = "gen4.5"
    """The model generate/video (the Model Router) picks."""
    pending_s: float = 0.05
    """How long a new task reads PENDING before it can run."""
    processing_s: float = 1.0
    jitter_s: float = 0.0
    """Each task runs processing_s + uniform(0, jitter_s) (seeded)."""
    seed: int | None = 0
    outcome_mix: dict[str, float] = field(default_factory=lambda: {"SUCCEEDED": 1.0})
    """Weights of OUTCOMES ("SUCCEEDED", "FAILED", "CANCELLED"), drawn per task (seeded)."""
    failure: str = "An unexpected error occurred."
    failure_code: str = "INTERNAL.BAD_OUTPUT.CODE01"
    concurrency: int | None = None
    """Running tasks per model at once (more read THROTTLED); None: unlimited."""
    daily_cap: int | None = None
    """Creates per model in a rolling 24 h; beyond it a create answers 429. None: no cap."""
    daily_cap_retry_after_s: float | None = None
    """If set, the daily-cap 429 carries `Retry-After` (Runway documents none)."""
    hang_s: float = 30.0
    """How long `hang` holds its answer and `hang_then_create` waits before it creates."""
    fivexx_status: int = 502
    """The status of `5xx_after`, `5xx_before` and failed status reads."""
    status_5xx: int = 0
    """How many of the first task reads answer `fivexx_status`."""
    output_count: int = 1
    output_ttl_s: float = DAY_S
    media_bytes: int = 4096
    credits_per_second: int = 10
    credit_balance: int = 100_000
    max_monthly_credit_spend: int = 100_000
    cancel_deletes: bool = False
    """A cancelled task is gone at once (reads 404), as a third party observed."""
    latency_s: float = 0.0


@dataclass
class MediaRead:
    """One request for an output URL (the query, which holds the signature, is not kept)."""

    path: str
    method: str
    valid: bool
    """Whether the `_jwt` was a live signature for this path."""
    status: int
    range: str | None = None
    authorization: bool = False
    """Whether the request carried an Authorization header (a CDN should not get the key)."""


@dataclass
class RunwayTask:
    """One task: what was asked, and when and how it ends."""

    id: str
    seq: int
    endpoint: str
    body: dict[str, Any]
    """The JSON object as received."""
    model: str
    created: float
    ready_at: float
    processing_s: float
    outcome: str
    estimated_credits: int
    failure: str
    failure_code: str
    started: float | None = None
    ended: float | None = None
    end_status: str | None = None
    cost_credits: int | None = None
    deleted: bool = False
    """Deleted by DELETE (reads 404); kept here for inspection."""
    advance: Callable[[], None] = field(default=lambda: None, repr=False, compare=False)

    @property
    def status(self) -> str:
        """Runway's status now (a deleted task keeps its last one)."""
        self.advance()
        return self.status_at(time.time())

    def status_at(self, now: float) -> str:
        """The status at `now`, once the fake has advanced its queues to `now`."""
        if self.end_status is not None:
            return self.end_status
        if self.started is not None:
            return "RUNNING"
        return "PENDING" if now < self.ready_at else "THROTTLED"

    def ends_at(self) -> float:
        """When a started task's run ends (inf if it has not started)."""
        return math.inf if self.started is None else self.started + self.processing_s

    def progress_at(self, now: float) -> float:
        if self.started is None or self.processing_s <= 0:
            return 0.0
        return round(min(0.99, max(0.0, (now - self.started) / self.processing_s)), 2)


@dataclass
class ModelQueue:
    """The tasks of one model that have not ended, and the time of its last event."""

    clock: float = 0.0
    waiting: list[RunwayTask] = field(default_factory=list)
    running: list[RunwayTask] = field(default_factory=list)


@dataclass
class Grant:
    """One signed output URL handed out."""

    task_id: str
    index: int
    expired: bool = False


# ---- the fake ----

class FakeRunway:
    """Runway's developer API: state, inspection for tests, and handlers. Serve it with
    start_fake_runway()."""

    def __init__(self, config: RunwayFakeConfig | None = None) -> None:
        self.config = config or RunwayFakeConfig()
        self.rng = random.Random(self.config.seed)
        self.api_key = self.config.api_key
        self.tasks: dict[str, RunwayTask] = {}
        self.status_reads = 0
        """Requests to GET /v1/tasks/{id} (answered or not)."""
        self.create_posts = 0
        """POSTs to a create endpoint (answered or not)."""
        self.delete_requests = 0
        self.media_reads: list[MediaRead] = []
        self.status_5xx = self.config.status_5xx
        """Task reads still to fail with `fivexx_status` (a test may set it)."""
        self.base_url: str | None = None
        """Set by start_fake_runway(): the origin the fake is served on."""
        self._billed: list[tuple[str, dict[str, Any]]] = []
        self._queues: dict[str, ModelQueue] = {}
        self._daily: dict[str, list[float]] = {}
        self._create_script: deque[str | None] = deque()
        self._grants: dict[str, Grant] = {}
        self._jwt_key = secrets.token_bytes(32)
        self._media_cache: dict[tuple[str, int, int], bytes] = {}
        self._spawned: set[asyncio.Task[Any]] = set()
        self._seq = 0

    # ---- inspection and scripting (no HTTP) ----

    def billed(self) -> list[tuple[str, dict[str, Any]]]:
        """(task id, body) of every create that billed, in order."""
        return list(self._billed)

    def script_creates(self, steps: Iterable[str | None]) -> None:
        """Queue what the next creates do: None (or "ok") for normal, else a CREATE_FAULTS
        name; consumed one per create."""
        steps = list(steps)
        unknown = {s for s in steps if s is not None and s != "ok" and s not in CREATE_FAULTS}
        if unknown:
            raise ValueError(f"unknown create steps: {sorted(unknown)}")
        self._create_script.extend(None if s == "ok" else s for s in steps)

    def finish(self, task_id: str, outcome: str) -> None:
        """End a task now with `outcome` ("SUCCEEDED", "FAILED" or "CANCELLED"), whatever its
        state (an ended task is ended again)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}")
        task = self.tasks[task_id]
        now = time.time()
        self._advance(now)
        self._end(task, outcome, now)

    def expire_outputs(self, task_id: str | None = None) -> int:
        """Expire every output URL handed out so far (of one task, or of all); returns how
        many. A later read of the task hands out fresh ones."""
        count = 0
        for grant in self._grants.values():
            if (task_id is None or grant.task_id == task_id) and not grant.expired:
                grant.expired = True
                count += 1
        return count

    def reset_daily_cap(self) -> None:
        """Forget the creates counted against the daily cap."""
        self._daily.clear()

    def media_bytes(self, task_id: str, index: int = 0) -> bytes:
        """The bytes served for output `index` of a task."""
        size = self.config.media_bytes
        key = (task_id, index, size)
        cached = self._media_cache.get(key)
        if cached is None:
            cached = self._media_cache[key] = media_bytes_for(f"{task_id}/{index}", size)
        return cached

    def daily_count(self, model: str) -> int:
        """Creates of `model` counted against the daily cap now."""
        return len(self._live_daily(model, time.time()))

    def view(self, task_id: str) -> dict[str, Any]:
        """What GET /v1/tasks/{id} would answer now (minting output URLs)."""
        now = time.time()
        self._advance(now)
        return self._task_body(self.tasks[task_id], now, self.base_url or "")

    async def close(self) -> None:
        """Cancel pending `hang_then_create` work."""
        tasks = list(self._spawned)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application()
        r = app.router
        r.add_get("/v1/tasks/{task_id}", self.get_task)
        r.add_delete("/v1/tasks/{task_id}", self.delete_task)
        r.add_get("/v1/organization", self.get_organization)
        r.add_post("/v1/{endpoint:.+}", self.create)
        r.add_get("/cdn/{task_id}/{index:\\d+}.mp4", self.media)
        app.on_cleanup.append(self._cleanup)
        return app

    async def _cleanup(self, _app: web.Application) -> None:
        await self.close()

    # ---- the queues (all timing is computed from elapsed time) ----

    def _advance(self, now: float) -> None:
        """Play every start and end up to `now`, per model, in time order."""
        limit = self.config.concurrency
        for queue in self._queues.values():
            while True:
                ending = min(queue.running, key=RunwayTask.ends_at, default=None)
                end_at = ending.ends_at() if ending is not None else math.inf
                head = (queue.waiting[0] if queue.waiting
                        and (limit is None or len(queue.running) < limit) else None)
                start_at = max(head.ready_at, queue.clock) if head is not None else math.inf
                if min(end_at, start_at) > now:
                    break
                if ending is not None and end_at <= start_at:
                    self._end(ending, ending.outcome, end_at)
                else:
                    assert head is not None
                    queue.waiting.pop(0)
                    head.started = start_at
                    queue.running.append(head)
                    queue.clock = max(queue.clock, start_at)

    def _end(self, task: RunwayTask, outcome: str, at: float) -> None:
        """End `task` at `at` with `outcome` and settle its cost."""
        queue = self._queues.get(task.model)
        if queue is not None:
            if task in queue.running:
                queue.running.remove(task)
            if task in queue.waiting:
                queue.waiting.remove(task)
            queue.clock = max(queue.clock, at)
        ran = task.started is not None
        task.ended = at
        task.end_status = outcome
        task.cost_credits = (task.estimated_credits if outcome == "SUCCEEDED"
                             or (outcome == "CANCELLED" and ran) else 0)

    def _live_daily(self, model: str, now: float) -> list[float]:
        stamps = [t for t in self._daily.get(model, []) if t > now - DAY_S]
        self._daily[model] = stamps
        return stamps

    # ---- creating ----

    def _new_id(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def _record(self, endpoint: str, body: dict[str, Any], model: str,
                estimated: int) -> RunwayTask:
        """Create (bill) a task. Never awaits."""
        cfg = self.config
        now = time.time()
        mix = {k: w for k, w in cfg.outcome_mix.items() if k in OUTCOMES and w > 0}
        if not mix:
            raise ValueError(f"outcome_mix needs a positive weight on one of {OUTCOMES}")
        outcome = self.rng.choices(list(mix), weights=list(mix.values()))[0]
        processing = cfg.processing_s + (self.rng.uniform(0, cfg.jitter_s)
                                         if cfg.jitter_s > 0 else 0.0)
        self._seq += 1
        task = RunwayTask(
            id=self._new_id(), seq=self._seq, endpoint=endpoint, body=body, model=model,
            created=now, ready_at=now + max(0.0, cfg.pending_s), processing_s=processing,
            outcome=outcome, estimated_credits=estimated, failure=cfg.failure,
            failure_code=cfg.failure_code)
        task.advance = lambda: self._advance(time.time())
        self._advance(now)
        self.tasks[task.id] = task
        self._queues.setdefault(model, ModelQueue(clock=now)).waiting.append(task)
        self._billed.append((task.id, body))
        self._daily.setdefault(model, []).append(now)
        return task

    def _next_fault(self) -> str | None:
        return self._create_script.popleft() if self._create_script else None

    def _estimate(self, endpoint: str, body: dict[str, Any]) -> int:
        source = body.get("input") if endpoint == "generate/video" else body
        duration = source.get("duration") if isinstance(source, dict) else None
        seconds = (duration if isinstance(duration, int | float)
                   and not isinstance(duration, bool) and duration > 0 else 5)
        return max(1, math.ceil(self.config.credits_per_second * seconds))

    def _validate(self, endpoint: str, body: Any) -> list[dict[str, Any]]:
        """Validation issues of a create body (empty: valid)."""
        if not isinstance(body, dict):
            return [{"expected": "object", "code": "invalid_type", "path": [],
                     "message": f"Invalid input: expected object, received {json_type(body)}"}]
        issues: list[dict[str, Any]] = []
        for name, types, expected in REQUIRED_FIELDS.get(endpoint, ()):
            value = body.get(name)
            if not isinstance(value, types):
                got = "undefined" if name not in body else json_type(value)
                issues.append({"expected": expected, "code": "invalid_type", "path": [name],
                               "message": f"Invalid input: expected {expected}, received {got}"})
        model = body.get("model")
        if (self.config.models is not None and endpoint != "generate/video"
                and isinstance(model, str) and model not in self.config.models):
            issues.append({"code": "invalid_union", "errors": [],
                           "note": "No matching discriminator", "discriminator": "model",
                           "path": ["model"], "message": "Invalid input"})
        return issues

    def _created_body(self, task: RunwayTask) -> dict[str, Any]:
        if task.endpoint == "generate/video":
            source = task.body.get("input")
            given = source if isinstance(source, dict) else {}
            duration = given.get("duration")
            return {"id": task.id, "routing": {
                "configId": task.body.get("configId"),
                "estimatedCost": {"credits": task.estimated_credits},
                "model": task.model, "provider": "runway",
                "resolvedInput": {
                    "duration": duration if isinstance(duration, int | float) else 5,
                    "ratio": "1280:720", "resolution": "720p"},
                "resolvedSettings": {"optimizeFor": "quality", "priceCeiling": None}}}
        return {"id": task.id, "estimatedCost": {"credits": task.estimated_credits}}

    def _daily_cap_answer(self) -> web.Response:
        response = runway_error(429, DAILY_CAP_MESSAGE)
        if self.config.daily_cap_retry_after_s is not None:
            response.headers["Retry-After"] = f"{self.config.daily_cap_retry_after_s:g}"
        return response

    def _server_error(self) -> web.Response:
        status = self.config.fivexx_status
        return runway_error(status, SERVER_MESSAGES.get(status, "An unexpected error occurred."))

    # ---- auth ----

    async def _enter(self, request: web.Request) -> web.Response | None:
        """Latency, then the API key, then the version header; None when both pass."""
        if self.config.latency_s > 0:
            await asyncio.sleep(self.config.latency_s)
        header = request.headers.get("Authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(
                key.strip().encode(), self.config.api_key.encode()):
            return runway_error(401, INVALID_KEY_MESSAGE)
        version = request.headers.get("X-Runway-Version")
        if version is None:
            return runway_error(400, MISSING_VERSION_MESSAGE, docUrl=DOC_URL)
        if version not in self.config.versions:
            return runway_error(400, BAD_VERSION_MESSAGE, docUrl=DOC_URL)
        return None

    # ---- handlers ----

    async def create(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/{endpoint}: validate, check the daily cap, then create under the next
        scripted fault."""
        endpoint = request.match_info["endpoint"]
        if endpoint not in self.config.endpoints:
            early = await self._enter(request)
            return early or runway_error(404, "Not found")
        self.create_posts += 1
        early = await self._enter(request)
        if early is not None:
            return early
        try:
            body = await request.json()
        except ValueError:
            body = None
        issues = self._validate(endpoint, body)
        if issues:
            return runway_error(400, "Validation of body failed", issues=issues,
                                docUrl=DOC_URL)
        assert isinstance(body, dict)
        model = self.config.router_model if endpoint == "generate/video" else body["model"]
        cap = self.config.daily_cap
        if cap is not None and len(self._live_daily(model, time.time())) >= cap:
            return self._daily_cap_answer()
        estimated = self._estimate(endpoint, body)
        fault = self._next_fault()
        if fault == "5xx_before":
            return self._server_error()
        if fault == "429":
            return self._daily_cap_answer()
        if fault == "hang_then_create":
            # The server goes on after the client gave up: the create runs in a task of its
            # own, which a disconnect (cancelling this handler) does not cancel.
            pending = self._spawn(self._create_later(endpoint, body, model, estimated))
            late: RunwayTask = await asyncio.shield(pending)
            return web.json_response(self._created_body(late))
        task = self._record(endpoint, body, model, estimated)  # billed before any await
        if fault == "lose_reply":
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=200)  # written to a closed connection: never arrives
        if fault == "5xx_after":
            return self._server_error()
        if fault == "hang":
            await asyncio.sleep(self.config.hang_s)
        return web.json_response(self._created_body(task))

    async def _create_later(self, endpoint: str, body: dict[str, Any], model: str,
                            estimated: int) -> RunwayTask:
        await asyncio.sleep(self.config.hang_s)
        return self._record(endpoint, body, model, estimated)

    def _spawn(self, coro: Coroutine[Any, Any, RunwayTask]) -> asyncio.Task[RunwayTask]:
        task = asyncio.get_running_loop().create_task(coro)
        self._spawned.add(task)
        task.add_done_callback(self._spawned.discard)
        return task

    def _visible(self, task_id: str) -> RunwayTask | None:
        task = self.tasks.get(task_id)
        return None if task is None or task.deleted else task

    def _output_urls(self, task: RunwayTask, now: float, origin: str) -> list[str]:
        """Fresh signed URLs (a new `_jwt` each) for every output of a task."""
        urls = []
        for index in range(max(0, self.config.output_count)):
            jti = secrets.token_hex(12)
            path = f"/cdn/{task.id}/{index}.mp4"
            token = jwt.encode({"sub": path, "jti": jti, "iat": int(now),
                                "exp": int(now + self.config.output_ttl_s)},
                               self._jwt_key, algorithm="HS256")
            self._grants[jti] = Grant(task.id, index)
            urls.append(f"{origin}{path}?_jwt={token}")
        return urls

    def _task_body(self, task: RunwayTask, now: float, origin: str) -> dict[str, Any]:
        status = task.status_at(now)
        body: dict[str, Any] = {"id": task.id, "createdAt": iso_ms(task.created),
                                "status": status}
        if status in ACTIVE:
            if status == "RUNNING":
                body["progress"] = task.progress_at(now)
            body["estimatedCost"] = {"credits": task.estimated_credits}
            return body
        if status == "SUCCEEDED":
            body["output"] = self._output_urls(task, now, origin)
        elif status == "FAILED":
            body["failure"] = task.failure
            body["failureCode"] = task.failure_code
        body["cost"] = {"credits": task.cost_credits or 0}
        return body

    async def get_task(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/tasks/{id}."""
        self.status_reads += 1
        early = await self._enter(request)
        if early is not None:
            return early
        if self.status_5xx > 0:
            self.status_5xx -= 1
            return self._server_error()
        task = self._visible(request.match_info["task_id"])
        if task is None:
            return runway_error(404, NOT_FOUND_MESSAGE)
        now = time.time()
        self._advance(now)
        return web.json_response(
            self._task_body(task, now, f"{request.scheme}://{request.host}"))

    async def delete_task(self, request: web.Request) -> web.StreamResponse:
        """DELETE /v1/tasks/{id}: cancel an active task, delete an ended one; 204."""
        self.delete_requests += 1
        early = await self._enter(request)
        if early is not None:
            return early
        task = self._visible(request.match_info["task_id"])
        if task is None:
            return runway_error(404, NOT_FOUND_MESSAGE)
        now = time.time()
        self._advance(now)
        if task.status_at(now) in ACTIVE:
            self._end(task, "CANCELLED", now)
            task.deleted = self.config.cancel_deletes
        else:
            task.deleted = True
        return web.Response(status=204)

    async def get_organization(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/organization: tier limits and daily usage per model."""
        early = await self._enter(request)
        if early is not None:
            return early
        now = time.time()
        self._advance(now)
        models = sorted({*(self.config.models or ()), *(t.model for t in self.tasks.values())})
        held = sum((t.cost_credits or 0) if t.end_status is not None else t.estimated_credits
                   for t in self.tasks.values())
        return web.json_response({
            "creditBalance": self.config.credit_balance - held,
            "tier": {"maxMonthlyCreditSpend": self.config.max_monthly_credit_spend,
                     "models": {m: {"maxConcurrentGenerations": self.config.concurrency,
                                    "maxDailyGenerations": self.config.daily_cap}
                                for m in models}},
            "usage": {"models": {m: {"dailyGenerations": len(self._live_daily(m, now))}
                                 for m in models}}})

    def _grant_valid(self, token: str | None, path: str) -> bool:
        if not token:
            return False
        try:
            claims = jwt.decode(token, self._jwt_key, algorithms=["HS256"])
        except jwt.InvalidTokenError:
            return False
        grant = self._grants.get(str(claims.get("jti")))
        return grant is not None and not grant.expired and claims.get("sub") == path

    async def media(self, request: web.Request) -> web.StreamResponse:
        """GET/HEAD /cdn/{task}/{n}.mp4?_jwt=...: the signature is the only credential."""
        path = request.path
        valid = self._grant_valid(request.query.get("_jwt"), path)
        task = self.tasks.get(request.match_info["task_id"])
        index = int(request.match_info["index"])
        response: web.Response
        if not valid:
            response = web.Response(status=403, text=ACCESS_DENIED_XML,
                                    content_type="application/xml")
        elif task is None or task.end_status != "SUCCEEDED":
            response = web.Response(status=404, content_type="application/xml", text=(
                '<?xml version="1.0" encoding="UTF-8"?>\n'
                "<Error><Code>NoSuchKey</Code><Message>The specified key does not exist."
                "</Message></Error>"))
        else:
            response = serve_bytes(request, self.media_bytes(task.id, index))
        self.media_reads.append(MediaRead(
            path=path, method=request.method, valid=valid, status=response.status,
            range=request.headers.get("Range"),
            authorization="Authorization" in request.headers))
        return response


async def start_fake_runway(fake: FakeRunway, host: str = "127.0.0.1",
                            port: int = 0) -> tuple[web.AppRunner, str]:
    """Serve `fake` on `host:port` (0: any free port); returns the runner and its base URL
    (no trailing slash, no /v1)."""
    # handler_cancellation: a client that gives up ends its request here too (the fault
    # paths create before awaiting, or in a shielded task, so billing survives that).
    runner = web.AppRunner(fake.app(), access_log=None, handler_cancellation=True,
                           shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    url = f"http://{host}:{bound}"
    fake.base_url = url
    return runner, url
