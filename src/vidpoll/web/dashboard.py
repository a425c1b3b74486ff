"""The dashboard: server-rendered pages (Jinja2, no JavaScript) over the job table.

Pages: the overview (counts, exact for pending rows and estimated for finished ones on a big
table: vidpoll.web.figures; backlog, lateness and reads over the last hour as SVG charts,
recent errors, stuck claims, deliveries), the jobs table (filters, keyset paging that stays fast
at a million rows), a job's detail (row, intent, result without signed query strings,
deliveries, history) with its actions (resume, poll now, retry the intent).

Security: every state-changing action is a POST carrying a CSRF token (an HMAC of the session,
checked in constant time) and, when the browser says where it comes from, the same origin. With
VIDPOLL_DASHBOARD_TOKEN set every page asks for it once (a login form sets an HttpOnly,
SameSite=Strict cookie holding an HMAC of the token, never the token); `vidpoll serve` refuses
to bind beyond loopback without one. Bound to loopback without a token, only a loopback Host
header is served (no DNS rebinding).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import quote, urlsplit

import jinja2
from aiohttp import web
from markupsafe import Markup, escape

from vidpoll.logs import Redactor, secrets_from_env
from vidpoll.media import without_signatures
from vidpoll.models import (
    LOCAL_TERMINAL_STATES,
    PENDING,
    QUEUED,
    REJECTED,
    SUBMITTED,
    UNKNOWN,
)
from vidpoll.store import InvalidCursor, PgStore
from vidpoll.web.figures import COUNT_CAP_ROWS, EXACT_ROWS, STUCK_WALK_ROWS, read_figures

SESSION_COOKIE = "vidpoll_session"
PAGE_SIZES = (25, 50, 100, 200)
STATES = ("pending", "finished", "completed", "failed", "canceled", "expired", "gave_up",
          "not_found")
LOOPBACK_HOST = re.compile(r"(127\.0\.0\.1|localhost|\[::1\])(:\d{1,5})?", re.IGNORECASE)
SESSION_MAX_AGE_S = 12 * 3600
FORWARDED_HEADERS = ("Forwarded", "X-Forwarded-For", "X-Forwarded-Host", "X-Real-IP")
DONE_WORDS = frozenset({"poll_now", "resume", "poll_now_refused", "resume_refused", "retried",
                        "retry_refused"})
CHART_MINUTES = 60
INTENT_STATES = (REJECTED, UNKNOWN, QUEUED, SUBMITTED)
WRONG_TOKEN_DELAY_S = 1.0

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Guard:
    """The dashboard's token wall and CSRF tokens."""

    def __init__(self, token: str | None, loopback_only: bool,
                 clock: Callable[[], float] = time.time) -> None:
        self.token = token or None
        self.loopback_only = loopback_only
        self._clock = clock
        # signs sessions and CSRF tokens; derived from the token so several servers agree,
        # random per process without one
        self._key = (hashlib.sha256(b"vidpoll-dashboard:" + self.token.encode()).digest()
                     if self.token else secrets.token_bytes(32))

    def _sign(self, what: str) -> str:
        return hmac.new(self._key, what.encode(), hashlib.sha256).hexdigest()

    def new_session(self) -> str:
        """A session cookie: when it was issued, signed (never the token itself)."""
        issued = f"{int(self._clock())}.{secrets.token_hex(8)}"
        return f"{issued}.{self._sign('session:' + issued)}"

    def _session_ok(self, cookie: str) -> bool:
        issued, _, signature = cookie.rpartition(".")
        if not issued or not hmac.compare_digest(signature, self._sign("session:" + issued)):
            return False
        try:
            age = self._clock() - float(issued.split(".")[0])
        except ValueError:
            return False
        return -60 <= age <= SESSION_MAX_AGE_S  # a minute of clock skew between servers

    def signed_in(self, request: web.Request) -> bool:
        """No token configured, or a live session cookie, or the right Bearer header."""
        if self.token is None:
            return True
        if self._session_ok(request.cookies.get(SESSION_COOKIE, "")):
            return True
        auth = request.headers.get("Authorization", "")
        given = auth[7:] if auth.lower().startswith("bearer ") else ""
        return bool(given) and hmac.compare_digest(given.encode(), self.token.encode())

    def token_ok(self, given: str) -> bool:
        """The login form's token, compared in constant time."""
        return self.token is not None and hmac.compare_digest(given.encode(),
                                                              self.token.encode())

    def csrf(self, request: web.Request) -> str:
        """The CSRF token for forms on this session (each session has its own)."""
        return self._sign("csrf:" + request.cookies.get(SESSION_COOKIE, "-"))

    def csrf_ok(self, request: web.Request, given: str) -> bool:
        """The form's token matches, and the request comes from this origin (if it says;
        an opaque "null" origin is refused)."""
        origin = request.headers.get("Origin")
        if origin is not None and (origin == "null" or urlsplit(origin).netloc != request.host):
            return False
        return hmac.compare_digest(given.encode(), self.csrf(request).encode())


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
                    secrets: Iterable[str] = ()) -> None:
    """Add the dashboard's routes and its guard to `app`; `secrets` (besides those of the
    environment and the dashboard token) are never shown."""
    redact = Redactor([s for s in (*secrets_from_env(), *secrets, guard.token or "")
                       if len(s) >= 4])
    env = jinja2.Environment(loader=jinja2.PackageLoader("vidpoll.web", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined,
                             finalize=shown(redact))
    env.filters["when"] = _when
    env.filters["ago"] = _ago
    env.filters["q"] = lambda v: quote(str(v), safe="")
    env.filters["n"] = lambda v: f"{v:,}"  # 9,405,000: readable at 10M rows
    env.globals["STATES"] = STATES

    def render(request: web.Request, name: str, status: int = 200,
               **context: Any) -> web.Response:
        html = env.get_template(name).render(
            csrf=guard.csrf(request), signed_in=guard.token is not None, path=request.path,
            **context)
        return web.Response(text=html, content_type="text/html", status=status, headers={
            "Content-Security-Policy": "default-src 'none'; style-src 'self'; img-src 'self' "
                                       "data:; form-action 'self'; frame-ancestors 'none'",
            "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin",
            "Cache-Control": "no-store"})

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
        if path in ("/login", "/static/style.css") or guard.signed_in(request):
            return await handler(request)
        if request.method != "GET":
            return web.Response(status=401, text="sign in first")
        raise web.HTTPSeeOther(f"/login?next={quote(request.path_qs, safe='')}")

    app.middlewares.append(wall)

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
                      deliveries=await store.delivery_backlog())

    async def jobs(request: web.Request) -> web.Response:
        state = request.query.get("state") or None
        account = request.query.get("account") or None
        if state is not None and state not in STATES:
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
        return render(request, "job.html", job=without_signatures(row), archived=archived,
                      intent=intent, result=without_signatures(result),
                      history=await store.job_history(job_id),
                      deliveries=without_signatures(await store.job_deliveries(job_id)),
                      # a pending row has poll-now (resume would only poke it the same way)
                      can_resume=not archived and row["state"] in LOCAL_TERMINAL_STATES,
                      can_poll=not archived and row["state"] == PENDING,
                      done=_done(request))

    async def action(request: web.Request) -> web.StreamResponse:
        form = await request.post()
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

    async def retry_intent(request: web.Request) -> web.StreamResponse:
        form = await request.post()
        if not guard.csrf_ok(request, str(form.get("csrf", ""))):
            return web.Response(status=403, text="stale or forged form; reload the page")
        retried = await store.requeue_intents([str(form.get("key", ""))])
        raise web.HTTPSeeOther(f"/intents?state=rejected&done="
                               f"{'retried' if retried else 'retry_refused'}")

    async def login(request: web.Request) -> web.StreamResponse:
        nxt = safe_next(request.query.get("next", "/"))  # never another site
        if request.method == "GET":
            return render(request, "login.html", next=nxt, wrong=False, needed=bool(guard.token))
        form = await request.post()
        if not guard.token_ok(str(form.get("token", ""))):
            await asyncio.sleep(WRONG_TOKEN_DELAY_S)  # guessing costs time
            return render(request, "login.html", status=401, next=nxt, wrong=True, needed=True)
        response = web.HTTPSeeOther(nxt)
        secure = request.secure or request.headers.get("X-Forwarded-Proto") == "https"
        response.set_cookie(SESSION_COOKIE, guard.new_session(), httponly=True,
                            samesite="Strict", max_age=SESSION_MAX_AGE_S, secure=secure)
        raise response

    app.router.add_get("/", overview)
    app.router.add_get("/jobs", jobs)
    app.router.add_get("/jobs/view", job)
    app.router.add_post("/jobs/action", action)
    app.router.add_get("/intents", intents)
    app.router.add_post("/intents/retry", retry_intent)
    app.router.add_route("*", "/login", login)
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


def _fmt(value: float) -> str:
    return f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:.2f}"
