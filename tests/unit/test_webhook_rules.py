"""Webhook signature, replay window and job id, without a server."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vidpoll.webhook import WebhookRejected, job_id_of, sign, verify

SECRET = "whsec-test"
NOW = 1_800_000_000.0
BODY = json.dumps({"type": "avatar_video.ready", "data": {"job_id": "vid_1"}}).encode()


def headers(ts: float = NOW, body: bytes = BODY, secret: str = SECRET) -> tuple[str, str]:
    stamp = f"{ts:.0f}"
    return stamp, sign(secret, stamp, body)


def test_a_signed_recent_delivery_passes():
    stamp, signature = headers()
    verify(SECRET, stamp, signature, BODY, NOW)
    verify(SECRET, stamp, f"v1=deadbeef, {signature}", BODY, NOW)  # a rotated secret


@pytest.mark.parametrize(("stamp", "signature", "body", "reason"), [
    (None, "v1=00", BODY, "missing"),
    (f"{NOW:.0f}", "", BODY, "missing"),
    ("soon", "v1=00", BODY, "not a number"),
    (f"{NOW - 301:.0f}", None, BODY, "replay window"),
    (f"{NOW + 301:.0f}", None, BODY, "replay window"),
    (f"{NOW:.0f}", None, BODY + b" ", "does not match"),
    (f"{NOW:.0f}", "v2=whatever", BODY, "does not match"),
    ("nan", "v1=00", BODY, "replay window"),
    (f"{NOW:.0f}", "v1=\u00e9\u00e9, v1=\u4e2d", BODY, "does not match"),
])
def test_forged_stale_or_malformed_deliveries_are_refused(stamp, signature, body, reason):
    if signature is None:  # signed correctly for BODY at that time: only the named fault
        signature = sign(SECRET, stamp, BODY)
    with pytest.raises(WebhookRejected, match=reason):
        verify(SECRET, stamp, signature, body, NOW)


def test_another_secret_is_refused():
    stamp, signature = headers(secret="someone-else")
    with pytest.raises(WebhookRejected):
        verify(SECRET, stamp, signature, BODY, NOW)


@pytest.mark.parametrize(("body", "job_id"), [
    ({"job_id": "a"}, "a"), ({"data": {"job_id": "b"}}, "b"), ({"data": {"id": "c"}}, "c"),
    ({"id": "evt_1", "data": {"id": "d"}}, "d"), ({"id": "evt_1"}, None), ({"job_id": 5}, None),
    ({"data": "x"}, None), ([1], None), ({"job_id": "x" * 2000}, None),
])
def test_job_id_of(body, job_id):
    assert job_id_of(json.dumps(body).encode()) == job_id


@given(st.binary(max_size=200))
def test_any_body_is_read_without_crashing(body):
    job_id_of(body)
