"""Issue 18, item 2, end to end: a provider that echoes the API key back in an error, in any
encoding, gets it stored nowhere (no column of any table, not the job page), a status answer's
signed link is stored without its query string, and bodies nested 500 or 100,000 deep are
recorded like any other answer. The worker reads every answer through real HTTP."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web

from vidpoll.providers.sume.client import SumeClient
from vidpoll.providers.sume.fake import ECHO_FORMS, FakeConfig, FakeSume
from vidpoll.store import PgStore
from vidpoll.web import make_app, start_server

from ..conftest import run_until
from .test_security import dump_tables

KEY = "sk_live/Ab+Cd=Ef/0123456789=="
"""A key with the characters encoders treat specially: `/` (JSON's `\\/`), `+` and `=`."""
KEY_FORMS = {
    "as written": KEY,
    "JSON \\/": KEY.replace("/", "\\/"),
    "JSON \\u": "".join(f"\\u{ord(c):04x}" for c in KEY),
    "JSON \\u, as stored in JSON text": "".join(f"\\\\u{ord(c):04x}" for c in KEY),
    "percent": quote(KEY, safe=""),
    "HTML": "".join({"/": "&#x2F;", "=": "&#x3D;", "+": "&#43;"}.get(c, c) for c in KEY),
    "the key's middle": KEY[4:-4],
    "a space for +": KEY.replace("+", " "),
    "base64": base64.b64encode(KEY.encode()).decode()[2:-2],
    "base64 after user:": base64.b64encode(f"user:{KEY}".encode()).decode()[10:-2],
}
SIG = "leakedsig9f8e7d6c"


@pytest.fixture
def fake() -> FakeSume:
    return FakeSume(FakeConfig(api_key=KEY, queued_s=0, render_s=0, render_jitter=0, seed=1))


@pytest.fixture
async def client(fake_url: str) -> AsyncIterator[SumeClient]:
    async with SumeClient(fake_url, KEY, timeout_s=2.0) as c:
        yield c


def leaks(texts: dict[str, str]) -> list[tuple[str, str]]:
    """(where, form) for every form of the key (or the signature) found in any text."""
    return [(where, form) for where, text in texts.items()
            for form, shown in (*KEY_FORMS.items(), ("signature", SIG)) if shown in text]


async def test_a_key_echoed_in_any_encoding_is_stored_nowhere(store: PgStore, fake: FakeSume,
                                                              make_worker, db_url: str):
    jobs = {form: f"echo-{form}" for form in ECHO_FORMS}
    for form, job_id in jobs.items():
        # html: a proxy's page (500, not Sume's envelope); the others: Sume's 400 envelope
        fake.add_job(job_id, script=[{"echo_key": form,
                                      "http": 500 if form == "html" else 400}])
        await store.add_job(job_id, delay_s=0)
    worker = make_worker()
    await run_until(worker, lambda: all(fake.reads[j] >= 1 for j in jobs.values()))

    rows = {form: await store.get_job(job_id) or {} for form, job_id in jobs.items()}
    for form, row in rows.items():
        assert row.get("last_error_class") == ("server_error" if form == "html"
                                               else "client_error"), (form, row)
        if form != "html":  # the answer was stored, with the key replaced
            assert "<redacted>" in row["last_error"], (form, row["last_error"])
            bearer = "Bearer%20<redacted>" if form == "percent" else "Bearer <redacted>"
            assert row["last_response"]["echo"]["authorization"] == bearer, form
            assert bearer in row["last_response"]["echo"], form  # an object key
    dump = await dump_tables(db_url)
    texts = {f"{table}[{i}]": row for table, rows_ in dump.items()
             for i, row in enumerate(rows_)}
    assert leaks(texts) == []

    # the dashboard's job page shows what the database holds
    runner, url = await start_server(make_app(store, None, loopback_only=True), "127.0.0.1", 0)
    try:
        async with aiohttp.ClientSession() as http:
            for form, job_id in jobs.items():
                async with http.get(f"{url}/jobs/view", params={"id": job_id}) as resp:
                    assert resp.status == 200
                    texts[f"page {form}"] = await resp.text()
    finally:
        await runner.cleanup()
    assert leaks(texts) == []


async def test_a_signed_link_in_a_2xx_status_answer_is_stored_without_its_query(
        store: PgStore, fake: FakeSume, make_worker, db_url: str):
    signed = f"https://cdn.example/preview.mp4?X-Amz-Signature={SIG}&X-Amz-Expires=60"
    fake.add_job("preview", script=[{
        "sume_status": "running", "terminal": False, "next_poll_after_seconds": 60,
        "preview_url": signed, "links": [signed],
        # a JSON document inside a string, its slashes escaped (a provider's debug field)
        "debug": json.dumps({"url": signed}).replace("/", "\\/")}])
    await store.add_job("preview", delay_s=0)
    worker = make_worker()
    await run_until(worker, lambda: fake.reads["preview"] >= 1)
    row = await store.get_job("preview") or {}
    assert row["provider_status"] == "running"
    stored = row["last_response"]
    assert stored["preview_url"] == stored["links"][0] == "https://cdn.example/preview.mp4"
    assert "cdn.example" in stored["debug"]
    dump = await dump_tables(db_url)
    assert [table for table, rows in dump.items() for r in rows if SIG in r] == []


def nested(depth: int, inner: str) -> str:
    return "[" * depth + inner + "]" * depth


@pytest.mark.parametrize("status", [200, 500])
async def test_bodies_nested_500_and_100000_deep_are_recorded_like_any_answer(
        store: PgStore, fake: FakeSume, make_worker, db_url: str, status: int):
    signed = json.dumps(f"https://cdn.example/v.mp4?sig={SIG} {KEY}")
    bodies = {f"deep-{depth}": '{"error": {"code": "bad", "message": ' + signed + '}, "deep": '
              + nested(depth, signed) + "}" for depth in (500, 100_000)}
    for job_id, raw in bodies.items():
        fake.add_job(job_id, script=[{"http": status, "raw": raw,
                                      "content_type": "application/json"}])
        await store.add_job(job_id, delay_s=0)
    worker = make_worker()
    await run_until(worker, lambda: all(fake.reads[j] >= 1 for j in bodies))
    for job_id in bodies:
        row = await store.get_job(job_id) or {}
        # the answer's own class: not a reader that raised (connection), nor a body the
        # worker could not interpret
        want = "server_error" if status == 500 else "malformed"
        assert row["last_error_class"] == want, (job_id, row["last_error"])
        assert "could not interpret" not in (row["last_error"] or ""), row["last_error"]
        # 500 deep parses and is stored, scrubbed; 100,000 deep is no JSON python reads
        assert (row["last_response"] is not None) == (job_id == "deep-500"), job_id
    assert worker.stats.errors.get("connection", 0) == 0
    dump = await dump_tables(db_url)
    texts = {f"{table}[{i}]": r for table, rows in dump.items() for i, r in enumerate(rows)}
    assert leaks(texts) == []


SPACED = KEY.replace("+", " ")
RAW_ECHOES = {
    # json keeps the last of two members of one name: the key was in the first
    "duplicated member": ('{"error": {"code": "bad", "message": "invalid key ' + KEY
                          + '"}, "error": {"code": "invalid_api_key", "message": "no"}}',
                          "application/json"),
    "plus as space, JSON": (json.dumps({"error": {"code": "bad", "message": SPACED}}),
                            "application/json"),
    "plus as space, text": (f"key={SPACED} refused", "text/plain"),
    "basic auth": ("Authorization: Basic " + base64.b64encode(f"user:{KEY}".encode()).decode(),
                   "text/plain"),
}


async def test_a_key_echoed_in_a_duplicate_member_with_spaces_or_base64_is_stored_nowhere(
        store: PgStore, fake: FakeSume, make_worker, db_url: str):
    for name, (raw, content_type) in RAW_ECHOES.items():
        # text: a proxy's 500 (a 4xx that is no envelope pauses the account instead)
        fake.add_job(name, script=[{"http": 400 if content_type == "application/json" else 500,
                                    "raw": raw, "content_type": content_type}])
        await store.add_job(name, delay_s=0)
    worker = make_worker()
    await run_until(worker, lambda: all(fake.reads[j] >= 1 for j in RAW_ECHOES))
    for name in RAW_ECHOES:
        row = await store.get_job(name) or {}
        want = "client_error" if RAW_ECHOES[name][1] == "application/json" else "server_error"
        assert row.get("last_error_class") == want, (name, row)
    dump = await dump_tables(db_url)
    texts = {f"{table}[{i}]": r for table, rows in dump.items() for i, r in enumerate(rows)}
    assert leaks(texts) == []


async def serve_bodies(bodies: dict[str, tuple[bytes, str]]) -> tuple[web.AppRunner, str]:
    """A loopback server answering `/v1/jobs/<id>/status` with 400 and the bytes of `id`."""
    async def answer(request: web.Request) -> web.Response:
        body, content_type = bodies[request.match_info["job_id"]]
        return web.Response(status=400, body=body, content_type=content_type)

    app = web.Application()
    app.router.add_get("/v1/jobs/{job_id}/status", answer)
    return await start_server(app, "127.0.0.1", 0)


async def test_utf16_error_bodies_come_back_without_the_key_or_signed_links():
    signed = f"https://cdn.example/v.mp4?sig={SIG}"
    text = json.dumps({"error": {"code": "bad", "message": f"key {KEY} for {signed}"}})
    escaped = text.replace("/", "\\/")
    bodies = {f"{encoding}-{i}": (t.encode(encoding), "application/json")
              for encoding in ("utf-16", "utf-16-le", "utf-16-be")
              for i, t in enumerate((text, escaped))}
    runner, url = await serve_bodies(bodies)
    try:
        async with SumeClient(url, KEY, timeout_s=5.0) as client:
            for job_id in bodies:
                answer = await client.read_status(job_id)
                shown = answer.body.decode(json.detect_encoding(answer.body))
                assert "<redacted>" in shown, (job_id, shown)
                assert leaks({job_id: shown}) == [], (job_id, shown)
    finally:
        await runner.cleanup()


async def test_a_1_mib_adversarial_body_is_scrubbed_off_the_event_loop(monkeypatch):
    # 1 MiB of letters with no `://` after them (a `%3a`): quadratic in the URL pattern
    # before; now linear, and a body this long is scrubbed in a thread. No timing asserted:
    # the bound is one only a quadratic scan could reach (it took hours)
    body = b"a" * ((1 << 20) - 3) + b"%3a"
    threaded: list[int] = []
    to_thread = asyncio.to_thread

    async def spy(func: Any, /, *args: Any, **kwargs: Any) -> Any:
        threaded.append(len(func.args[0]))
        return await to_thread(func, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", spy)
    runner, url = await serve_bodies({"big": (body, "text/plain"),
                                      "small": (b"bad key " + KEY.encode(), "text/plain")})
    try:
        async with SumeClient(url, KEY, timeout_s=30.0) as client:
            answer = await asyncio.wait_for(client.read_status("big"), 30)
            assert answer.status == 400 and answer.body == body
            small = await client.read_status("small")
            assert small.body == b"bad key <redacted>"
    finally:
        await runner.cleanup()
    assert threaded == [len(body)]  # the small body was scrubbed on the loop
