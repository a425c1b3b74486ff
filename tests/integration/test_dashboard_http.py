"""The dashboard's HTTP surface without a browser: the token wall, CSRF, the Host check, escaping,
no signed URL on a page, and `vidpoll serve` refusing to expose itself without a token."""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import psycopg
import pytest

from vidpoll.web import make_app, start_server

from .test_process import cli_env

TOKEN = "dash-token-7d2a0b"


@pytest.fixture
async def open_site(store) -> AsyncIterator[str]:
    runner, url = await start_server(make_app(store, None, loopback_only=True), "127.0.0.1", 0)
    yield url
    await runner.cleanup()


@pytest.fixture
async def walled_site(store) -> AsyncIterator[str]:
    runner, url = await start_server(make_app(store, None, dashboard_token=TOKEN,
                                              loopback_only=False), "127.0.0.1", 0)
    yield url
    await runner.cleanup()


async def get(url: str, **kwargs: Any) -> tuple[int, str, Any]:
    async with aiohttp.ClientSession() as http, http.get(url, allow_redirects=False,
                                                         **kwargs) as resp:
        return resp.status, await resp.text(), resp.headers


async def csrf_of(url: str, job_id: str, **kwargs: Any) -> str:
    _, html, _ = await get(f"{url}/jobs/view?id={job_id}", **kwargs)
    match = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert match, html
    return match.group(1)


async def post_action(url: str, form: dict[str, str], **kwargs: Any) -> int:
    async with aiohttp.ClientSession() as http, http.post(
            f"{url}/jobs/action", data=form, allow_redirects=False, **kwargs) as resp:
        return resp.status


async def test_actions_need_the_csrf_token_and_the_same_origin(open_site, store):
    await store.add_job("j1", delay_s=3600)
    before = (await store.get_job("j1"))["next_poll_at"]
    form = {"id": "j1", "action": "poll_now"}
    assert await post_action(open_site, form) == 403  # no token
    assert await post_action(open_site, {**form, "csrf": "0" * 64}) == 403  # forged
    token = await csrf_of(open_site, "j1")
    assert await post_action(open_site, {**form, "csrf": token},
                             headers={"Origin": "https://evil.example"}) == 403
    assert await post_action(open_site, {**form, "csrf": token},
                             headers={"Origin": "null"}) == 403  # a sandboxed frame
    assert (await get(open_site + "/jobs/action?id=j1&action=poll_now"))[0] == 405
    assert (await store.get_job("j1"))["next_poll_at"] == before  # nothing changed
    assert await post_action(open_site, {**form, "csrf": token}) == 303
    assert (await store.get_job("j1"))["next_poll_at"] < before


async def test_a_loopback_dashboard_answers_only_to_a_loopback_host(open_site):
    assert (await get(open_site + "/"))[0] == 200
    for host in ("attacker.example:8800", "127.0.0.1.attacker.example", "[::1]evil",
                 "localhost.", "127.0.0.1:80:80"):
        status, _, _ = await get(open_site + "/", headers={"Host": host})
        assert status == 421, host  # a DNS-rebinding page cannot read it
    for host in ("127.0.0.1:8800", "LOCALHOST", "[::1]:8800"):
        assert (await get(open_site + "/", headers={"Host": host}))[0] == 200, host
    # behind a proxy every visitor looks local: without a token, refused
    status, text, _ = await get(open_site + "/", headers={"X-Forwarded-For": "203.0.113.9"})
    assert status == 421 and "VIDPOLL_DASHBOARD_TOKEN" in text
    # the webhook, metrics and health routes are not the dashboard's
    assert (await get(open_site + "/healthz", headers={"Host": "x.example"}))[0] == 200


async def test_the_token_wall(walled_site):
    status, _, headers = await get(walled_site + "/jobs?state=failed")
    assert status == 303 and headers["Location"].startswith("/login?next=")
    assert (await get(walled_site + "/", headers={"Authorization": f"Bearer {TOKEN}"}))[0] == 200
    assert (await get(walled_site + "/", headers={"Authorization": "Bearer nope"}))[0] == 303
    # /metrics takes the token too (a proxy in front makes even a loopback bind public)
    assert (await get(walled_site + "/metrics"))[0] == 401
    assert (await get(walled_site + "/metrics",
                      headers={"Authorization": f"Bearer {TOKEN}"}))[0] == 200
    assert (await get(walled_site + "/static/style.css"))[0] == 200
    async with aiohttp.ClientSession() as http:
        async with http.post(walled_site + "/login?next=//evil.example/x",
                             data={"token": TOKEN}, allow_redirects=False) as resp:
            assert resp.status == 303 and resp.headers["Location"] == "/"  # no open redirect
            cookie = resp.cookies["vidpoll_session"]
            assert TOKEN not in cookie.value and cookie["httponly"]
        async with http.post(walled_site + "/login", data={"token": "wrong"},
                             allow_redirects=False) as resp:
            assert resp.status == 401  # (guessing costs budget: test_dashboard_guessing.py)
        async with http.post(walled_site + "/login", data={"token": TOKEN},
                             headers={"X-Forwarded-Proto": "https"},
                             allow_redirects=False) as resp:
            assert resp.cookies["vidpoll_session"]["secure"]  # behind TLS: Secure
        async with http.post(walled_site + "/jobs/action", data={"id": "x"},
                             allow_redirects=False) as resp:
            assert resp.status == 401  # a POST without a session is refused, not redirected


async def test_sessions_expire_and_are_signed(store):
    from vidpoll.web.dashboard import SESSION_MAX_AGE_S, Guard

    now = [1_000_000.0]
    guard = Guard(TOKEN, loopback_only=False, clock=lambda: now[0], sessions=store)
    await guard.start()
    cookie = await guard.new_session()
    assert TOKEN not in cookie and await guard.session_ok(cookie)
    assert await guard.new_session() != cookie  # each session its own (and its own CSRF token)
    forged = cookie.rsplit(".", 1)[0] + "." + "0" * 64
    assert not await guard.session_ok(forged)
    now[0] += SESSION_MAX_AGE_S + 1
    assert not await guard.session_ok(cookie)
    now[0] -= SESSION_MAX_AGE_S + 1
    other = Guard(TOKEN + "x", loopback_only=False, clock=lambda: now[0], sessions=store)
    await other.start()
    assert not await other.session_ok(cookie)  # another token: another key


async def test_a_rejected_intent_is_retried_from_the_intents_page(open_site, store):
    from vidpoll.models import REJECTED

    await store.add_intent("k-402", {"prompt": "x"})
    async with await psycopg.AsyncConnection.connect(store._url, autocommit=True) as conn:
        await conn.execute("UPDATE video_intents SET state = 'rejected', error_code = "
                           "'insufficient_credits' WHERE idempotency_key = 'k-402'")
    status, html, _ = await get(open_site + "/intents")
    assert status == 200 and "k-402" in html and "insufficient_credits" in html
    token = re.search(r'name="csrf" value="([0-9a-f]+)"', html)
    assert token
    async with aiohttp.ClientSession() as http, http.post(
            open_site + "/intents/retry", data={"csrf": token.group(1), "key": "k-402"},
            allow_redirects=False) as resp:
        assert resp.status == 303 and resp.headers["Location"].endswith("done=retried")
    intent = await store.get_intent("k-402")
    assert intent is not None and intent.state != REJECTED
    # the flash text comes from a fixed list, never from the query string
    _, html, _ = await get(open_site + "/intents?done=<b>you+were+hacked</b>")
    assert "hacked" not in html


async def test_pages_escape_what_they_show_and_never_show_a_signature(open_site, store,
                                                                      db_url):
    evil = '<script>alert(1)</script>'
    await store.add_job(evil, delay_s=0)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(
            "UPDATE video_jobs SET state = 'completed', finished_at = now(), "
            "result_state = 'fetched', result = %s, last_error = %s WHERE job_id = %s",
            ('{"videos": [{"url": "https://cdn.example/v.mp4?X-Amz-Signature=SECRET"}]}',
             '<img src=x onerror=alert(2)>', evil))
    for path in ("/", "/jobs", "/jobs?state=completed",
                 "/jobs/view?id=%3Cscript%3Ealert(1)%3C%2Fscript%3E"):
        status, html, headers = await get(open_site + path)
        assert status == 200, path
        assert "<script>" not in html and "<img src=x" not in html, path
        assert "SECRET" not in html, path
        assert "default-src 'none'" in headers["Content-Security-Policy"]
    _, html, _ = await get(open_site + "/jobs/view?id=%3Cscript%3Ealert(1)%3C%2Fscript%3E")
    assert "https://cdn.example/v.mp4" in html and "&lt;script&gt;" in html


async def test_serve_refuses_to_expose_the_dashboard_without_a_good_token(db_url, fake_url):
    for extra, says in (({}, b"set VIDPOLL_DASHBOARD_TOKEN"),
                        ({"VIDPOLL_DASHBOARD_TOKEN": "short"}, b"shorter than 16")):
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "vidpoll.cli", "serve", "--host", "0.0.0.0", "--port", "0",
            env=cli_env(db_url, fake_url, **extra), stderr=asyncio.subprocess.PIPE)
        _, err = await asyncio.wait_for(proc.communicate(), 30)
        assert proc.returncode == 2 and says in err, err


async def signed_in_session(site: str) -> aiohttp.ClientSession:
    """A browser-like session that logged in with the token (its own cookie jar)."""
    http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))
    async with http.post(site + "/login", data={"token": TOKEN},
                         allow_redirects=False) as resp:
        assert resp.status == 303
    return http


async def test_a_csrf_token_is_good_only_for_its_own_session_and_origin(walled_site, store):
    await store.add_job("j1", delay_s=3600)
    await store.add_intent("k-1", {"prompt": "x"})
    async with await psycopg.AsyncConnection.connect(store._url, autocommit=True) as conn:
        await conn.execute("UPDATE video_intents SET state = 'rejected' "
                           "WHERE idempotency_key = 'k-1'")
    before = (await store.get_job("j1"))["next_poll_at"]
    alice, mallory = await signed_in_session(walled_site), await signed_in_session(walled_site)
    try:
        tokens = {}
        for name, http in (("alice", alice), ("mallory", mallory)):
            async with http.get(walled_site + "/jobs/view?id=j1") as resp:
                match = re.search(r'name="csrf" value="([0-9a-f]+)"', await resp.text())
                assert resp.status == 200 and match
                tokens[name] = match.group(1)
        assert tokens["alice"] != tokens["mallory"]  # one per session

        async def post(http: aiohttp.ClientSession, path: str, form: dict[str, str],
                       **headers: str) -> int:
            async with http.post(walled_site + path, data=form, headers=headers,
                                 allow_redirects=False) as resp:
                return resp.status

        action = {"id": "j1", "action": "poll_now"}
        retry = {"key": "k-1"}
        for path, form in (("/jobs/action", action), ("/intents/retry", retry)):
            assert await post(alice, path, form) == 403, path  # no CSRF token
            assert await post(alice, path, {**form, "csrf": tokens["mallory"]}) == 403, path
            assert await post(alice, path, {**form, "csrf": tokens["alice"]},
                              Origin="https://evil.example") == 403, path  # cross-origin
            # a page of another origin cannot even present the session (SameSite=Strict),
            # and without the cookie the token is nothing: still refused
            async with aiohttp.ClientSession() as stranger:
                assert await post(stranger, path, {**form, "csrf": tokens["alice"]}) == 401
        assert (await store.get_job("j1"))["next_poll_at"] == before  # nothing changed
        intent = await store.get_intent("k-1")
        assert intent is not None and intent.state == "rejected"
        # the genuine form works, so the refusals above are about the token and origin
        host = walled_site.removeprefix("http://")
        assert await post(alice, "/jobs/action", {**action, "csrf": tokens["alice"]},
                          Origin=f"http://{host}") == 303
        assert (await store.get_job("j1"))["next_poll_at"] < before
    finally:
        await alice.close()
        await mallory.close()


async def test_missing_or_wrong_tokens_never_open_a_page(walled_site):
    for headers in ({}, {"Authorization": "Bearer "}, {"Authorization": f"Bearer {TOKEN}x"},
                    {"Authorization": f"Bearer {TOKEN[:-1]}"}, {"Authorization": TOKEN},
                    {"Cookie": f"vidpoll_session={TOKEN}"},
                    {"Cookie": "vidpoll_session=1.2.3"}):
        for path in ("/", "/jobs", "/jobs/view?id=x", "/intents"):
            status, html, _ = await get(walled_site + path, headers=headers)
            assert status == 303, (headers, path)  # to the login form
            assert "csrf" not in html
