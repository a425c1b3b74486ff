"""The dashboard: server-rendered pages (Jinja2, no JavaScript) over the job table.

Pages: the overview (counts, exact for pending rows and estimated for finished ones on a big
table: vidpoll.web.figures; backlog, lateness and reads over the last hour as SVG charts,
recent errors, stuck claims, deliveries), the jobs table (filters, keyset paging that stays fast
at a million rows), a job's detail (row, intent, result without signed query strings,
deliveries, history, cost and tags) with its actions (resume, poll now, retry the intent),
the intents by state (a held one with why), this month's spend per account (a bar per
day, spent and reserved apart, against the day cap; the month against its cap: `spend`), and
the render times per account, provider, model and duration key with the overdue jobs
(`durations`: vidpoll.web.durations draws them).

Security (Guard): every state-changing action is a POST carrying a CSRF token (an HMAC of the
session, checked in constant time) and, when the browser says where it comes from, the same
origin. With VIDPOLL_DASHBOARD_TOKEN set every page asks for it once (a login form sets an
HttpOnly, SameSite=Strict cookie: its issue time, a session id and an HMAC under a key derived
with scrypt from the token and a random salt kept in the database, never the token); the
session is a row in the database, so logging out ends it for every copy of the cookie and
every `serve`. Wrong tokens, on any path that takes one (the form, `Authorization: Bearer`, the
scrape routes), draw on a FailureLimiter per token and process: a few per client address
(spent: 429) and a budget for all clients (spent: checks wait their turn in one lane, paced
at the budget), taken before the token is compared, so parallel guesses cannot outrun it and
guessers cannot lock out the right token; the metrics token has a budget of its own. Every
comparison is of bytes (no input can make it raise). `vidpoll serve` refuses to bind beyond
loopback without a token; bound to loopback without one, only a loopback Host header is served
(no DNS rebinding).
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import hmac
import ipaddress
import math
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from typing import Any, Protocol
from urllib.parse import quote, urlsplit

import jinja2
from aiohttp import web
from markupsafe import Markup, escape

from vidpoll.config import ProxyNetwork
from vidpoll.logs import Redactor, secrets_from_env
from vidpoll.media import without_signatures
from vidpoll.models import (
    HELD,
    LOCAL_TERMINAL_STATES,
    PENDING,
    QUEUED,
    RECONCILING,
    REJECTED,
    SUBMITTED,
    UNKNOWN,
)
from vidpoll.providers import registry
from vidpoll.schedule import LEARN_AFTER_JOBS
from vidpoll.spend import NO_SPEND, AccountSpend, month_start
from vidpoll.store import InvalidCursor, PgStore
from vidpoll.web.durations import duration_views, seconds_text
from vidpoll.web.figures import COUNT_CAP_ROWS, EXACT_ROWS, STUCK_WALK_ROWS, read_figures

SESSION_COOKIE = "vidpoll_session"
PAGE_SIZES = (25, 50, 100, 200)
LOOPBACK_HOST = re.compile(r"(127\.0\.0\.1|localhost|\[::1\])(:\d{1,5})?", re.IGNORECASE)
SESSION_MAX_AGE_S = 12 * 3600
FORWARDED_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Real-IP")
DONE_WORDS = frozenset({"poll_now", "resume", "poll_now_refused", "resume_refused", "retried",
                        "retry_refused"})
CHART_MINUTES = 60
INTENT_STATES = (REJECTED, UNKNOWN, HELD, RECONCILING, QUEUED, SUBMITTED)
OVERDUE_LISTED = 200
"""The durations page lists at most this many overdue jobs (the longest overdue first)."""

KDF_N, KDF_R, KDF_P = 2**15, 8, 1
"""scrypt's cost for the signing key: 32 MiB and about 80 ms of one core (measured on the 2-core
machine the tests run on), paid once per `serve` start. A guess of the token from a leaked
cookie (and the database's salt, which the cookie does not hold) then costs the same, about
a million times a SHA-256's; more would slow every start and test for a token that should be
random anyway (16 characters at least). RFC 7914's interactive-login figure is 2**14."""
KDF_MAXMEM = 64 * 1024 * 1024
SALT_BYTES = 32
FAILURES_PER_CLIENT = 10
"""Wrong tokens a client address may try per FAILURE_WINDOW_S (an IPv6 client: its /64)."""
FAILURES_OVERALL = 100
"""Wrong tokens all clients together may try per FAILURE_WINDOW_S (many addresses)."""
FAILURE_WINDOW_S = 60.0
CLIENTS_KEPT = 1000
"""Above this many client buckets, the ones that refilled are forgotten (a full bucket is the
same as none); the overall budget bounds how many can be partly spent."""
LANE_WAITERS = 10
"""Checks that may wait for the overall budget at once: one leaves every 0.6 s at the
defaults, so the last waits 6 s (below Prometheus's default scrape timeout of 10 s); more are
refused with 429 until one leaves."""
_COOKIE = re.compile(r"(\d{1,12})\.([0-9a-f]{32})\.([0-9a-f]{64})")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class SessionStore(Protocol):
    """Where the signing key's salt and the signed-in sessions live (PgStore)."""

    async def dashboard_salt(self, candidate: bytes) -> bytes: ...

    async def add_dashboard_session(self, digest: bytes, max_age_s: float) -> None: ...

    async def dashboard_session_live(self, digest: bytes) -> bool: ...

    async def end_dashboard_session(self, digest: bytes) -> bool: ...


class TooManyGuesses(Exception):
    """The failure budget is spent: the token was not even checked."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"too many wrong tokens; try again in {retry_after_s} s")
        self.retry_after_s = retry_after_s


@dataclass
class _Bucket:
    left: float
    at: float


class FailureLimiter:
    """The budget of wrong guesses of one token, per client address and for all clients:
    each holds `burst` failures and refills at that many per `window_s`. A check takes one
    failure from both before its token is compared (no await between the take and the
    comparison), so any number of parallel guesses get at most the budget checked; a right
    token gives it back, so the budget only ever counts wrong ones.

    A client whose own budget is spent is refused (TooManyGuesses: 429). Once the overall
    budget is spent, a check is not refused but waits in one lane: one waiter at a time, each
    let through as the overall budget refills a failure (window_s / overall: 0.6 s at the
    defaults), at most `waiters` waiting (more are refused). Guessers from many addresses
    thus get no more checks than the budget, and a right token waits its turn instead of
    being refused for the rest of the minute."""

    def __init__(self, per_client: int = FAILURES_PER_CLIENT,
                 overall: int = FAILURES_OVERALL, window_s: float = FAILURE_WINDOW_S,
                 clock: Callable[[], float] = time.monotonic, *, waiters: int = LANE_WAITERS,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.per_client, self.overall, self.window_s = per_client, overall, window_s
        self.waiters = waiters
        self._clock, self._sleep = clock, sleep
        self._clients: dict[str, _Bucket] = {}
        self._all = _Bucket(float(overall), clock())
        self._lane = asyncio.Lock()  # FIFO: nobody who comes later overtakes a waiter
        self.waiting = 0
        """Checks waiting in the lane now."""
        self.waited = 0
        """Checks that waited in the lane (since the start)."""

    def _level(self, bucket: _Bucket, burst: int, now: float) -> float:
        refill = max(0.0, now - bucket.at) * burst / self.window_s
        return min(float(burst), bucket.left + refill)

    async def take(self, client: str) -> None:
        """Take one failure for a check about to happen (the caller compares right after,
        without awaiting in between); waits in the lane while the overall budget is spent;
        TooManyGuesses if the client's own budget is spent or the lane is full."""
        now = self._clock()
        mine = self._clients.get(client) or _Bucket(float(self.per_client), now)
        left_mine = self._level(mine, self.per_client, now)
        if left_mine < 1:
            raise TooManyGuesses(max(1, math.ceil(self._wait(left_mine, self.per_client))))
        # the client's failure is taken now: its parallel guesses queue no more than its budget
        mine.left, mine.at = left_mine - 1, now
        self._clients[client] = mine
        if len(self._clients) > CLIENTS_KEPT:
            self._clients = {c: b for c, b in self._clients.items()
                             if self._level(b, self.per_client, now) < self.per_client}
        if self.waiting == 0 and self._take_overall(now):
            return
        if self.waiting >= self.waiters:
            self._give_back_client(client)  # refused unread: it was no check
            raise TooManyGuesses(max(1, math.ceil(self.waiting * self.window_s
                                                  / self.overall)))
        self.waiting += 1
        self.waited += 1
        taken = False
        try:
            async with self._lane:
                while not (taken := self._take_overall(self._clock())):
                    level = self._level(self._all, self.overall, self._clock())
                    await self._sleep(self._wait(level, self.overall))
        finally:
            self.waiting -= 1
            if not taken:  # cancelled (the client went away): nothing was checked
                self._give_back_client(client)

    def _take_overall(self, now: float) -> bool:
        left = self._level(self._all, self.overall, now)
        if left < 1:
            return False
        self._all.left, self._all.at = left - 1, now
        return True

    def give_back(self, client: str) -> None:
        """The token was right: the failure taken for it was none."""
        self._give_back_client(client)
        now = self._clock()
        self._all.left, self._all.at = min(float(self.overall),
                                           self._level(self._all, self.overall, now) + 1), now

    def _give_back_client(self, client: str) -> None:
        now = self._clock()
        mine = self._clients.get(client)
        if mine is not None:
            mine.left, mine.at = min(float(self.per_client),
                                     self._level(mine, self.per_client, now) + 1), now

    def _wait(self, left: float, burst: int) -> float:
        return 0.0 if left >= 1 else (1 - left) * self.window_s / burst


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip())
    except ValueError:
        return None


def client_of(request: web.Request, trusted: Sequence[ProxyNetwork] = ()) -> str:
    """The address a failure budget is kept for: the peer's IP, an IPv6 peer's /64 (one host
    may own all of it). A proxy header only from a peer in `trusted` (anyone can write one):
    then X-Forwarded-For is read from the right, each trusted proxy's entry skipped, and the
    first address no trusted proxy owns is the client (what a client wrote to the left of it
    is never read). Without `trusted`, behind a proxy every client is the proxy, and the
    per-client budget becomes one more overall budget."""
    ip = _ip(request.remote or "")
    if ip is None:
        return request.remote or "-"
    if trusted and any(ip in net for net in trusted):
        forwarded = ",".join(request.headers.getall("X-Forwarded-For", [])).split(",")
        for hop in reversed(forwarded):
            before = _ip(hop)
            if before is None:  # garbled: the last address known good stands
                break
            ip = before
            if not any(ip in net for net in trusted):
                break
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


def same(given: str, expected: str) -> bool:
    """Constant-time equality of two texts as UTF-8 bytes: any input, lone surrogates
    included, compares (unequal) instead of raising as compare_digest does on non-ASCII str."""
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"),
                               expected.encode("utf-8", "surrogatepass"))


@functools.lru_cache(maxsize=8)
def signing_key(token: str, salt: bytes) -> bytes:
    """The key that signs sessions and CSRF tokens: scrypt(token, salt) (KDF_N, KDF_R,
    KDF_P); cached, so an app started twice in one process derives it once."""
    return hashlib.scrypt(b"vidpoll-dashboard:" + token.encode("utf-8", "surrogatepass"),
                          salt=salt, n=KDF_N, r=KDF_R, p=KDF_P, maxmem=KDF_MAXMEM, dklen=32)


def bearer_of(request: web.Request) -> str:
    """The token of an `Authorization: Bearer` header, or ""."""
    auth = request.headers.get("Authorization", "")
    return auth[7:] if auth[:7].lower() == "bearer " else ""


def too_many(exc: TooManyGuesses) -> web.Response:
    """429 with Retry-After."""
    return web.Response(status=429, text=f"{exc}\n",
                        headers={"Retry-After": str(exc.retry_after_s)})


class Guard:
    """The dashboard's token wall, sessions and CSRF tokens, and the token checks of the
    scrape routes: each token has a FailureLimiter of its own (`limiter` for the dashboard
    token, `metrics_limiter` for the metrics token), so guessing one cannot hold up the
    other's right callers."""

    def __init__(self, token: str | None, loopback_only: bool,
                 clock: Callable[[], float] = time.time, *,
                 sessions: SessionStore | None = None, metrics_token: str | None = None,
                 limiter: FailureLimiter | None = None,
                 metrics_limiter: FailureLimiter | None = None,
                 trusted_proxies: Sequence[ProxyNetwork] = ()) -> None:
        self.token = token or None
        self.trusted_proxies = tuple(trusted_proxies)
        self.metrics_token = metrics_token or None
        self.loopback_only = loopback_only
        self.limiter = limiter or FailureLimiter()
        self.metrics_limiter = metrics_limiter or FailureLimiter()
        self._clock = clock
        if self.token is not None and sessions is None:
            raise ValueError("a dashboard token needs a session store (its salt, sessions)")
        self._sessions = sessions
        # signs CSRF tokens (and, once start() derived it from the token, sessions); random
        # per process without a token
        self._key = secrets.token_bytes(32)
        self._started = self.token is None

    async def start(self) -> None:
        """Derive the signing key from the token and the database's salt (once per start,
        off the event loop: scrypt takes a while on purpose)."""
        if self.token is None or self._sessions is None:
            return
        salt = await self._sessions.dashboard_salt(secrets.token_bytes(SALT_BYTES))
        self._key = await asyncio.to_thread(signing_key, self.token, salt)
        self._started = True

    def _sign(self, what: str) -> str:
        return hmac.new(self._key, what.encode("utf-8", "surrogatepass"),
                        hashlib.sha256).hexdigest()

    async def check(self, request: web.Request, given: str,
                    accepted: Sequence[tuple[str | None, FailureLimiter]] | None = None
                    ) -> bool:
        """Whether `given` is the dashboard token (or one of `accepted`, each with its
        budget), in constant time. Each comparison is paid for first from its token's budget
        (FailureLimiter.take: it may wait in the lane, or raise TooManyGuesses, and then
        nothing more is compared); a right token gives its failure back. An empty `given` is
        no guess."""
        tokens = [(t, budget) for t, budget in (
            accepted if accepted is not None else [(self.token, self.limiter)]) if t]
        if not given:
            return False
        client = client_of(request, self.trusted_proxies)
        taken: list[FailureLimiter] = []
        for token, budget in tokens:
            await budget.take(client)
            taken.append(budget)
            # no await since the take: parallel guesses get no more comparisons than it allows
            if same(given, token):
                for paid in taken:  # a right token is no wrong guess of the others either
                    paid.give_back(client)
                return True
        return False

    async def new_session(self) -> str:
        """A new signed-in session: recorded in the database, and its cookie (the issue
        time, a random id and their HMAC; never the token)."""
        if not self._started or self._sessions is None:
            raise RuntimeError("Guard.start() first: the signing key is not derived yet")
        issued, sid = str(int(self._clock())), secrets.token_hex(16)
        await self._sessions.add_dashboard_session(_digest(sid), SESSION_MAX_AGE_S)
        return f"{issued}.{sid}.{self._sign(f'session:{issued}.{sid}')}"

    def _signed_session(self, cookie: str) -> str | None:
        """The session id of a well-formed cookie this server's key signed and whose age is
        within SESSION_MAX_AGE_S, or None."""
        match = _COOKIE.fullmatch(cookie)  # ASCII digits and hex only: anything else is None
        if match is None or not self._started:
            return None
        issued, sid, signature = match.groups()
        if not same(signature, self._sign(f"session:{issued}.{sid}")):
            return None
        age = self._clock() - int(issued)
        return sid if -60 <= age <= SESSION_MAX_AGE_S else None  # a minute of clock skew

    async def session_ok(self, cookie: str) -> bool:
        """A signed, unexpired session that nobody logged out."""
        sid = self._signed_session(cookie)
        return (sid is not None and self._sessions is not None
                and await self._sessions.dashboard_session_live(_digest(sid)))

    async def end_session(self, cookie: str) -> bool:
        """Log the cookie's session out, for every copy of it and every `serve`."""
        sid = self._signed_session(cookie)
        return (sid is not None and self._sessions is not None
                and await self._sessions.end_dashboard_session(_digest(sid)))

    async def signed_in(self, request: web.Request) -> bool:
        """No token configured, or a live session cookie, or the right Bearer header (which
        may raise TooManyGuesses)."""
        if self.token is None:
            return True
        if await self.session_ok(request.cookies.get(SESSION_COOKIE, "")):
            return True
        return await self.check(request, bearer_of(request))

    def csrf(self, request: web.Request) -> str:
        """The CSRF token for forms on this session (each session has its own)."""
        return self._sign("csrf:" + request.cookies.get(SESSION_COOKIE, "-"))

    def csrf_ok(self, request: web.Request, given: str) -> bool:
        """The form's token matches, and the request comes from this origin (if it says;
        an opaque "null" origin is refused)."""
        origin = request.headers.get("Origin")
        if origin is not None and (origin == "null" or urlsplit(origin).netloc != request.host):
            return False
        return same(given, self.csrf(request))

    async def scrape_refusal(self, request: web.Request,
                             public: bool) -> web.StreamResponse | None:
        """Whether /metrics or /readyz (request.path) may be read, as a refusal or None.

        With a metrics token both need it (or the dashboard token) as Bearer; without one,
        /metrics on the public port needs the dashboard token if there is one (a proxy in
        front makes a loopback bind public too), and /readyz stays open for probes (it names
        only the kind of failure). `public`: the dashboard's port, not `--metrics-port`.

        The metrics token is compared first, on its own budget (a scrape never waits for the
        dashboard's guessers); a token that is not it is a guess of the dashboard token too,
        on the dashboard's budget (no faster through /metrics than through /login)."""
        if self.metrics_token is not None:
            accepted = [(self.metrics_token, self.metrics_limiter), (self.token, self.limiter)]
        elif public and request.path == "/metrics" and self.token is not None:
            accepted = [(self.token, self.limiter)]
        else:
            return None
        try:
            if await self.check(request, bearer_of(request), accepted):
                return None
        except TooManyGuesses as exc:
            return too_many(exc)
        return web.Response(status=401, text="send the metrics token as Authorization: Bearer\n",
                            headers={"WWW-Authenticate": 'Bearer realm="vidpoll"'})


async def form_of(request: web.Request) -> Mapping[str, Any]:
    """The request's form; a body that is not UTF-8 is a 400, not a traceback."""
    try:
        return await request.post()
    except (UnicodeDecodeError, ValueError):
        raise web.HTTPBadRequest(text="a form must be UTF-8") from None


def _digest(sid: str) -> bytes:
    """What the database keeps of a session id: its SHA-256 (a reader of the table learns no
    cookie)."""
    return hashlib.sha256(sid.encode()).digest()


def loopback_host(header: str) -> bool:
    """Whether a Host header names this machine's loopback (with an optional port)."""
    return LOOPBACK_HOST.fullmatch(header) is not None


def safe_next(target: str) -> str:
    """Where to go after signing in: a path on this site, never another site."""
    if (not target.startswith("/") or target.startswith("//") or "\\" in target
            or any(ord(c) < 32 or ord(c) == 127 for c in target)):
        return "/"
    parts = urlsplit(target)
    return "/" if parts.scheme or parts.netloc else target


def shown(redact: Redactor) -> Callable[[Any], Any]:
    """Jinja's `finalize`: every value a template prints, redacted (escaping comes after)."""

    def finalize(value: Any) -> Any:
        if isinstance(value, Markup):  # already HTML (charts, tojson): keep it HTML
            return Markup(redact(str(value)).replace("<redacted>", "&lt;redacted&gt;"))
        if isinstance(value, str):
            return redact(value)
        return value

    return finalize


def setup_dashboard(app: web.Application, store: PgStore, guard: Guard,
                    secrets: Iterable[str] = (), *,
                    spends: Mapping[str, AccountSpend] | None = None,
                    clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
    """Add the dashboard's routes and its guard to `app`; `secrets` (besides those of the
    environment and the dashboard token) are never shown. `spends`: each account's prices
    and caps (Settings.accounts[name].spend) for the spend page and the jobs' currency;
    `clock`: what "this month" is counted from (tests fix it)."""
    spends = dict(spends or {})
    redact = Redactor([s for s in (*secrets_from_env(), *secrets, guard.token or "")
                       if len(s) >= 4])
    env = jinja2.Environment(loader=jinja2.PackageLoader("vidpoll.web", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             finalize=shown(redact))
    env.filters["when"] = _when
    env.filters["ago"] = _ago
    env.filters["q"] = lambda v: quote(str(v), safe="")
    env.filters["n"] = lambda v: f"{v:,}"  # 9,405,000: readable at 10M rows
    env.globals["money"] = _money
    env.filters["figure"] = _figure
    env.filters["secs"] = seconds_text
    env.globals["STATES"] = states = registry.job_states()

    def render(request: web.Request, name: str, status: int = 200,
               headers: Mapping[str, str] | None = None, **context: Any) -> web.Response:
        html = env.get_template(name).render(
            csrf=guard.csrf(request), path=request.path,
            # a session to end (a Bearer caller has none)
            can_sign_out=(guard.token is not None and request.path != "/login"
                          and SESSION_COOKIE in request.cookies),
            **context)
        return web.Response(text=html, content_type="text/html", status=status, headers={
            "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self' "
                                       "data:; form-action 'self'; frame-ancestors 'none'",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin",
            "Cache-Control": "no-store", **(headers or {})})

    @web.middleware
    async def wall(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if not _dashboard_path(path):
            return await handler(request)
        if guard.loopback_only and (not loopback_host(request.host) or any(
                h in request.headers for h in FORWARDED_HEADERS)):
            # a proxy in front makes every visitor look local: that needs a token
            return web.Response(status=421, text="this dashboard answers only on loopback; "
                                "behind a proxy, set VIDPOLL_DASHBOARD_TOKEN")
        try:
            allowed = path in ("/login", "/static/style.css") or await guard.signed_in(request)
        except TooManyGuesses as exc:  # a Bearer token, refused before it was checked
            return too_many(exc)
        if allowed:
            return await handler(request)
        if request.method != "GET":
            return web.Response(status=401, text="sign in first")
        raise web.HTTPSeeOther(f"/login?next={quote(request.path_qs, safe='')}")

    app.middlewares.append(wall)

    async def derive_key(_: web.Application) -> None:
        await guard.start()

    app.on_startup.append(derive_key)

    async def overview(request: web.Request) -> web.Response:
        figures = await read_figures(store)
        series = _series(await store.minutes_since(CHART_MINUTES), datetime.now(UTC))
        return render(request, "overview.html", counts=figures.states,
                      estimated=figures.estimated, analyzed_at=figures.analyzed_at,
                      total=figures.total, due=figures.due, due_capped=figures.due_capped,
                      late=figures.oldest_late_s, exact_rows=EXACT_ROWS,
                      cap=COUNT_CAP_ROWS,
                      charts=[_bar_chart(series["reads"], "Status reads per minute", ""),
                              _bar_chart(series["errors"], "Failed reads per minute", ""),
                              _bar_chart(series["late_max"], "Worst lateness per minute", "s"),
                              _bar_chart(series["backlog"], "Rows due (sampled each minute)",
                                         "")],
                      errors=without_signatures(await store.recent_errors(15)),
                      stuck=await store.stuck_claims_upto(STUCK_WALK_ROWS),
                      stuck_walk=STUCK_WALK_ROWS,
                      deliveries=await store.delivery_backlog(),
                      overdue=sum((await store.count_overdue()).values()))

    async def jobs(request: web.Request) -> web.Response:
        state = request.query.get("state") or None
        account = request.query.get("account") or None
        if state is not None and state not in states:
            raise web.HTTPBadRequest(text=f"unknown state {state!r}")
        try:
            limit = int(request.query.get("limit", "50"))
        except ValueError:
            limit = 50
        limit = limit if limit in PAGE_SIZES else 50
        cursor = request.query.get("after") or None
        try:
            rows, next_cursor = await store.list_jobs(state, account, limit, cursor)
        except InvalidCursor as exc:
            raise web.HTTPBadRequest(text=str(exc)) from None
        base = {k: v for k, v in (("state", state), ("account", account),
                                  ("limit", str(limit))) if v}
        next_url = None
        if next_cursor:
            next_url = "/jobs?" + "&".join(f"{k}={quote(v, safe='')}"
                                           for k, v in {**base, "after": next_cursor}.items())
        return render(request, "jobs.html", rows=rows, state=state or "", account=account or "",
                      limit=limit, sizes=PAGE_SIZES, next_url=next_url, first=cursor is None)

    async def job(request: web.Request) -> web.Response:
        job_id = request.query.get("id", "")
        row = await store.get_job(job_id)
        archived = row is None
        if row is None:
            row = await store.get_archived_job(job_id)
        if row is None:
            return render(request, "missing.html", status=404, job_id=job_id)
        intent = await store.intent_of_job(job_id)
        result = row.pop("result", None)
        priced = spends.get(row["account"], NO_SPEND)
        return render(request, "job.html", job=without_signatures(row), archived=archived,
                      currency=priced.currency if priced.priced else None,
                      intent=intent, result=without_signatures(result),
                      history=await store.job_history(job_id),
                      deliveries=without_signatures(await store.job_deliveries(job_id)),
                      # a pending row has poll-now (resume would only poke it the same way)
                      can_resume=not archived and row["state"] in LOCAL_TERMINAL_STATES,
                      can_poll=not archived and row["state"] == PENDING,
                      overdue_now=(row.get("overdue_at") is not None
                                   and row["overdue_at"] <= datetime.now(UTC)),
                      done=_done(request))

    async def action(request: web.Request) -> web.StreamResponse:
        form = await form_of(request)
        if not guard.csrf_ok(request, str(form.get("csrf", ""))):
            return web.Response(status=403, text="stale or forged form; reload the page")
        job_id, what = str(form.get("id", "")), str(form.get("action", ""))
        if what == "resume":
            ok = await store.resume(job_id) is not None
        elif what == "poll_now":
            ok = await store.poll_now(job_id) is not None
        else:
            raise web.HTTPBadRequest(text="unknown action")
        done = what if ok else f"{what}_refused"
        raise web.HTTPSeeOther(f"/jobs/view?id={quote(job_id, safe='')}&done={done}")

    async def intents(request: web.Request) -> web.Response:
        state = request.query.get("state") or REJECTED
        if state not in INTENT_STATES:
            raise web.HTTPBadRequest(text=f"unknown state {state!r}")
        return render(request, "intents.html", state=state, states=INTENT_STATES,
                      rows=await store.list_intents(state, 200), done=_done(request),
                      counts=await store.intent_counts())

    async def spend(request: web.Request) -> web.Response:
        now = clock()
        # the earliest first of a month anywhere on Earth now (zones run to UTC-12)
        since = month_start((now.astimezone(UTC) - timedelta(hours=14)).date())
        held = await store.held_by_cap()
        names = sorted({*spends, *(r["account"] for r in held),
                        *await store.spend_accounts_since(since)})
        windows = {name: month_of(spends.get(name, NO_SPEND), now) for name in names}
        by_day, by_tag = await store.spend_rows(windows) if windows else ([], [])
        views = spend_views(spends, windows, by_day, by_tag, held, now)
        return render(request, "spend.html", accounts=views,
                      held_total=sum(v.held_n for v in views))

    async def durations(request: web.Request) -> web.Response:
        overdue = await store.count_overdue()
        return render(request, "durations.html",
                      sections=duration_views(await store.render_stats()),
                      learn_after=LEARN_AFTER_JOBS, overdue_total=sum(overdue.values()),
                      overdue=await store.list_overdue(limit=OVERDUE_LISTED),
                      now=datetime.now(UTC))  # how long overdue: by the wall clock

    async def retry_intent(request: web.Request) -> web.StreamResponse:
        form = await form_of(request)
        if not guard.csrf_ok(request, str(form.get("csrf", ""))):
            return web.Response(status=403, text="stale or forged form; reload the page")
        retried = await store.requeue_intents([str(form.get("key", ""))])
        raise web.HTTPSeeOther(f"/intents?state=rejected&done="
                               f"{'retried' if retried else 'retry_refused'}")

    async def login(request: web.Request) -> web.StreamResponse:
        nxt = safe_next(request.query.get("next", "/"))  # never another site
        if request.method == "GET":
            return render(request, "login.html", next=nxt, wrong=False, needed=bool(guard.token))
        form = await form_of(request)
        try:
            right = await guard.check(request, str(form.get("token", "")))
        except TooManyGuesses as exc:  # not even checked
            return render(request, "login.html", status=429, next=nxt, wrong=False,
                          needed=True, retry_after=exc.retry_after_s,
                          headers={"Retry-After": str(exc.retry_after_s)})
        if not right:
            return render(request, "login.html", status=401, next=nxt, wrong=True, needed=True)
        response = web.HTTPSeeOther(nxt)
        secure = request.secure or request.headers.get("X-Forwarded-Proto") == "https"
        response.set_cookie(SESSION_COOKIE, await guard.new_session(), httponly=True,
                            samesite="Strict", max_age=SESSION_MAX_AGE_S, secure=secure)
        raise response

    async def logout(request: web.Request) -> web.StreamResponse:
        form = await form_of(request)
        if not guard.csrf_ok(request, str(form.get("csrf", ""))):
            return web.Response(status=403, text="stale or forged form; reload the page")
        await guard.end_session(request.cookies.get(SESSION_COOKIE, ""))
        response = web.HTTPSeeOther("/login")
        response.del_cookie(SESSION_COOKIE)
        raise response

    app.router.add_get("/", overview)
    app.router.add_get("/jobs", jobs)
    app.router.add_get("/jobs/view", job)
    app.router.add_post("/jobs/action", action)
    app.router.add_get("/intents", intents)
    app.router.add_post("/intents/retry", retry_intent)
    app.router.add_get("/spend", spend)
    app.router.add_get("/durations", durations)
    app.router.add_route("*", "/login", login)
    app.router.add_post("/logout", logout)
    app.router.add_static("/static", _static_dir())


def _done(request: web.Request) -> str | None:
    """The flash word of a redirect after an action (only known words: never echo input)."""
    done = request.query.get("done")
    return done if done in DONE_WORDS else None


def _dashboard_path(path: str) -> bool:
    return not (path.startswith(("/webhooks/", "/metrics"))
                or path in ("/healthz", "/readyz"))


def _static_dir() -> str:
    from importlib.resources import files

    return str(files("vidpoll.web") / "static")


def _when(value: Any) -> str:
    if isinstance(value, datetime):
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S")
    return "" if value is None else str(value)


def _ago(value: Any) -> str:
    if not isinstance(value, datetime):
        return ""
    seconds = (datetime.now(UTC) - value).total_seconds()
    word = "ago" if seconds >= 0 else "from now"
    seconds = abs(seconds)
    if seconds < 90:
        return f"{seconds:.0f} s {word}"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min {word}"
    if seconds < 172800:
        return f"{seconds / 3600:.0f} h {word}"
    return f"{seconds / 86400:.0f} d {word}"


def _series(rows: list[dict[str, Any]], now: datetime) -> dict[str, list[tuple[datetime, float]]]:
    """Per-minute values of the last hour (missing minutes are 0)."""
    end = now.replace(second=0, microsecond=0)
    minutes = [end - timedelta(minutes=i) for i in range(CHART_MINUTES - 1, -1, -1)]
    reads = dict.fromkeys(minutes, 0.0)
    errors = dict.fromkeys(minutes, 0.0)
    late = dict.fromkeys(minutes, 0.0)
    backlog = dict.fromkeys(minutes, 0.0)
    for r in rows:
        minute = r["minute"].astimezone(UTC)
        if minute not in reads:
            continue
        if r["kind"] == "poll":
            reads[minute] += r["n"]
            if r["outcome"] not in ("final", "not_ready"):
                errors[minute] += r["n"]
            late[minute] = max(late[minute], r["late_max_s"])
        elif r["kind"] == "backlog":
            backlog[minute] = max(backlog[minute], r["n"])
    return {"reads": list(reads.items()), "errors": list(errors.items()),
            "late_max": list(late.items()), "backlog": list(backlog.items())}


def _bar_chart(points: list[tuple[datetime, float]], title: str, unit: str) -> Markup:
    """An accessible SVG bar chart (role=img, a title and a one-line summary)."""
    width, height, pad = 600, 120, 4
    top = max((v for _, v in points), default=0.0)
    summary = title
    if points:
        peak = max(points, key=lambda p: p[1])
        summary = f"{title}, last {len(points)} minutes: peak {_fmt(top)}{unit}"
        if top > 0:
            summary += f" at {peak[0]:%H:%M} UTC"
        summary += f", latest {_fmt(points[-1][1])}{unit}"
    bar_w = (width - 2) / max(len(points), 1)
    bars = []
    for i, (minute, value) in enumerate(points):
        h = 0.0 if top <= 0 else (height - pad) * value / top
        bars.append(f'<rect x="{1 + i * bar_w:.1f}" y="{height - h:.1f}" '
                    f'width="{max(bar_w - 1, 1):.1f}" height="{h:.1f}">'
                    f"<title>{minute:%H:%M} {_fmt(value)}{escape(unit)}</title></rect>")
    svg = (f'<figure class="chart"><figcaption>{escape(title)} <span class="max">max '
           f'{_fmt(top)}{escape(unit)}</span></figcaption>'
           f'<svg viewBox="0 0 {width} {height}" role="img" aria-label="{escape(summary)}" '
           f'preserveAspectRatio="none"><title>{escape(summary)}</title>{"".join(bars)}</svg>'
           f'<p class="summary">{escape(summary)}</p></figure>')
    return Markup(svg)


def _money(amount: Decimal | None, currency: str | None = None) -> str:
    """An amount as the spend page and `vidpoll spend` write it: 1,234.50 EUR."""
    if amount is None:
        return ""
    return f"{amount:,.2f} {currency}" if currency else f"{amount:,.2f}"


def _figure(amount: Decimal | None) -> str:
    """A provider's own figure as it gave it (12 credits, 3.25 predict seconds): no rounding,
    no exponent."""
    return "" if amount is None else format(amount.normalize(), "f")


def month_of(spend: AccountSpend, now: datetime) -> tuple[date, date]:
    """The first and the last day of the month of `now` in the account's cap_timezone."""
    return month_start(spend.today(now)), spend.month_end(now).date() - timedelta(days=1)


@dataclass(frozen=True)
class SpendDay:
    """One calendar day of an account's month (cap_timezone): spent and reserved."""

    day: date
    spent: Decimal
    reserved: Decimal

    @property
    def used(self) -> Decimal:
        """What counts against the day cap."""
        return self.spent + self.reserved


@dataclass(frozen=True)
class AccountSpendView:
    """One account on the spend page: its month day by day, its caps, its held intents."""

    name: str
    spend: AccountSpend
    configured: bool
    """Named by this server's settings (an account only the ledger knows is not)."""
    currency: str
    today: date
    days: list[SpendDay]
    creates: int
    other_currencies: dict[str, Decimal]
    """This month's amounts in another currency (the account's currency was changed): not
    added to the figures, shown beside them."""
    models: list[dict[str, Any]]
    tags: list[dict[str, Any]]
    held: list[dict[str, Any]]

    @property
    def month_spent(self) -> Decimal:
        return sum((d.spent for d in self.days), Decimal(0))

    @property
    def month_reserved(self) -> Decimal:
        return sum((d.reserved for d in self.days), Decimal(0))

    @property
    def month_used(self) -> Decimal:
        """What counts against the month cap."""
        return self.month_spent + self.month_reserved

    @property
    def month_share(self) -> str:
        """The month cap's share used ("" without a month cap)."""
        cap = self.spend.cap_per_month
        return "" if cap is None else f"{self.month_used / cap:.0%}"

    @property
    def today_used(self) -> Decimal:
        return next((d.used for d in self.days if d.day == self.today), Decimal(0))

    @property
    def held_n(self) -> int:
        return sum(int(h["n"]) for h in self.held)

    @property
    def charted(self) -> bool:
        """Priced (by the settings, or by the ledger's rows of this month): a chart of money;
        otherwise creates are only counted and the page says "no prices set"."""
        return self.spend.priced or any(d.used for d in self.days)

    @property
    def chart(self) -> Markup:
        return _spend_chart(self)

    def local(self, at: datetime | None) -> str:
        """A time in the account's cap_timezone, as its windows turn."""
        if at is None:
            return ""
        return f"{at.astimezone(self.spend.zone):%Y-%m-%d %H:%M} {self.spend.cap_timezone}"


def spend_views(spends: Mapping[str, AccountSpend], windows: Mapping[str, tuple[date, date]],
                by_day: list[dict[str, Any]], by_tag: list[dict[str, Any]],
                held: list[dict[str, Any]], now: datetime) -> list[AccountSpendView]:
    """The spend page's accounts (those of `windows`) from the ledger's rows
    (PgSpend.spend_rows over `windows`) and the held intents (PgSpend.held_by_cap)."""
    views = []
    for name, (first, last) in windows.items():
        spend = spends.get(name, NO_SPEND)
        rows = [r for r in by_day if r["account"] == name]
        currency = spend.currency if spend.priced else next(
            (r["currency"] for r in rows if r["currency"]), spend.currency)
        days = {first + timedelta(days=i): [Decimal(0), Decimal(0)]
                for i in range((last - first).days + 1)}
        other: dict[str, Decimal] = {}
        models: dict[str, dict[str, Any]] = {}
        for r in rows:
            if r["currency"] and r["currency"] != currency:
                other[r["currency"]] = other.get(r["currency"], Decimal(0)) + (
                    r["spent"] + r["reserved"])
                continue
            if r["day"] in days:
                days[r["day"]][0] += r["spent"]
                days[r["day"]][1] += r["reserved"]
            m = models.setdefault(r["model"] or "", {
                "model": r["model"] or "", "spent": Decimal(0), "reserved": Decimal(0),
                "creates": 0})
            m["spent"] += r["spent"]
            m["reserved"] += r["reserved"]
            m["creates"] += r["creates"]
        views.append(AccountSpendView(
            name=name, spend=spend, configured=name in spends, currency=currency,
            today=spend.today(now),
            days=[SpendDay(d, spent, reserved) for d, (spent, reserved) in days.items()],
            creates=sum(int(r["creates"]) for r in rows), other_currencies=other,
            models=sorted(models.values(), key=lambda m: m["model"]),
            tags=[t for t in by_tag if t["account"] == name],
            held=[h for h in held if h["account"] == name]))
    return views


def _spend_chart(view: AccountSpendView) -> Markup:
    """An account's month as an SVG bar chart: a bar per day, spent below and reserved above,
    the day cap a dashed line; role=img with a one-line summary, a <title> per day, and each
    day's figures in data attributes (what the browser test reads)."""
    width, height, pad = 620, 140, 8
    days, c, cap = view.days, view.currency, view.spend.cap_per_day
    top = float(max([d.used for d in days] + [cap or Decimal(0)]))
    month = f"{days[0].day:%B %Y}"
    summary = (f"Spend per day, {month} ({view.spend.cap_timezone}): "
               f"{_money(view.month_used, c)} this month")
    peak = max(days, key=lambda d: d.used)
    if peak.used > 0:
        summary += f", peak {_money(peak.used, c)} on {peak.day:%d %b}"
    summary += f", today {_money(view.today_used, c)}"
    if cap is not None:
        summary += f" of the {_money(cap, c)} day cap"

    def h(amount: Decimal) -> float:
        return 0.0 if top <= 0 else (height - pad) * float(amount) / top

    slot = width / len(days)
    parts = []
    for i, d in enumerate(days):
        x, w = i * slot + slot * 0.1, slot * 0.8
        hs, hr = h(d.spent), h(d.reserved)
        rects = ""
        if hs > 0:
            rects += (f'<rect class="spent" x="{x:.1f}" y="{height - hs:.1f}" width="{w:.1f}" '
                      f'height="{hs:.1f}"/>')
        if hr > 0:
            rects += (f'<rect class="reserved" x="{x:.1f}" y="{height - hs - hr:.1f}" '
                      f'width="{w:.1f}" height="{hr:.1f}"/>')
        if d.day == view.today:
            rects += (f'<line class="today" x1="{x:.1f}" x2="{x + w:.1f}" y1="{height - 1}" '
                      f'y2="{height - 1}" vector-effect="non-scaling-stroke"/>')
        parts.append(f'<g class="day" data-day="{d.day.isoformat()}" '
                     f'data-spent="{d.spent:.2f}" data-reserved="{d.reserved:.2f}">'
                     f"<title>{d.day:%a %d %b}: {escape(_money(d.spent, c))} spent, "
                     f"{escape(_money(d.reserved, c))} reserved</title>{rects}</g>")
    if cap is not None and top > 0:
        y = height - h(cap)
        parts.append(f'<line class="cap" x1="0" x2="{width}" y1="{y:.1f}" y2="{y:.1f}" '
                     f'data-cap="{cap:.2f}" vector-effect="non-scaling-stroke">'
                     f"<title>day cap {escape(_money(cap, c))}</title></line>")
    svg = (f'<figure class="chart spend-chart"><figcaption>Per day, {escape(month)} '
           f'<span class="max">({escape(view.spend.cap_timezone)})</span></figcaption>'
           f'<svg viewBox="0 0 {width} {height}" role="img" aria-label="{escape(summary)}" '
           f'preserveAspectRatio="none"><title>{escape(summary)}</title>{"".join(parts)}'
           f'</svg><div class="axis"><span>{days[0].day:%d %b}</span>'
           f'<span>{days[-1].day:%d %b}</span></div>'
           f'<p class="legend"><span class="key spent"></span> spent '
           f'<span class="key reserved"></span> reserved'
           + ('' if cap is None else f' <span class="key cap"></span> day cap '
              f'{escape(_money(cap, c))}')
           + f'</p><p class="summary">{escape(summary)}</p></figure>')
    return Markup(svg)


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:.2f}"
