"""fal's webhooks through the real route (POST /webhooks/fal), with fal's keys fetched over
HTTP from a JWKS server on loopback written here: a signed delivery makes its job due, a
forged one is a 401, a repeat is a duplicate; a flood of forgeries costs the JWKS host one
request; a rotation is picked up by a refetch; the fetch refuses redirects, oversized
answers, errors and slow hosts. Real aiohttp apps on loopback, real PostgreSQL.

A provider named `fal` is registered here as a stand-in with the real `FalWebhooks` (the
adapter's `PROVIDER` may not exist yet); its webhooks are the only thing the route uses."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from types import SimpleNamespace

import aiohttp
import pytest
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from vidpoll import metrics
from vidpoll.providers import registry
from vidpoll.providers.fal.webhooks import FalWebhooks, JwksUnavailable, fetch_jwks
from vidpoll.store import PgStore
from vidpoll.web import make_app, start_server

KEY = Ed25519PrivateKey.generate()
NEW_KEY = Ed25519PrivateKey.generate()
FORGER = Ed25519PrivateKey.generate()
REQUEST_ID = "5057fca7-2eb3-468f-b95d-cefe92b0b9d4"


def jwk(key: Ed25519PrivateKey) -> dict[str, str]:
    x = base64.urlsafe_b64encode(key.public_key().public_bytes_raw()).decode().rstrip("=")
    return {"kty": "OKP", "crv": "Ed25519", "x": x}


class JwksHost:
    """fal's JWKS host on loopback: the keys it serves now, the requests it got, and a few
    ways to misbehave."""

    def __init__(self) -> None:
        self.keys = [KEY]
        self.hits = 0
        self.url = ""

    async def jwks(self, request: web.Request) -> web.Response:
        self.hits += 1
        return web.json_response({"keys": [jwk(k) for k in self.keys]})

    async def start(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/.well-known/jwks.json", self.jwks)
        app.router.add_get("/moved", self.moved)
        app.router.add_get("/huge", self.huge)
        app.router.add_get("/broken", self.broken)
        app.router.add_get("/slow", self.slow)
        app.router.add_get("/chunked", self.chunked)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        self.base = f"http://127.0.0.1:{port}"
        self.url = f"{self.base}/.well-known/jwks.json"
        return runner

    async def moved(self, request: web.Request) -> web.Response:
        raise web.HTTPFound(self.url)  # to the real set: still not followed

    async def huge(self, request: web.Request) -> web.Response:
        return web.json_response({"keys": [jwk(KEY)], "pad": "x" * 100_000})

    async def broken(self, request: web.Request) -> web.Response:
        return web.json_response({}, status=503)

    async def slow(self, request: web.Request) -> web.Response:
        await asyncio.sleep(1.5)
        return web.json_response({"keys": [jwk(KEY)]})

    async def chunked(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for _ in range(100):  # no Content-Length: cut off by the reader at the cap
            await resp.write(b" " * 4096)
        await resp.write_eof()
        return resp


@pytest.fixture
async def host() -> AsyncIterator[JwksHost]:
    jwks_host = JwksHost()
    runner = await jwks_host.start()
    yield jwks_host
    await runner.cleanup()


@pytest.fixture
def fal_hooks() -> Iterator[FalWebhooks]:
    hooks = FalWebhooks()  # the real fetch, over HTTP, and the real clock
    registry.register(SimpleNamespace(  # type: ignore[arg-type]
        name="fal", title="fal", env_prefix="FAL", default_base_url="https://queue.fal.run",
        rules=SimpleNamespace(words={}), webhooks=hooks))
    try:
        yield hooks
    finally:
        registry.unregister("fal")


@pytest.fixture
async def server(store: PgStore, host: JwksHost, fal_hooks: FalWebhooks
                 ) -> AsyncIterator[str]:
    app = make_app(store, {"fal": [host.url]})
    runner, url = await start_server(app, "127.0.0.1", 0)
    yield url
    await runner.cleanup()


def signed(key: Ed25519PrivateKey, request_id: str = REQUEST_ID,
           ts: float | None = None) -> tuple[bytes, dict[str, str]]:
    body = json.dumps({"request_id": request_id, "gateway_request_id": request_id,
                       "status": "OK", "payload": {"video": {"url": "https://x/v.mp4"}},
                       "error": None}).encode()
    stamp = f"{time.time() if ts is None else ts:.0f}"
    message = f"{request_id}\nuser-1\n{stamp}\n{hashlib.sha256(body).hexdigest()}".encode()
    return body, {"X-Fal-Webhook-Request-Id": request_id, "X-Fal-Webhook-User-Id": "user-1",
                  "X-Fal-Webhook-Timestamp": stamp,
                  "X-Fal-Webhook-Signature": key.sign(message).hex(),
                  "Content-Type": "application/json"}


async def post(url: str, body: bytes, headers: dict[str, str]
               ) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as http, http.post(f"{url}/webhooks/fal", data=body,
                                                          headers=headers) as resp:
        return resp.status, await resp.json()


async def due_in_s(store: PgStore, job_id: str) -> float:
    row = await store.get_job(job_id)
    assert row is not None
    return float((row["next_poll_at"] - datetime.now(UTC)).total_seconds())


def rejected(reason: str) -> float:
    value = metrics.REGISTRY.get_sample_value("vidpoll_webhooks_rejected_total",
                                              {"reason": reason})
    return value or 0.0


async def test_a_signed_delivery_pokes_its_job_a_forged_one_is_refused_a_repeat_is_one(
        store, server, host):
    await store.add_job(REQUEST_ID, delay_s=3600)
    refusals = rejected("signature")
    body, forged = signed(FORGER)
    assert await post(server, body, forged) == (401, {"error": "invalid signature or "
                                                                "timestamp"})
    assert rejected("signature") == refusals + 1
    assert await due_in_s(store, REQUEST_ID) > 3500  # refused: untouched
    assert host.hits == 1  # fetched once, before the first delivery was verified
    body, sent = signed(KEY)
    assert await post(server, body, sent) == (200, {"status": "poked", "made_due": True})
    assert await due_in_s(store, REQUEST_ID) <= 0.5
    assert await post(server, body, sent) == (200, {"status": "duplicate"})
    # fal retries with a new timestamp and signature: the same request, still a repeat
    body, again = signed(KEY, ts=time.time() + 1)
    assert await post(server, body, again) == (200, {"status": "duplicate"})
    # a delivery signed for one request but naming another in its body: signed, malformed
    other = body.replace(REQUEST_ID.encode(), b"another-request")
    _, headers = signed(KEY)
    message = "\n".join([REQUEST_ID, "user-1", headers["X-Fal-Webhook-Timestamp"],
                         hashlib.sha256(other).hexdigest()]).encode()
    headers["X-Fal-Webhook-Signature"] = KEY.sign(message).hex()
    assert (await post(server, other, headers))[0] == 400
    assert host.hits == 1


async def test_a_flood_of_forged_deliveries_costs_the_jwks_host_one_request(
        store, server, host):
    await store.add_job(REQUEST_ID, delay_s=3600)
    deliveries = [signed(FORGER, f"req-{i}") for i in range(200)]
    answers = await asyncio.gather(*(post(server, b, h) for b, h in deliveries))
    assert {status for status, _ in answers} == {401}
    assert host.hits == 1  # the first fetch, shared; no refetch within the minute
    body, sent = signed(KEY)
    assert (await post(server, body, sent))[0] == 200
    assert host.hits == 1


async def test_a_rotated_key_is_fetched_when_a_delivery_signed_with_it_arrives(
        store, host, fal_hooks):
    fal_hooks._refetch_every_s = 0.3  # a minute, shortened for the test
    runner, url = await start_server(make_app(store, {"fal": [host.url]}), "127.0.0.1", 0)
    try:
        await store.add_job(REQUEST_ID, delay_s=3600)
        await store.add_job("req-new", delay_s=3600)
        body, sent = signed(KEY)
        assert (await post(url, body, sent))[0] == 200
        host.keys = [KEY, NEW_KEY]  # fal adds a key and signs with it
        await asyncio.sleep(0.35)
        body, sent = signed(NEW_KEY, "req-new")
        assert await post(url, body, sent) == (200, {"status": "poked", "made_due": True})
        assert host.hits == 2
    finally:
        await runner.cleanup()


async def test_fetching_refuses_redirects_oversized_answers_errors_and_slow_hosts(host):
    assert json.loads(await fetch_jwks(host.url))["keys"] == [jwk(KEY)]
    for path, why in (("/moved", "HTTP 302"), ("/broken", "HTTP 503"),
                      ("/huge", "a body over 65536 bytes"),
                      ("/chunked", "a body over 65536 bytes")):
        with pytest.raises(JwksUnavailable, match=why):
            await fetch_jwks(host.base + path)
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await fetch_jwks(host.base + "/slow", timeout_s=0.3)
    assert time.monotonic() - started < 2


async def test_a_host_that_cannot_be_reached_keeps_the_old_keys(host, caplog):
    hooks = FalWebhooks(refetch_every_s=0.0)
    assert await hooks.refresh_keys(host.url)
    dead = host.base.rsplit(":", 1)[0] + ":9/.well-known/jwks.json"  # nothing listens on 9
    assert not await hooks.refresh_keys(dead)
    assert "fetching fal's webhook keys from http://127.0.0.1:9/.well-known/jwks.json" in (
        caplog.text)
    host.keys = []  # a JWKS without a usable key: a failure, the old keys stay
    assert not await hooks.refresh_keys(host.url, refused=True)
    assert len(hooks.keys(host.url)) == 1
