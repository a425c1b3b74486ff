"""A stand-in for Kling's official API (video tasks), served by aiohttp on loopback.

Written from Kling's own documentation, not from vidpoll's client, so the client is tested
against Kling's behaviour rather than against its own expectations. Kling publishes no Python
SDK; its docs give a PyJWT sample for the token and plain HTTP calls. Tags: [D] documented,
[O] observed in public transcripts or third-party material, [A] an assumption of this fake.

Sources
- GEN: Kling "General Information" (app.klingai.com/global/dev/document-api/apiReference/
  commonInfo, now kling.ai/document-api/apiReference/commonInfo), read in two copies: the docs
  site's own bundle `s16-kling.klingai.com/kos/s101/nlav112918/api-doc/assets/en-Dyq2OaES.js`
  (extracted in a public repository) and the page mirror
  m-macmini.tail568a50.ts.net/youtube-automation/samples/kling-api/pages/apiReference_commonInfo.html.
  It names the API domain `https://api-singapore.klingai.com` ("The API endpoint for the new
  system has been updated from https://api.klingai.com to https://api-singapore.klingai.com.
  This API is suitable for users whose servers are located outside of China."), the PyJWT
  token sample, and the error-code table (HTTP status, service code).
- VID: "Video Generation - Text to Video" / "Image to Video" (copy in artykrd/ai-bot-misha
  docs/kling_api.md at a7b6213, 2025-12-12; and a newer kling.ai copy of Image to Video:
  durations 3..15, `final_unit_deduction`, models up to kling-v3).
- CB: "Callback Protocol" (mirror .../pages/apiReference_callbackProtocol.html).
- RATE: "Concurrency Rules" (rateLimits): the 1303 body
  `{"code": 1303, "message": "parallel task over resource pack limit", "request_id": <uuid>}`.
- OBS: QuantumNous/new-api#2532, a real answer for a failed task: `"message": "SUCCEED"`, a
  UUID `request_id`, an 18-digit `task_id`, `task_info: {}` and `task_result: {}`.
- PROV: PROVIDERS.md (project notes) section 7 and "Updates (2026-12-06)".

Behaviour and its basis
- Auth [D GEN]: every request carries `Authorization: Bearer <JWT>`, HS256, `iss` = access
  key, `exp`, `nbf`, signed with the secret key. Refusals are HTTP 401 in Kling's envelope
  `{"code", "message", "request_id"}`: 1001 "Authorization is empty" (no header, or `Bearer`
  with nothing after it), 1002 "Authorization is invalid" (not a JWT, not Bearer, bad
  signature, unknown `iss`, not HS256, no `exp`), 1003 not yet valid (`nbf`/`iat` ahead),
  1004 expired [D: codes and texts; which fault gives which code beyond the texts is A].
  No leeway (`token_leeway_s`) [A]. Each access key is its own account [A]; extra ones in
  `extra_accounts`. `reject_tokens_issued_before(epoch)` and `expire_seen_tokens()` make
  tokens answer 1004 as if the server's clock had passed them [A: a test hook].
- Envelope [D VID]: `{"code": 0, "message": "SUCCEED" [O OBS], "request_id": <uuid> [O],
  "data": ...}`. Errors use the table's HTTP status and code [D GEN], the table's explanation
  as message [A], except 1303's documented message [D RATE].
- `POST /v1/videos/{endpoint}` for `endpoint` in `config.endpoints` (default text2video,
  image2video) [D VID]. Checked [D VID]: a JSON object (else 400/1200); `prompt` required
  for text2video unless `multi_shot` is true, at most 2500 characters, as `negative_prompt`;
  `cfg_scale` in [0, 1]; `mode` std|pro; `aspect_ratio` 16:9|9:16|1:1 (text2video);
  `duration` "3".."15"; image2video needs `image` or `image_tail`; others 400/1201 [D code,
  A message]. A `model_name` outside `config.models` answers 404/1203 ("The requested
  resource does not exist, such as the model") [D]. `callback_url` and `external_task_id`
  given as "" count as absent [D: the docs' examples send ""]; no length or charset rule for
  `external_task_id` is documented, so none is enforced [A]. Other fields are kept, not
  checked [A]. Answer `data: {task_id, task_status: "submitted", task_info:
  {external_task_id}, created_at, updated_at}` (ms) [D VID]; `task_info` is `{}` without an
  external id [O OBS]; `task_id` is 18 digits [O OBS].
- A repeated `external_task_id` in one account: the docs say it "must be unique within a
  single user account" [D VID] but not what the server answers [PROV]. `repeated_external_id`:
  "refuse" (default) answers 400/1201 "external_task_id already exists" [A], nothing billed;
  "accept" creates and bills a second task (a lookup then finds the newest) [A];
  "return_existing" answers the existing task's data, not billed [A]. Uniqueness spans the
  account's endpoints [A]. The check runs when the task would be created (so also after a
  `hang_then_create`) [A].
- `concurrency_limit`: a create while that many tasks of the account are submitted or
  processing answers 429/1303 [D RATE], nothing billed.
- `GET /v1/videos/{endpoint}/{id}`, `id` a task_id or an external_task_id [D VID, PROV]:
  `data: {task_id, task_status: submitted|processing|succeed|failed, task_status_msg,
  task_info, task_result: {videos: [{id, url, duration}]}, created_at, updated_at}` [D VID],
  plus `final_unit_deduction` once ended [D VID newer copy; value A]. `task_result` is `{}`
  until success [O OBS for failed]. Unknown id, another account's task, or a task of another
  endpoint: `not_found_status`/`not_found_code` (default 404/1203) [A: the table's code for a
  missing resource; Kling's real answer is undocumented]. Timing [A]: "submitted" for
  `queue_s`, then "processing" for `processing_s` + uniform(0, `jitter_s`) (seeded), computed
  from elapsed time at each read; the outcome is drawn from `outcome_mix` (seeded); failed
  tasks carry a `failure_messages` text [A; OBS saw "Image pixel is invalid"]. `finish()`
  ends a task now.
- `GET /v1/videos/{endpoint}?pageNum=&pageSize=` [D VID: ranges [1, 1000] and [1, 500],
  defaults 1 and 30]: `data: [task, ...]` of the account and endpoint, newest first [A order];
  out of range: 400/1201 [A].
- Media [D VID: "generated images/videos will be cleared after 30 days"]: the video URL is
  `{origin}/cdn/{task_id}/video.mp4` on this app (a stand-in for Kling's CDN), public [O: the
  docs' example URLs carry no credential], GET/HEAD with a single Range (206) [A], and 404
  [A] once `expire_media()` was called for it or `media_retention_s` after the task ended.
- Callbacks [D CB]: with a `callback_url`, the task object itself (no envelope) is POSTed on
  status changes; which changes (`callback_statuses`, default processing and the end) and the
  retries (`callback_retry_delays_s` on a non-2xx or network error) are A; no signature is
  documented. Attempts are kept in `callbacks`.
- Faults (none by default), per create, from `script_creates([...])` (None or "ok" = normal):
  `lose_reply` (created and billed, then the connection drops), `5xx_after` (created, then
  `fivexx_status` 500/503/504 with code 5000/5001/5002 [D GEN]), `5xx_before` (the same,
  nothing created), `hang` (created at once, answer held `hang_s`), `hang_then_create` (held
  `hang_s`, created only then, even if the client has gone), `429` (429/1302, nothing
  created), `code_under_200` (HTTP 200 with code `code_under_200`, default 5000, nothing
  created [A: "code != 0 is an error even under HTTP 200"]). Single-task reads, from
  `script_reads([...])`: `5xx`, `429`, `code_under_200`. A create is recorded (billed) before
  any await a client disconnect could cancel, or in a shielded task.
- Paths under /v1 that match no route, or a method a route does not take, answer 404/1202
  ("The requested method is invalid") [D code; A for unknown paths].
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import random
import time
import uuid
import warnings
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from typing import Any, Literal

import aiohttp
import jwt
from aiohttp import web

from vidpoll.providers.veo.fake import serve_app, serve_bytes, video_bytes_for

log = logging.getLogger(__name__)

GLOBAL_BASE_URL = "https://api-singapore.klingai.com"
"""Kling's documented API domain for servers outside China [D GEN]."""
LEGACY_BASE_URL = "https://api.klingai.com"
"""The domain the docs say the new system moved away from [D GEN]."""
DEFAULT_ACCESS_KEY = "AKfake-vidpoll-kling-0123456789abcdef"
DEFAULT_SECRET_KEY = "SKfake-vidpoll-kling-secret-0123456789abcdef-0123456789"
"""At least 32 bytes: PyJWT warns about shorter HS256 keys."""
DEFAULT_ENDPOINTS = ("text2video", "image2video")
DEFAULT_MODELS = ("kling-v1", "kling-v1-5", "kling-v1-6", "kling-v2-master", "kling-v2-1",
                  "kling-v2-1-master", "kling-v2-5-turbo", "kling-v2-6", "kling-v3")
OUTCOMES = ("succeed", "failed")
STATUSES = ("submitted", "processing", "succeed", "failed")
ENDED = frozenset(OUTCOMES)
CREATE_FAULTS = ("lose_reply", "5xx_after", "5xx_before", "hang", "hang_then_create", "429",
                 "code_under_200")
READ_FAULTS = ("5xx", "429", "code_under_200")
RepeatedExternalId = Literal["refuse", "accept", "return_existing"]
SUCCEED_MESSAGE = "SUCCEED"
DEFAULT_FAILURE_MESSAGE = "Failure to pass the risk control system"
REPEATED_EXTERNAL_ID_MESSAGE = "external_task_id already exists"
THIRTY_DAYS_S = 30 * 24 * 3600.0
MAX_PROMPT_CHARS = 2500
DURATIONS = frozenset(str(n) for n in range(3, 16))
PAGE_NUM_RANGE = (1, 1000)
PAGE_SIZE_RANGE = (1, 500)

CODE_STATUS: dict[int, int] = {
    1000: 401, 1001: 401, 1002: 401, 1003: 401, 1004: 401,
    1100: 429, 1101: 429, 1102: 429, 1103: 403,
    1200: 400, 1201: 400, 1202: 404, 1203: 404,
    1300: 400, 1301: 400, 1302: 429, 1303: 429, 1304: 429,
    5000: 500, 5001: 503, 5002: 504,
}
"""Service code -> HTTP status, from Kling's error-code table [D GEN]."""
CODE_MESSAGES: dict[int, str] = {
    1000: "Authentication failed",
    1001: "Authorization is empty",
    1002: "Authorization is invalid",
    1003: "Authorization is not yet valid",
    1004: "Authorization has expired",
    1100: "Account exception",
    1101: "Account in arrears (postpaid scenario)",
    1102: "Resource pack depleted or expired (prepaid scenario)",
    1103: "Unauthorized access to requested resource, such as API/model",
    1200: "Invalid request parameters",
    1201: "Invalid parameters, such as incorrect key or illegal value",
    1202: "The requested method is invalid",
    1203: "The requested resource does not exist, such as the model",
    1300: "Trigger strategy of the platform",
    1301: "Trigger the content security policy of the platform",
    1302: "The API request is too fast, exceeding the platform's rate limit",
    1303: "parallel task over resource pack limit",
    1304: "Trigger the platform's IP whitelisting policy",
    5000: "Server internal error",
    5001: "Server temporarily unavailable, usually due to maintenance",
    5002: "Server internal timeout, usually due to a backlog",
}
"""The table's explanations [D GEN], 1303's documented message [D RATE]."""
SERVER_CODES = {500: 5000, 503: 5001, 504: 5002}


def kling_error(code: int, message: str | None = None, status: int | None = None
                ) -> web.Response:
    """Kling's error envelope with the table's HTTP status for `code`."""
    body = {"code": code, "message": message or CODE_MESSAGES.get(code, "error"),
            "request_id": str(uuid.uuid4())}
    return web.json_response(body, status=status or CODE_STATUS.get(code, 400))


def kling_ok(data: Any) -> web.Response:
    """Kling's success envelope around `data`."""
    return web.json_response({"code": 0, "message": SUCCEED_MESSAGE,
                              "request_id": str(uuid.uuid4()), "data": data})


def ms(t: float) -> int:
    """Unix seconds as Kling writes times: integer milliseconds."""
    return int(t * 1000)


# ---- configuration and state ----

@dataclass
class KlingFakeConfig:
    """The fake's knobs; mutable while it runs."""

    endpoints: tuple[str, ...] = DEFAULT_ENDPOINTS
    models: tuple[str, ...] | None = DEFAULT_MODELS
    """Accepted `model_name` values; None accepts any."""
    queue_s: float = 0.1
    """Time a task stays "submitted" before "processing"."""
    processing_s: float = 1.0
    jitter_s: float = 0.0
    """Each task processes processing_s + uniform(0, jitter_s) (seeded)."""
    seed: int | None = 0
    outcome_mix: dict[str, float] = field(default_factory=lambda: {"succeed": 1.0})
    """Weights of OUTCOMES ("succeed", "failed"), drawn per task (seeded)."""
    failure_messages: tuple[str, ...] = (DEFAULT_FAILURE_MESSAGE,)
    unit_deduction: str = "1"
    """`final_unit_deduction` of a succeeded task (a failed one: "0")."""
    video_duration: str = "5"
    """A video's `duration` when the body names none (the documented default)."""
    hang_s: float = 30.0
    """How long `hang` holds its answer and `hang_then_create` works before it creates."""
    fivexx_status: int = 500
    """HTTP status of the 5xx faults: 500, 503 or 504 (codes 5000, 5001, 5002)."""
    code_under_200: int = 5000
    """The non-zero code the `code_under_200` faults answer under HTTP 200."""
    repeated_external_id: RepeatedExternalId = "refuse"
    concurrency_limit: int | None = None
    not_found_status: int = 404
    not_found_code: int = 1203
    media_retention_s: float = THIRTY_DAYS_S
    media_base_url: str | None = None
    """Origin written into video URLs; None: this fake's own origin."""
    file_bytes: int = 64 * 1024
    extra_accounts: dict[str, str] = field(default_factory=dict)
    """More access key -> secret key pairs, each an account of its own."""
    token_leeway_s: float = 0.0
    nbf_lead_s: float = 5.0
    """A token without `iat` counts as issued at `nbf` + this (the docs' sample sets nbf five
    seconds before it mints)."""
    callback_statuses: tuple[str, ...] = ("processing", "succeed", "failed")
    callback_retry_delays_s: tuple[float, ...] = (0.1, 0.5)
    callback_timeout_s: float = 5.0


@dataclass
class FakeTask:
    """One video task: what was asked, by whom, and when and how it ends."""

    task_id: str
    endpoint: str
    body: dict[str, Any]
    """The create's JSON body as received."""
    external_task_id: str | None
    access_key: str
    created: float
    queue_s: float
    run_s: float
    outcome: str
    status_msg: str
    video_id: str
    duration: str
    callback_url: str | None
    origin: str
    seq: int
    finished_at: float | None = None
    media_expired: bool = False
    changed: asyncio.Event | None = None

    @property
    def created_at(self) -> int:
        """Creation time in ms, as Kling reports it."""
        return ms(self.created)

    @property
    def processing_at(self) -> float:
        return self.created + self.queue_s

    @property
    def done_at(self) -> float:
        if self.finished_at is not None:
            return self.finished_at
        return self.processing_at + self.run_s

    def status(self, now: float) -> str:
        if now >= self.done_at:
            return self.outcome
        if now >= self.processing_at:
            return "processing"
        return "submitted"

    def updated(self, now: float) -> float:
        """When the status last changed."""
        status = self.status(now)
        if status in ENDED:
            return self.done_at
        return self.processing_at if status == "processing" else self.created


@dataclass
class CallbackAttempt:
    """One POST of a task to its callback_url (kept for tests)."""

    task_id: str
    url: str
    task_status: str
    attempt: int
    status: int | None
    error: str | None = None


class FakeKling:
    """The fake's state and handlers; serve it with start_fake_kling()."""

    def __init__(self, config: KlingFakeConfig | None = None,
                 access_key: str = DEFAULT_ACCESS_KEY,
                 secret_key: str = DEFAULT_SECRET_KEY) -> None:
        self.config = config or KlingFakeConfig()
        self.access_key = access_key
        self.secret_key = secret_key
        self.rng = random.Random(self.config.seed)
        self.tasks: dict[str, FakeTask] = {}
        """task_id -> task, every task created (billed)."""
        self.tokens_seen: list[dict[str, Any]] = []
        """Claims of every distinct well-formed JWT received, in the order first seen."""
        self.callbacks: list[CallbackAttempt] = []
        self.create_posts = 0
        """POSTs to a create path, whatever their answer."""
        self.status_reads = 0
        """GETs of a single task, whatever their answer."""
        self.list_reads = 0
        self.media_reads = 0
        self.base_url: str | None = None
        """Set by start_fake_kling(): the origin the fake is served on."""
        self._billed: list[tuple[str, dict[str, Any]]] = []
        self._stats: Counter[str] = Counter()
        self._create_script: deque[str | None] = deque()
        self._read_script: deque[str | None] = deque()
        self._token_digests: set[str] = set()
        self._revoked_digests: set[str] = set()
        self._revoked_before: float | None = None
        self._bg: set[asyncio.Task[Any]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._seq = 0

    # ---- inspection and scripting (no HTTP) ----

    def billed(self) -> list[tuple[str, dict[str, Any]]]:
        """(task_id, create body) of every create that billed, in order."""
        return list(self._billed)

    def stats(self) -> dict[str, int]:
        """Counts: create_posts, status_reads, list_reads, media_reads, creates, unauthorized,
        callbacks_sent, callbacks_failed, fault_<name>..."""
        return {"create_posts": self.create_posts, "status_reads": self.status_reads,
                "list_reads": self.list_reads, "media_reads": self.media_reads,
                **dict.fromkeys(("creates", "unauthorized", "callbacks_sent",
                                 "callbacks_failed"), 0),
                **self._stats}

    def script_creates(self, steps: Iterable[str | None]) -> None:
        """Queue what the next creates do: None/"ok" or one of CREATE_FAULTS, in order."""
        steps = list(steps)
        unknown = {s for s in steps if s not in (None, "ok", *CREATE_FAULTS)}
        if unknown:
            raise ValueError(f"unknown create steps: {sorted(map(str, unknown))}")
        self._create_script.extend(None if s == "ok" else s for s in steps)

    def script_reads(self, steps: Iterable[str | None]) -> None:
        """Queue what the next single-task reads do: None/"ok" or one of READ_FAULTS."""
        steps = list(steps)
        unknown = {s for s in steps if s not in (None, "ok", *READ_FAULTS)}
        if unknown:
            raise ValueError(f"unknown read steps: {sorted(map(str, unknown))}")
        self._read_script.extend(None if s == "ok" else s for s in steps)

    def finish(self, task_id: str, outcome: str, message: str | None = None) -> None:
        """End a running task now with "succeed" or "failed" (and its task_status_msg)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}")
        task = self.tasks[task_id]
        now = time.time()
        if task.status(now) in ENDED:
            raise ValueError(f"task {task_id} has already ended ({task.outcome})")
        task.outcome = outcome
        if message is not None:
            task.status_msg = message
        task.finished_at = now
        if task.changed is not None:
            task.changed.set()

    def expire_media(self, task_id: str | None = None) -> None:
        """Clear the video of one task (or of every task): its URL answers 404 from now on."""
        for task in ([self.tasks[task_id]] if task_id is not None else self.tasks.values()):
            task.media_expired = True

    def reject_tokens_issued_before(self, epoch: float) -> None:
        """From now on, answer 1004 to tokens issued before `epoch` (their `iat`, else `nbf`
        + `nbf_lead_s`), as a server whose clock has passed them would. Tokens minted by the
        docs' sample carry whole seconds, so one minted in the same second as `epoch` is also
        refused."""
        self._revoked_before = epoch

    def expire_seen_tokens(self) -> None:
        """From now on, answer 1004 to every token received so far (new ones pass)."""
        self._revoked_digests |= self._token_digests

    def task_by_external_id(self, external_task_id: str,
                            access_key: str | None = None) -> FakeTask | None:
        """The newest task of the account with that external_task_id, if any."""
        return self._by_external(access_key or self.access_key, external_task_id)

    def view(self, task_id: str) -> dict[str, Any]:
        """What a GET of this task would hold in `data` now."""
        return self._data(self.tasks[task_id], time.time())

    def video_bytes(self, task_id: str) -> bytes:
        """The bytes served for a task's video (deterministic)."""
        return video_bytes_for(task_id, self.config.file_bytes)

    def media_url(self, task_id: str) -> str:
        task = self.tasks[task_id]
        return f"{self._media_origin(task)}/cdn/{task_id}/video.mp4"

    async def close(self) -> None:
        """Cancel pending callbacks and creates; close the callback client."""
        pending = list(self._bg)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application(middlewares=[self._unrouted])
        r = app.router
        r.add_post("/v1/videos/{endpoint}", self.create)
        r.add_get("/v1/videos/{endpoint}", self.list_tasks)
        r.add_get("/v1/videos/{endpoint}/{id}", self.get_task)
        r.add_get("/cdn/{task_id}/video.mp4", self.media)
        app.on_cleanup.append(self._cleanup)
        return app

    # ---- plumbing ----

    async def _cleanup(self, _app: web.Application) -> None:
        await self.close()

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)
        return task

    @web.middleware
    async def _unrouted(self, request: web.Request,
                        handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                        ) -> web.StreamResponse:
        """Kling's envelope for /v1 paths no route takes (404/405 from aiohttp)."""
        try:
            return await handler(request)
        except (web.HTTPNotFound, web.HTTPMethodNotAllowed):
            if request.path.startswith("/v1/"):
                return kling_error(1202)
            raise

    def _accounts(self) -> dict[str, str]:
        return {**self.config.extra_accounts, self.access_key: self.secret_key}

    @staticmethod
    def _origin(request: web.Request) -> str:
        return f"{request.scheme}://{request.host}"

    def _media_origin(self, task: FakeTask) -> str:
        return (self.config.media_base_url or task.origin).rstrip("/")

    # ---- auth ----

    def _refuse(self, code: int) -> web.Response:
        self._stats["unauthorized"] += 1
        return kling_error(code)

    def _authorize(self, request: web.Request) -> str | web.Response:
        """The caller's access key, or Kling's 401 answer."""
        header = request.headers.get("Authorization", "").strip()
        if not header:
            return self._refuse(1001)
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer":
            return self._refuse(1002)
        if not token:
            return self._refuse(1001)
        try:
            claims = jwt.decode(token, options={"verify_signature": False})
        except jwt.InvalidTokenError:
            return self._refuse(1002)
        digest = hashlib.sha256(token.encode()).hexdigest()
        if digest not in self._token_digests:
            self._token_digests.add(digest)
            self.tokens_seen.append(dict(claims))
        issuer = claims.get("iss")
        if not isinstance(issuer, str) or issuer not in self._accounts():
            return self._refuse(1002)
        secret = self._accounts()[issuer]
        try:
            with warnings.catch_warnings():
                # A short secret is the account's business, not a reason to warn here.
                warnings.simplefilter("ignore", jwt.InsecureKeyLengthWarning)
                jwt.decode(token, secret, algorithms=["HS256"],
                           options={"require": ["exp"]}, leeway=self.config.token_leeway_s)
        except jwt.ExpiredSignatureError:
            return self._refuse(1004)
        except jwt.ImmatureSignatureError:
            return self._refuse(1003)
        except jwt.InvalidTokenError:
            return self._refuse(1002)
        if digest in self._revoked_digests or self._issued_too_early(claims):
            return self._refuse(1004)
        return issuer

    def _issued_too_early(self, claims: dict[str, Any]) -> bool:
        if self._revoked_before is None:
            return False
        iat, nbf = claims.get("iat"), claims.get("nbf")
        if isinstance(iat, int | float):
            issued = float(iat)
        elif isinstance(nbf, int | float):
            issued = float(nbf) + self.config.nbf_lead_s
        else:
            return True
        return issued < self._revoked_before

    # ---- the task object ----

    def _data(self, task: FakeTask, now: float) -> dict[str, Any]:
        """The task as a query (or a callback) shows it."""
        status = task.status(now)
        data: dict[str, Any] = {
            "task_id": task.task_id,
            "task_status": status,
            "task_status_msg": task.status_msg if status == "failed" else "",
            "task_info": self._info(task),
            "task_result": {},
            "created_at": task.created_at,
            "updated_at": ms(task.updated(now)),
        }
        if status == "succeed":
            data["task_result"] = {"videos": [{
                "id": task.video_id,
                "url": f"{self._media_origin(task)}/cdn/{task.task_id}/video.mp4",
                "duration": task.duration}]}
        if status in ENDED:
            data["final_unit_deduction"] = (self.config.unit_deduction
                                            if status == "succeed" else "0")
        return data

    @staticmethod
    def _info(task: FakeTask) -> dict[str, Any]:
        return {"external_task_id": task.external_task_id} if task.external_task_id else {}

    def _created_data(self, task: FakeTask) -> dict[str, Any]:
        """The create's answer: the documented subset."""
        return {"task_id": task.task_id, "task_status": "submitted",
                "task_info": self._info(task), "created_at": task.created_at,
                "updated_at": task.created_at}

    def _by_external(self, access_key: str, external_task_id: str) -> FakeTask | None:
        found = [t for t in self.tasks.values()
                 if t.access_key == access_key and t.external_task_id == external_task_id]
        return max(found, key=lambda t: t.seq) if found else None

    def _lookup(self, access_key: str, endpoint: str, task_or_external_id: str
                ) -> FakeTask | None:
        task = self.tasks.get(task_or_external_id)
        if task is None or task.access_key != access_key:
            task = self._by_external(access_key, task_or_external_id)
        if task is None or task.endpoint != endpoint:
            return None
        return task

    def _new_task_id(self) -> str:
        while True:
            candidate = str(self.rng.randrange(10**17, 10**18))
            if candidate not in self.tasks:
                return candidate

    def _active(self, access_key: str, now: float) -> int:
        return sum(1 for t in self.tasks.values()
                   if t.access_key == access_key and t.status(now) not in ENDED)

    def _record(self, *, endpoint: str, body: dict[str, Any], access_key: str,
                origin: str) -> tuple[FakeTask, bool] | web.Response:
        """Create (and bill) a task, or answer the existing one or a refusal. Never awaits."""
        cfg = self.config
        external = _text(body.get("external_task_id"))
        if external is not None:
            existing = self._by_external(access_key, external)
            if existing is not None and cfg.repeated_external_id == "refuse":
                self._stats["repeated_refused"] += 1
                return kling_error(1201, REPEATED_EXTERNAL_ID_MESSAGE)
            if existing is not None and cfg.repeated_external_id == "return_existing":
                self._stats["repeated_returned"] += 1
                return existing, False
        now = time.time()
        if cfg.concurrency_limit is not None and self._active(access_key, now) >= \
                cfg.concurrency_limit:
            self._stats["over_concurrency"] += 1
            return kling_error(1303)
        mix = {k: w for k, w in cfg.outcome_mix.items() if k in OUTCOMES and w > 0}
        if not mix:
            raise ValueError(f"outcome_mix needs a positive weight on one of {OUTCOMES}")
        outcome = self.rng.choices(list(mix), weights=list(mix.values()))[0]
        run_s = cfg.processing_s + (self.rng.uniform(0, cfg.jitter_s)
                                    if cfg.jitter_s > 0 else 0.0)
        self._seq += 1
        duration = body.get("duration")
        task = FakeTask(
            task_id=self._new_task_id(), endpoint=endpoint, body=body,
            external_task_id=external, access_key=access_key, created=now,
            queue_s=cfg.queue_s, run_s=run_s, outcome=outcome,
            status_msg=self.rng.choice(cfg.failure_messages) if outcome == "failed" else "",
            video_id=str(uuid.UUID(int=self.rng.getrandbits(128), version=4)),
            duration=str(duration) if duration not in (None, "") else cfg.video_duration,
            callback_url=_text(body.get("callback_url")), origin=origin, seq=self._seq)
        self.tasks[task.task_id] = task
        self._billed.append((task.task_id, body))
        self._stats["creates"] += 1
        if task.callback_url:
            self._spawn(self._notify(task))
        return task, True

    # ---- handlers ----

    async def create(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/videos/{endpoint}."""
        self.create_posts += 1
        caller = self._authorize(request)
        if isinstance(caller, web.Response):
            return caller
        endpoint = request.match_info["endpoint"]
        if endpoint not in self.config.endpoints:
            return kling_error(1202)
        try:
            body = await request.json()
        except ValueError:
            return kling_error(1200, "Invalid request parameters: the body is not JSON")
        problem = self._body_problem(endpoint, body)
        if problem is not None:
            return kling_error(*problem)
        origin = self._origin(request)

        def record() -> tuple[FakeTask, bool] | web.Response:
            return self._record(endpoint=endpoint, body=body, access_key=caller,
                                origin=origin)

        return await self._create_with_faults(request, record)

    def _answer(self, outcome: tuple[FakeTask, bool] | web.Response) -> web.Response:
        if isinstance(outcome, web.Response):
            return outcome
        task, fresh = outcome
        return kling_ok(self._created_data(task) if fresh else self._data(task, time.time()))

    def _server_error(self) -> web.Response:
        status = self.config.fivexx_status
        return kling_error(SERVER_CODES.get(status, 5000), status=status)

    async def _create_with_faults(
            self, request: web.Request,
            record: Callable[[], tuple[FakeTask, bool] | web.Response]) -> web.StreamResponse:
        """Apply the next scripted create fault around `record` (which bills)."""
        fault = self._create_script.popleft() if self._create_script else None
        if fault is not None:
            self._stats[f"fault_{fault}"] += 1
        if fault == "5xx_before":
            return self._server_error()
        if fault == "429":
            return kling_error(1302)
        if fault == "code_under_200":
            return kling_error(self.config.code_under_200, status=200)
        if fault == "hang_then_create":
            # The server goes on working after the client gave up: the create runs in a task
            # of its own, which a disconnect (cancelling this handler) does not cancel.
            pending = self._spawn(self._create_later(record))
            return self._answer(await asyncio.shield(pending))
        outcome = record()  # billed before any await a disconnect could cancel
        if fault == "lose_reply":
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=200)  # written to a closed connection: never arrives
        if fault == "5xx_after":
            return self._server_error()
        if fault == "hang":
            await asyncio.sleep(self.config.hang_s)
        return self._answer(outcome)

    async def _create_later(self, record: Callable[[], tuple[FakeTask, bool] | web.Response]
                            ) -> tuple[FakeTask, bool] | web.Response:
        await asyncio.sleep(self.config.hang_s)
        return record()

    def _body_problem(self, endpoint: str, body: Any) -> tuple[int, str] | None:
        """(code, message) when the create body breaks a documented rule."""
        if not isinstance(body, dict):
            return 1200, "Invalid request parameters: the body must be a JSON object"
        model = body.get("model_name")
        if model not in (None, ""):
            if not isinstance(model, str):
                return 1201, "model_name must be a string"
            if self.config.models is not None and model not in self.config.models:
                return 1203, f"model_name {model} is not supported"
        multi_shot = body.get("multi_shot") in (True, "true")
        for name in ("prompt", "negative_prompt"):
            value = body.get(name)
            if value is not None and not isinstance(value, str):
                return 1201, f"{name} must be a string"
            if isinstance(value, str) and len(value) > MAX_PROMPT_CHARS:
                return 1201, f"{name} cannot exceed {MAX_PROMPT_CHARS} characters"
        if endpoint == "text2video" and not multi_shot and not body.get("prompt"):
            return 1201, "prompt is required"
        if endpoint == "image2video" and not (_text(body.get("image"))
                                              or _text(body.get("image_tail"))):
            return 1201, "image or image_tail is required"
        return _enum_problem(body, endpoint) or _link_problem(body)

    async def get_task(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/videos/{endpoint}/{id}: id is a task_id or an external_task_id."""
        self.status_reads += 1
        caller = self._authorize(request)
        if isinstance(caller, web.Response):
            return caller
        endpoint = request.match_info["endpoint"]
        if endpoint not in self.config.endpoints:
            return kling_error(1202)
        fault = self._read_script.popleft() if self._read_script else None
        if fault is not None:
            self._stats[f"fault_read_{fault}"] += 1
        if fault == "5xx":
            return self._server_error()
        if fault == "429":
            return kling_error(1302)
        if fault == "code_under_200":
            return kling_error(self.config.code_under_200, status=200)
        task = self._lookup(caller, endpoint, request.match_info["id"])
        if task is None:
            return kling_error(self.config.not_found_code, "task not found",
                               status=self.config.not_found_status)
        return kling_ok(self._data(task, time.time()))

    async def list_tasks(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/videos/{endpoint}?pageNum=&pageSize=: the account's tasks, newest first."""
        self.list_reads += 1
        caller = self._authorize(request)
        if isinstance(caller, web.Response):
            return caller
        endpoint = request.match_info["endpoint"]
        if endpoint not in self.config.endpoints:
            return kling_error(1202)
        try:
            page_num = int(request.query.get("pageNum", "1"))
            page_size = int(request.query.get("pageSize", "30"))
        except ValueError:
            return kling_error(1201, "pageNum and pageSize must be integers")
        if not (PAGE_NUM_RANGE[0] <= page_num <= PAGE_NUM_RANGE[1]
                and PAGE_SIZE_RANGE[0] <= page_size <= PAGE_SIZE_RANGE[1]):
            return kling_error(1201, "pageNum must be in [1, 1000] and pageSize in [1, 500]")
        mine = sorted((t for t in self.tasks.values()
                       if t.access_key == caller and t.endpoint == endpoint),
                      key=lambda t: t.seq, reverse=True)
        start = (page_num - 1) * page_size
        now = time.time()
        return kling_ok([self._data(t, now) for t in mine[start:start + page_size]])

    async def media(self, request: web.Request) -> web.StreamResponse:
        """GET/HEAD /cdn/{task_id}/video.mp4: public; Range; 404 once cleared."""
        self.media_reads += 1
        task = self.tasks.get(request.match_info["task_id"])
        now = time.time()
        if (task is None or task.media_expired or task.status(now) != "succeed"
                or now >= task.done_at + self.config.media_retention_s):
            return web.Response(status=404, text="Not Found")
        return serve_bytes(request, self.video_bytes(task.task_id), "video/mp4")

    # ---- callbacks ----

    async def _notify(self, task: FakeTask) -> None:
        """POST the task to its callback_url at each status change (those configured)."""
        task.changed = asyncio.Event()
        sent: str | None = None
        try:
            while True:
                now = time.time()
                status = task.status(now)
                if status != sent:
                    sent = status
                    if status in self.config.callback_statuses:
                        await self._deliver(task, self._data(task, now))
                if status in ENDED:
                    return
                wake = task.processing_at if status == "submitted" else task.done_at
                task.changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(task.changed.wait(), max(0.0, wake - time.time()))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("fake Kling: callbacks of %s failed", task.task_id)

    async def _deliver(self, task: FakeTask, data: dict[str, Any]) -> None:
        """One callback, retried on a network error or a non-2xx answer."""
        cfg = self.config
        url = task.callback_url or ""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        body = json.dumps(data).encode()
        for attempt, pause in enumerate((0.0, *cfg.callback_retry_delays_s), start=1):
            if pause:
                await asyncio.sleep(pause)
            status: int | None = None
            error: str | None = None
            try:
                async with self._session.post(
                        url, data=body, headers={"Content-Type": "application/json"},
                        allow_redirects=False,
                        timeout=aiohttp.ClientTimeout(total=cfg.callback_timeout_s)) as resp:
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                error = f"{type(exc).__name__}: {exc}"
            self.callbacks.append(CallbackAttempt(task.task_id, url, data["task_status"],
                                                  attempt, status, error))
            if status is not None and 200 <= status < 300:
                self._stats["callbacks_sent"] += 1
                return
        self._stats["callbacks_failed"] += 1


def _text(value: Any) -> str | None:
    """A non-empty string, or None ("" counts as absent, as the docs' examples send it)."""
    return value if isinstance(value, str) and value else None


def _enum_problem(body: dict[str, Any], endpoint: str) -> tuple[int, str] | None:
    mode = body.get("mode")
    if mode not in (None, "", "std", "pro"):
        return 1201, "mode must be one of std, pro"
    ratio = body.get("aspect_ratio")
    if endpoint == "text2video" and ratio not in (None, "", "16:9", "9:16", "1:1"):
        return 1201, "aspect_ratio must be one of 16:9, 9:16, 1:1"
    duration = body.get("duration")
    if duration not in (None, "") and (isinstance(duration, bool)
                                       or str(duration) not in DURATIONS):
        return 1201, "duration must be one of 3..15"
    cfg_scale = body.get("cfg_scale")
    if cfg_scale is not None and (isinstance(cfg_scale, bool)
                                  or not isinstance(cfg_scale, int | float)
                                  or not 0 <= cfg_scale <= 1):
        return 1201, "cfg_scale must be a number in [0, 1]"
    return None


def _link_problem(body: dict[str, Any]) -> tuple[int, str] | None:
    for name in ("callback_url", "external_task_id"):
        value = body.get(name)
        if value is not None and not isinstance(value, str):
            return 1201, f"{name} must be a string"
    callback = _text(body.get("callback_url"))
    if callback is not None and not callback.startswith(("http://", "https://")):
        return 1201, "callback_url must be an http(s) URL"
    return None


async def start_fake_kling(fake: FakeKling, host: str = "127.0.0.1",
                           port: int = 0) -> tuple[web.AppRunner, str]:
    """Serve `fake` on a loopback port; returns the runner and its base URL (no /v1)."""
    runner, url = await serve_app(fake.app(), host, port)
    fake.base_url = url
    return runner, url
