"""Veo's webhooks on the Gemini API (static webhooks: Standard Webhooks, a `whsec_` signing
secret; the thin envelope `{type, version, timestamp, data: {id, ...}}`), without a server.
Deliveries are signed here with hmac/hashlib, not with the code under test."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vidpoll.errors import ConfigError
from vidpoll.providers import registry
from vidpoll.providers.base import WebhookHint
from vidpoll.providers.veo.webhooks import WEBHOOKS, job_id_of
from vidpoll.web.webhooks import served_providers, verify_any
from vidpoll.webhook import REJECT_REASONS, WebhookRejected

KEY = b"vidpoll-test-gemini-signing-key!"
SECRET = "whsec_" + base64.b64encode(KEY).decode()
OLD_KEY = b"the-gemini-secret-rotated-out-24h"
OLD_SECRET = "whsec_" + base64.b64encode(OLD_KEY).decode()
NOW = 1_800_000_000.0
TOLERANCE = 300.0
MSG_ID = "msg_gemini_0001"
OPERATION = "models/veo-3.1-generate-preview/operations/b8ak2p0dfq1e"
ENVELOPE = {"type": "video.generated", "version": "v1", "timestamp": "2027-01-15T12:00:00Z",
            "data": {"id": OPERATION, "output_file_uri": "https://generativelanguage."
                     "googleapis.com/v1beta/files/abc:download?alt=media",
                     "file_name": "files/abc"}}
BODY = json.dumps(ENVELOPE).encode()


def hmac_sign(key: bytes, msg_id: str, stamp: str, body: bytes) -> str:
    mac = hmac.new(key, f"{msg_id}.{stamp}.".encode() + body, hashlib.sha256).digest()
    return f"v1,{base64.b64encode(mac).decode()}"


def delivery(body: bytes = BODY, *, ts: float = NOW, msg_id: str = MSG_ID,
             keys: tuple[bytes, ...] = (KEY,)) -> dict[str, str]:
    stamp = f"{ts:.0f}"
    return {"webhook-id": msg_id, "webhook-timestamp": stamp,
            "webhook-signature": " ".join(hmac_sign(k, msg_id, stamp, body) for k in keys)}


def refusal(headers: dict[str, str], body: bytes = BODY, secret: str = SECRET,
            now: float = NOW) -> WebhookRejected:
    with pytest.raises(WebhookRejected) as refused:
        WEBHOOKS.verify(headers, body, secret, now, TOLERANCE)
    assert refused.value.reason in REJECT_REASONS
    return refused.value


def test_a_signed_recent_delivery_names_its_operation_with_its_slashes():
    sent = delivery()
    assert WEBHOOKS.verify(sent, BODY, SECRET, NOW, TOLERANCE) == WebhookHint(
        job_id=OPERATION, event_id=MSG_ID, dedupe=sent["webhook-signature"])


@pytest.mark.parametrize("secret", [SECRET, OLD_SECRET])
def test_during_a_rotation_either_secret_verifies(secret):
    sent = delivery(keys=(KEY, OLD_KEY))  # both signatures while the old one lives (24 h)
    hint = WEBHOOKS.verify(sent, BODY, secret, NOW, TOLERANCE)
    key = KEY if secret == SECRET else OLD_KEY
    assert hint.dedupe == hmac_sign(key, MSG_ID, f"{NOW:.0f}", BODY)


def test_either_accounts_secret_verifies_through_the_routes_search():
    hint = verify_any(WEBHOOKS, [OLD_SECRET, SECRET], delivery(), BODY, NOW, TOLERANCE)
    assert hint.job_id == OPERATION


SIGNED = delivery()


@pytest.mark.parametrize(("headers", "body", "secret", "reason"), [
    (SIGNED, BODY, OLD_SECRET, "signature"),  # another secret
    (SIGNED, BODY + b" ", SECRET, "signature"),  # a changed body
    (SIGNED, BODY.replace(b"b8ak2p0dfq1e", b"b8ak2p0dfq1f"), SECRET, "signature"),
    ({**SIGNED, "webhook-id": "msg_gemini_0002"}, BODY, SECRET, "signature"),
    ({**SIGNED, "webhook-timestamp": f"{NOW + 1:.0f}"}, BODY, SECRET, "signature"),
    # a dynamic webhook's delivery (webhookConfig on the create): an RS256 JWT, not verified
    ({**SIGNED, "webhook-signature": "eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ.eyJhIjoxfQ.c2ln"},
     BODY, SECRET, "signature"),
    ({k: v for k, v in SIGNED.items() if k != "webhook-id"}, BODY, SECRET, "unsigned"),
    ({k: v for k, v in SIGNED.items() if k != "webhook-timestamp"}, BODY, SECRET,
     "unsigned"),
    ({k: v for k, v in SIGNED.items() if k != "webhook-signature"}, BODY, SECRET,
     "unsigned"),
    ({}, BODY, SECRET, "unsigned"),
    (delivery(ts=NOW - TOLERANCE - 1), BODY, SECRET, "timestamp"),
    (delivery(ts=NOW + TOLERANCE + 1), BODY, SECRET, "timestamp"),
    ({**SIGNED, "webhook-timestamp": "soon"}, BODY, SECRET, "timestamp"),
    (SIGNED, BODY, base64.b64encode(KEY).decode(), "signature"),  # not whsec_: a bad secret
])
def test_forged_altered_stale_or_unsigned_deliveries_are_refused(headers, body, secret,
                                                                 reason):
    assert refusal(headers, body, secret).reason == reason


@pytest.mark.parametrize("body", [
    b"not json", b"", b"[]", {"type": "video.generated"}, {"data": None},
    {"data": {"id": 5}}, {"data": {"id": ""}}, {"data": {"id": "a\x00b"}},
    {"data": "models/veo/operations/x"}, {"id": OPERATION},  # only data.id names the job
    {"data": {"name": OPERATION}},
])
def test_a_signed_body_without_a_usable_data_id_is_malformed(body):
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    assert refusal(delivery(raw), raw).reason == "malformed"


def test_another_events_id_is_taken_as_it_is_a_job_vidpoll_does_not_track():
    batch = json.dumps({"type": "batch.succeeded", "version": "v1",
                        "data": {"id": "batches/123456"}}).encode()
    assert WEBHOOKS.verify(delivery(batch), batch, SECRET, NOW, TOLERANCE).job_id == (
        "batches/123456")


@pytest.mark.parametrize(("body", "job_id"), [
    (ENVELOPE, OPERATION), ({"data": {"id": "abc"}}, "abc"), ({"data": {"id": 5}}, None),
    ({"data": {"id": "x" * 2000}}, None), ([1], None),
])
def test_job_id_of(body, job_id):
    assert job_id_of(json.dumps(body).encode()) == job_id


@given(st.binary(max_size=200))
def test_any_body_is_read_without_crashing(body):
    job_id_of(body)


@given(st.text(max_size=60), st.text(max_size=20), st.text(max_size=120),
       st.binary(max_size=100))
def test_any_headers_are_verified_or_refused_never_crash(msg_id, stamp, signature, body):
    sent = {"webhook-id": msg_id, "webhook-timestamp": stamp, "webhook-signature": signature}
    try:
        WEBHOOKS.verify(sent, body, SECRET, NOW, TOLERANCE)
    except WebhookRejected as exc:
        assert exc.reason in REJECT_REASONS


@pytest.fixture
def veo_stand_in() -> Iterator[None]:
    """A provider named veo with these webhooks, whether or not the adapter exists yet."""
    registry.register(SimpleNamespace(  # type: ignore[arg-type]
        name="veo", title="Veo", env_prefix="GEMINI", rules=SimpleNamespace(words={}),
        default_base_url="https://generativelanguage.googleapis.com", webhooks=WEBHOOKS))
    try:
        yield
    finally:
        registry.unregister("veo")


def test_serve_refuses_a_secret_that_cannot_be_geminis_without_showing_it(veo_stand_in):
    with pytest.raises(ConfigError) as err:
        served_providers({"veo": "not-a-whsec-secret-1234"})
    assert "whsec_" in str(err.value) and "not-a-whsec-secret-1234" not in str(err.value)
    assert served_providers({"veo": SECRET})["veo"].secrets == (SECRET,)
