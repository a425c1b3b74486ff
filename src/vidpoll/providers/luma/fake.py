"""A stand-in for Luma's Dream Machine API (api.lumalabs.ai/dream-machine/v1) and its media CDN,
served by aiohttp on loopback.

It is written from Luma's documentation and OpenAPI description and from what Luma's official
SDK (lumaai 1.21.0) sends and parses, not from vidpoll's code, so a client is tested against
Luma's behaviour rather than against its own expectations. Tags below: [D] documented (docs,
the OpenAPI description or the SDK's code), [O] observed (issue threads, public transcripts),
[A] an assumption of this fake.

Sources
- SDK: lumaai 1.21.0 — `_client.py` (default base URL `https://api.lumalabs.ai/dream-machine/v1`,
  `Authorization: Bearer <auth_token>`), `resources/generations/{generations,video}.py` (`create`
  and `video.create` both POST `/generations/video`; `get`, `list(limit, offset)`, `delete`),
  `resources/credits.py`, `resources/ping.py`, `types/generation.py`,
  `types/generation_list_response.py`, `types/credit_get_response.py`, `_constants.py`
  (2 retries, 60 s timeout) and `_base_client.py` (`_idempotency_header = None`; retries on
  408/409/429/5xx and connection errors; honours `retry-after-ms` / `retry-after` up to 60 s).
- SPEC: github.com/lumalabs/lumaai-api `openapi.yaml` at 2520034: `Error {detail: string}`
  (example "Invalid API key is provided"), create answers 201, list `limit` default 100 and
  `offset` default 0, delete answers 204, `Credits {credit_balance}` in USD cents.
- ERRORS: docs.lumalabs.ai/docs/errors (messages before submission, `failure_reason` texts
  after it). FAQ: docs.lumalabs.ai/docs/faq ("We pre-charge your account ... If the generation
  fails, we fully refund the amount"). RATE: docs.lumalabs.ai/docs/rate-limits (Build tier, Ray:
  10 concurrent generations, 20 create requests/min). HOOKS:
  docs.lumalabs.ai/changelog/callbacks-and-credits-balance.
- REF: PROVIDERS.md (project notes) section 6 and its "Updates (2026-12-06)" Luma line.

Behaviour and its basis
- Paths live under `/dream-machine/v1` [D SDK]; `start_fake_luma` returns the base URL with that
  prefix, as the SDK's default has. `GET /ping` answers `{"message": "pong"}` [D SPEC].
- Auth `Authorization: Bearer <key>` [D SDK, SPEC]. No header: 401 `{"detail": "Not
  authenticated"}` [O: Luma's web API, danaigc/DreamMachineAPI#9; 401 rather than 403 is A];
  another scheme or a wrong key: 401 `{"detail": "Invalid API key is provided"}` [D SPEC
  example; the status is A].
- `POST /generations/video` [D SDK] (and the older `POST /generations` of the first docs, same
  handling here [A]) with `model` (one of `config.models`, required [D SPEC, SDK]),
  `prompt`, `aspect_ratio` (1:1, 16:9, 9:16, 4:3, 3:4, 21:9, 9:21), `duration`, `resolution`
  (any string), `keyframes` (`frame0`/`frame1`: `{type: image, url}` or `{type: generation,
  id}`), `loop`, `callback_url`, `concepts`, `generation_type` ("video") [D SDK]. Unknown fields
  are accepted and echoed [A]. A body that breaks this schema answers 422 with FastAPI's
  `{"detail": [{"type", "loc", "msg", "input"}]}` [A: Luma's `detail` key and the `Not
  authenticated` text suggest FastAPI]. The documented pre-submission errors answer 400
  `{"detail": <message>}` [D ERRORS: the messages; the status is A]: "Prompt is required"
  (no prompt and no image keyframe), "Prompt is too short, minimum length is 3 characters",
  "Prompt is too long, maximum length is 5000 characters", "No keyframes provided", "Loop is
  not supported for keyframes" / "... for end frame".
- The create answers 201 [D SPEC] with the Generation: `id` (UUID4, seeded [A]),
  `generation_type: "video"`, `state: "queued"`, `failure_reason: null`, `created_at` (ISO 8601,
  UTC, `Z`), `assets: null`, `model`, `request` (the body exactly as received, callback_url
  included) [D SDK types; the exact echo is A].
- `GET /generations/{id}` [D SDK]: `queued` for `queued_s`, then `dreaming` for `processing_s`
  + uniform(0, `jitter_s`) (seeded), then `completed` with `assets.video` or `failed` with a
  `failure_reason` [D SDK, ERRORS], drawn per generation from `outcome_mix` (seeded) [A], all
  computed from elapsed time when read. A prompt containing one of `blacklisted_words` fails
  with "Contains blacklisted words" [D ERRORS: the text]. Unknown or deleted id: 404
  `{"detail": "Generation not found"}` [A: text and status].
- `DELETE /generations/{id}`: 204 [D SPEC]; later reads and lists answer as if it never
  existed [A]; its media answer 404 [A]. The record stays in `fake.generations` (`deleted`).
- `GET /generations?limit=&offset=` [D SDK]: newest first [A], answer `{generations, count,
  has_more, limit, offset}` [D SDK, REF]; `count` is the number on this page [D SDK docstring].
  `limit` defaults to 100 [D SPEC]; above `list_limit_max` (100) it is cut to the max and the
  answer says so [A]; a limit below 1, a negative offset or a non-integer answers 422 [A].
  Offsets shift: a generation created while a client walks the pages pushes the rest down, so
  the client sees an item twice (and skips none). Deleted generations are not listed [A].
  Foreign generations (`add_foreign_generations`: made on the same account by another tool,
  with other prompts) are listed like any other [A: whether the web app's generations show up
  in the API's list is unconfirmed]. `shift_on_list` foreign generations arrive after each page
  served, and `fake.on_list_page(fake, body)` is called with each page before it is sent
  (it may change the body), so tests can provoke shifting deterministically.
- `GET /credits` → `{"credit_balance": <float, USD cents>}` [D SPEC, HOOKS]: `start_credits`
  minus `price_cents` for every generation created through the API, pre-charged at the create
  and refunded when it fails [D FAQ]; foreign generations do not touch it [A: the docs say the
  web app's credits are separate]. A create the balance cannot cover answers 402 `{"detail":
  "Insufficient credits"}` [A: by analogy with Luma's Agents API].
- Callbacks [D HOOKS, SDK docstring]: when a generation has `callback_url`, the full
  Generation (the GET body) is POSTed as JSON on each update — `dreaming`, then `completed` or
  `failed` (`queued` is not sent [D SDK docstring]); no signature header (none documented [D
  REF]). An answer other than exactly 200, or a network error, is retried 3 times 100 ms apart,
  each attempt with a 5 s timeout [D HOOKS: "retry 3 times", so 4 attempts in all is A]. Every
  attempt is recorded in `fake.callbacks`. A generation skipped past `dreaming` (`finish`
  while queued) sends only its end [A].
- Media: `assets.video` points at this fake (`/cdn/{id}/video.mp4`, a stand-in for Luma's
  storage.cdn-luma.com [O]), public (no auth) [O: the docs download it with a bare curl],
  GET/HEAD with a single `Range` (206 + `Content-Range`, 416 when unsatisfiable) [A],
  deterministic bytes (`expected_media`). `expire_media(generation_id=None)` makes them
  answer `expired_media_status` (403) afterwards [A: Luma documents no expiry; tests trigger
  it, never wait for it].
- Rate limits: Luma documents per-tier limits (Build: 10 concurrent Ray generations, 20
  creates/min) [D RATE] but not what exceeding them answers. `max_concurrent` and
  `creates_per_minute` (default None: unlimited) refuse with 429 `{"detail": "Too many
  requests"}` [A], plus `Retry-After` when `create_429_retry_after_s` is set [A].
- Faults (none by default), scripted per create with `script_creates([...])` (None = normal):
  `lose_reply` (created and billed, then the connection drops), `5xx_after` (created, then
  `fivexx_status`), `5xx_before` (nothing created, `fivexx_status`), `hang` (created at once,
  the answer held `hang_s`), `hang_then_create` (held `hang_s`, created only then, even if the
  client has gone), `429` (nothing created). A 5xx is Starlette's plain-text "Internal Server
  Error" (or the status's reason) [A]. Lists: `script_lists([...])` with `5xx`, `429`,
  `garbled` (200 with truncated JSON), None. Status reads: the next `config.status_5xx` reads
  answer 500. A create is recorded (billed) before any await a client disconnect could
  cancel, or in a shielded task.
- Retries: the SDK sends no idempotency key and re-sends a create after a 5xx, a 429 or a
  dropped connection [D SDK], so one create call can bill up to 3 generations [D REF].
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import math
import random
import re
import time
import uuid
from collections import deque
from collections.abc import Callable, Coroutine, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp
from aiohttp import web

log = logging.getLogger(__name__)

API_PREFIX = "/dream-machine/v1"
DEFAULT_KEY = "luma-fake-vidpoll-0123456789abcdef"
DEFAULT_MODELS = ("ray-2", "ray-flash-2")
ASPECT_RATIOS = ("1:1", "16:9", "9:16", "4:3", "3:4", "21:9", "9:21")
OUTCOMES = ("completed", "failed")
CREATE_FAULTS = ("lose_reply", "5xx_after", "5xx_before", "hang", "hang_then_create", "429")
LIST_FAULTS = ("5xx", "429", "garbled")
FAILURE_REASONS = (
    "Advanced prompt moderation failed",
    "Frame moderation failed",
    "Failed to read user input frames",
    "Prompt processing failed",
)
"""`failure_reason` texts from Luma's errors page (ERRORS)."""
BLACKLISTED = "Contains blacklisted words"
VIDEO_NAME = "video.mp4"
NO_AUTH = {"detail": "Not authenticated"}
BAD_KEY = {"detail": "Invalid API key is provided"}
NOT_FOUND = {"detail": "Generation not found"}
THROTTLED = {"detail": "Too many requests"}
NO_CREDITS = {"detail": "Insufficient credits"}
PROMPT_MIN, PROMPT_MAX = 3, 5000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
FOREIGN_PROMPTS = (
    "a paper boat drifting down a rainy street",
    "slow dolly through a neon-lit ramen bar",
    "a fox running across fresh snow at dawn",
    "timelapse of clouds over a mountain lake",
    "close-up of coffee being poured, steam rising",
)
"""Prompts of generations made by another tool (the web app, a teammate's script)."""
REASONS = {500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable",
           504: "Gateway Timeout"}


@dataclass
class LumaFakeConfig:
    """How the fake behaves; mutable while it runs (read on every request)."""

    api_key: str = DEFAULT_KEY
    models: tuple[str, ...] = DEFAULT_MODELS
    queued_s: float = 0.2
    """How long a generation stays `queued` before it is `dreaming`."""
    processing_s: float = 1.0
    jitter_s: float = 0.0
    """Each generation dreams processing_s + uniform(0, jitter_s) (seeded)."""
    seed: int | None = 0
    outcome_mix: dict[str, float] = field(default_factory=lambda: {"completed": 1.0})
    """Weights of OUTCOMES, drawn per generation at creation (seeded)."""
    failure_reasons: tuple[str, ...] = FAILURE_REASONS
    blacklisted_words: tuple[str, ...] = ()
    """A prompt containing one of these fails with "Contains blacklisted words"."""
    hang_s: float = 30.0
    fivexx_status: int = 500
    """What `5xx_after`, `5xx_before`, list `5xx` and status 5xx faults answer."""
    list_limit_default: int = 100
    list_limit_max: int = 100
    shift_on_list: int = 0
    """After each list page served, this many foreign generations arrive."""
    price_cents: float = 50.0
    start_credits: float = 100_000.0
    create_429_retry_after_s: float | None = None
    """Retry-After (seconds) on a 429; None: no header."""
    max_concurrent: int | None = None
    """Active (queued or dreaming) API generations allowed; more: 429. Luma's Build tier: 10."""
    creates_per_minute: int | None = None
    """Creates accepted per sliding 60 s; more: 429. Luma's Build tier: 20."""
    status_5xx: int = 0
    """The next this-many status reads answer `fivexx_status` (counted down)."""
    callback_retries: int = 3
    callback_retry_delay_s: float = 0.1
    callback_timeout_s: float = 5.0
    media_bytes: int = 64 * 1024
    expired_media_status: int = 403
    latency_s: float = 0.0


@dataclass
class FakeGeneration:
    """One generation: what was asked and how it goes (times are unix seconds)."""

    id: str
    seq: int
    request: dict[str, Any]
    """The create body exactly as received."""
    created_at: float
    model: str
    outcome: str
    failure_reason: str | None
    dreaming_at: float | None
    """When it starts dreaming; None if it ended before (finish while queued)."""
    done_at: float
    price_cents: float = 0.0
    foreign: bool = False
    deleted: bool = False
    media_expired: bool = False

    def state_at(self, t: float) -> str:
        """queued, dreaming, completed or failed at time t."""
        if t >= self.done_at:
            return self.outcome
        if self.dreaming_at is not None and t >= self.dreaming_at:
            return "dreaming"
        return "queued"

    @property
    def callback_url(self) -> str | None:
        """The create's callback_url, if it asked for one."""
        url = self.request.get("callback_url")
        return url if isinstance(url, str) and url else None


@dataclass
class CallbackAttempt:
    """One POST of a generation to its callback_url (the fake keeps them all)."""

    generation_id: str
    state: str
    attempt: int
    status: int | None
    body: dict[str, Any]
    error: str | None = None


@dataclass
class MediaRead:
    """One request to the media CDN."""

    path: str
    method: str
    range: str | None
    status: int


def iso(t: float) -> str:
    """Unix seconds as ISO 8601 UTC with microseconds and Z."""
    return (EPOCH + timedelta(microseconds=round(t * 1e6))).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def server_error(status: int) -> web.Response:
    """A 5xx as Starlette answers an unhandled error: plain text."""
    return web.Response(status=status, content_type="text/plain",
                        text=REASONS.get(status, "Server Error"))


def _detail(status: int, message: str) -> web.Response:
    return web.json_response({"detail": message}, status=status)


def _invalid(loc: list[str | int], msg: str, kind: str, value: Any) -> web.Response:
    """FastAPI's request validation error (422)."""
    return web.json_response(
        {"detail": [{"type": kind, "loc": ["body", *loc], "msg": msg, "input": value}]},
        status=422)


def _one_of(values: Iterable[str]) -> str:
    """Pydantic's wording: "'a', 'b' or 'c'"."""
    quoted = [f"'{v}'" for v in values]
    return quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]


def _check_frame(name: str, frame: Any) -> web.Response | None:
    loc: list[str | int] = ["keyframes", name]
    if frame is None:
        return None
    if not isinstance(frame, dict):
        return _invalid(loc, "Input should be a valid dictionary or object to extract fields "
                        "from", "model_attributes_type", frame)
    kind = frame.get("type")
    key = {"image": "url", "generation": "id"}.get(kind) if isinstance(kind, str) else None
    if key is None:
        return _invalid([*loc, "type"] if "type" in frame else loc,
                        "Input tag found using 'type' does not match any of the expected "
                        "tags: 'generation', 'image'", "union_tag_invalid", frame)
    if not isinstance(frame.get(key), str):
        return _invalid([*loc, str(kind), key], "Field required" if key not in frame
                        else "Input should be a valid string",
                        "missing" if key not in frame else "string_type", frame)
    return None


def validate_video_request(body: Any, models: Iterable[str]) -> web.Response | None:
    """The error answer a create with this body gets, or None when it is acceptable."""
    if not isinstance(body, dict):
        return _invalid([], "Input should be a valid dictionary or object to extract fields "
                        "from", "model_attributes_type", body)
    models = tuple(models)
    if "model" not in body:
        return _invalid(["model"], "Field required", "missing", body)
    if body["model"] not in models:
        return _invalid(["model"], f"Input should be {_one_of(models)}", "enum", body["model"])
    if body.get("generation_type") not in (None, "video"):
        return _invalid(["generation_type"], "Input should be 'video'", "literal_error",
                        body["generation_type"])
    for name in ("prompt", "duration", "resolution", "callback_url"):
        value = body.get(name)
        if value is not None and not isinstance(value, str):
            return _invalid([name], "Input should be a valid string", "string_type", value)
    if body.get("aspect_ratio") is not None and body["aspect_ratio"] not in ASPECT_RATIOS:
        return _invalid(["aspect_ratio"], f"Input should be {_one_of(ASPECT_RATIOS)}", "enum",
                        body["aspect_ratio"])
    if body.get("loop") is not None and not isinstance(body["loop"], bool):
        return _invalid(["loop"], "Input should be a valid boolean", "bool_type", body["loop"])
    url = body.get("callback_url")
    if url is not None and not re.match(r"https?://[^/\s]+", url):
        return _invalid(["callback_url"], "Input should be a valid URL, relative URL without a "
                        "base", "url_parsing", url)
    concepts = body.get("concepts")
    if concepts is not None and not (isinstance(concepts, list) and all(
            isinstance(c, dict) and isinstance(c.get("key"), str) for c in concepts)):
        return _invalid(["concepts"], "Input should be a valid list of concept objects",
                        "list_type", concepts)
    keyframes = body.get("keyframes")
    frames: dict[str, Any] = {}
    if keyframes is not None:
        if not isinstance(keyframes, dict):
            return _invalid(["keyframes"], "Input should be a valid dictionary or object to "
                            "extract fields from", "model_attributes_type", keyframes)
        for name in ("frame0", "frame1"):
            bad = _check_frame(name, keyframes.get(name))
            if bad is not None:
                return bad
            if keyframes.get(name) is not None:
                frames[name] = keyframes[name]
        if not frames:
            return _detail(400, "No keyframes provided")
    prompt = body.get("prompt")
    has_image = any(f.get("type") == "image" for f in frames.values())
    if prompt is None and not has_image:
        return _detail(400, "Prompt is required")
    if prompt is not None and len(prompt) < PROMPT_MIN:
        return _detail(400, f"Prompt is too short, minimum length is {PROMPT_MIN} characters")
    if prompt is not None and len(prompt) > PROMPT_MAX:
        return _detail(400, f"Prompt is too long, maximum length is {PROMPT_MAX} characters")
    if body.get("loop") is True and "frame1" in frames:
        return _detail(400, "Loop is not supported for keyframes" if "frame0" in frames
                       else "Loop is not supported for end frame")
    return None


def _int_param(query: Any, name: str, default: int, least: int) -> int | web.Response:
    raw = query.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        return web.json_response({"detail": [{
            "type": "int_parsing", "loc": ["query", name],
            "msg": "Input should be a valid integer, unable to parse string as an integer",
            "input": raw}]}, status=422)
    if value < least:
        return web.json_response({"detail": [{
            "type": "greater_than_equal", "loc": ["query", name],
            "msg": f"Input should be greater than or equal to {least}", "input": raw}]},
            status=422)
    return value


class FakeLuma:
    """The fake's state and handlers; serve it with start_fake_luma()."""

    def __init__(self, config: LumaFakeConfig | None = None) -> None:
        self.config = config or LumaFakeConfig()
        self.rng = random.Random(self.config.seed)
        self._foreign_rng = random.Random(f"{self.config.seed}:foreign")
        self.generations: dict[str, FakeGeneration] = {}
        self.callbacks: list[CallbackAttempt] = []
        self.media_reads: list[MediaRead] = []
        self.create_posts = 0
        """Create POSTs received (any outcome, faults and refusals included)."""
        self.status_reads = 0
        self.list_reads = 0
        """List pages requested (any outcome)."""
        self.deletes = 0
        self.credit_reads = 0
        self.on_list_page: Callable[[FakeLuma, dict[str, Any]], None] | None = None
        """Called for each list page once it is built and before it is sent, with the page's
        body (which it may change: what it leaves is what the client gets)."""
        self.origin = ""
        """scheme://host:port this fake is served on (set by start_fake_luma)."""
        self._create_script: deque[str | None] = deque()
        self._list_script: deque[str | None] = deque()
        self._accepted_at: deque[float] = deque()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._media: dict[tuple[str, int], bytes] = {}

    # ---- inspection and scripting (no HTTP) ----

    @property
    def api_key(self) -> str:
        """The key the fake accepts."""
        return self.config.api_key

    def billed(self) -> list[tuple[str, dict[str, Any]]]:
        """(id, request as received) of every create that billed, in order (not foreign ones;
        deleted and failed ones included: the create itself was paid)."""
        return [(g.id, g.request) for g in self.generations.values() if not g.foreign]

    def script_creates(self, steps: Iterable[str | None]) -> None:
        """Queue what the next creates do: None (normal) or one of CREATE_FAULTS, in order."""
        steps = list(steps)
        unknown = {s for s in steps if s is not None} - set(CREATE_FAULTS)
        if unknown:
            raise ValueError(f"unknown create faults: {sorted(unknown)}")
        self._create_script.extend(steps)

    def script_lists(self, steps: Iterable[str | None]) -> None:
        """Queue what the next list pages do: None (normal) or one of LIST_FAULTS, in order."""
        steps = list(steps)
        unknown = {s for s in steps if s is not None} - set(LIST_FAULTS)
        if unknown:
            raise ValueError(f"unknown list faults: {sorted(unknown)}")
        self._list_script.extend(steps)

    def state(self, generation_id: str) -> str:
        """The generation's state now."""
        return self.generations[generation_id].state_at(time.time())

    def view(self, generation_id: str) -> dict[str, Any]:
        """What a GET of this generation would answer now (deleted or not)."""
        g = self.generations[generation_id]
        return self._body(g, g.state_at(time.time()))

    def finish(self, generation_id: str, outcome: str,
               failure_reason: str | None = None) -> None:
        """End a generation now as "completed" or "failed" (it must not have ended yet)."""
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, not {outcome!r}")
        g = self.generations[generation_id]
        now = time.time()
        if g.state_at(now) in OUTCOMES:
            raise ValueError(f"generation {generation_id} has already ended")
        g.outcome, g.done_at = outcome, now
        if g.dreaming_at is not None and g.dreaming_at > now:
            g.dreaming_at = None
        if outcome == "failed":
            g.failure_reason = (failure_reason or g.failure_reason
                                or self.config.failure_reasons[0])
        else:
            g.failure_reason = None

    def expire_media(self, generation_id: str | None = None, *,
                     id: str | None = None) -> None:
        """Make the media of one generation (or of every generation so far) unreadable;
        `id=` is the same as `generation_id`."""
        generation_id = generation_id if generation_id is not None else id
        targets = ([self.generations[generation_id]] if generation_id is not None
                   else list(self.generations.values()))
        for g in targets:
            g.media_expired = True

    def credit_balance(self) -> float:
        """USD cents left: pre-charged per API create, refunded when a generation fails."""
        now = time.time()
        spent = sum(g.price_cents for g in self.generations.values()
                    if not g.foreign and g.state_at(now) != "failed")
        return float(self.config.start_credits - spent)

    def add_foreign_generations(self, n: int) -> list[str]:
        """n generations made by another tool on the account arrive now (newest first in lists);
        they are not billed to this client. Returns their ids."""
        ids = []
        rng = self._foreign_rng
        for _ in range(n):
            now = time.time()
            prompt = f"{rng.choice(FOREIGN_PROMPTS)} (take {rng.randint(1, 99)})"
            request = {"model": rng.choice(self.config.models) if self.config.models
                       else DEFAULT_MODELS[0], "prompt": prompt, "aspect_ratio": "16:9"}
            g = self._new_generation(rng, request, now, foreign=True)
            ids.append(g.id)
        return ids

    def expected_media(self, generation_id: str) -> bytes:
        """The bytes the CDN serves for this generation's video (deterministic per id)."""
        size = self.config.media_bytes
        key = (generation_id, size)
        if key not in self._media:
            blocks = (hashlib.sha256(generation_id.encode() + i.to_bytes(4, "big")).digest()
                      for i in range(math.ceil(size / 32)))
            self._media[key] = b"".join(blocks)[:size]
        return self._media[key]

    def media_url(self, generation_id: str) -> str:
        """Where `assets.video` points for this generation."""
        return f"{self.origin}/cdn/{generation_id}/{VIDEO_NAME}"

    # ---- the application ----

    def app(self) -> web.Application:
        """The aiohttp application: the API under /dream-machine/v1 and the CDN under /cdn."""
        app = web.Application()
        p = API_PREFIX
        app.router.add_get(f"{p}/ping", self.ping)
        app.router.add_post(f"{p}/generations/video", self.create)
        app.router.add_post(f"{p}/generations", self.create)
        app.router.add_get(f"{p}/generations", self.list_generations)
        app.router.add_get(f"{p}/generations/{{gid}}", self.get_generation)
        app.router.add_delete(f"{p}/generations/{{gid}}", self.delete_generation)
        app.router.add_get(f"{p}/credits", self.get_credits)
        app.router.add_get("/cdn/{gid}/{name}", self.serve_media)
        app.on_cleanup.append(self._cleanup)
        return app

    async def close(self) -> None:
        """Cancel callback and pending-create tasks; close the callback client."""
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
        header = request.headers.get("Authorization", "").strip()
        if not header:
            return web.json_response(NO_AUTH, status=401)
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or key.strip() != self.config.api_key:
            return web.json_response(BAD_KEY, status=401)
        return None

    async def _enter(self, request: web.Request) -> web.Response | None:
        if self.config.latency_s > 0:
            await asyncio.sleep(self.config.latency_s)
        if not self.origin:
            self.origin = f"{request.scheme}://{request.host}"
        return self._authorized(request)

    def _throttled(self) -> web.Response:
        after = self.config.create_429_retry_after_s
        headers = {}
        if after is not None:
            headers["Retry-After"] = str(int(after)) if float(after).is_integer() else str(after)
        return web.json_response(THROTTLED, status=429, headers=headers)

    def _lookup(self, request: web.Request) -> FakeGeneration | None:
        g = self.generations.get(request.match_info["gid"])
        return None if g is None or g.deleted else g

    def _body(self, g: FakeGeneration, state: str) -> dict[str, Any]:
        return {
            "id": g.id,
            "generation_type": "video",
            "state": state,
            "failure_reason": g.failure_reason if state == "failed" else None,
            "created_at": iso(g.created_at),
            "assets": {"video": self.media_url(g.id)} if state == "completed" else None,
            "model": g.model,
            "request": g.request,
        }

    # ---- creates ----

    def _new_generation(self, rng: random.Random, request: dict[str, Any], now: float, *,
                        foreign: bool) -> FakeGeneration:
        cfg = self.config
        gid = str(uuid.UUID(int=rng.getrandbits(128), version=4))
        jitter = rng.uniform(0, cfg.jitter_s) if cfg.jitter_s > 0 else 0.0
        weights = [max(0.0, cfg.outcome_mix.get(o, 0.0)) for o in OUTCOMES]
        outcome = rng.choices(OUTCOMES, weights)[0] if sum(weights) > 0 else "completed"
        reason = rng.choice(cfg.failure_reasons) if cfg.failure_reasons else "Job failed"
        prompt = request.get("prompt")
        if isinstance(prompt, str) and any(w.lower() in prompt.lower()
                                           for w in cfg.blacklisted_words):
            outcome, reason = "failed", BLACKLISTED
        dreaming_at = now + max(0.0, cfg.queued_s)
        g = FakeGeneration(
            id=gid, seq=len(self.generations), request=request, created_at=now,
            model=str(request.get("model")), outcome=outcome,
            failure_reason=reason if outcome == "failed" else None,
            dreaming_at=dreaming_at, done_at=dreaming_at + max(0.0, cfg.processing_s) + jitter,
            price_cents=0.0 if foreign else cfg.price_cents, foreign=foreign)
        self.generations[gid] = g
        return g

    def _record(self, request: dict[str, Any]) -> FakeGeneration:
        """Create (and bill) a generation now. Synchronous on purpose: nothing can cancel it."""
        now = time.time()
        g = self._new_generation(self.rng, request, now, foreign=False)
        self._accepted_at.append(now)
        if g.callback_url:
            self._spawn(self._callbacks(g))
        return g

    async def _record_later(self, request: dict[str, Any]) -> FakeGeneration:
        await asyncio.sleep(self.config.hang_s)
        return self._record(request)

    def _refusal(self) -> web.Response | None:
        """429 or 402 for a create the account's limits or balance do not allow."""
        cfg = self.config
        now = time.time()
        while self._accepted_at and self._accepted_at[0] <= now - 60.0:
            self._accepted_at.popleft()
        if cfg.creates_per_minute is not None and len(self._accepted_at) >= cfg.creates_per_minute:
            return self._throttled()
        if cfg.max_concurrent is not None:
            active = sum(1 for g in self.generations.values()
                         if not g.foreign and not g.deleted and g.state_at(now) not in OUTCOMES)
            if active >= cfg.max_concurrent:
                return self._throttled()
        if self.credit_balance() < cfg.price_cents:
            return web.json_response(NO_CREDITS, status=402)
        return None

    async def create(self, request: web.Request) -> web.StreamResponse:
        """POST /generations/video (and the older POST /generations)."""
        self.create_posts += 1
        early = await self._enter(request)
        if early is not None:
            return early
        try:
            payload = await request.json()
        except ValueError:
            return _invalid([], "JSON decode error", "json_invalid", {})
        bad = validate_video_request(payload, self.config.models)
        if bad is not None:
            return bad
        fault = self._create_script.popleft() if self._create_script else None
        if fault == "5xx_before":
            return server_error(self.config.fivexx_status)
        if fault == "429":
            return self._throttled()
        refused = self._refusal()
        if refused is not None:
            return refused
        if fault == "hang_then_create":
            # The server goes on after the client gave up: the create runs in a task of its
            # own, which a disconnect (cancelling this handler) does not cancel.
            later: FakeGeneration = await asyncio.shield(
                self._spawn(self._record_later(payload)))
            return web.json_response(self._body(later, later.state_at(time.time())),
                                     status=201)
        g = self._record(payload)  # billed before any await a disconnect could cancel
        if fault == "lose_reply":
            if request.transport is not None:
                request.transport.close()
            return web.Response(status=201)  # written to a closed connection: never arrives
        if fault == "5xx_after":
            return server_error(self.config.fivexx_status)
        if fault == "hang":
            await asyncio.sleep(self.config.hang_s)
        return web.json_response(self._body(g, g.state_at(time.time())), status=201)

    # ---- reads ----

    async def ping(self, request: web.Request) -> web.StreamResponse:
        """GET /ping."""
        early = await self._enter(request)
        return early or web.json_response({"message": "pong"})

    async def get_generation(self, request: web.Request) -> web.StreamResponse:
        """GET /generations/{id}."""
        self.status_reads += 1
        early = await self._enter(request)
        if early is not None:
            return early
        if self.config.status_5xx > 0:
            self.config.status_5xx -= 1
            return server_error(self.config.fivexx_status)
        g = self._lookup(request)
        if g is None:
            return web.json_response(NOT_FOUND, status=404)
        return web.json_response(self._body(g, g.state_at(time.time())))

    async def delete_generation(self, request: web.Request) -> web.StreamResponse:
        """DELETE /generations/{id}: 204, then gone."""
        self.deletes += 1
        early = await self._enter(request)
        if early is not None:
            return early
        g = self._lookup(request)
        if g is None:
            return web.json_response(NOT_FOUND, status=404)
        g.deleted = True
        return web.Response(status=204)

    async def get_credits(self, request: web.Request) -> web.StreamResponse:
        """GET /credits."""
        self.credit_reads += 1
        early = await self._enter(request)
        return early or web.json_response({"credit_balance": self.credit_balance()})

    async def list_generations(self, request: web.Request) -> web.StreamResponse:
        """GET /generations?limit=&offset=: newest first, offset pages."""
        self.list_reads += 1
        early = await self._enter(request)
        if early is not None:
            return early
        cfg = self.config
        fault = self._list_script.popleft() if self._list_script else None
        if fault == "5xx":
            return server_error(cfg.fivexx_status)
        if fault == "429":
            return self._throttled()
        limit = _int_param(request.query, "limit", cfg.list_limit_default, 1)
        if isinstance(limit, web.Response):
            return limit
        offset = _int_param(request.query, "offset", 0, 0)
        if isinstance(offset, web.Response):
            return offset
        limit = min(limit, cfg.list_limit_max)
        now = time.time()
        listed = sorted((g for g in self.generations.values() if not g.deleted),
                        key=lambda g: (g.created_at, g.seq), reverse=True)
        page = listed[offset:offset + limit]
        body = {"generations": [self._body(g, g.state_at(now)) for g in page],
                "count": len(page), "has_more": offset + len(page) < len(listed),
                "limit": limit, "offset": offset}
        if cfg.shift_on_list > 0:
            self.add_foreign_generations(cfg.shift_on_list)
        if self.on_list_page is not None:
            self.on_list_page(self, body)
        if fault == "garbled":
            text = json.dumps(body)
            return web.Response(status=200, content_type="application/json",
                                text=text[: max(1, len(text) // 2)])
        return web.json_response(body)

    # ---- the media CDN ----

    async def serve_media(self, request: web.Request) -> web.StreamResponse:
        """GET/HEAD /cdn/{id}/video.mp4: public, a single Range, refused once expired."""
        if self.config.latency_s > 0:
            await asyncio.sleep(self.config.latency_s)
        response = self._media_response(request)
        self.media_reads.append(MediaRead(request.path, request.method,
                                          request.headers.get("Range"), response.status))
        return response

    def _media_response(self, request: web.Request) -> web.Response:
        g = self.generations.get(request.match_info["gid"])
        if (g is None or g.deleted or request.match_info["name"] != VIDEO_NAME
                or g.state_at(time.time()) != "completed"):
            return web.Response(status=404, content_type="text/plain", text="Not Found")
        if g.media_expired:
            status = self.config.expired_media_status
            return web.Response(status=status, content_type="text/plain",
                                text="Forbidden" if status == 403 else "Not Found")
        data = self.expected_media(g.id)
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

    # ---- callbacks ----

    def _updates(self, g: FakeGeneration) -> list[tuple[str, float]]:
        """(state, when) of the updates a callback reports, in order."""
        steps = [("dreaming", g.dreaming_at)] if g.dreaming_at is not None else []
        return [*steps, (g.outcome, g.done_at)]

    async def _callbacks(self, g: FakeGeneration) -> None:
        """POST the generation to its callback_url on each update until it ends."""
        sent: set[str] = set()
        try:
            while not g.deleted:
                now = time.time()
                for state, at in self._updates(g):
                    if at <= now and state not in sent:
                        sent.add(state)
                        await self._deliver(g, state)
                if g.outcome in sent and g.state_at(time.time()) == g.outcome:
                    return
                due = min((at for state, at in self._updates(g) if state not in sent),
                          default=now)
                await asyncio.sleep(min(0.05, max(0.001, due - time.time())))
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("fake luma: callbacks of %s failed", g.id)

    async def _deliver(self, g: FakeGeneration, state: str) -> None:
        cfg = self.config
        url = g.callback_url
        assert url is not None
        if self._session is None:
            self._session = aiohttp.ClientSession()
        body = self._body(g, state)
        payload = json.dumps(body).encode()
        for attempt in range(1, 2 + max(0, cfg.callback_retries)):
            if attempt > 1:
                await asyncio.sleep(cfg.callback_retry_delay_s)
            status: int | None = None
            error: str | None = None
            try:
                async with self._session.post(
                        url, data=payload, headers={"Content-Type": "application/json"},
                        allow_redirects=False,
                        timeout=aiohttp.ClientTimeout(total=cfg.callback_timeout_s)) as resp:
                    status = resp.status
            except (aiohttp.ClientError, TimeoutError) as exc:
                error = f"{type(exc).__name__}: {exc}"
            self.callbacks.append(CallbackAttempt(g.id, state, attempt, status, body, error))
            if status == 200:
                return


async def start_fake_luma(fake: FakeLuma, host: str = "127.0.0.1",
                          port: int = 0) -> tuple[web.AppRunner, str]:
    """Serve `fake` on a loopback port; returns the runner and the API base URL, which ends in
    /dream-machine/v1 like the SDK's default (the CDN is /cdn/... on the same origin)."""
    # handler_cancellation: a client that gives up ends its request here too (creates are
    # recorded before any await, or in a shielded task, so billing survives that).
    runner = web.AppRunner(fake.app(), access_log=None, handler_cancellation=True,
                           shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    fake.origin = f"http://{host}:{bound}"
    return runner, f"{fake.origin}{API_PREFIX}"
