"""Webhook signature, replay window and job id (Sume's), and the shared refusal rules, without
a server."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vidpoll.providers.base import WebhookHint
from vidpoll.providers.sume.webhooks import WEBHOOKS, job_id_of, sign, verify_signature
from vidpoll.webhook import REJECT_REASONS, LogSampler, SourceLimiter, WebhookRejected

SECRET = "whsec-test"
NOW = 1_800_000_000.0
BODY = json.dumps({"type": "avatar_video.ready", "data": {"job_id": "vid_1"}}).encode()


def headers(ts: float = NOW, body: bytes = BODY, secret: str = SECRET) -> tuple[str, str]:
    stamp = f"{ts:.0f}"
    return stamp, sign(secret, stamp, body)


def test_a_signed_recent_delivery_passes():
    stamp, signature = headers()
    verify_signature(SECRET, stamp, signature, BODY, NOW)
    verify_signature(SECRET, stamp, f"v1=deadbeef, {signature}", BODY, NOW)  # a rotated secret


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
        verify_signature(SECRET, stamp, signature, body, NOW)


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
        verify_signature(SECRET, stamp, signature, body, NOW)
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
        verify_signature(SECRET, stamp, signature, BODY, NOW)


def test_the_provider_interface_reads_the_headers_and_names_the_job_and_the_signed_value():
    stamp, signature = headers()
    sent = {"x-sume-timestamp": stamp, "X-SUME-SIGNATURE": f" v1=00 ,{signature}",
            "X-Sume-Event-Id": " evt_1 "}  # any case, as HTTP; a plain dict too
    assert WEBHOOKS.verify(sent, BODY, SECRET, NOW, 300.0) == WebhookHint(
        job_id="vid_1", event_id="evt_1", dedupe=signature)  # the value that verified


NO_JOB = json.dumps({"id": "evt_1"}).encode()  # an event's own id is no job id


@pytest.mark.parametrize(("signed_for", "body", "event_id", "reason"), [
    (None, BODY, "evt_1", "unsigned"),
    (BODY, BODY + b" ", "evt_1", "signature"),
    (NO_JOB, NO_JOB, "evt_1", "malformed"),  # signed, but names no job
    (BODY, BODY, "  ", "malformed"),
    (BODY, BODY, None, "malformed"),
])
def test_the_provider_interface_refuses_as_the_signature_rules_do(signed_for, body, event_id,
                                                                  reason):
    stamp = f"{NOW:.0f}"
    sent = {} if signed_for is None else {"X-Sume-Timestamp": stamp,
                                          "X-Sume-Signature": sign(SECRET, stamp, signed_for)}
    if event_id is not None:
        sent["X-Sume-Event-Id"] = event_id
    with pytest.raises(WebhookRejected) as refused:
        WEBHOOKS.verify(sent, body, SECRET, NOW, 300.0)
    assert refused.value.reason == reason


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


def test_unsigned_deliveries_are_limited_per_source_with_a_burst_then_a_rate():
    now = [0.0]
    limiter = SourceLimiter(burst=3, per_s=2, max_sources=100, clock=lambda: now[0])
    assert [limiter.admit("198.51.100.7") for _ in range(4)] == [True, True, True, False]
    assert limiter.admit("203.0.113.9")  # another source has its own bucket
    now[0] += 0.5  # one token back (2 a second)
    assert limiter.admit("198.51.100.7") and not limiter.admit("198.51.100.7")
    now[0] += 60  # refilled to the burst, never beyond
    assert [limiter.admit("198.51.100.7") for _ in range(4)] == [True, True, True, False]


def test_the_source_limiter_keeps_a_bounded_number_of_sources():
    limiter = SourceLimiter(burst=1, per_s=0.001, max_sources=2, clock=lambda: 0.0)
    assert limiter.admit("a") and not limiter.admit("a")
    assert limiter.admit("b") and limiter.admit("c")  # "a", least recently seen, is forgotten
    assert limiter.admit("a")  # ... so it starts full again, and the state stays at 2 sources
    assert len(limiter._buckets) == 2
