"""Replicate's webhook signature (Standard Webhooks), replay window, event id and job id,
without a server. Deliveries are signed here with hmac/hashlib, not with the library the code
under test uses, so the two computations check each other."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vidpoll.providers.base import WebhookHint
from vidpoll.providers.replicate.webhooks import (
    MAX_EVENT_ID_CHARS,
    MAX_SIGNATURE_HEADER_CHARS,
    WEBHOOKS,
    job_id_of,
    signing_key,
)
from vidpoll.webhook import REJECT_REASONS, WebhookRejected

KEY = b"vidpoll-test-replicate-signing!!"
SECRET = "whsec_" + base64.b64encode(KEY).decode()
OLD_KEY = b"the-secret-being-rotated-out-now"
OLD_SECRET = "whsec_" + base64.b64encode(OLD_KEY).decode()
NOW = 1_800_000_000.0
TOLERANCE = 300.0
MSG_ID = "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W"
PREDICTION = {"id": "ufawqhfynnddngldkgtslldrkq", "status": "succeeded",
              "output": ["https://replicate.delivery/x/out.mp4"], "urls": {"get": "..."}}
BODY = json.dumps(PREDICTION).encode()


def hmac_sign(key: bytes, msg_id: str, stamp: str, body: bytes, version: str = "v1") -> str:
    """One Standard Webhooks signature, computed independently of the code under test."""
    mac = hmac.new(key, f"{msg_id}.{stamp}.".encode() + body, hashlib.sha256).digest()
    return f"{version},{base64.b64encode(mac).decode()}"


def delivery(body: bytes = BODY, *, ts: float = NOW, msg_id: str = MSG_ID,
             keys: tuple[bytes, ...] = (KEY,)) -> dict[str, str]:
    stamp = f"{ts:.0f}"
    return {"webhook-id": msg_id, "webhook-timestamp": stamp,
            "webhook-signature": " ".join(hmac_sign(k, msg_id, stamp, body) for k in keys)}


def refusal(headers: dict[str, str], body: bytes = BODY, secret: str = SECRET,
            now: float = NOW, tolerance: float = TOLERANCE) -> WebhookRejected:
    with pytest.raises(WebhookRejected) as refused:
        WEBHOOKS.verify(headers, body, secret, now, tolerance)
    exc = refused.value
    assert exc.reason in REJECT_REASONS  # a metric label: one of a fixed set
    text = str(exc)  # logged: never the secret, its key or a signature
    shown = [SECRET, secret.strip(), *(v.partition(",")[2] for v in
                                       headers.get("webhook-signature", "").split())]
    assert not [s for s in shown if s.removeprefix("whsec_") and s.removeprefix("whsec_")
                in text]
    return exc


def test_a_signed_recent_delivery_names_its_prediction_and_the_signature_that_verified():
    sent = delivery()
    assert WEBHOOKS.verify(sent, BODY, SECRET, NOW, TOLERANCE) == WebhookHint(
        job_id=PREDICTION["id"], event_id=MSG_ID, dedupe=sent["webhook-signature"])


def test_headers_are_found_in_any_case_and_stripped():
    sent = delivery()
    shouted = {"Webhook-Id": f" {MSG_ID} ", "WEBHOOK-TIMESTAMP": f"{NOW:.0f}",
               "webhook-Signature": f"  {sent['webhook-signature']}  "}
    hint = WEBHOOKS.verify(shouted, BODY, SECRET, NOW, TOLERANCE)
    assert (hint.event_id, hint.dedupe) == (MSG_ID, sent["webhook-signature"])


@pytest.mark.parametrize("secret", [SECRET, OLD_SECRET])
def test_during_a_rotation_either_secret_verifies(secret):
    sent = delivery(keys=(KEY, OLD_KEY))  # Replicate signs with both, space-separated
    hint = WEBHOOKS.verify(sent, BODY, secret, NOW, TOLERANCE)
    key = KEY if secret == SECRET else OLD_KEY
    assert hint.dedupe == hmac_sign(key, MSG_ID, f"{NOW:.0f}", BODY)  # the one that matched


@pytest.mark.parametrize("skew", [-TOLERANCE, -299.0, 0.0, 299.0, TOLERANCE])
def test_a_timestamp_just_inside_the_window_either_way_is_accepted(skew):
    WEBHOOKS.verify(delivery(ts=NOW + skew), BODY, SECRET, NOW, TOLERANCE)


@pytest.mark.parametrize("skew", [-TOLERANCE - 1, TOLERANCE + 1, -86_400.0, 86_400.0])
def test_a_stale_or_future_timestamp_beyond_the_window_is_refused(skew):
    # correctly signed: only the time is wrong
    assert refusal(delivery(ts=NOW + skew)).reason == "timestamp"


def test_the_window_is_the_callers_not_the_librarys_five_minutes():
    late = delivery(ts=NOW - 900)
    WEBHOOKS.verify(late, BODY, SECRET, NOW, 1000.0)
    assert refusal(delivery(ts=NOW - 20), tolerance=10.0).reason == "timestamp"
    for now, tolerance in ((float("nan"), TOLERANCE), (NOW, float("nan"))):
        assert refusal(delivery(), now=now, tolerance=tolerance).reason == "timestamp"
    # past year 9999: no datetime to sign with, refused rather than a crash
    far = delivery(ts=999_999_999_999)
    assert refusal(far, tolerance=float("inf")).reason == "timestamp"


def _with(headers: dict[str, str], **changed: str) -> dict[str, str]:
    return {**headers, **{k.replace("_", "-"): v for k, v in changed.items()}}


SIGNED = delivery()
GOOD_SIG = SIGNED["webhook-signature"]
STAMP = SIGNED["webhook-timestamp"]
DIGEST_B64 = GOOD_SIG.partition(",")[2]


@pytest.mark.parametrize(("headers", "body", "secret", "reason"), [
    # forged or altered: the signature no longer covers what came
    (SIGNED, BODY, OLD_SECRET, "signature"),  # another secret
    (SIGNED, BODY + b" ", SECRET, "signature"),  # a changed body
    (SIGNED, BODY.replace(b"succeeded", b"failed\x20\x20\x20"), SECRET, "signature"),
    (_with(SIGNED, webhook_id="msg_2KWPBgLlAfxdpx2AI54pPJ85f4X"), BODY, SECRET, "signature"),
    (_with(SIGNED, webhook_timestamp=f"{NOW + 1:.0f}"), BODY, SECRET, "signature"),
    (_with(SIGNED, webhook_signature="v2," + DIGEST_B64), BODY, SECRET, "signature"),
    (_with(SIGNED, webhook_signature="v1a," + DIGEST_B64), BODY, SECRET, "signature"),
    (_with(SIGNED, webhook_signature="v1,!!!not*base64"), BODY, SECRET, "signature"),
    (_with(SIGNED, webhook_signature="v1," + DIGEST_B64.rstrip("=")), BODY, SECRET,
     "signature"),  # not the canonical form: never a second value for one delivery
    (_with(SIGNED, webhook_signature=GOOD_SIG.replace(",", "=")), BODY, SECRET, "signature"),
    (_with(SIGNED, webhook_signature="v1,\u00e9\u00e9 v1,\u4e2d \ud800"), BODY, SECRET,
     "signature"),  # not ASCII: refused, not a crash
    (_with(SIGNED, webhook_signature="v1,AAAA " * (MAX_SIGNATURE_HEADER_CHARS // 8)
           + GOOD_SIG), BODY, SECRET, "signature"),  # oversized, even holding the right one
    # missing or unusable headers
    ({k: v for k, v in SIGNED.items() if k != "webhook-id"}, BODY, SECRET, "unsigned"),
    ({k: v for k, v in SIGNED.items() if k != "webhook-timestamp"}, BODY, SECRET, "unsigned"),
    ({k: v for k, v in SIGNED.items() if k != "webhook-signature"}, BODY, SECRET, "unsigned"),
    ({}, BODY, SECRET, "unsigned"),
    (_with(SIGNED, webhook_signature="   "), BODY, SECRET, "unsigned"),
    (_with(SIGNED, webhook_id="m" * (MAX_EVENT_ID_CHARS + 1)), BODY, SECRET, "unsigned"),
    (_with(SIGNED, webhook_id="msg.1"), BODY, SECRET, "unsigned"),  # the spec bars a `.`
    (_with(SIGNED, webhook_id="msg 1"), BODY, SECRET, "unsigned"),
    (_with(SIGNED, webhook_id="msg_\u00e9"), BODY, SECRET, "unsigned"),
    (_with(SIGNED, webhook_timestamp="1" * 13), BODY, SECRET, "timestamp"),  # oversized
    (_with(SIGNED, webhook_timestamp="soon"), BODY, SECRET, "timestamp"),
    (_with(SIGNED, webhook_timestamp=f"{NOW:.1f}"), BODY, SECRET, "timestamp"),
    (_with(SIGNED, webhook_timestamp="1.8e9"), BODY, SECRET, "timestamp"),
    (_with(SIGNED, webhook_timestamp="+" + STAMP), BODY, SECRET, "timestamp"),
    (_with(SIGNED, webhook_timestamp="0" + STAMP), BODY, SECRET, "timestamp"),
    (_with(SIGNED, webhook_timestamp="nan"), BODY, SECRET, "timestamp"),
    (_with(SIGNED, webhook_timestamp="\u0661\u0668" + "\u0660" * 8), BODY, SECRET,
     "timestamp"),  # digits, but not ASCII ones
])
def test_forged_altered_or_malformed_deliveries_are_refused_with_a_fixed_reason(
        headers, body, secret, reason):
    assert refusal(headers, body, secret).reason == reason


def signed_body(value) -> tuple[dict[str, str], bytes]:
    body = value if isinstance(value, bytes) else json.dumps(value).encode()
    return delivery(body), body


@pytest.mark.parametrize("body", [
    b"not json", b"\xff\xfe", b"", b"[" * 100_000,
    [PREDICTION], "ufawqhfynnddngldkgtslldrkq", {"status": "succeeded"},
    {"id": 5}, {"id": None}, {"id": ""}, {"id": "a\x00b"}, {"id": "x" * 2000},
    {"prediction": {"id": "abc"}},  # only the top-level `id` is the prediction's
])
def test_a_signed_body_without_a_usable_prediction_id_is_malformed(body):
    headers, raw = signed_body(body)
    assert refusal(headers, raw).reason == "malformed"


@pytest.mark.parametrize("secret", [
    base64.b64encode(KEY).decode(),  # no whsec_ prefix
    "whsec-" + base64.b64encode(KEY).decode(),
    "whsec_",  # empty
    "whsec_!!!!",  # not base64
    "whsec_" + base64.b64encode(KEY).decode()[:-2] + "*=",
    "whsec_" + base64.urlsafe_b64encode(b"\xfb\xff" * 16).decode(),  # not the standard alphabet
    "whsec_abcde",  # a length no base64 has
    "whsec_ab=cd",  # padding inside
    "whsec_====",
    KEY.decode(),  # the raw key
])
def test_a_secret_that_is_not_whsec_base64_is_refused_without_echoing_it(secret):
    exc = refusal(SIGNED, secret=secret)
    assert (exc.reason, str(exc)) == (
        "signature", "the webhook secret is not whsec_<base64>: a configuration error")


def test_the_secret_may_come_without_padding_and_with_stray_whitespace():
    assert signing_key(SECRET) == signing_key(SECRET.rstrip("=")) == KEY
    assert signing_key(f" {SECRET}\n") == KEY
    WEBHOOKS.verify(SIGNED, BODY, SECRET.rstrip("="), NOW, TOLERANCE)


def test_a_bad_secret_leaves_the_providers_other_secrets_to_try():
    from vidpoll.web.webhooks import verify_any

    hint = verify_any(WEBHOOKS, ["whsec_!!!!", OLD_SECRET, SECRET], SIGNED, BODY, NOW,
                      TOLERANCE)
    assert hint.dedupe == GOOD_SIG


def test_a_resent_delivery_has_the_same_dedupe_however_its_signature_list_is_rewritten():
    sent = delivery(keys=(KEY, OLD_KEY))
    first = WEBHOOKS.verify(sent, BODY, SECRET, NOW, TOLERANCE)
    new, old = sent["webhook-signature"].split(" ")
    for rewritten in (f"{old} {new}", f"v2,AAAA  {old}\t{new} v1,AAAA", f"{new} {new}"):
        again = WEBHOOKS.verify(_with(sent, webhook_signature=rewritten), BODY, SECRET, NOW,
                                TOLERANCE)
        assert again == first
    assert first.dedupe == new  # `v1,` + standard base64 of the digest: the canonical form


def test_another_delivery_of_the_same_prediction_has_another_dedupe():
    retry = delivery(ts=NOW + 5)  # a retry: same webhook-id, new timestamp, new signature
    first = WEBHOOKS.verify(SIGNED, BODY, SECRET, NOW, TOLERANCE)
    second = WEBHOOKS.verify(retry, BODY, SECRET, NOW, TOLERANCE)
    assert first.event_id == second.event_id and first.dedupe != second.dedupe


@pytest.mark.parametrize(("body", "job_id"), [
    ({"id": "a"}, "a"), ({"id": "p", "status": "starting"}, "p"), ({"id": 5}, None),
    ({"data": {"id": "c"}}, None), ([1], None), ({"id": "x" * 2000}, None),
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


def test_serve_refuses_a_secret_that_cannot_be_replicates_without_showing_it() -> None:
    from vidpoll.errors import ConfigError
    from vidpoll.web.webhooks import served_providers
    with pytest.raises(ConfigError) as err:
        served_providers({"replicate": "not-a-whsec-secret-1234"})
    assert "whsec_" in str(err.value) and "not-a-whsec-secret-1234" not in str(err.value)
    assert "replicate" in served_providers({"replicate": "whsec_" + "QUJDREVGR0g="})
