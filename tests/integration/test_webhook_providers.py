"""One webhook route for every provider: a toy provider registered from this module, with a
signature scheme of its own, gets its jobs read at once through POST /webhooks/toy, beside
Sume's on the same app, with no change to vidpoll.web; a name no provider answers to is a 404,
counted like any other refusal. Real aiohttp app on loopback, real PostgreSQL."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from datetime import UTC, datetime
from types import SimpleNamespace

import aiohttp
import psycopg
import pytest

from vidpoll import metrics
from vidpoll.errors import ConfigError
from vidpoll.providers import registry
from vidpoll.providers.base import WebhookHint
from vidpoll.providers.sume.webhooks import sign
from vidpoll.store import PgStore
from vidpoll.web import make_app, start_server
from vidpoll.webhook import WebhookRejected

SUME_SECRET = "whsec-providers"
TOY_SECRETS = ["toy-old", "toy-new"]  # two accounts of the toy provider, each its own secret


def toy_signature(secret: str, body: bytes) -> str:
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class ToyWebhooks:
    """`X-Toy-Signature: <hex HMAC-SHA256 of the body>`; the body says `{"job", "event"}`."""

    def verify(self, headers: Mapping[str, str], body: bytes, secret: str, now_s: float,
               tolerance_s: float) -> WebhookHint:
        offered = headers.get("X-Toy-Signature", "").strip()
        if not offered:
            raise WebhookRejected("unsigned", "missing X-Toy-Signature")
        if not hmac.compare_digest(offered.encode(), toy_signature(secret, body).encode()):
            raise WebhookRejected("signature", "signature does not match")
        value = json.loads(body)  # signed: the toy's own JSON
        if not (isinstance(value, dict) and isinstance(value.get("job"), str)
                and isinstance(value.get("event"), str)):
            raise WebhookRejected("malformed", "toy wants a job and an event")
        return WebhookHint(job_id=value["job"], event_id=value["event"], dedupe=offered)


class Toy:
    """A provider with webhooks and nothing else this module needs."""

    def __init__(self, name: str, webhooks: ToyWebhooks | None) -> None:
        self.name = name
        self.title = name.capitalize()
        self.default_base_url = "http://127.0.0.1:9"
        self.env_prefix = name.upper()
        self.rules = SimpleNamespace(words={})
        self.webhooks = webhooks

    def client(self, *args: object, **kwargs: object) -> object:
        raise NotImplementedError


@pytest.fixture
def toys() -> Iterator[None]:
    registry.register(Toy("toy", ToyWebhooks()))
    registry.register(Toy("quiet", None))  # a provider without webhooks
    try:
        yield
    finally:
        registry.unregister("toy")
        registry.unregister("quiet")


@pytest.fixture
async def server(store: PgStore, toys: None) -> AsyncIterator[str]:
    app = make_app(store, {"sume": SUME_SECRET, "toy": TOY_SECRETS, "quiet": None})
    runner, url = await start_server(app, "127.0.0.1", 0)
    yield url
    await runner.cleanup()


def rejected(reason: str) -> float:
    value = metrics.REGISTRY.get_sample_value("vidpoll_webhooks_rejected_total",
                                              {"reason": reason})
    return value or 0.0


async def post(url: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, object]]:
    async with aiohttp.ClientSession() as http, http.post(url, data=body,
                                                          headers=headers) as resp:
        return resp.status, await resp.json()


async def to_toy(url: str, job: str, event: str, secret: str) -> tuple[int, dict[str, object]]:
    body = json.dumps({"job": job, "event": event}).encode()
    return await post(f"{url}/webhooks/toy", body,
                      {"X-Toy-Signature": toy_signature(secret, body)})


async def due_in_s(store: PgStore, job_id: str) -> float:
    row = await store.get_job(job_id)
    assert row is not None
    return float((row["next_poll_at"] - datetime.now(UTC)).total_seconds())


async def test_a_toy_providers_signed_delivery_pokes_its_job_and_a_forged_one_is_refused(
        store, server):
    await store.add_job("toy_1", delay_s=3600)
    await store.add_job("toy_2", delay_s=3600)
    signature_refusals = rejected("signature")
    assert await to_toy(server, "toy_1", "evt_1", "not-the-secret") == (
        401, {"error": "invalid signature or timestamp"})
    assert rejected("signature") == signature_refusals + 1
    body = json.dumps({"job": "toy_1"}).encode()  # signed, but no event: its own words
    assert await post(f"{server}/webhooks/toy", body, {
        "X-Toy-Signature": toy_signature("toy-new", body)}) == (
        400, {"error": "toy wants a job and an event"})
    assert await due_in_s(store, "toy_1") > 3500  # refused: untouched
    # either account's secret verifies (the first is tried, refused, and the next one is)
    assert await to_toy(server, "toy_1", "evt_1", "toy-new") == (
        200, {"status": "poked", "made_due": True})
    assert await due_in_s(store, "toy_1") <= 0.5
    assert await to_toy(server, "toy_2", "evt_2", "toy-old") == (
        200, {"status": "poked", "made_due": True})
    # the toy resends a delivery: a repeat, recognised by what the toy says (its signature)
    assert await to_toy(server, "toy_2", "evt_2", "toy-old") == (200, {"status": "duplicate"})


async def test_sumes_route_is_the_same_route_beside_the_toys(store, server):
    await store.add_job("vid_1", delay_s=3600)
    body = json.dumps({"job_id": "vid_1"}).encode()
    stamp = f"{time.time():.0f}"
    assert await post(f"{server}/webhooks/sume", body, {
        "X-Sume-Timestamp": stamp, "X-Sume-Signature": sign(SUME_SECRET, stamp, body),
        "X-Sume-Event-Id": "evt_s"}) == (200, {"status": "poked", "made_due": True})
    # the toy's signature means nothing to Sume's rules, and Sume's secret nothing to the toy's
    assert (await post(f"{server}/webhooks/sume", body, {
        "X-Toy-Signature": toy_signature(SUME_SECRET, body)}))[0] == 401
    assert (await to_toy(server, "vid_1", "evt_t", SUME_SECRET))[0] == 401


@pytest.mark.parametrize("path", ["nope", "quiet", "SUME", "sume.x"])
async def test_a_name_no_served_provider_answers_to_is_a_counted_404(store, server, path):
    before = rejected("unknown_provider")
    body = json.dumps({"job": "toy_1", "event": "e"}).encode()
    async with aiohttp.ClientSession() as http, http.post(
            f"{server}/webhooks/{path}", data=body,
            headers={"X-Toy-Signature": toy_signature("toy-new", body)}) as resp:
        assert (resp.status, await resp.json()) == (404, {"error": "no such webhook"})
    assert rejected("unknown_provider") == before + 1


async def test_a_registered_provider_is_served_only_with_a_secret_given_for_it(store, toys):
    # only Sume's secret given (what make_app(store, secret) means): the toy is a 404
    runner, url = await start_server(make_app(store, SUME_SECRET), "127.0.0.1", 0)
    try:
        assert (await to_toy(url, "toy_1", "evt_1", "toy-new"))[0] == 404
    finally:
        await runner.cleanup()
    # named, but without a secret: the 503 names the setting, as Sume's always did
    runner, url = await start_server(make_app(store, {"toy": None}), "127.0.0.1", 0)
    try:
        assert await to_toy(url, "toy_1", "evt_1", "toy-new") == (
            503, {"error": "no Toy webhook secret is set (webhook_secret_env in the accounts "
                           "file, or TOY_WEBHOOK_SECRET)"})
        assert (await post(f"{url}/webhooks/sume", b"{}", {}))[0] == 404
    finally:
        await runner.cleanup()


async def test_a_secret_for_no_provider_or_for_one_without_webhooks_is_refused_at_start(
        store, toys):
    with pytest.raises(ConfigError, match="unknown provider 'nope'"):
        make_app(store, {"nope": "x"})
    with pytest.raises(ConfigError, match="'quiet' has no webhooks"):
        make_app(store, {"quiet": "x"})


LUMA_ID = "0f3c2a1e-5b7d-4e8f-9a0b-1c2d3e4f5a6b"
RUNWAY_ID = "8d2b6c1a-3e4f-4a5b-9c8d-7e6f5a4b3c2d"


async def test_lumas_unsigned_callbacks_are_served_without_a_secret_only_as_a_hint(store,
                                                                                   db_url):
    from aiohttp import web

    from vidpoll.web.webhooks import setup_webhooks
    from vidpoll.webhook import SourceLimiter

    await store.add_job(LUMA_ID, delay_s=3600, provider="luma")
    await store.add_job(RUNWAY_ID, delay_s=3600, provider="runway")
    app = web.Application()
    setup_webhooks(app, store, {"luma": None}, sources=SourceLimiter(burst=4, per_s=0.001))
    runner, url = await start_server(app, "127.0.0.1", 0)
    try:
        hook = f"{url}/webhooks/luma"
        # the whole Generation, as Luma sends it; only the id is read: no state is taken
        body = json.dumps({"id": LUMA_ID, "state": "completed",
                           "assets": {"video": "https://evil.example/x.mp4"}}).encode()
        assert await post(hook, body, {}) == (200, {"status": "poked", "made_due": True})
        assert await due_in_s(store, LUMA_ID) <= 0.5
        row = await store.get_job(LUMA_ID)
        assert row is not None and row["state"] == "pending" and row["result"] is None
        # Luma's retry (or another state word): the job was just poked, nothing more happens
        again = json.dumps({"id": LUMA_ID, "state": "dreaming"}).encode()
        assert await post(hook, again, {}) == (200, {"status": "duplicate"})
        # another provider's job is never touched, and an unknown id leaves no trace
        assert await post(hook, json.dumps({"id": RUNWAY_ID}).encode(), {}) == (
            200, {"status": "unknown"})
        assert await due_in_s(store, RUNWAY_ID) > 3500
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            stored = await (await conn.execute(
                "SELECT count(*) FROM vidpoll_webhook_events")).fetchone()
        assert stored is not None and stored[0] == 0
        before = rejected("malformed")
        assert (await post(hook, b'{"id": "../etc"}', {}))[0] == 400
        assert rejected("malformed") == before + 1
        # a fifth delivery from one source past its burst of four is refused, unread
        limited = rejected("rate_limited")
        assert await post(hook, body, {}) == (429, {"error": "too many deliveries"})
        assert rejected("rate_limited") == limited + 1
    finally:
        await runner.cleanup()


def test_one_ipv6_host_is_one_source_and_ipv4_is_itself():
    from vidpoll.webhook import source_key

    assert source_key("2001:db8:1:2:aaaa::1") == source_key("2001:db8:1:2:ffff::9")
    assert source_key("2001:db8:1:2::1") != source_key("2001:db8:1:3::1")
    assert source_key("198.51.100.7") == "198.51.100.7"
    assert source_key("::ffff:198.51.100.7") == "198.51.100.7"
    assert source_key("-") == "-"


async def test_a_secret_given_for_lumas_unsigned_callbacks_is_refused_at_start(store):
    with pytest.raises(ConfigError, match="Luma signs no webhook delivery"):
        make_app(store, {"luma": "whsec-x"})
