"""An account's health, as one runner sees it: the one state machine the poller and the
submitter consult before they send anything for an account.

    healthy ──401/403──▶ key refused: paused, longer each time (up to auth_backoff_max_s)
    key refused ──any other answer (the probe's, one row once the pause ran out)──▶ healthy
    healthy ──402 on a create──▶ no credits: paused the same way (unknown intents still go)
    no credits ──a create accepted──▶ healthy
    healthy ──a 4xx without the provider's envelope──▶ misrouted: paused, rows given back
    misrouted ──its pause over──▶ probing: one read of a job id that cannot exist
    probing ──the provider answers (or refuses the key)──▶ healthy (the poller), or cleared
        (the submitter: one create at a time; a create still misrouted: misrouted, longer)
    probing ──anything else──▶ misrouted, a longer pause
    misrouted, probing, cleared ──a read (a create) the provider answers──▶ healthy (a
        create's leaves the pause it began to run out)

Reads answered by a redirect or a 2xx that is no JSON object pause nothing: NOT_API_STREAK of
them in a row are said once (`not_api_answer`), until the provider answers again
(`api_answered`). A server that asks every caller to stop (429, `RateLimit-Remaining: 0`)
pauses the fleet's bucket instead (`bucket_pause`, written by the runner): that pause lives in
PostgreSQL, not here.

Pure: no I/O, no asyncio. Times are floats the caller injects (its loop's clock); the runners
own the tasks that actually send a probe, and say here what came back.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from vidpoll.models import HttpAnswer
from vidpoll.policy import (
    KEY_REFUSED,
    NOT_API_STREAK,
    PROVIDER,
    PollPolicy,
    auth_pause_delay,
    parse_retry_after,
    server_pause_s,
)

PROBE_OUT_S = 30.0
"""An account stays paused this long while its probe is out (a slow one too): the probe's
answer sets the pause anew. As long as an idle loop's longest sleep (runner.IDLE_MAX_S)."""
MAX_SUSPECTS = 10_000
"""Rows remembered as refused by something other than the provider while it answered the
account's other reads (see Health.url_works); beyond it the memory starts over."""
CREATE_PAUSE_MAX_S = 86400.0
"""The longest a 429 on a create holds the account's creates when it names its reset: a
daily cap (Runway's) resets hours away, and every create sent before then is refused."""
CREATE_429_PAUSE_MAX_S = 3600.0
"""A create 429 that names no wait holds the account's creates for the backoff base (2 s),
each one in a row after it twice as long, up to this (a cap that does not say when it resets,
Runway's daily one, is tried about once an hour after a dozen refusals, never in a storm)."""


@dataclass
class Misroute:
    """One account's reads (or creates) answered by something other than the provider (a
    wrong base URL, a proxy): from the first such answer until the provider answers again."""

    url: str
    """The first URL tried (scheme, host and path only), as logged."""
    since: float
    """Loop time of the first such answer."""
    rows: set[str] = field(default_factory=set)
    """The rows given back meanwhile (they become suspects when it ends: Health.url_works)."""
    failures: int = 1
    """Pauses in a row: the next one grows with them."""
    probing: bool = False
    """A probe is out (at most one at a time)."""
    cleared: bool = False
    """(Submitter) A probe, a status read, reached the provider: one intent at a time may be
    sent until a POST is answered by the provider too (the create path alone may be wrong)."""
    warned_create: bool = False
    """(Submitter) The create path was said to look wrong (once an episode)."""


@dataclass
class NotApiStreak:
    """One account's status reads in a row answered by a redirect or a 2xx that is no JSON
    object (policy.is_not_api), none by the provider in between. No pause: the provider
    itself may send a broken body now and then, and that must never stop an account."""

    count: int = 0
    rows: set[str] = field(default_factory=set)
    logged: bool = False
    """The ERROR naming the URL was said (once a streak)."""


@dataclass(frozen=True)
class ProbeAfter:
    """What a probe's answer did to its episode (Health.probe_answered)."""

    resumed: bool
    """The provider answered: the pause ended (the submitter: one create first)."""
    delay_s: float = 0.0
    """Not resumed: seconds until the next probe."""


def bucket_pause(seconds: float | None, status: int | None,
                 budgeted: bool) -> tuple[float, bool] | None:
    """The pause of the fleet's bucket (seconds, refused) a server's answer asks for, if any.

    A refusal (429) always pauses; "Remaining: 0" only an account without a budget: a
    budgeted fleet already paces itself, and a server at its limit says it on nearly every
    answer (pausing on each held the fleet to 0.75 of the limit).
    """
    if seconds is None or (status != 429 and budgeted):
        return None
    return seconds, status == 429


def add_pause(pauses: dict[str, tuple[float, bool]], account: str,
              pause: tuple[float, bool]) -> None:
    """Merge one bucket pause into those waiting to be written: the longest, refused if any
    was."""
    seconds, refused = pauses.get(account, (0.0, False))
    pauses[account] = (max(pause[0], seconds), refused or pause[1])


class Health:
    """The health of one runner's accounts: paused until when, and why."""

    def __init__(self, policy: PollPolicy, rng: random.Random, *,
                 confirm_by_create: bool = False) -> None:
        self.policy = policy
        self.rng = rng
        self.confirm_by_create = confirm_by_create
        """The submitter's: a probe that reached the provider clears its episode for one
        create at a time (Misroute.cleared) instead of ending it."""
        self.paused_until: dict[str, float] = {}
        """Loop time until which nothing is sent for an account (absent: not paused)."""
        self.key_failures: dict[str, int] = {}
        """401/403 pauses in a row, by account."""
        self.credit_failures: dict[str, int] = {}
        """402 (out of credits) pauses in a row, by account (the submitter's)."""
        self.misroutes: dict[str, Misroute] = {}
        self.suspects: set[str] = set()
        """Rows refused by something other than the provider while it answered the account's
        other reads: their next such refusal is their own error (backoff), not a pause."""
        self.create_429s: dict[str, int] = {}
        """Creates answered 429 in a row, by account (a cap that names no reset: longer
        holds)."""
        self.not_api: dict[str, NotApiStreak] = {}
        """Streaks of answers that were not the API's, by account (the poller's)."""

    # -- what may be sent ---------------------------------------------------------------
    def unpaused(self, accounts: Sequence[str], now: float) -> list[str]:
        """The accounts that may be claimed for now."""
        return [a for a in accounts if self.paused_until.get(a, 0.0) <= now]

    def all_paused_for(self, accounts: Sequence[str], now: float) -> float:
        """Seconds until the first of `accounts` may be claimed again; <= 0 if one may now."""
        return min(self.paused_until.get(a, 0.0) for a in accounts) - now

    def probe_in(self, now: float, default: float) -> float:
        """Seconds until a paused account's probe is due (`default` if none is paused)."""
        return min((t - now for t in self.paused_until.values() if t > now), default=default)

    def blocked(self, account: str) -> bool:
        """Misrouted and not cleared: nothing is sent for it but a probe."""
        episode = self.misroutes.get(account)
        return episode is not None and not episode.cleared

    def on_trial(self, account: str) -> bool:
        """A pause ran out but its cause is not known to be gone: one at a time (the probe
        of a refused key, of an empty account, of a cleared wrong URL)."""
        return bool(self.key_failures.get(account) or self.credit_failures.get(account)
                    or account in self.misroutes)

    def any_key_refused(self, accounts: Iterable[str] | None = None) -> bool:
        """Whether a key (of `accounts`, else any) is refused right now."""
        if accounts is None:
            return any(self.key_failures.values())
        return any(self.key_failures.get(a) for a in accounts)

    def is_suspect(self, row: str) -> bool:
        """A row refused that way while the provider answered the account's other reads."""
        return row in self.suspects

    # -- a refused key (401/403) --------------------------------------------------------
    def key_refused(self, account: str, now: float) -> float | None:
        """A 401/403: pause `account`, longer each time; returns the pause, or None if it
        was paused already (the other answers of the same pause: counted and said once)."""
        if self.paused_until.get(account, 0.0) > now:
            return None
        failures = self.key_failures[account] = self.key_failures.get(account, 0) + 1
        delay = auth_pause_delay(failures, self.policy, self.rng)
        self.paused_until[account] = now + delay
        return delay

    def key_accepted(self, account: str) -> bool:
        """An answer other than 401/403: True if that ended a key's pause (say so)."""
        if not self.key_failures.get(account):
            return False
        self.key_failures[account] = 0
        return True

    # -- an empty account (402, creates) --------------------------------------------------
    def out_of_credits(self, account: str, now: float) -> float:
        """The provider reports no credits: pause the account's creates, longer each time
        (the next would most likely be refused too, and each refusal is final)."""
        failures = self.credit_failures[account] = self.credit_failures.get(account, 0) + 1
        delay = auth_pause_delay(failures, self.policy, self.rng)
        self.paused_until[account] = max(self.paused_until.get(account, 0.0), now + delay)
        return delay

    def credits_back(self, account: str) -> bool:
        """The provider accepted a create: a pause for credits ends. True if the account may
        be claimed again at once (no refused key holds it)."""
        if not self.credit_failures.get(account):
            return False
        self.credit_failures[account] = 0
        if self.key_failures.get(account):
            return False
        self.paused_until.pop(account, None)
        return True

    def credit_paused(self, account: str, now: float) -> bool:
        """Paused because the provider reported no credits (not a refused key, not a wrong
        URL): the account's `unknown` intents still go out on their slow schedule."""
        return (self.credit_failures.get(account, 0) > 0
                and not self.key_failures.get(account)
                and account not in self.misroutes
                and self.paused_until.get(account, 0.0) > now)

    # -- a wrong URL: misrouted, probing, back ---------------------------------------------
    def misrouted(self, account: str, now: float, url: Callable[[], str],
                  row: str | None = None) -> float | None:
        """An answer that was not the provider's. Returns the pause begun: a new episode's
        first (`url()` names it), or, after a cleared episode's create was answered that way
        again, a longer one; None while the episode's pause is under way (`row` is kept)."""
        episode = self.misroutes.get(account)
        if episode is not None and not episode.cleared:
            if row is not None and len(episode.rows) < MAX_SUSPECTS:
                episode.rows.add(row)
            return None
        if episode is None:
            episode = self.misroutes[account] = Misroute(
                url(), now, set() if row is None else {row})
        else:  # a probe reached the provider, this create still did not: its path is wrong
            episode.cleared = False
            episode.failures += 1
        delay = auth_pause_delay(episode.failures, self.policy, self.rng)
        self.paused_until[account] = max(self.paused_until.get(account, 0.0), now + delay)
        return delay

    def episode(self, account: str) -> Misroute | None:
        """The account's misroute episode, if one is under way."""
        return self.misroutes.get(account)

    def probe_starts(self, account: str, now: float) -> Misroute | None:
        """A blocked account's pause ran out: it stays paused while a probe is out. Returns
        the episode if a probe is to be sent now (none is out yet), else None."""
        episode = self.misroutes[account]
        self.paused_until[account] = now + PROBE_OUT_S
        if episode.probing:
            return None
        episode.probing = True
        return episode

    def probe_instead(self, account: str) -> None:
        """A runner with no way to probe (a creator without reads): its next send is the
        probe, one at a time."""
        self.misroutes[account].cleared = True

    def probe_over(self, episode: Misroute) -> None:
        """The probe ended, answered or not (cancelled too): another may be sent."""
        episode.probing = False

    def probe_answered(self, account: str, episode: Misroute, verdict: str,
                       now: float) -> ProbeAfter | None:
        """A probe's `verdict` (policy.probe_verdict). None if the episode ended meanwhile
        (a read or a POST reached the provider). The provider's answer, or a refused key (the
        rows' to report), resumes the account; anything else pauses it again, longer."""
        if self.misroutes.get(account) is not episode:
            return None
        if verdict in (PROVIDER, KEY_REFUSED):
            if self.confirm_by_create:
                episode.cleared = True
                if not (self.key_failures.get(account) or self.credit_failures.get(account)):
                    self.paused_until.pop(account, None)
            else:
                self.url_works(account)
            return ProbeAfter(resumed=True)
        episode.failures += 1
        delay = auth_pause_delay(episode.failures, self.policy, self.rng)
        self.paused_until[account] = now + delay
        return ProbeAfter(resumed=False, delay_s=delay)

    def read_answered(self, account: str, row: str) -> Misroute | None:
        """A read of `row` reached the provider: the row is no suspect, and an episode of its
        account ends (returned)."""
        self.suspects.discard(row)
        if account not in self.misroutes:
            return None
        return self.url_works(account)

    def url_works(self, account: str, *, unpause: bool = True) -> Misroute | None:
        """The provider answers the account again: its episode ends (returned; None if there
        was none). The rows given back meanwhile become suspects: if one of them alone is
        refused again, it is that row's URL (a proxy rule), and it backs off on its own.
        `unpause`: the pause ends too, unless a refused key (or no credits) holds it (a POST
        answered during the pause leaves it to run out)."""
        episode = self.misroutes.pop(account, None)
        if episode is None:
            return None
        if len(self.suspects) + len(episode.rows) > MAX_SUSPECTS:
            self.suspects.clear()
        self.suspects |= episode.rows
        if unpause and not (self.key_failures.get(account)
                            or self.credit_failures.get(account)):
            self.paused_until.pop(account, None)
        return episode

    # -- answers that are not the API's (a redirect, a 2xx that is no JSON object) ----------
    def not_api_answer(self, account: str, row: str) -> NotApiStreak | None:
        """One more such answer: the streak, once it reaches NOT_API_STREAK (said once a
        streak), else None."""
        streak = self.not_api.setdefault(account, NotApiStreak())
        streak.count += 1
        if len(streak.rows) < MAX_SUSPECTS:
            streak.rows.add(row)
        if streak.logged or streak.count < NOT_API_STREAK:
            return None
        streak.logged = True
        return streak

    def api_answered(self, account: str) -> NotApiStreak | None:
        """The provider answered one of the account's reads: its streak ends (returned if it
        was said, to say that it ended)."""
        streak = self.not_api.pop(account, None)
        return streak if streak is not None and streak.logged else None

    # -- a server that asks to pause creates (429) -----------------------------------------
    def create_hold_s(self, account: str, answer: HttpAnswer, now: datetime) -> float | None:
        """How long the fleet holds `account`'s creates after this answer (None: not at all).

        A 429 on a create is a cap (Runway's daily one, or a rate): held until the reset it
        names, up to CREATE_PAUSE_MAX_S; one that names none holds the backoff base (2 s),
        then twice as long for each 429 in a row, up to an hour; never a retry storm."""
        if answer.status != 429:
            if answer.status is not None and 200 <= answer.status < 300:
                self.create_429s.pop(account, None)
            return server_pause_s(answer, now, self.policy)
        hinted = parse_retry_after(answer.retry_after, now)
        if hinted is None:
            hinted = server_pause_s(answer, now, replace(self.policy,
                                                         max_poll_s=CREATE_PAUSE_MAX_S),
                                    named_only=True)
        in_row = self.create_429s[account] = self.create_429s.get(account, 0) + 1
        if hinted is not None:
            return min(CREATE_PAUSE_MAX_S, float(hinted))
        return min(CREATE_429_PAUSE_MAX_S,
                   self.policy.backoff_base_s * 2.0 ** min(in_row - 1, 16))
