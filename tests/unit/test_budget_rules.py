"""Pure rules of the rate budget: the bucket arithmetic, server pauses, account settings."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vidpoll.config import Settings
from vidpoll.errors import ConfigError, InvalidIntent
from vidpoll.models import HttpAnswer
from vidpoll.policy import (
    MIN_RATE_FACTOR,
    RATE_RECOVERY_PER_S,
    Budget,
    PollPolicy,
    server_pause_s,
    take_tokens,
    validate_account,
)

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
POLICY = PollPolicy()
BUDGET = Budget(rate_per_s=2.0, burst=4.0)


def test_refill_then_take_whole_tokens():
    grant = take_tokens(tokens=0.5, elapsed_s=1.0, paused_s=0, want=10, budget=BUDGET)
    assert grant.granted == 2 and grant.tokens_left == pytest.approx(0.5)
    assert grant.wait_s == pytest.approx(0.25)  # half a token at 2 a second


def test_the_burst_caps_what_idle_time_saves():
    grant = take_tokens(tokens=0, elapsed_s=3600, paused_s=0, want=100, budget=BUDGET)
    assert grant.granted == 4 and grant.tokens_left == 0


def test_a_pause_grants_nothing_and_says_how_long():
    grant = take_tokens(tokens=4, elapsed_s=0, paused_s=7.5, want=1, budget=BUDGET)
    assert grant.granted == 0 and grant.wait_s == 7.5


def test_a_cut_rate_refills_slower_and_recovers():
    slow = take_tokens(tokens=0, elapsed_s=1.0, paused_s=0, want=10, budget=Budget(10, 100),
                       rate_factor=0.5)
    factor = 0.5 + RATE_RECOVERY_PER_S
    assert slow.rate_factor == pytest.approx(factor)
    assert slow.granted == int(10 * factor)
    later = take_tokens(tokens=0, elapsed_s=1000, paused_s=0, want=1, budget=BUDGET,
                        rate_factor=0.5)
    assert later.rate_factor == 1.0


def test_the_rate_factor_has_a_floor():
    grant = take_tokens(tokens=0, elapsed_s=0, paused_s=0, want=1, budget=BUDGET,
                        rate_factor=0.0)
    assert grant.rate_factor == pytest.approx(MIN_RATE_FACTOR)


@given(st.lists(st.tuples(st.floats(0, 5), st.integers(0, 20), st.integers(0, 5),
                          st.floats(0.01, 1.0)), min_size=1, max_size=60),
       st.floats(0.1, 50), st.floats(1, 30))
def test_a_bucket_never_grants_more_than_burst_plus_rate_times_time(steps, rate, burst):
    # with refunds of unused tokens and any rate factor (a cut from a 429, recovering)
    budget = Budget(rate, burst)
    tokens, total, elapsed, factor = burst, 0, 0.0, 1.0
    for gap, want, unused, cut in steps:
        grant = take_tokens(tokens, gap, 0, want, budget, factor * cut)
        assert 0 <= grant.granted <= want and grant.rate_factor <= 1
        back = min(unused, grant.granted)
        tokens = min(burst, grant.tokens_left + back)  # what bucket_refund does
        factor = grant.rate_factor
        total += grant.granted - back
        elapsed += gap
        assert total <= burst + rate * elapsed + 1e-6


def test_default_burst_is_two_seconds_of_the_rate():
    assert Budget.per_minute(120) == Budget(2.0, 4.0)
    assert Budget.per_minute(6).burst == 1.0
    assert Budget.per_minute(600, burst=3).burst == 3


@pytest.mark.parametrize(("answer", "pause"), [
    (HttpAnswer(429, retry_after="3"), 3.0),
    (HttpAnswer(429, ratelimit_reset="4"), 4.0),
    (HttpAnswer(429), POLICY.backoff_base_s),
    (HttpAnswer(200, ratelimit_remaining="0", ratelimit_reset="1.5"), 1.5),
    (HttpAnswer(200, ratelimit_remaining="0"), POLICY.backoff_base_s),
    (HttpAnswer(200, ratelimit_remaining="0",
                ratelimit_reset=str(int(NOW.timestamp()) + 30)), 30.0),
    (HttpAnswer(200, ratelimit_remaining="5", ratelimit_reset="9"), None),
    (HttpAnswer(200, ratelimit_remaining="lots"), None),
    (HttpAnswer(200), None),
    (HttpAnswer(503, retry_after="3"), None),
    (HttpAnswer(429, retry_after="999999"), POLICY.max_poll_s),
])
def test_server_pauses(answer, pause):
    assert server_pause_s(answer, NOW, POLICY) == pause


@given(st.text(max_size=30), st.text(max_size=30), st.sampled_from([200, 404, 429, 500]))
def test_any_rate_limit_headers_are_handled(remaining, reset, status):
    pause = server_pause_s(HttpAnswer(status, ratelimit_remaining=remaining,
                                      ratelimit_reset=reset), NOW, POLICY)
    assert pause is None or 0 <= pause <= POLICY.max_poll_s


def test_accounts_and_rates_from_the_environment():
    settings = Settings.from_env({
        "SUME_API_KEY": "sk-a", "SUME_API_KEY_ACME": "sk-b", "SUME_API_KEY_BIG_CO": "sk-c",
        "VIDPOLL_STATUS_RATE_PER_MIN": "120", "VIDPOLL_STATUS_RATE_PER_MIN_ACME": "60",
        "VIDPOLL_SUBMIT_RATE_PER_MIN_BIG_CO": "10"})
    assert settings.require_api_key() == "sk-a"
    assert settings.require_api_key("acme") == "sk-b"
    assert settings.require_api_key("big_co") == "sk-c"
    assert settings.budget("status", "default") == Budget(2.0, 4.0)
    assert settings.budget("status", "acme") == Budget(1.0, 2.0)
    assert settings.budget("create", "default") is None  # unlimited
    assert settings.budget("create", "big_co") == Budget.per_minute(10)
    assert "sk-" not in repr(settings)


def test_a_missing_key_names_its_variable():
    with pytest.raises(ConfigError, match="SUME_API_KEY_ACME is not set"):
        Settings.from_env({}).require_api_key("acme")


@pytest.mark.parametrize("name", ["SUME_API_KEY_", "SUME_API_KEY_-X", "SUME_API_KEY__A"])
def test_bad_account_variables_are_refused(name):
    with pytest.raises(ConfigError, match=name):
        Settings.from_env({name: "sk"})


@pytest.mark.parametrize("bad", ["", "Acme", "a b", "_a", "a-b", "x" * 64])
def test_account_names(bad):
    assert validate_account("acme_2") == "acme_2"
    with pytest.raises(InvalidIntent):
        validate_account(bad)


@pytest.mark.parametrize("raw", ["0", "-5", "fast"])
def test_bad_rates_are_refused(raw):
    with pytest.raises(ConfigError, match="VIDPOLL_STATUS_RATE_PER_MIN"):
        Settings.from_env({"SUME_API_KEY": "k", "VIDPOLL_STATUS_RATE_PER_MIN": raw})
