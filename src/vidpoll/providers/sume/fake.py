"""A stand-in Sume server for tests, the demo and benchmarks (real HTTP, aiohttp).

It implements the seed's contract (`POST /v1/videos`, `GET /v1/jobs/{id}/status`,
`GET /v1/jobs/{id}/result`) with Sume's error envelope, plus every fault a real provider
shows: latency, 5xx, 429/503 with Retry-After, hangs past the client timeout, malformed and
HTML bodies, 404 right after creation, upper-case statuses; and on creates: 5xx before or
after billing, 429, lost replies (billed, then silence), 402 when credits run out, 422 for an
invalid request or a reused key, and a cap on renders running at once; optionally, as real
providers may: limits and credits checked before the Idempotency-Key lookup, keys that expire,
and creates that go on (and bill) after the client disconnected. Status answers come
in the seed's bare shape or in the enveloped shapes Sume's CLI reads (no `terminal` flag, any
letter case, other words), per fake or per job, each with Sume's `usage` ledger: a job's price
(`credits_per_job`) reserved when it is accepted, captured when it completes, refunded when it
fails, is canceled or expires, in credits or in the dollar fields Sume's CLI reads
(`usage_form`); `ledger()` sums what the answers report. Something else can answer in Sume's place
(`front_answer`: a proxy's error page), and requests to paths no route takes (a wrong base
URL) are counted. Tests can script the
exact answers one job (or one key's POSTs) gives, and read counters (reads per job, overlapping
reads, POSTs and clips billed per key, overlapping POSTs of one key, peak renders running).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import random
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web

from vidpoll.media import job_path_segment
from vidpoll.providers.sume.webhooks import sign

TERMINAL = ("completed", "failed", "canceled", "expired")
STATUS_SHAPES = ("seed", "data", "data.sume_status", "data.job", "job", "status")
"""How a status answer is laid out (SUME_API.md, "Two shapes of the status answer"): `seed` is
the seed's bare `{terminal, sume_status, next_poll_after_seconds}`; the others are the shapes
Sume's CLI reads and its tests mock, with no `terminal` flag: the word under `data.status`,
`data.sume_status`, `data.job.status`, `job.status`, or a top-level `status`, beside
`request_id`, `status_url`/`result_url`, `result_ready`, `next_action` and `usage`."""
STATUS_CASES = ("as_is", "lower", "upper", "title", "random")
USAGE_FORMS = ("credits", "usd_micros")
"""How `usage` is written: `credits`, bare amounts `{"reserved", "captured", "refunded"}`
(SUME_API.md); `usd_micros`, the fields Sume's CLI reads (`usage_status`, `currency`,
`billable_amount_usd_micros`, `reserved_/captured_/refunded_amount_usd_micros`)."""


@dataclass
class FakeConfig:
    """How the fake behaves; every fault rate is a probability per status read."""

    api_key: str | None = "sk-fake"
    latency_s: float = 0.0
    latency_jitter: float = 0.0
    queued_s: float = 0.5
    render_s: float = 2.0
    render_jitter: float = 0.5
    next_poll_after_s: float | None = 1.0
    terminal_mix: dict[str, float] = field(default_factory=lambda: {"completed": 1.0})
    fail_5xx: float = 0.0
    rate_429: float = 0.0
    unavailable_503: float = 0.0
    retry_after_s: float = 1.0
    hang: float = 0.0
    hang_s: float = 30.0
    malformed: float = 0.0
    html: float = 0.0
    not_found_for_s: float = 0.0
    uppercase: bool = False
    auto_create: bool = False
    status_shape: str = "seed"
    """One of STATUS_SHAPES, for every job not given its own (add_job(shape=...))."""
    status_words: dict[str, str] = field(default_factory=dict)
    """The word sent for each of the fake's states, where it is not the state's own name:
    e.g. {"completed": "succeeded", "canceled": "cancelled", "failed": "error"}."""
    status_case: str = "as_is"
    """Letter case of the word: one of STATUS_CASES (random: a new pick on every read)."""
    credits_per_job: int = 50
    """What a job costs (add_job(price=...) for another): reserved when it is accepted,
    captured when it completes, refunded when it fails, is canceled or expires."""
    usage_form: str = "credits"
    """How status answers write `usage`: one of USAGE_FORMS."""
    usd_micros_per_credit: int = 10_000
    """With usage_form "usd_micros": the dollars (in millionths) one credit is written as."""
    # creates (POST /v1/videos); each rate is a probability per POST that is not a replay
    create_fail_5xx: float = 0.0
    """500 before anything is billed."""
    create_5xx_billed: float = 0.0
    """The render starts and is billed, then the answer is a 500 anyway."""
    create_rate_429: float = 0.0
    create_lose_reply: float = 0.0
    """The render starts and is billed, then no answer comes for `hang_s` (lost reply)."""
    credits: int | None = None
    """Renders the account can still pay for; then 402 insufficient_credits."""
    max_concurrent: int | None = None
    """Renders that may run at once; beyond it 429 concurrency_limit_exceeded."""
    limits_before_key: bool = False
    """Check the create rate, the request, the concurrency cap and the credits BEFORE the
    Idempotency-Key lookup, as real providers may: a re-send of a key already billed then
    answers 402 insufficient_credits while credits are out (and 429 while at the cap)."""
    key_ttl_s: float | None = None
    """An Idempotency-Key is remembered this long after the render it started; a re-send
    after that is a new request (a second render, billed again). None: forever."""
    create_keeps_running: bool = False
    """A create keeps running after the client disconnected (a timeout): it still bills and
    starts the render, and its answer goes to nobody."""
    create_bill_s: float = 0.0
    """Seconds a create works before it bills (with create_keeps_running and a shorter client
    timeout: the reply is lost, the render billed anyway)."""
    # per-key rate limits, token buckets as a provider would run them: beyond them 429 with
    # Retry-After; every answer then carries RateLimit-Limit/-Remaining/-Reset (and X-*)
    read_rate_per_s: float | None = None
    """Status and result reads per second per API key (None: no limit)."""
    read_burst: float = 1.0
    read_rate_by_key: dict[str, float] = field(default_factory=dict)
    """Per-key read rates that override read_rate_per_s (several accounts)."""
    create_rate_per_s: float | None = None
    create_burst: float = 1.0
    extra_api_keys: list[str] = field(default_factory=list)
    """More keys the fake accepts besides api_key (one per account)."""
    # webhooks: when a job reaches its terminal state, POST a signed event (as Sume does)
    webhook_url: str | None = None
    webhook_secret: str = ""
    webhook_delay_s: float = 0.0
    # media (GET /media/...): what a CDN with signed, expiring links does
    media_bytes: int = 256 * 1024
    """Size of every job's video file (its bytes follow from the job id: see media_content)."""
    media_url_ttl_s: float = 3600.0
    """How long a result's signed media link works; then 403 "Request has expired"."""
    media_expired_first: int = 0
    """The first N links the fake hands out are already expired (a link that died early)."""
    media_bytes_per_s: float | None = None
    """Throttle media streaming (kill -9 mid-download tests)."""
    media_ranges: bool = True
    """Answer Range requests with 206 (a CDN that ignores them answers 200 with everything)."""
    front_answer: dict[str, Any] | None = None
    """What something in Sume's place answers to every request (a proxy's error page, another
    service behind a wrong base URL): {"http": code, "raw": text, "content_type": type,
    "headers": {...}}; None: Sume answers. Counted in `front_answers`."""
    seed: int | None = None


@dataclass
class FakeJob:
    """One job the fake knows: when it was created and how it will end."""

    job_id: str
    created: float
    queued_s: float
    render_s: float
    outcome: str
    idempotency_key: str | None = None
    script: list[dict[str, Any]] = field(default_factory=list)
    shape: str | None = None
    """This job's status shape (STATUS_SHAPES); None: the config's."""
    words: dict[str, str] | None = None
    """This job's words for its states; None: the config's."""
    case: str | None = None
    price: int = 0
    """Credits this job costs (its `usage`)."""


class FakeSume:
    """The fake's state and handlers; `app()` gives the aiohttp application."""

    def __init__(self, config: FakeConfig | None = None) -> None:
        self.config = config or FakeConfig()
        self.rng = random.Random(self.config.seed)
        self.jobs: dict[str, FakeJob] = {}
        self.by_key: dict[str, str] = {}
        self.reads: Counter[str] = Counter()
        self.in_flight: Counter[str] = Counter()
        self.overlaps = 0
        self.creates = 0
        self.billed = 0
        self.answers: Counter[int] = Counter()
        self.raw_paths: list[str] = []
        self.auth_failures = 0
        self.billed_by_key: Counter[str] = Counter()
        self.posts_by_key: Counter[str] = Counter()
        self.create_order: list[str] = []
        self.creates_in_flight: Counter[str] = Counter()
        self.create_overlaps = 0
        self.max_running_seen = 0
        self.concurrency_refusals = 0
        self.create_script: dict[str, list[str]] = {}
        self.payloads: dict[str, Any] = {}
        self.key_born: dict[str, float] = {}
        """Monotonic time each key's render was billed (keys expire after key_ttl_s)."""
        self.refusals_of_billed_keys: Counter[str] = Counter()
        """Refusals (402/429/422) answered to re-sends of keys that had already billed."""
        self.orphaned_creates = 0
        """Creates that finished after their client had disconnected."""
        self._create_tasks: set[asyncio.Task[web.StreamResponse]] = set()
        self._creating: set[str] = set()
        """Keys whose first create is still at work (create_bill_s): a re-send gets 409."""
        self.on_create: Callable[[str | None], Awaitable[None]] | None = None
        self.terminal_at: dict[str, float] = {}
        """Wall-clock time each job reaches its terminal state (detection-delay benchmarks)."""
        self.webhooks_sent: Counter[int] = Counter()
        self._webhook_tasks: set[asyncio.Task[None]] = set()
        self._buckets: dict[tuple[str, str], list[float]] = {}
        self.create_times: list[float] = []
        self.read_log: list[tuple[float, str, int]] = []
        """(monotonic time, API key, HTTP status) of every authorized status read."""
        self.answer_log: list[tuple[float, str]] = []
        """(wall-clock time, job id) of every 200 status answer, as it leaves: when a client
        may count the answer's hint from, at the earliest (the chaos run's hint check)."""
        self.results_served: Counter[str] = Counter()
        """200 answers of GET .../result per job."""
        self.media_links: dict[str, float] = {}
        """Signature -> expiry (monotonic) of every media link handed out."""
        self.media_log: list[tuple[str, int, str | None, str | None]] = []
        """(job id, HTTP status, Range header, Authorization header) of every media GET."""
        self.faults: Counter[str] = Counter()
        """Faults injected by the configured rates, by class (chaos runs report them)."""
        self.front_answers = 0
        """Requests answered by `front_answer` instead of Sume."""
        self.unrouted: Counter[str] = Counter()
        """Requests by path that matched none of Sume's routes (a wrong base URL's path
        prefix): answered with aiohttp's own plain-text "404: Not Found", not the envelope."""

    # -- test helpers -------------------------------------------------------------------
    def add_job(self, job_id: str | None = None, *, outcome: str | None = None,
                render_s: float | None = None, queued_s: float | None = None,
                script: list[dict[str, Any]] | None = None, shape: str | None = None,
                words: dict[str, str] | None = None, case: str | None = None,
                price: int | None = None) -> str:
        """Create a job directly (not counted as billed); `script` fixes its answers one read
        at a time; `shape`, `words` and `case` choose how its status answers look, `price` the
        credits its `usage` reports (else the config's)."""
        job_id = job_id or f"vid_{uuid.uuid4().hex[:20]}"
        cfg = self.config
        if render_s is None:
            render_s = cfg.render_s * self.rng.uniform(1 - cfg.render_jitter,
                                                       1 + cfg.render_jitter)
        if shape is not None and shape not in STATUS_SHAPES:
            raise ValueError(f"unknown status shape {shape!r}; one of {STATUS_SHAPES}")
        if case is not None and case not in STATUS_CASES:
            raise ValueError(f"unknown status case {case!r}; one of {STATUS_CASES}")
        job = FakeJob(job_id, time.monotonic(), cfg.queued_s if queued_s is None else queued_s,
                      max(0.0, render_s), outcome or self._pick_outcome(),
                      script=list(script or []), shape=shape,
                      words=None if words is None else dict(words), case=case,
                      price=cfg.credits_per_job if price is None else price)
        self.jobs[job_id] = job
        self.terminal_at[job_id] = time.time() + job.queued_s + job.render_s
        if cfg.webhook_url:
            with contextlib.suppress(RuntimeError):  # no running loop: no webhook
                task = asyncio.get_running_loop().create_task(self._send_webhook(job))
                self._webhook_tasks.add(task)
                task.add_done_callback(self._webhook_tasks.discard)
        return job_id

    async def _send_webhook(self, job: FakeJob) -> None:
        """Sleep until the job ends, then deliver a signed event (failures are ignored)."""
        cfg = self.config
        await asyncio.sleep(job.queued_s + job.render_s + cfg.webhook_delay_s)
        body = json.dumps({"type": f"avatar_video.{job.outcome}",
                           "data": {"job_id": job.job_id, "status": job.outcome}}).encode()
        stamp = f"{time.time():.0f}"
        headers = {"X-Sume-Timestamp": stamp,
                   "X-Sume-Signature": sign(cfg.webhook_secret, stamp, body),
                   "X-Sume-Event-Id": f"evt_{uuid.uuid4().hex[:16]}",
                   "Content-Type": "application/json"}
        assert cfg.webhook_url is not None
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with aiohttp.ClientSession() as http, http.post(
                    cfg.webhook_url, data=body, headers=headers,
                    timeout=aiohttp.ClientTimeout(total=5)) as resp:
                self.webhooks_sent[resp.status] += 1

    def ledger(self) -> dict[str, Any]:
        """What the status answers report now, summed over the jobs whose answers the fake
        writes itself (not scripted ones), added or created: credits `reserved` (accepted, not
        ended), `captured` (completed), `refunded` (failed, canceled, expired), and by job
        the credits captured."""
        totals = dict.fromkeys(("reserved", "captured", "refunded"), 0)
        jobs: dict[str, int] = {}
        for job in self.jobs.values():
            if job.script:
                continue
            usage = self._ledger_of(job, self._status_of(job))
            for name in totals:
                totals[name] += usage[name]
            jobs[job.job_id] = usage["captured"]
        return {**totals, "jobs": jobs}

    def stats(self) -> dict[str, Any]:
        """Counters for tests and benchmarks."""
        ledger = self.ledger()
        return {"jobs": len(self.jobs), "reads": sum(self.reads.values()),
                **{f"credits_{k}": ledger[k] for k in ("reserved", "captured", "refunded")},
                "in_flight": sum(self.in_flight.values()),
                "overlaps": self.overlaps, "creates": self.creates, "billed": self.billed,
                "answers": {str(k): v for k, v in sorted(self.answers.items())},
                "auth_failures": self.auth_failures, "create_overlaps": self.create_overlaps,
                "keys_billed_twice": sum(1 for n in self.billed_by_key.values() if n > 1),
                "max_running_seen": self.max_running_seen,
                "concurrency_refusals": self.concurrency_refusals}

    def running(self) -> int:
        """Billed renders that have not reached a terminal state yet."""
        return sum(1 for j in self.jobs.values()
                   if j.idempotency_key is not None and self._status_of(j) not in TERMINAL)

    def _pick_outcome(self) -> str:
        mix = self.config.terminal_mix
        return self.rng.choices(list(mix), weights=list(mix.values()))[0]

    # -- HTTP -----------------------------------------------------------------------------
    def app(self) -> web.Application:
        """The aiohttp application serving the fake."""
        app = web.Application(middlewares=[self._front])
        # [^/]+: aiohttp's default pattern leaves out braces, and a job id may hold any
        # character (it arrives percent-encoded as one segment)
        any_id = "{job_id:[^/]+}"
        app.router.add_post("/v1/videos", self.create)
        app.router.add_get(f"/v1/jobs/{any_id}/status", self.status)
        app.router.add_get(f"/v1/jobs/{any_id}/result", self.result)
        app.router.add_get(f"/media/{any_id}/video.mp4", self.media)
        app.router.add_get("/_fake/stats", self.stats_view)
        app.router.add_post("/_fake/config", self.config_view)
        return app

    @web.middleware
    async def _front(self, request: web.Request,
                     handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                     ) -> web.StreamResponse:
        """Answer in Sume's place when `front_answer` says so; count requests no route takes."""
        step = self.config.front_answer
        if step is not None and not request.path.startswith("/_fake/"):
            self.front_answers += 1
            code = int(step.get("http", 404))
            self.answers[code] += 1
            return web.Response(status=code, text=str(step.get("raw", "")),
                                content_type=step.get("content_type", "text/plain"),
                                headers=step.get("headers"))
        if getattr(request.match_info, "http_exception", None) is not None:
            self.unrouted[request.path] += 1
        return await handler(request)

    def _error(self, status: int, code: str, message: str,
               headers: dict[str, str] | None = None) -> web.Response:
        self.answers[status] += 1
        body = {"error": {"code": code, "message": message},
                "request_id": f"req_{uuid.uuid4().hex[:16]}"}
        return web.json_response(body, status=status, headers=headers)

    def _authorized(self, request: web.Request) -> bool:
        want = self.config.api_key
        if want is None:
            return True
        given = request.headers.get("Authorization")
        return any(given == f"Bearer {k}" for k in (want, *self.config.extra_api_keys))

    def _limit(self, request: web.Request, kind: str
               ) -> tuple[web.Response | None, dict[str, str]]:
        """Take one token from this key's bucket: (a 429 to send, or None; headers to add)."""
        cfg = self.config
        key = request.headers.get("Authorization", "")
        if kind == "read":
            rate = cfg.read_rate_by_key.get(key.removeprefix("Bearer "), cfg.read_rate_per_s)
            burst = cfg.read_burst
        else:
            rate, burst = cfg.create_rate_per_s, cfg.create_burst
        if rate is None:
            return None, {}
        now = time.monotonic()
        bucket = self._buckets.setdefault((key, kind), [burst, now])
        bucket[0] = min(burst, bucket[0] + (now - bucket[1]) * rate)
        bucket[1] = now
        allowed = bucket[0] >= 1.0
        if allowed:
            bucket[0] -= 1.0
        remaining = int(bucket[0])
        until_token = max(0.0, (1.0 - bucket[0]) / rate)
        reset = until_token if remaining == 0 else (burst - bucket[0]) / rate
        headers = {}
        for prefix in ("RateLimit-", "X-RateLimit-"):
            headers[prefix + "Limit"] = f"{rate * 60:g}"
            headers[prefix + "Remaining"] = str(remaining)
            headers[prefix + "Reset"] = f"{reset:.3f}"
        if allowed:
            return None, headers
        return self._error(429, "rate_limit_exceeded", "slow down",
                           {**headers, "Retry-After": f"{until_token:.3f}"}), headers

    async def _latency(self) -> None:
        cfg = self.config
        if cfg.latency_s > 0:
            j = cfg.latency_jitter
            await asyncio.sleep(cfg.latency_s * self.rng.uniform(1 - j, 1 + j))

    async def create(self, request: web.Request) -> web.StreamResponse:
        """POST /v1/videos: 202 with a job id; the same Idempotency-Key returns the same job."""
        key = request.headers.get("Idempotency-Key")
        if key:
            self.posts_by_key[key] += 1
            self.creates_in_flight[key] += 1
            if self.creates_in_flight[key] > 1:
                # two POSTs with one key in flight at once: what submitters must never do
                self.create_overlaps += 1
        counted = key
        try:
            if not self.config.create_keeps_running:
                return await self._create(request, key)
            # like a real server's worker: the client going away does not stop the work
            task = asyncio.create_task(self._create(request, key))
            self._create_tasks.add(task)
            task.add_done_callback(self._create_tasks.discard)
            try:
                return await asyncio.shield(task)
            except asyncio.CancelledError:
                # the client gave up: its POST is no longer "in flight" (a re-send now is no
                # overlap), while the work goes on in `task`
                self.orphaned_creates += 1
                if key:
                    self.creates_in_flight[key] -= 1
                    counted = None
                raise
        finally:
            if counted:
                self.creates_in_flight[counted] -= 1

    async def _create(self, request: web.Request, key: str | None) -> web.StreamResponse:
        cfg = self.config
        await self._latency()
        if not self._authorized(request):
            self.auth_failures += 1
            return self._error(401, "unauthorized", "invalid API key")
        try:
            payload = await request.json()
        except (ValueError, UnicodeDecodeError):
            payload = None
        if not isinstance(payload, dict):
            return self._error(422, "bad_request", "body must be a JSON object")
        self.creates += 1
        self.create_times.append(time.monotonic())
        if key:
            self.create_order.append(key)
        if cfg.limits_before_key:
            refused = self._create_checks(request, payload)
            if refused is not None:
                if key and key in self.by_key:
                    self.refusals_of_billed_keys[key] += 1
                return refused
        if key and key in self.by_key and cfg.key_ttl_s is not None and (
                time.monotonic() - self.key_born.get(key, 0.0) > cfg.key_ttl_s):
            # the provider forgot the key: this is a new request now
            del self.by_key[key]
            self.payloads.pop(key, None)
        if key and key in self.by_key:
            if self.payloads.get(key) != payload:
                return self._error(422, "idempotency_key_reused",
                                   "this Idempotency-Key was used with a different request")
            self.answers[202] += 1
            job_id = self.by_key[key]
            return web.json_response({"job_id": job_id, "status": "queued"}, status=202)
        if key and key in self._creating:
            # the first request with this key is still at work: a provider locks its keys
            return self._error(409, "idempotency_key_in_use",
                               "a request with this Idempotency-Key is in progress")
        if self.on_create is not None:
            await self.on_create(key)  # tests: look at the database before anything is billed
        if not cfg.limits_before_key:
            refused, _ = self._limit(request, "create")
            if refused is not None:
                return refused
        fault = self._create_fault(key)
        if fault:
            self.faults["create_" + fault] += 1
        if fault == "5xx":
            return self._error(500, "internal_error", "something broke")
        if fault == "429":
            return self._error(429, "rate_limit_exceeded", "slow down",
                               {"Retry-After": f"{cfg.retry_after_s:g}"})
        if not cfg.limits_before_key:
            refused = self._create_checks(request, payload, rate_checked=True)
            if refused is not None:
                return refused
        if cfg.create_bill_s > 0:
            if key:
                self._creating.add(key)
            try:
                await asyncio.sleep(cfg.create_bill_s)
            finally:
                if key:
                    self._creating.discard(key)
            if cfg.credits is not None and cfg.credits <= 0:  # spent meanwhile
                return self._error(402, "insufficient_credits",
                                   "not enough credits for this job")
        job_id = self.add_job()
        self.jobs[job_id].idempotency_key = key
        if key:
            self.by_key[key] = job_id
            self.payloads[key] = payload
            self.key_born[key] = time.monotonic()
            self.billed_by_key[key] += 1
        self.billed += 1
        if cfg.credits is not None:
            cfg.credits -= 1
        self.max_running_seen = max(self.max_running_seen, self.running())
        if fault == "5xx_billed":
            return self._error(500, "internal_error", "something broke after starting the job")
        if fault == "lose_reply":
            await asyncio.sleep(cfg.hang_s)
        self.answers[202] += 1
        return web.json_response({"job_id": job_id, "status": "queued"}, status=202)

    def _create_checks(self, request: web.Request, payload: dict[str, Any],
                       rate_checked: bool = False) -> web.Response | None:
        """The create's own checks (rate, request, concurrency cap, credits): the refusal to
        send, or None. Run before the key lookup with limits_before_key, else after it."""
        cfg = self.config
        if not rate_checked:
            refused, _ = self._limit(request, "create")
            if refused is not None:
                return refused
        prompt = payload.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            return self._error(422, "invalid_request", "'prompt' must be a non-empty string")
        if cfg.max_concurrent is not None and self.running() >= cfg.max_concurrent:
            self.concurrency_refusals += 1
            return self._error(429, "concurrency_limit_exceeded",
                               f"at most {cfg.max_concurrent} generations at once",
                               {"Retry-After": f"{cfg.retry_after_s:g}"})
        if cfg.credits is not None and cfg.credits <= 0:
            return self._error(402, "insufficient_credits", "not enough credits for this job")
        return None

    def _create_fault(self, key: str | None) -> str | None:
        """The fault for this POST: the key's script first, then the configured rates."""
        if key and self.create_script.get(key):
            step = self.create_script[key].pop(0)
            return None if step == "ok" else step
        cfg = self.config
        roll = self.rng.random()
        for rate, fault in ((cfg.create_fail_5xx, "5xx"), (cfg.create_rate_429, "429"),
                            (cfg.create_5xx_billed, "5xx_billed"),
                            (cfg.create_lose_reply, "lose_reply")):
            if roll < rate:
                return fault
            roll -= rate
        return None

    def _status_of(self, job: FakeJob) -> str:
        age = time.monotonic() - job.created
        if age < job.queued_s:
            return "queued"
        if age < job.queued_s + job.render_s:
            return "running"
        return job.outcome

    async def status(self, request: web.Request) -> web.StreamResponse:
        """GET /v1/jobs/{id}/status with the configured faults."""
        job_id = request.match_info["job_id"]
        self.raw_paths.append(request.raw_path)
        self.reads[job_id] += 1
        self.in_flight[job_id] += 1
        if self.in_flight[job_id] > 1:
            self.overlaps += 1
        try:
            return await self._status(request, job_id)
        finally:
            self.in_flight[job_id] -= 1

    async def _status(self, request: web.Request, job_id: str) -> web.StreamResponse:
        await self._latency()
        if not self._authorized(request):
            self.auth_failures += 1
            return self._error(401, "unauthorized", "invalid API key")
        refused, headers = self._limit(request, "read")
        answer = refused or await self._status_answer(
            job_id, request.headers.get("Authorization", ""))
        answer.headers.update(headers)
        self.read_log.append((time.monotonic(),
                              request.headers.get("Authorization", "").removeprefix("Bearer "),
                              answer.status))
        if answer.status == 200:
            self.answer_log.append((time.time(), job_id))
        return answer

    async def _status_answer(self, job_id: str, auth: str = "") -> web.StreamResponse:
        cfg = self.config
        job = self.jobs.get(job_id)
        if job is None and cfg.auto_create:
            self.add_job(job_id)
            job = self.jobs[job_id]
        if job is None:
            return self._error(404, "not_found", "no such job")
        if job.script:
            step = job.script.pop(0) if len(job.script) > 1 else job.script[0]
            return await self._scripted(job, step, auth)
        if time.monotonic() - job.created < cfg.not_found_for_s:
            self.faults["404_new"] += 1
            return self._error(404, "not_found", "no such job")
        roll = self.rng.random()
        for rate, fault in ((cfg.hang, "hang"), (cfg.fail_5xx, "5xx"), (cfg.rate_429, "429"),
                            (cfg.unavailable_503, "503"), (cfg.malformed, "malformed"),
                            (cfg.html, "html")):
            if roll < rate:
                self.faults[fault] += 1
                return await self._fault(fault)
            roll -= rate
        return self._answer(job)

    def _answer(self, job: FakeJob, status: str | None = None) -> web.Response:
        status = status or self._status_of(job)
        terminal = status in TERMINAL
        word = self._word(job, status)
        hint = None if terminal else self.config.next_poll_after_s
        shape = job.shape or self.config.status_shape
        body: dict[str, Any]
        if shape == "seed":
            body = {"job_id": job.job_id, "sume_status": word, "terminal": terminal,
                    "usage": self._usage(job, status)}
            if hint is not None:
                body["next_poll_after_seconds"] = hint
        else:
            body = self._enveloped(job, status, word, shape, hint)
        self.answers[200] += 1
        return web.json_response(body)

    @staticmethod
    def _ledger_of(job: FakeJob, status: str) -> dict[str, int]:
        """A job's credits reserved, captured and refunded when its state is `status`."""
        ended = status in TERMINAL
        return {"reserved": 0 if ended else job.price,
                "captured": job.price if status == "completed" else 0,
                "refunded": job.price if ended and status != "completed" else 0}

    def _usage(self, job: FakeJob, status: str) -> dict[str, Any]:
        """The `usage` of a status answer, in the config's USAGE_FORMS."""
        ledger = self._ledger_of(job, status)
        form = self.config.usage_form
        if form == "credits":
            return ledger
        if form != "usd_micros":
            raise ValueError(f"unknown usage form {form!r}; one of {USAGE_FORMS}")
        rate = self.config.usd_micros_per_credit
        state = next((k for k in ("captured", "refunded") if ledger[k]), "reserved")
        return {"usage_status": state, "currency": "USD",
                "billable_amount_usd_micros": job.price * rate,
                **{f"{k}_amount_usd_micros": v * rate for k, v in ledger.items()}}

    def _word(self, job: FakeJob, status: str) -> str:
        """The word this job's answers use for `status`, in its letter case."""
        cfg = self.config
        word = (job.words if job.words is not None else cfg.status_words).get(status, status)
        case = job.case or cfg.status_case
        if case == "as_is" and cfg.uppercase:
            case = "upper"
        if case == "random":
            case = self.rng.choice(("lower", "upper", "title"))
        if case == "lower":
            return word.lower()
        if case == "upper":
            return word.upper()
        if case == "title":
            return word.title()
        return word

    def _enveloped(self, job: FakeJob, status: str, word: str, shape: str,
                   hint: float | None) -> dict[str, Any]:
        """A status answer as Sume's CLI reads it: no `terminal` flag, the word in `shape`."""
        if shape not in STATUS_SHAPES:
            raise ValueError(f"unknown status shape {shape!r}; one of {STATUS_SHAPES}")
        done = status == "completed"
        ended = status in TERMINAL
        fields: dict[str, Any] = {
            "id": job.job_id,
            "progress": 1.0 if ended else 0.0 if status == "queued" else 0.5,
            "result_ready": done,
            "next_action": "fetch_result" if done else "none" if ended else "poll",
            "usage": self._usage(job, status)}
        if hint is not None:
            fields["next_poll_after_seconds"] = hint
        path = f"/v1/jobs/{job_path_segment(job.job_id)}"
        links = {"status_url": f"{path}/status", "result_url": f"{path}/result"}
        request_id = f"req_{uuid.uuid4().hex[:16]}"
        if shape == "data":
            return {"data": {**fields, "status": word, **links}, "request_id": request_id}
        if shape == "data.sume_status":
            return {"data": {**fields, "sume_status": word, **links}, "request_id": request_id}
        if shape == "data.job":
            return {"data": {"job": {**fields, "status": word}, **links},
                    "request_id": request_id}
        if shape == "job":
            return {"job": {**fields, "status": word}, **links, "request_id": request_id}
        return {**fields, "job_id": job.job_id, "status": word, **links,
                "request_id": request_id}

    async def _fault(self, fault: str) -> web.StreamResponse:
        cfg = self.config
        if fault == "hang":
            await asyncio.sleep(cfg.hang_s)
            return self._error(504, "internal_error", "hung")
        if fault == "5xx":
            return self._error(500, "internal_error", "something broke")
        if fault == "429":
            return self._error(429, "rate_limit_exceeded", "slow down",
                               {"Retry-After": f"{cfg.retry_after_s:g}"})
        if fault == "503":
            return self._error(503, "internal_error", "overloaded",
                               {"Retry-After": f"{cfg.retry_after_s:g}"})
        self.answers[200] += 1
        if fault == "malformed":
            return web.json_response({"job_id": "?", "sume_status": 3})
        return web.Response(text="<html><body>502 Bad Gateway</body></html>",
                            content_type="text/html")

    async def _scripted(self, job: FakeJob, step: dict[str, Any],
                        auth: str = "") -> web.StreamResponse:
        """One scripted answer: {"hang": s} | {"http": code, "headers": {...}, "raw": text}
        | {"body": {...}} | {"sume_status": s, "terminal": b, ...} | {"fault": name}
        | {"echo_key": form, "http": code} (see `echo_answer`)."""
        if "hang" in step:
            await asyncio.sleep(float(step["hang"]))
        if "fault" in step:
            return await self._fault(str(step["fault"]))
        if "echo_key" in step:
            code = int(step.get("http", 400))
            self.answers[code] += 1
            text, content_type = echo_answer(str(step["echo_key"]), auth)
            return web.Response(status=code, text=text, content_type=content_type)
        code = int(step.get("http", 200))
        headers = step.get("headers")
        if "raw" in step:
            self.answers[code] += 1
            return web.Response(status=code, text=str(step["raw"]), headers=headers,
                                content_type=step.get("content_type", "text/plain"))
        if code != 200:
            return self._error(code, step.get("code", "error"), step.get("message", "scripted"),
                               headers)
        body = step.get("body")
        if body is None:
            body = {k: v for k, v in step.items() if k not in ("http", "headers")}
            body.setdefault("job_id", job.job_id)
        self.answers[200] += 1
        return web.Response(text=json.dumps(body), content_type="application/json",
                            headers=headers)

    async def result(self, request: web.Request) -> web.Response:
        """GET /v1/jobs/{id}/result: 409 job_not_completed until the job completed."""
        await self._latency()
        if not self._authorized(request):
            return self._error(401, "unauthorized", "invalid API key")
        refused, _ = self._limit(request, "read")
        if refused is not None:
            return refused
        job = self.jobs.get(request.match_info["job_id"])
        if job is None:
            return self._error(404, "not_found", "no such job")
        if self._status_of(job) != "completed":
            return self._error(409, "job_not_completed", "the job has not completed")
        self.answers[200] += 1
        self.results_served[job.job_id] += 1
        return web.json_response({"job_id": job.job_id,
                                  "videos": [{"url": self._media_link(request, job.job_id)}]})

    def _media_link(self, request: web.Request, job_id: str) -> str:
        cfg = self.config
        sig = uuid.uuid4().hex
        born_expired = len(self.media_links) < cfg.media_expired_first
        self.media_links[sig] = time.monotonic() + (-1.0 if born_expired
                                                    else cfg.media_url_ttl_s)
        host = f"{request.scheme}://{request.host}"
        return (f"{host}/media/{job_path_segment(job_id)}/video.mp4"
                f"?sig={sig}&expires={cfg.media_url_ttl_s:.0f}")

    @staticmethod
    def media_content(job_id: str, size: int) -> bytes:
        """The bytes of a job's video: a digest of its id, repeated (tests check sha256)."""
        block = hashlib.sha256(job_id.encode("utf-8", "surrogatepass")).digest() * 64
        return (block * (size // len(block) + 1))[:size]

    async def media(self, request: web.Request) -> web.StreamResponse:
        """GET /media/{id}/video.mp4?sig=...: the file, 403 once the link expired; Range
        requests get 206 (unless media_ranges is off); throttled by media_bytes_per_s."""
        cfg = self.config
        job_id = request.match_info["job_id"]
        range_header = request.headers.get("Range")
        expiry = self.media_links.get(request.query.get("sig", ""))
        if job_id not in self.jobs or expiry is None or expiry < time.monotonic():
            self.media_log.append((job_id, 403, range_header,
                                   request.headers.get("Authorization")))
            return web.Response(status=403, text="<Error>Request has expired</Error>",
                                content_type="application/xml")
        data = self.media_content(job_id, cfg.media_bytes)
        start, status = 0, 200
        if range_header and cfg.media_ranges and range_header.startswith("bytes="):
            first = range_header.removeprefix("bytes=").split("-", 1)[0]
            if first.isdigit():
                start, status = int(first), 206
                if start >= len(data):
                    self.media_log.append((job_id, 416, range_header, None))
                    return web.Response(status=416,
                                        headers={"Content-Range": f"bytes */{len(data)}"})
        self.media_log.append((job_id, status, range_header,
                               request.headers.get("Authorization")))
        resp = web.StreamResponse(status=status, headers={
            "Content-Type": "video/mp4", "Content-Length": str(len(data) - start),
            **({"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
               if status == 206 else {})})
        await resp.prepare(request)
        chunk = 16 * 1024
        for at in range(start, len(data), chunk):
            await resp.write(data[at:at + chunk])
            if cfg.media_bytes_per_s:
                await asyncio.sleep(chunk / cfg.media_bytes_per_s)
        await resp.write_eof()
        return resp

    async def stats_view(self, request: web.Request) -> web.Response:
        """GET /_fake/stats: the counters as JSON."""
        return web.json_response(self.stats())

    async def config_view(self, request: web.Request) -> web.Response:
        """POST /_fake/config: change fault rates at runtime (benchmarks, chaos runs)."""
        changes = await request.json()
        for key, value in changes.items():
            if not hasattr(self.config, key):
                return web.json_response({"error": f"unknown setting {key}"}, status=400)
            setattr(self.config, key, value)
        return web.json_response(asdict(self.config))


ECHO_FORMS = ("raw", "slash", "unicode", "percent", "html")
"""How `echo_answer` writes the request's Authorization header back: as sent, JSON with every
`/` escaped (`\\/`, as PHP's json_encode writes it), JSON with each of its characters
`\\u`-escaped, percent-encoded (a URL's query), or an HTML page with character references
(`&#x2F;`, `&#x3D;`, `&#43;`)."""


def echo_answer(form: str, auth: str) -> tuple[str, str]:
    """An error body that quotes the request's Authorization header (key included) in
    `form` (one of ECHO_FORMS), as a provider or a proxy may when it refuses a request:
    (text, content type). The JSON forms are Sume's error envelope, the header also in an
    object key and under `echo`."""
    if form == "html":
        shown = "".join({"/": "&#x2F;", "=": "&#x3D;", "+": "&#43;"}.get(c, c) for c in auth)
        return (f"<html><body><h1>Bad Request</h1><p>Header Authorization: {shown}</p>"
                "</body></html>", "text/html")
    mark = "\x00echo\x00"
    body = {"error": {"code": "invalid_request",
                      "message": f"Authorization: {mark} is not allowed here"},
            "echo": {"authorization": mark, mark: True},
            "request_id": f"req_{uuid.uuid4().hex[:16]}"}
    text = json.dumps(body)
    quoted = json.dumps(auth)[1:-1]
    if form == "slash":
        text, quoted = text.replace("/", "\\/"), quoted.replace("/", "\\/")
    elif form == "unicode":
        quoted = "".join(f"\\u{ord(c):04x}" for c in auth)
    elif form == "percent":
        quoted = quote(auth, safe="")
    elif form != "raw":
        raise ValueError(f"echo_key: one of {', '.join(ECHO_FORMS)}, not {form!r}")
    return text.replace(json.dumps(mark)[1:-1], quoted), "application/json"


async def start_fake(fake: FakeSume, host: str = "127.0.0.1",
                     port: int = 0) -> tuple[web.AppRunner, str]:
    """Serve `fake` on a loopback port; returns the runner and its base URL."""
    # handler_cancellation: a client that gave up (timeout) ends its request here too, so
    # "two reads of one job at once" counts only reads a client is still waiting for.
    runner = web.AppRunner(fake.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    addresses = runner.addresses
    bound = addresses[0][1]
    return runner, f"http://{host}:{bound}"
