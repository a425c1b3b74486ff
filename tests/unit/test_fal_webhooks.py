"""fal's webhook signatures (Ed25519 over request id, user id, timestamp and the body's
SHA-256, keys from a JWKS), the replay window, the job id, and the key cache: fetched when
needed, never more than once a minute whatever arrives, a failed fetch keeping the old keys.
No server: the JWKS comes from a fetcher a test controls, the time from a clock it moves.
Deliveries are signed here with `cryptography` directly and the message built by hand, not
with the helpers under test."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given
from hypothesis import strategies as st

from vidpoll.errors import ConfigError
from vidpoll.providers import registry
from vidpoll.providers.base import WebhookHint
from vidpoll.providers.fal.webhooks import (
    DEFAULT_JWKS_URL,
    MAX_KEYS,
    REFETCH_EVERY_S,
    FalWebhooks,
    JwksUnavailable,
    keys_of_jwks,
)
from vidpoll.web.webhooks import served_providers, verify_fresh
from vidpoll.webhook import REJECT_REASONS, WebhookRejected

URL = "https://jwks.example.test/.well-known/jwks.json"
NOW = 1_800_000_000.0
TOLERANCE = 300.0
REQUEST_ID = "024ca5b1-45d3-4afd-883e-ad3abe2a1c4d"
USER_ID = "github|vidpoll-test"
KEY = Ed25519PrivateKey.generate()
NEW_KEY = Ed25519PrivateKey.generate()
OTHER_KEY = Ed25519PrivateKey.generate()  # nobody publishes this one: a forger's
BODY = json.dumps({"request_id": REQUEST_ID, "gateway_request_id": REQUEST_ID,
                   "status": "OK", "payload": {"video": {"url": "https://v3.fal.media/x.mp4"}}
                   }).encode()


def jwk(key: Ed25519PrivateKey, **extra: str) -> dict[str, str]:
    raw = key.public_key().public_bytes_raw()
    x = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    return {"kty": "OKP", "crv": "Ed25519", "x": x, **extra}


def jwks(*keys: Ed25519PrivateKey) -> bytes:
    return json.dumps({"keys": [jwk(k) for k in keys]}).encode()


def sign(key: Ed25519PrivateKey, body: bytes = BODY, *, request_id: str = REQUEST_ID,
         user_id: str = USER_ID, ts: float = NOW) -> dict[str, str]:
    stamp = f"{ts:.0f}"
    message = "\n".join([request_id, user_id, stamp, hashlib.sha256(body).hexdigest()])
    return {"X-Fal-Webhook-Request-Id": request_id, "X-Fal-Webhook-User-Id": user_id,
            "X-Fal-Webhook-Timestamp": stamp,
            "X-Fal-Webhook-Signature": key.sign(message.encode()).hex()}


class Jwks:
    """fal's JWKS host as a test sees it: what it serves now, and how often it was asked."""

    def __init__(self, *keys: Ed25519PrivateKey) -> None:
        self.document: bytes | Exception = jwks(*keys)
        self.calls = 0
        self.gate: asyncio.Event | None = None

    def serve(self, *keys: Ed25519PrivateKey) -> None:
        self.document = jwks(*keys)

    async def __call__(self, url: str) -> bytes:
        assert url == URL
        self.calls += 1
        if self.gate is not None:
            await self.gate.wait()
        if isinstance(self.document, Exception):
            raise self.document
        return self.document


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def host() -> Jwks:
    return Jwks(KEY)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def hooks(host: Jwks, clock: Clock) -> FalWebhooks:
    return FalWebhooks(host, clock)


async def ready(hooks: FalWebhooks) -> FalWebhooks:
    assert await hooks.refresh_keys(URL)
    return hooks


def refusal(hooks: FalWebhooks, headers: dict[str, str], body: bytes = BODY,
            now: float = NOW, tolerance: float = TOLERANCE) -> WebhookRejected:
    with pytest.raises(WebhookRejected) as refused:
        hooks.verify(headers, body, URL, now, tolerance)
    exc = refused.value
    assert exc.reason in REJECT_REASONS
    sig = headers.get("X-Fal-Webhook-Signature", "")
    assert not sig or sig not in str(exc)  # logged: never a signature
    return exc


async def delivered(hooks: FalWebhooks, headers: dict[str, str], body: bytes = BODY,
                    now: float = NOW) -> WebhookHint:
    """Through the route's own sequence (verify_fresh), without a server."""
    return await verify_fresh(hooks, [URL], headers, body, lambda: now, TOLERANCE)


async def test_a_signed_recent_delivery_names_its_request_and_the_signature_that_verified(
        hooks):
    await ready(hooks)
    sent = sign(KEY)
    assert hooks.verify(sent, BODY, URL, NOW, TOLERANCE) == WebhookHint(
        job_id=REQUEST_ID, event_id=REQUEST_ID, dedupe=sent["X-Fal-Webhook-Signature"])


async def test_the_dedupe_is_the_signature_in_lower_case_hex_however_it_came(hooks):
    await ready(hooks)
    sent = sign(KEY)
    shouted = {k.lower(): f"  {v} " for k, v in sent.items()}
    shouted["x-fal-webhook-signature"] = sent["X-Fal-Webhook-Signature"].upper()
    assert hooks.verify(shouted, BODY, URL, NOW, TOLERANCE) == hooks.verify(
        sent, BODY, URL, NOW, TOLERANCE)


async def test_a_body_without_its_request_id_is_known_by_the_signed_header(hooks):
    await ready(hooks)
    body = json.dumps({"status": "ERROR", "error": "Invalid status code: 422",
                       "payload": {"detail": []}}).encode()
    assert hooks.verify(sign(KEY, body), body, URL, NOW, TOLERANCE).job_id == REQUEST_ID


async def test_an_empty_user_id_is_signed_like_any_other(hooks):
    await ready(hooks)
    hooks.verify(sign(KEY, user_id=""), BODY, URL, NOW, TOLERANCE)


@pytest.mark.parametrize("skew", [-TOLERANCE, -299.0, 0.0, 299.0, TOLERANCE])
async def test_a_timestamp_just_inside_the_window_either_way_is_accepted(hooks, skew):
    await ready(hooks)
    hooks.verify(sign(KEY, ts=NOW + skew), BODY, URL, NOW, TOLERANCE)


@pytest.mark.parametrize("skew", [-TOLERANCE - 1, TOLERANCE + 1, -86_400.0, 86_400.0])
async def test_a_stale_or_future_timestamp_is_refused(hooks, skew):
    await ready(hooks)
    assert refusal(hooks, sign(KEY, ts=NOW + skew)).reason == "timestamp"


async def test_the_window_is_the_callers(hooks):
    await ready(hooks)
    hooks.verify(sign(KEY, ts=NOW - 900), BODY, URL, NOW, 1000.0)
    assert refusal(hooks, sign(KEY, ts=NOW - 20), tolerance=10.0).reason == "timestamp"
    for now, tolerance in ((float("nan"), TOLERANCE), (NOW, float("nan"))):
        assert refusal(hooks, sign(KEY), now=now, tolerance=tolerance).reason == "timestamp"


def _with(headers: dict[str, str], name: str, value: str | None) -> dict[str, str]:
    changed = {k: v for k, v in headers.items() if k != f"X-Fal-Webhook-{name}"}
    if value is not None:
        changed[f"X-Fal-Webhook-{name}"] = value
    return changed


SIGNED = sign(KEY)
SIG = SIGNED["X-Fal-Webhook-Signature"]


@pytest.mark.parametrize(("headers", "body", "reason"), [
    # forged or altered: the signature no longer covers what came
    (sign(OTHER_KEY), BODY, "signature"),  # a key fal does not publish
    (SIGNED, BODY + b" ", "signature"),  # a changed body
    (SIGNED, BODY.replace(b'"OK"', b'"NO"'), "signature"),
    (_with(SIGNED, "User-Id", "someone-else"), BODY, "signature"),
    (_with(SIGNED, "Timestamp", f"{NOW + 1:.0f}"), BODY, "signature"),
    (_with(SIGNED, "Signature", SIG[:-2] + ("00" if SIG[-2:] != "00" else "11")), BODY,
     "signature"),
    (_with(SIGNED, "Signature", SIG[:-2]), BODY, "signature"),  # not 64 bytes
    (_with(SIGNED, "Signature", SIG + "00"), BODY, "signature"),
    (_with(SIGNED, "Signature", "zz" * 64), BODY, "signature"),
    (_with(SIGNED, "Signature", "\u00e9" * 128), BODY, "signature"),
    (_with(SIGNED, "Signature", base64.b64encode(bytes.fromhex(SIG)).decode()), BODY,
     "signature"),
    # missing or unusable headers
    ({}, BODY, "unsigned"),
    (_with(SIGNED, "Request-Id", None), BODY, "unsigned"),
    (_with(SIGNED, "User-Id", None), BODY, "unsigned"),
    (_with(SIGNED, "Timestamp", None), BODY, "unsigned"),
    (_with(SIGNED, "Signature", None), BODY, "unsigned"),
    (_with(SIGNED, "Signature", "   "), BODY, "unsigned"),
    (_with(SIGNED, "Request-Id", "a b"), BODY, "unsigned"),
    (_with(SIGNED, "Request-Id", "r" * 201), BODY, "unsigned"),
    (_with(SIGNED, "User-Id", "u\nv"), BODY, "unsigned"),
    (_with(SIGNED, "Request-Id", "r\u00e9"), BODY, "unsigned"),
    (_with(SIGNED, "Timestamp", "soon"), BODY, "timestamp"),
    (_with(SIGNED, "Timestamp", f"{NOW:.1f}"), BODY, "timestamp"),
    (_with(SIGNED, "Timestamp", "0" + f"{NOW:.0f}"), BODY, "timestamp"),
    (_with(SIGNED, "Timestamp", "1" * 13), BODY, "timestamp"),
    (_with(SIGNED, "Timestamp", "\u0661\u0668" + "\u0660" * 8), BODY, "timestamp"),
])
async def test_forged_altered_or_unusable_deliveries_are_refused_with_a_fixed_reason(
        hooks, headers, body, reason):
    await ready(hooks)
    assert refusal(hooks, headers, body).reason == reason


@pytest.mark.parametrize("body", [
    b"not json", b"", b"\xff", b"[1]", b'"024ca5b1"',
    json.dumps({"request_id": "another-request"}).encode(),
    json.dumps({"request_id": None}).encode(),
    json.dumps({"request_id": 5}).encode(),
])
async def test_a_signed_body_that_is_not_fals_json_for_that_request_is_malformed(
        hooks, body):
    await ready(hooks)
    assert refusal(hooks, sign(KEY, body), body).reason == "malformed"


async def test_before_any_key_is_fetched_a_delivery_is_refused_as_signature(hooks):
    assert hooks.keys(URL) == ()
    exc = refusal(hooks, SIGNED)
    assert (exc.reason, str(exc)) == ("signature", "no fal webhook key could be fetched yet")


async def test_the_route_fetches_the_keys_before_the_first_delivery_and_then_not_again(
        hooks, host, clock):
    assert (await delivered(hooks, sign(KEY))).job_id == REQUEST_ID
    assert host.calls == 1
    for _ in range(5):
        clock.now += 3600  # hours pass: still cached (fal: up to 24 hours)
        await delivered(hooks, sign(KEY))
    assert host.calls == 1


async def test_keys_older_than_a_day_are_fetched_again_before_verifying(hooks, host, clock):
    await delivered(hooks, sign(KEY))
    clock.now += 24 * 3600
    host.serve(NEW_KEY)  # fal rotated, and dropped the old key
    await delivered(hooks, sign(NEW_KEY))
    assert host.calls == 2
    with pytest.raises(WebhookRejected):
        await delivered(hooks, sign(KEY))  # the dropped key no longer verifies


async def test_a_delivery_signed_with_a_key_not_cached_makes_the_route_fetch_them_anew(
        hooks, host, clock):
    await delivered(hooks, sign(KEY))
    clock.now += REFETCH_EVERY_S  # a minute after the first fetch
    host.serve(KEY, NEW_KEY)  # fal adds a key and signs with it: no key id names it
    hint = await delivered(hooks, sign(NEW_KEY))
    assert hint.job_id == REQUEST_ID and host.calls == 2


async def test_during_a_rotation_a_delivery_signed_with_either_key_verifies(host, clock):
    host.serve(KEY, NEW_KEY)
    hooks = await ready(FalWebhooks(host, clock))
    for key in (KEY, NEW_KEY):
        hint = hooks.verify(sign(key), BODY, URL, NOW, TOLERANCE)
        assert hint.dedupe == sign(key)["X-Fal-Webhook-Signature"]
    assert refusal(hooks, sign(OTHER_KEY)).reason == "signature"


async def test_a_flood_of_forged_deliveries_costs_at_most_one_fetch_a_minute(
        hooks, host, clock):
    await delivered(hooks, sign(KEY))
    assert host.calls == 1
    start = clock.now
    for i in range(3000):  # 10 minutes of forgeries, 5 a second
        clock.now = start + i * 0.2
        with pytest.raises(WebhookRejected) as refused:
            await delivered(hooks, sign(OTHER_KEY))
        assert refused.value.reason == "signature"
    minutes = (clock.now - start) / REFETCH_EVERY_S
    assert minutes - 1 <= host.calls - 1 <= minutes  # one a minute, never more
    # and forgeries refused before the signature (stale, unsigned) cost none at all
    before, clock.now = host.calls, clock.now + 3 * REFETCH_EVERY_S
    for _ in range(100):
        with pytest.raises(WebhookRejected):
            await delivered(hooks, sign(OTHER_KEY, ts=NOW - 3600))
        with pytest.raises(WebhookRejected):
            await delivered(hooks, {})
    assert host.calls == before
    # the genuine deliveries among them verified throughout
    assert (await delivered(hooks, sign(KEY))).job_id == REQUEST_ID


async def test_concurrent_deliveries_share_one_fetch(hooks, host):
    host.gate = asyncio.Event()
    deliveries = [asyncio.ensure_future(delivered(hooks, sign(KEY))) for _ in range(50)]
    forged = [asyncio.ensure_future(delivered(hooks, sign(OTHER_KEY))) for _ in range(50)]
    await asyncio.sleep(0.01)
    assert host.calls == 1  # one in flight; the others wait for it
    host.gate.set()
    assert {h.job_id for h in await asyncio.gather(*deliveries)} == {REQUEST_ID}
    refused = await asyncio.gather(*forged, return_exceptions=True)
    assert all(isinstance(r, WebhookRejected) and r.reason == "signature" for r in refused)
    assert host.calls == 1


@pytest.mark.parametrize("failure", [
    JwksUnavailable("HTTP 503"), TimeoutError(), OSError("connection refused"),
    RuntimeError("a bug in the fetcher"), b"<html>maintenance</html>", b'{"keys": []}',
    json.dumps({"keys": [{"kty": "RSA", "n": "AQAB", "e": "AQAB"}]}).encode(),
])
async def test_a_failed_fetch_keeps_the_old_keys(hooks, host, clock, failure, caplog):
    await delivered(hooks, sign(KEY))
    host.document = failure
    clock.now += 25 * 3600  # past the age limit: fetched again before verifying, and fails
    assert (await delivered(hooks, sign(KEY))).job_id == REQUEST_ID
    assert host.calls == 2
    assert "keeping the 1 keys there were" in caplog.text
    clock.now += REFETCH_EVERY_S
    with pytest.raises(WebhookRejected):  # a key not cached: fetched again, fails again
        await delivered(hooks, sign(NEW_KEY))
    assert host.calls == 3 and len(hooks.keys(URL)) == 1
    assert (await delivered(hooks, sign(KEY))).job_id == REQUEST_ID
    assert host.calls == 3  # retried at most once a minute, however stale the keys are


async def test_a_failed_first_fetch_is_tried_again_a_minute_later(hooks, host, clock):
    host.document = JwksUnavailable("HTTP 502")
    for _ in range(20):
        with pytest.raises(WebhookRejected):
            await delivered(hooks, sign(KEY))
    assert host.calls == 1
    host.serve(KEY)
    clock.now += REFETCH_EVERY_S
    assert (await delivered(hooks, sign(KEY))).job_id == REQUEST_ID
    assert host.calls == 2


async def test_a_refetch_returning_the_same_keys_does_not_verify_again(hooks, host, clock):
    await ready(hooks)
    clock.now += REFETCH_EVERY_S
    assert await hooks.refresh_keys(URL, refused=True) is False  # fetched, nothing new
    assert host.calls == 2


def test_keys_of_a_jwks_are_its_ed25519_signing_keys_only():
    good, second = jwk(KEY, kid="k1", alg="EdDSA", use="sig"), jwk(NEW_KEY)
    entries = [
        {"kty": "RSA", "n": "AQAB", "e": "AQAB"},
        {"kty": "OKP", "crv": "X25519", "x": good["x"]},
        {"kty": "OKP", "crv": "Ed25519", "x": good["x"][:-4]},  # not 32 bytes
        {"kty": "OKP", "crv": "Ed25519", "x": "!!" + good["x"][2:]},
        {"kty": "OKP", "crv": "Ed25519", "x": 5},
        {**good, "use": "enc"},
        "not an object", None,
        good, good,  # a repeat
        second,
    ]
    keys = keys_of_jwks(json.dumps({"keys": entries}).encode())
    assert [k.public_bytes_raw() for k in keys] == [
        KEY.public_key().public_bytes_raw(), NEW_KEY.public_key().public_bytes_raw()]
    padded = {**good, "x": good["x"] + "="}
    assert len(keys_of_jwks(json.dumps({"keys": [padded]}).encode())) == 1
    for document in (b"", b"[]", b'{"keys": {}}', b"\xff", b"[" * 100_000):
        assert keys_of_jwks(document) == ()
    many = [jwk(Ed25519PrivateKey.generate()) for _ in range(MAX_KEYS + 5)]
    assert len(keys_of_jwks(json.dumps({"keys": many}).encode())) == MAX_KEYS


def test_an_accounts_jwks_url_is_its_option_else_fals():
    hooks = FalWebhooks()
    assert hooks.account_secret("", {}) == DEFAULT_JWKS_URL
    assert hooks.account_secret("ignored", {"jwks_url": f" {URL} "}) == URL
    assert hooks.account_secret("", {"jwks_url": ""}) == DEFAULT_JWKS_URL
    assert DEFAULT_JWKS_URL.startswith("https://") and hooks.secret_problem(
        DEFAULT_JWKS_URL) is None


@pytest.mark.parametrize(("url", "ok"), [
    (URL, True), ("http://127.0.0.1:8123/jwks.json", True), ("http://localhost/j", True),
    ("http://[::1]:9/j", True), ("http://rest.fal.ai/.well-known/jwks.json", False),
    ("ftp://rest.fal.ai/jwks.json", False), ("rest.fal.ai/jwks.json", False), ("", False),
    ("https://user:pw@rest.fal.ai/jwks.json", False), ("https://host:port/x", False),
])
def test_a_jwks_url_must_be_https_or_loopback(url, ok):
    assert (FalWebhooks().secret_problem(url) is None) == ok


@pytest.fixture
def fal_stand_in() -> Iterator[FalWebhooks]:
    """A provider named fal with these webhooks, whether or not the adapter exists yet."""
    hooks = FalWebhooks(Jwks(KEY))
    registry.register(SimpleNamespace(  # type: ignore[arg-type]
        name="fal", title="fal", env_prefix="FAL", default_base_url="https://queue.fal.run",
        rules=SimpleNamespace(words={}), webhooks=hooks))
    try:
        yield hooks
    finally:
        registry.unregister("fal")


def test_serve_refuses_a_jwks_url_it_would_not_fetch_without_starting(fal_stand_in):
    with pytest.raises(ConfigError, match="not an https URL"):
        served_providers({"fal": "http://rest.fal.ai/.well-known/jwks.json"})
    assert served_providers({"fal": [DEFAULT_JWKS_URL]})["fal"].secrets == (DEFAULT_JWKS_URL,)


PRIMED = FalWebhooks(Jwks(KEY), Clock())
asyncio.run(PRIMED.refresh_keys(URL))  # keys cached, as after a fetch


@given(st.text(max_size=60), st.text(max_size=60), st.text(max_size=20),
       st.text(max_size=140), st.binary(max_size=100))
def test_any_headers_are_verified_or_refused_never_crash(request_id, user_id, stamp,
                                                          signature, body):
    hooks = PRIMED
    sent = {"X-Fal-Webhook-Request-Id": request_id, "X-Fal-Webhook-User-Id": user_id,
            "X-Fal-Webhook-Timestamp": stamp, "X-Fal-Webhook-Signature": signature}
    try:
        hooks.verify(sent, body, URL, NOW, TOLERANCE)
    except WebhookRejected as exc:
        assert exc.reason in REJECT_REASONS
