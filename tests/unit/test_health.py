"""An account's health (vidpoll.health): every transition of the state machine the poller and
the submitter consult, with the time injected (no loop, no sleep, no server)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from vidpoll.health import (
    CREATE_429_PAUSE_MAX_S,
    CREATE_PAUSE_MAX_S,
    MAX_SUSPECTS,
    PROBE_OUT_S,
    Health,
    ProbeAfter,
    add_pause,
    bucket_pause,
)
from vidpoll.models import HttpAnswer
from vidpoll.policy import (
    KEY_REFUSED,
    MISROUTED,
    NO_ANSWER,
    NOT_API,
    NOT_API_STREAK,
    PROVIDER,
    UNSURE,
    PollPolicy,
)
from vidpoll.runner import IDLE_MAX_S

POLICY = PollPolicy()
T0 = 1000.0


class Top(random.Random):
    """Jitter at its top: every backoff is its whole step (base 2 s, doubling)."""

    def uniform(self, a: float, b: float) -> float:
        return b


def health(*, submitter: bool = False) -> Health:
    return Health(POLICY, Top(), confirm_by_create=submitter)


def url() -> str:
    return "https://api.example/v1/videos/x"


def test_a_new_account_is_healthy() -> None:
    h = health()
    assert h.unpaused(["a", "b"], T0) == ["a", "b"]
    assert h.all_paused_for(["a", "b"], T0) <= 0
    assert h.probe_in(T0, 30.0) == 30.0
    assert not h.blocked("a") and not h.on_trial("a") and not h.any_key_refused()
    assert h.episode("a") is None and not h.credit_paused("a", T0)


# -- a refused key ---------------------------------------------------------------------------
def test_a_refused_key_pauses_longer_each_time_up_to_the_max() -> None:
    h = health()
    pauses = []
    now = T0
    for _ in range(12):
        delay = h.key_refused("a", now)
        assert delay is not None
        pauses.append(delay)
        assert h.unpaused(["a", "b"], now) == ["b"]
        assert h.all_paused_for(["a"], now) == pytest.approx(delay)
        assert h.on_trial("a") and h.any_key_refused() and h.any_key_refused(["a"])
        assert not h.any_key_refused(["b"])
        now += delay  # the pause ran out: the next claim of one row is the probe
    assert pauses[:4] == [2.0, 4.0, 8.0, 16.0]
    assert pauses[-1] == POLICY.auth_backoff_max_s
    assert h.key_failures["a"] == 12


def test_the_other_answers_of_one_pause_are_counted_once() -> None:
    h = health()
    assert h.key_refused("a", T0) == 2.0
    assert h.key_refused("a", T0 + 1.0) is None  # POSTs or reads in flight together
    assert h.key_failures["a"] == 1 and h.paused_until["a"] == T0 + 2.0


def test_an_accepted_key_ends_the_pause_once() -> None:
    h = health()
    assert not h.key_accepted("a")  # never refused: nothing to say
    h.key_refused("a", T0)
    assert h.key_accepted("a")
    assert not h.key_accepted("a") and not h.on_trial("a") and not h.any_key_refused()
    assert h.key_refused("a", T0 + 5.0) == 2.0  # the backoff starts over


# -- an empty account -----------------------------------------------------------------------
def test_no_credits_pauses_creates_until_one_is_accepted() -> None:
    h = health(submitter=True)
    assert h.out_of_credits("a", T0) == 2.0
    assert h.credit_paused("a", T0) and h.on_trial("a")
    assert h.out_of_credits("a", T0 + 1.0) == 4.0  # never shortened
    assert h.paused_until["a"] == T0 + 5.0
    assert not h.credit_paused("a", T0 + 5.0)  # ran out: one intent tries
    assert h.credits_back("a") and h.unpaused(["a"], T0 + 1.0) == ["a"]
    assert not h.credits_back("a")


def test_a_refused_key_outlasts_credits_back() -> None:
    h = health(submitter=True)
    h.out_of_credits("a", T0)
    h.key_refused("a", T0 + 10.0)
    assert not h.credit_paused("a", T0 + 10.5)  # the key, not credits, pauses it
    assert not h.credits_back("a")
    assert h.unpaused(["a"], T0 + 10.5) == []


# -- a wrong URL: the poller ------------------------------------------------------------------
def test_a_misrouted_read_pauses_and_probes_when_the_pause_runs_out() -> None:
    h = health()
    calls: list[str] = []

    def shown() -> str:
        calls.append("url")
        return url()

    assert h.misrouted("a", T0, shown, row="r1") == 2.0
    assert h.misrouted("a", T0 + 0.1, shown, row="r2") is None  # the same episode
    episode = h.episode("a")
    assert episode is not None and calls == ["url"] and episode.url == url()
    assert episode.rows == {"r1", "r2"} and episode.since == T0
    assert h.blocked("a") and h.unpaused(["a"], T0 + 1.0) == []
    assert h.probe_in(T0 + 1.0, 30.0) == pytest.approx(1.0)
    # the pause ran out: one probe, the account paused while it is out
    probe = h.probe_starts("a", T0 + 2.0)
    assert probe is episode and episode.probing
    assert h.paused_until["a"] == T0 + 2.0 + PROBE_OUT_S == T0 + 2.0 + IDLE_MAX_S
    assert h.probe_starts("a", T0 + 3.0) is None  # at most one out at a time
    h.probe_over(episode)
    assert not episode.probing


@pytest.mark.parametrize("verdict", [PROVIDER, KEY_REFUSED])
def test_a_probe_the_provider_answers_ends_the_episode(verdict: str) -> None:
    h = health()
    h.misrouted("a", T0, url, row="r1")
    episode = h.probe_starts("a", T0 + 2.0)
    assert episode is not None
    assert h.probe_answered("a", episode, verdict, T0 + 2.5) == ProbeAfter(resumed=True)
    assert h.episode("a") is None and not h.blocked("a")
    assert h.unpaused(["a"], T0 + 2.5) == ["a"]
    assert h.is_suspect("r1")  # given back meanwhile: alone refused again, it backs off alone


@pytest.mark.parametrize("verdict", [MISROUTED, NO_ANSWER, UNSURE, NOT_API])
def test_a_probe_still_wrong_pauses_longer(verdict: str) -> None:
    h = health()
    h.misrouted("a", T0, url)
    now = T0
    delays = []
    for _ in range(10):
        now = h.paused_until["a"]
        episode = h.probe_starts("a", now)
        assert episode is not None
        h.probe_over(episode)
        after = h.probe_answered("a", episode, verdict, now + 0.5)
        assert after is not None and not after.resumed
        assert h.paused_until["a"] == now + 0.5 + after.delay_s
        delays.append(after.delay_s)
    assert delays[:3] == [4.0, 8.0, 16.0]
    assert delays[-1] == POLICY.auth_backoff_max_s
    assert h.blocked("a") and h.episode("a") is not None


def test_a_read_the_provider_answers_ends_the_episode_and_its_probe_is_stale() -> None:
    h = health()
    h.misrouted("a", T0, url, row="r1")
    probe = h.probe_starts("a", T0 + 2.0)
    assert probe is not None
    ended = h.read_answered("a", "r9")  # a read in flight reached the provider
    assert ended is probe and h.episode("a") is None
    assert h.unpaused(["a"], T0 + 2.1) == ["a"]
    assert h.probe_answered("a", probe, MISROUTED, T0 + 3.0) is None  # nothing changes
    assert h.unpaused(["a"], T0 + 3.0) == ["a"]
    assert h.read_answered("a", "r1") is None and not h.is_suspect("r1")


def test_a_refused_key_keeps_its_pause_after_the_url_works() -> None:
    h = health()
    h.misrouted("a", T0, url)
    h.key_refused("a", T0 + 100.0)  # (a pause that began after the episode's ran out)
    assert h.read_answered("a", "r1") is not None
    assert h.unpaused(["a"], T0 + 100.5) == []


def test_the_suspects_memory_starts_over_when_full() -> None:
    h = health()
    h.suspects = {f"old{i}" for i in range(MAX_SUSPECTS)}
    h.misrouted("a", T0, url, row="new")
    h.url_works("a")
    assert h.suspects == {"new"}
    assert h.url_works("a") is None  # no episode: nothing to end


def test_an_episode_remembers_at_most_max_suspects_rows() -> None:
    h = health()
    h.misrouted("a", T0, url, row="r0")
    episode = h.episode("a")
    assert episode is not None
    episode.rows |= {f"r{i}" for i in range(1, MAX_SUSPECTS)}
    h.misrouted("a", T0, url, row="one-too-many")
    assert len(episode.rows) == MAX_SUSPECTS and "one-too-many" not in episode.rows


# -- a wrong URL: the submitter ---------------------------------------------------------------
def test_a_submitters_probe_clears_for_one_create_until_a_post_is_answered() -> None:
    h = health(submitter=True)
    assert h.misrouted("a", T0, url) == 2.0
    assert h.misrouted("a", T0, url) is None  # POSTs in flight together: once
    episode = h.probe_starts("a", T0 + 2.0)
    assert episode is not None
    assert h.probe_answered("a", episode, PROVIDER, T0 + 2.5) == ProbeAfter(resumed=True)
    # cleared, not ended: one create at a time, no probe
    assert episode.cleared and h.episode("a") is episode
    assert not h.blocked("a") and h.on_trial("a") and h.unpaused(["a"], T0 + 2.5) == ["a"]
    assert not h.credit_paused("a", T0 + 2.5)
    # the create answered by the provider: the episode ends
    assert h.url_works("a", unpause=False) is episode and h.episode("a") is None


def test_a_cleared_create_still_wrong_pauses_longer() -> None:
    h = health(submitter=True)
    h.misrouted("a", T0, url)
    episode = h.probe_starts("a", T0 + 2.0)
    assert episode is not None
    h.probe_answered("a", episode, PROVIDER, T0 + 2.5)
    # the status path works, the create path does not
    assert h.misrouted("a", T0 + 3.0, url) == 4.0
    assert not episode.cleared and episode.failures == 2 and h.blocked("a")
    assert h.paused_until["a"] == T0 + 7.0


def test_a_post_answered_during_a_pause_ends_the_episode_but_not_the_pause() -> None:
    h = health(submitter=True)
    h.misrouted("a", T0, url)
    assert h.url_works("a", unpause=False) is not None
    assert not h.blocked("a") and h.unpaused(["a"], T0 + 1.0) == []
    assert h.unpaused(["a"], T0 + 2.0) == ["a"]


def test_a_creator_without_reads_probes_with_one_intent() -> None:
    h = health(submitter=True)
    h.misrouted("a", T0, url)
    h.probe_instead("a")
    assert not h.blocked("a") and h.on_trial("a")


def test_a_cleared_probe_keeps_a_pause_for_credits() -> None:
    h = health(submitter=True)
    h.out_of_credits("a", T0)
    h.misrouted("a", T0 + 1.0, url)
    assert not h.credit_paused("a", T0 + 1.0)  # the URL, not credits, pauses it
    episode = h.probe_starts("a", T0 + 3.0)
    assert episode is not None
    h.probe_answered("a", episode, PROVIDER, T0 + 3.5)
    assert h.unpaused(["a"], T0 + 3.5) == []


# -- a server that asks to pause -----------------------------------------------------------
@pytest.mark.parametrize(("seconds", "status", "budgeted", "pause"), [
    (None, 429, False, None),
    (5.0, 429, False, (5.0, True)),
    (5.0, 429, True, (5.0, True)),  # a refusal always pauses
    (5.0, 200, False, (5.0, False)),  # "Remaining: 0" pauses an unpaced account
    (5.0, 200, True, None),  # a budgeted fleet paces itself
])
def test_bucket_pause(seconds: float | None, status: int, budgeted: bool,
                      pause: tuple[float, bool] | None) -> None:
    assert bucket_pause(seconds, status, budgeted) == pause


def test_pauses_waiting_to_be_written_merge() -> None:
    pauses: dict[str, tuple[float, bool]] = {}
    add_pause(pauses, "a", (5.0, False))
    add_pause(pauses, "a", (3.0, True))
    add_pause(pauses, "b", (1.0, False))
    assert pauses == {"a": (5.0, True), "b": (1.0, False)}


def test_create_holds_grow_with_429s_in_a_row_and_a_2xx_resets_them() -> None:
    h = health(submitter=True)
    now = datetime.now(UTC)
    refused = HttpAnswer(429, b"{}")
    held = [h.create_hold_s("a", refused, now) for _ in range(14)]
    assert held[:4] == [2.0, 4.0, 8.0, 16.0] and held[-1] == CREATE_429_PAUSE_MAX_S
    assert h.create_hold_s("b", refused, now) == 2.0  # per account
    assert h.create_hold_s("a", HttpAnswer(201, b"{}"), now) is None
    assert h.create_hold_s("a", refused, now) == 2.0
    named = HttpAnswer(429, b"{}", retry_after="999999")
    assert h.create_hold_s("a", named, now) == CREATE_PAUSE_MAX_S
    reset = (now + timedelta(seconds=90)).strftime("%a, %d %b %Y %H:%M:%S GMT")
    hinted = h.create_hold_s("a", HttpAnswer(429, b"{}", retry_after=reset), now)
    assert hinted is not None and 88.0 <= hinted <= 90.0


# -- answers that are not the API's --------------------------------------------------------
def test_a_streak_of_answers_not_the_apis_is_said_once_and_pauses_nothing() -> None:
    h = health()
    said = [h.not_api_answer("a", f"r{i % 2}") for i in range(NOT_API_STREAK + 3)]
    streak = said[NOT_API_STREAK - 1]
    assert streak is not None and [s for s in said if s is not None] == [streak]
    assert streak.count == NOT_API_STREAK + 3 and streak.rows == {"r0", "r1"}
    assert h.unpaused(["a"], T0) == ["a"] and not h.on_trial("a")
    assert h.api_answered("a") is streak  # said: its end is said too
    assert h.api_answered("a") is None
    h.not_api_answer("a", "r0")
    assert h.api_answered("a") is None  # never said: ends quietly


def test_the_next_probe_is_the_earliest_pause_to_end() -> None:
    h = health()
    h.key_refused("a", T0)  # 2 s
    h.misrouted("b", T0 - 1.5, url)  # 2 s, from 0.5 s earlier
    assert h.probe_in(T0, 30.0) == pytest.approx(0.5)
    assert h.all_paused_for(["a", "b"], T0) == pytest.approx(0.5)
    assert h.all_paused_for(["a", "b", "c"], T0) < 0  # c may be claimed now
    assert h.probe_in(T0 + 5.0, 30.0) == 30.0  # every pause ran out
