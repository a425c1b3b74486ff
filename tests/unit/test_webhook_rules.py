"""Webhook signature, replay window and job id, without a server."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vidpoll.webhook import REJECT_REASONS, LogSampler, WebhookRejected, job_id_of, sign, verify

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


@pytest.mark.parametrize(("stamp", "signature", "body", "reason"), [
    (None, "v1=00", BODY, "unsigned"),
    (f"{NOW:.0f}", "", BODY, "unsigned"),
    ("soon", "v1=00", BODY, "timestamp"),
    ("nan", "v1=00", BODY, "timestamp"),
    (f"{NOW + 301:.0f}", None, BODY, "timestamp"),
    (f"{NOW:.0f}", None, BODY + b" ", "signature"),
    (f"{NOW:.0f}", "v2=whatever", BODY, "signature"),
])
def test_each_refusal_names_one_of_the_fixed_reasons(stamp, signature, body, reason):
    # the reason is a metric label: one of a fixed set, never anything the caller sent
    if signature is None:
        signature = sign(SECRET, stamp, BODY)
    with pytest.raises(WebhookRejected) as refused:
        verify(SECRET, stamp, signature, body, NOW)
    assert refused.value.reason == reason and reason in REJECT_REASONS


def test_the_log_sampler_lets_one_line_a_period_through_per_reason_and_counts_the_rest():
    now = [1000.0]
    sampler = LogSampler(60.0, clock=lambda: now[0])
    assert [sampler.admit("unsigned") for _ in range(3)] == [0, None, None]
    assert sampler.admit("signature") == 0  # each reason has its own period
    now[0] += 59.9
    assert sampler.admit("unsigned") is None
    now[0] += 0.1
    assert sampler.admit("unsigned") == 3  # logged, saying how many were held back
    assert sampler.admit("unsigned") is None
    now[0] += 3600
    assert (sampler.admit("unsigned"), sampler.admit("signature")) == (1, 0)


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


def test_the_retention_serve_prunes_by_is_never_shorter_than_the_replay_window():
    from vidpoll.errors import ConfigError
    from vidpoll.web.webhooks import retention_in_force

    assert retention_in_force(None, 300.0) == 600.0 + 3600.0  # two tolerances plus an hour
    assert retention_in_force(float("inf"), 300.0) is None  # off: kept for ever
    assert retention_in_force(7200.0, 300.0) == 7200.0
    with pytest.raises(ConfigError, match="at least 600s"):
        retention_in_force(599.0, 300.0)
