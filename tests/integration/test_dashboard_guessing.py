"""The dashboard resists guessing (issue 18, item 4): one budget of wrong tokens for every path
that takes one, a signing key an offline guess cannot afford, comparisons no input can make
raise, a logout that ends the session for every copy of its cookie, /metrics and /readyz
behind a token or on a port of their own, and state labels a provider cannot multiply."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import logging
import re
import time
from collections import Counter
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import psycopg
from aiohttp import web

import vidpoll.web
import vidpoll.web.dashboard
from vidpoll.store import PgStore, migrate
from vidpoll.web import make_app, metrics_app, start_server

from .test_process import wait_for

# (names this change adds are looked up where used: before it, each test fails on its own)

TOKEN = "dash-token-3b7e91c2"
METRICS_TOKEN = "metrics-token-5d20aa71"
COOKIE = "vidpoll_session"


class Clock:
    """A monotonic clock the test moves (the failure budget's refill)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def walled(store: PgStore, **options: Any) -> tuple[web.AppRunner, str]:
    """`vidpoll serve` with a dashboard token (as bound beyond loopback)."""
    return await start_server(make_app(store, None, dashboard_token=TOKEN,
                                       loopback_only=False, **options), "127.0.0.1", 0)


def client(source: str = "127.0.0.1") -> aiohttp.ClientSession:
    """A client whose requests come from `source` (every 127/8 address is this host)."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=(source, 0)),
                                 cookie_jar=aiohttp.CookieJar(unsafe=True))


async def login(http: aiohttp.ClientSession, site: str, token: str = TOKEN) -> int:
    async with http.post(site + "/login", data={"token": token},
                         allow_redirects=False) as resp:
        return resp.status


async def get(http: aiohttp.ClientSession, url: str, token: str | None = None,
              cookie: str | None = None) -> tuple[int, str]:
    """(status, Retry-After or "") of a GET with a Bearer token or a session cookie."""
    headers = {}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    if cookie is not None:
        headers["Cookie"] = f"{COOKIE}={cookie}"
    async with http.get(url, headers=headers, allow_redirects=False) as resp:
        return resp.status, resp.headers.get("Retry-After", "")


async def session_of(site: str) -> str:
    """A signed-in session's cookie value."""
    async with client() as http, http.post(site + "/login", data={"token": TOKEN},
                                           allow_redirects=False) as resp:
        assert resp.status == 303
        return resp.cookies[COOKIE].value


# -- one budget of wrong tokens, for the form and Bearer alike ---------------------------------


def checked_at_most(started: float) -> int:
    """How many wrong tokens of one address `serve`'s default budget lets through since
    `started` (time.monotonic()): 10, and one more per 6 s (a bound, never a timing)."""
    return 10 + int((time.monotonic() - started) / 6)


async def test_50_parallel_wrong_logins_by_form_and_bearer_check_at_most_the_budget(store):
    runner, site = await walled(store)  # serve's defaults
    try:
        async with client() as http:
            started = time.monotonic()
            form, bearer = await asyncio.gather(
                asyncio.gather(*(login(http, site, f"wrong-{i}") for i in range(25))),
                asyncio.gather(*(get(http, site + "/", f"wrong-{i}") for i in range(25))))
            limit = checked_at_most(started)
            # 50 at once from one address: only its budget is even checked (401: a wrong
            # form; 303: a wrong Bearer sent to the login page); the rest are refused unread
            seen = Counter([*form, *(status for status, _ in bearer)])
            assert seen[401] + seen[303] <= limit and seen[429] >= 50 - limit, seen
            assert all(int(after) >= 1 for status, after in bearer if status == 429)
            # a wrong token on the scrape route is a guess of the same token
            assert (await get(http, site + "/metrics", "wrong"))[0] == 429
    finally:
        await runner.cleanup()


class Gate:
    """The lane's sleep, held by the test: each sleep waits until the test lets one go, then
    moves the clock as far as it asked (the refill it waited for)."""

    def __init__(self, clock: Clock) -> None:
        self.clock, self.go = clock, asyncio.Semaphore(0)

    async def __call__(self, seconds: float) -> None:
        await self.go.acquire()
        self.clock.now += seconds


async def until(condition: Any, what: str) -> None:
    """Wait for a state the server exposes (never for a duration)."""
    await wait_for(condition, 30, what)


async def test_wrong_tokens_from_ten_addresses_lock_nobody_out(store):
    # the review's attack: 10 addresses spend the overall budget (100 a minute) between them
    clock = Clock()  # moved by the test: the budget is spent exactly, however slow the host
    limiter = vidpoll.web.dashboard.FailureLimiter(clock=clock)  # serve's default budgets
    runner, site = await walled(store, metrics_token=METRICS_TOKEN, limiter=limiter)
    try:
        async def guesser(n: int) -> list[int]:
            async with client(f"127.0.0.{n}") as http:
                return [(await get(http, site + "/", f"wrong-{n}-{i}"))[0] for i in range(10)]

        seen = Counter(s for statuses in await asyncio.gather(*(
            guesser(n) for n in range(2, 12))) for s in statuses)
        assert seen == {303: 100}, seen  # all checked (wrong: to the login form)

        async def right_bearer() -> int:
            async with client("127.0.0.50") as http:
                return (await get(http, site + "/", TOKEN))[0]

        async def right_form() -> int:
            async with client("127.0.0.51") as http:
                return await login(http, site)

        bearer, form = asyncio.create_task(right_bearer()), asyncio.create_task(right_form())
        await until(lambda: bearer.done() or form.done()
                    or getattr(limiter, "waiting", 0) == 2, "both wait their turn")
        # meanwhile the scrape, on a budget of its own, is not held up at all
        async with client("127.0.0.52") as http:
            assert (await get(http, site + "/metrics", METRICS_TOKEN))[0] == 200
        if not (bearer.done() or form.done()):
            clock.now += 0.6  # the overall budget refills one failure: one check
        # the right token gets in, by Bearer and by the form (its failure given back lets
        # the second one through at once), instead of a 429 for the rest of the minute
        assert (await bearer, await form) == (200, 303)
    finally:
        await runner.cleanup()


async def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_budget(store):
    # serve behind nginx: every request comes from the proxy. Without VIDPOLL_TRUSTED_PROXIES
    # one guesser spends the budget every visitor shares; with it, X-Forwarded-For (read
    # from the right, past the trusted proxy) names the client
    async def as_forwarded(site: str, forwarded: str, token: str) -> int:
        async with client() as http, http.get(
                site + "/", allow_redirects=False, headers={
                    "Authorization": f"Bearer {token}", "X-Forwarded-For": forwarded}) as resp:
            return resp.status

    guesser, colleague = "203.0.113.5", "198.51.100.7"
    results = {}
    for trusted in ((), (ipaddress.ip_network("127.0.0.1/32"),)):
        clock = Clock()  # still: nothing refills during the test
        limiter = vidpoll.web.dashboard.FailureLimiter(clock=clock)
        runner, site = await walled(store, limiter=limiter, trusted_proxies=trusted)
        try:
            wrong = [await as_forwarded(site, guesser, f"wrong-{i}") for i in range(10)]
            assert wrong == [303] * 10  # all checked: the per-client budget, spent
            results[bool(trusted)] = (
                await as_forwarded(site, guesser, "wrong-10"),
                await as_forwarded(site, colleague, TOKEN),
                # a client-written entry to the left of what the proxy appended is not read
                await as_forwarded(site, f"{colleague}, {guesser}", TOKEN))
        finally:
            await runner.cleanup()
    assert results[False] == (429, 429, 429)  # everyone is the proxy: locked out together
    assert results[True] == (429, 200, 429)  # only the guesser waits


async def test_a_spent_overall_budget_makes_checks_wait_in_one_lane_paced_at_the_budget(
        store):
    clock = Clock()
    gate = Gate(clock)
    limiter = vidpoll.web.dashboard.FailureLimiter(per_client=10, overall=15, window_s=60.0,
                                                   clock=clock, waiters=3, sleep=gate)
    runner, site = await walled(store, limiter=limiter)

    def checked_bound() -> int:  # the overall budget and its refill since the start
        return 15 + int((clock.now - 1000.0) * 15 / 60)

    try:
        kept = await session_of(site)  # signed in before the attack
        async with client() as http:
            form, bearer = await asyncio.gather(
                asyncio.gather(*(login(http, site, f"wrong-{i}") for i in range(25))),
                asyncio.gather(*(get(http, site + "/", f"wrong-{i}") for i in range(25))))
            seen = Counter([*form, *(status for status, _ in bearer)])
            assert seen[401] + seen[303] == 10 and seen[429] == 40, seen
            # an address whose own budget is spent is refused: it refills 1 per 6 s
            assert {after for status, after in bearer if status == 429} == {"6"}
            # the trade-off: the right token from this very address waits too...
            assert await login(http, site) == 429
            assert await get(http, site + "/", TOKEN) == (429, "6")
            # ...while a session signed in before keeps working: no token to check
            assert (await get(http, site + "/", cookie=kept))[0] == 200

        # five more addresses, four wrong tokens each, all at once: 5 are checked (15 - 10),
        # 3 wait in the lane, and the other 12 are refused unread (the lane is full)
        others = [client(f"127.0.0.{n}") for n in range(2, 7)]
        guesses = [asyncio.create_task(get(http, site + "/", f"wrong-{i}"))
                   for http in others for i in range(4)]
        await until(lambda: limiter.waiting == 3 and sum(t.done() for t in guesses) == 17,
                    "three waiting, the rest answered")
        seen = Counter(t.result() for t in guesses if t.done())
        assert seen == {(303, ""): 5, (429, "12"): 12}, seen  # 3 waiting, 4 s each
        async with client("127.0.0.20") as fresh:  # what remains: a full lane refuses
            assert await get(fresh, site + "/", TOKEN) == (429, "12")
        gate.go.release()  # the budget refills one failure (4 s): one waiting guess checked
        await until(lambda: limiter.waiting == 2, "one guess let through")
        async with client("127.0.0.21") as fresh:
            right = asyncio.create_task(get(fresh, site + "/", TOKEN))
            await until(lambda: limiter.waiting == 3, "the right token waits its turn")
            for _ in range(3):
                gate.go.release()
            assert (await right)[0] == 200  # after the two guesses before it
        seen = Counter(status for status, _ in await asyncio.gather(*guesses))
        assert seen == {303: 8, 429: 12}, seen
        # 10 + 8 wrong tokens checked, within the budget of the 16 s the lane waited
        assert 10 + 8 <= checked_bound() == 19
        assert limiter.waited == 4
        for http in others:
            await http.close()

        async with client() as http:
            # the first address's own budget refilled (16 s): the right token gives back
            # the failure it took, so twenty in a row get in without waiting
            for _ in range(20):
                assert (await get(http, site + "/", TOKEN))[0] == 200
            assert await login(http, site) == 303
            assert limiter.waited == 4
    finally:
        await runner.cleanup()


async def test_a_wrong_scrape_token_is_a_guess_of_both_tokens_each_on_its_own_budget(store):
    dashboard = vidpoll.web.dashboard.FailureLimiter(per_client=3, overall=100, clock=Clock())
    runner, site = await walled(store, metrics_token=METRICS_TOKEN, limiter=dashboard)
    try:
        async with client() as http:
            seen = Counter(s for s, _ in await asyncio.gather(*(
                get(http, site + path, f"wrong-{i}")
                for i, path in enumerate(["/metrics", "/readyz"] * 3))))
            assert seen == {401: 3, 429: 3}, seen
            # the dashboard token is guessed through /metrics no faster than through /login
            assert await login(http, site) == 429
            # the metrics token, on a budget of its own, still scrapes from this address
            assert (await get(http, site + "/metrics", METRICS_TOKEN))[0] == 200
    finally:
        await runner.cleanup()


# -- the signing key: scrypt of the token and the database's salt ------------------------------


async def salt_of(url: str) -> bytes:
    async with await psycopg.AsyncConnection.connect(url) as conn:
        row = await (await conn.execute("SELECT salt FROM vidpoll_dashboard_salt")).fetchone()
        assert row is not None
        return bytes(row[0])


def signature(key: bytes, cookie: str) -> tuple[str, str]:
    """(what the cookie's HMAC should be under `key`, what it is)."""
    issued, sid, signed = cookie.split(".")
    return hmac.new(key, f"session:{issued}.{sid}".encode(), hashlib.sha256).hexdigest(), signed


async def test_the_right_dashboard_token_on_metrics_is_no_wrong_guess_of_the_metrics_token(
        store):
    # the review: compared with the metrics token first, a right dashboard token was
    # charged as a wrong metrics token; the 11th scrape of a minute got 429, then so did
    # the metrics token itself
    runner, site = await walled(store, metrics_token=METRICS_TOKEN)
    try:
        async with client() as http:
            seen = [(await get(http, site + "/metrics", TOKEN))[0] for _ in range(15)]
            seen.append((await get(http, site + "/metrics", METRICS_TOKEN))[0])
    finally:
        await runner.cleanup()
    assert seen == [200] * 16, seen


async def test_the_signing_key_is_scrypt_of_the_token_and_a_salt_in_the_database(
        store, db_url, empty_db):
    runner, site = await walled(store)
    try:
        cookie = await session_of(site)
    finally:
        await runner.cleanup()
    assert TOKEN not in cookie
    salt = await salt_of(db_url)
    assert len(salt) == 32
    slow = hashlib.scrypt(b"vidpoll-dashboard:" + TOKEN.encode(), salt=salt, n=2**15, r=8,
                          p=1, maxmem=64 * 2**20, dklen=32)
    expected, signed = signature(slow, cookie)
    assert signed == expected  # the documented parameters, pinned
    fast = hashlib.sha256(b"vidpoll-dashboard:" + TOKEN.encode()).digest()  # the old key
    assert signature(fast, cookie)[0] != signed

    # a restart (a new app on the same database) keeps the salt, so sessions survive
    runner, site = await walled(store)
    try:
        async with client() as http:
            assert (await get(http, site + "/", cookie=cookie))[0] == 200
    finally:
        await runner.cleanup()
    assert await salt_of(db_url) == salt

    # another database has a salt of its own (made by its first `serve`, never by a migration,
    # which every database cloned from one template would share): a cookie of one is nothing
    # to the other, though the token is the same
    await migrate(empty_db)
    other = await PgStore.open(empty_db, max_size=2)
    try:
        runner, site = await walled(other)
        try:
            async with client() as http:
                assert (await get(http, site + "/", cookie=cookie))[0] == 303
        finally:
            await runner.cleanup()
    finally:
        await other.close()
    assert await salt_of(empty_db) != salt


# -- logout ends the session, for every copy of the cookie and every `serve` --------------------


async def test_logout_revokes_the_session_and_every_copy_of_its_cookie(store):
    runner, site = await walled(store)
    twin, twin_site = await walled(store)  # a second `serve` on the same database
    try:
        async with client() as http:
            assert await login(http, site) == 303
            [cookie] = [c.value for c in http.cookie_jar if c.key == COOKIE]
            async with http.get(site + "/") as resp:
                html = await resp.text()
                assert resp.status == 200 and 'action="/logout"' in html
            csrf = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
            assert csrf
            async with aiohttp.ClientSession() as copier:  # the cookie, copied elsewhere
                assert (await get(copier, site + "/", cookie=cookie))[0] == 200
                assert (await get(copier, twin_site + "/", cookie=cookie))[0] == 200
            async with http.post(site + "/logout", data={"csrf": "0" * 64},
                                 allow_redirects=False) as resp:
                assert resp.status == 403  # a forged form logs nobody out
            assert (await get(http, site + "/", cookie=cookie))[0] == 200
            async with http.post(site + "/logout", data={"csrf": csrf.group(1)},
                                 allow_redirects=False) as resp:
                assert resp.status == 303 and resp.headers["Location"] == "/login"
                assert resp.cookies[COOKIE].value == ""  # the browser forgets it
            async with aiohttp.ClientSession() as copier:
                for where in (site, twin_site):
                    status, _ = await get(copier, where + "/jobs", cookie=cookie)
                    assert status == 303, where  # to the login form: the copy is dead too
    finally:
        await runner.cleanup()
        await twin.cleanup()


# -- comparisons that cannot raise -------------------------------------------------------------


async def raw(site: str, head: bytes, body: bytes = b"") -> tuple[int, bytes]:
    """Send bytes as they are (no client library re-encodes them); (status, response)."""
    parts = urlsplit(site)
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port)
    length = f"Content-Length: {len(body)}\r\n".encode() if body else b""
    writer.write(head.replace(b"\n", b"\r\n") + length + b"Connection: close\r\n\r\n" + body)
    await writer.drain()
    data = await reader.read()
    writer.close()
    await writer.wait_closed()
    return int(data.split(b" ", 2)[1]), data


async def test_non_ascii_cookies_tokens_and_csrf_values_are_refused_cleanly(store, caplog):
    runner, site = await walled(store)
    try:
        cookie = (await session_of(site)).encode()
        host = f"Host: {urlsplit(site).netloc}\n".encode()
        form = b"Content-Type: application/x-www-form-urlencoded\n"
        with caplog.at_level(logging.INFO):
            for value in (b"1.2.\xc3\xa9t\xc3\xa9", b"1.2.\xff\xfe", b"\xc3\xa9.\xc3\xa9",
                          cookie[:-1] + b"\xff"):
                status, _ = await raw(site, b"GET /jobs HTTP/1.1\n" + host
                                      + b"Cookie: vidpoll_session=" + value + b"\n")
                assert status == 303, value  # to the login form
            bearers = (b"\xc3\xa9t\xc3\xa9", b"\xff\xfe", TOKEN.encode() + b"\xff")
            for value in bearers:
                status, _ = await raw(site, b"GET /jobs HTTP/1.1\n" + host
                                      + b"Authorization: Bearer " + value + b"\n")
                assert status == 303, value
            # a form's token or CSRF value: not the token, a forged form; a body that is not
            # UTF-8 at all is no form (400)
            for value, wrong, forged in ((b"%C3%A9t%C3%A9", 401, 403), (b"%ED%A0%80", 401, 403),
                                         (b"%FF%FE", 401, 403), (b"\xff\xfe", 400, 400)):
                status, _ = await raw(site, b"POST /login HTTP/1.1\n" + host + form,
                                      b"token=" + value)
                assert status == wrong, value
                status, _ = await raw(site, b"POST /jobs/action HTTP/1.1\n" + host + form
                                      + b"Cookie: vidpoll_session=" + cookie + b"\n",
                                      b"id=x&action=poll_now&csrf=" + value)
                assert status == forged, value
            for value in bearers:  # /metrics, which takes the dashboard token as well
                status, _ = await raw(site, b"GET /metrics HTTP/1.1\n" + host
                                      + b"Authorization: Bearer " + value + b"\n")
                assert status == 401, value
    finally:
        await runner.cleanup()
    failures = [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]
    assert failures == [], [r.getMessage() for r in failures]


# -- /metrics and /readyz behind a token, or on a port of their own ----------------------------


async def test_scrape_routes_need_a_token_or_a_port_of_their_own(store):
    async with aiohttp.ClientSession() as http:
        # a dashboard token: /metrics needs it (a proxy in front makes even a loopback bind
        # public); /readyz and /healthz stay open for probes
        runner, site = await walled(store)
        try:
            assert (await get(http, site + "/metrics"))[0] == 401
            assert (await get(http, site + "/metrics", TOKEN))[0] == 200
            assert (await get(http, site + "/readyz"))[0] == 200
            assert (await get(http, site + "/healthz"))[0] == 200
        finally:
            await runner.cleanup()
        # a metrics token: /metrics and /readyz need it, or the dashboard token
        runner, site = await walled(store, metrics_token=METRICS_TOKEN)
        try:
            for path in ("/metrics", "/readyz"):
                assert (await get(http, site + path))[0] == 401, path
                assert (await get(http, site + path, METRICS_TOKEN))[0] == 200, path
                assert (await get(http, site + path, TOKEN))[0] == 200, path
            assert (await get(http, site + "/healthz"))[0] == 200
            # the metrics token opens no page of the dashboard
            assert (await get(http, site + "/", METRICS_TOKEN))[0] == 303
        finally:
            await runner.cleanup()
        # serve --metrics-port: the dashboard's port keeps only /healthz; the metrics port
        # serves the table's figures, open there unless a metrics token is set
        for token, status in ((None, 200), (METRICS_TOKEN, 401)):
            app = make_app(store, None, dashboard_token=TOKEN, loopback_only=False,
                           metrics_token=token, metrics_apart=True)
            runner, site = await start_server(app, "127.0.0.1", 0)
            apart, apart_site = await start_server(
                metrics_app(store, table_gauges=True,
                            guard=app[vidpoll.web.GUARD]), "127.0.0.1", 0)
            try:
                assert (await get(http, site + "/healthz"))[0] == 200
                for path in ("/metrics", "/readyz"):
                    assert (await get(http, site + path, TOKEN))[0] == 404, path
                    assert (await get(http, apart_site + path))[0] == status, (token, path)
                async with http.get(apart_site + "/metrics",
                                    headers={"Authorization": f"Bearer {METRICS_TOKEN}"}
                                    ) as resp:
                    assert resp.status == 200 and "vidpoll_due_rows" in await resp.text()
            finally:
                await apart.cleanup()
                await runner.cleanup()


# -- state labels ------------------------------------------------------------------------------


async def test_provider_state_words_cannot_multiply_metric_labels(store, db_url):
    # a provider that ends jobs with words of its own choosing (terminal: true)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(
            "INSERT INTO video_jobs (job_id, state, finished_at) "
            "SELECT 'w' || g, 'word_' || g, now() FROM generate_series(1, 300) g")
        await conn.execute("INSERT INTO video_jobs (job_id, state, finished_at) "
                           "VALUES ('c1', 'completed', now()), ('s1', 'succeeded', now())")
        await conn.execute("INSERT INTO video_jobs (job_id) VALUES ('p1')")
    runner, site = await start_server(make_app(store, None), "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as http, http.get(site + "/metrics") as resp:
            text = await resp.text()
    finally:
        await runner.cleanup()
    jobs = dict(re.findall(r'^vidpoll_jobs\{state="([^"]*)"\} (\S+)$', text, re.M))
    assert jobs == {"completed": "1.0", "succeeded": "1.0", "pending": "1.0",
                    "other": "300.0"}, sorted(jobs)[:10]
    estimated = re.findall(r'^vidpoll_jobs_estimated\{state="([^"]*)"\}', text, re.M)
    assert sorted(estimated) == sorted(jobs)
