"""What every provider's webhook deliveries share: the refusal, its reasons, the size limit,
the replay window's default and the sampling of refusal logs. Pure; no I/O.

A provider's own rules (its headers, signature scheme and where the job id is) live in its
folder, behind `vidpoll.providers.base.Webhooks` (`vidpoll/providers/<name>/webhooks.py`);
the route that calls them is vidpoll.web.webhooks. A webhook is only a hint: vidpoll never
takes a job's state from it.

A repeat is recognised by the value the provider says a delivery is known by
(`WebhookHint.dedupe`: for a signed delivery, the signature that verified in its one canonical
form), never by a raw header the sender can rewrite. Refused deliveries cost no row and,
through `LogSampler`, at most one log line per reason a minute: anyone who can reach the server
can send them.
"""

from __future__ import annotations

import ipaddress
import time
from collections.abc import Callable
from typing import Literal

DEFAULT_TOLERANCE_S = 300.0
"""Deliveries whose timestamp is further than this from now (either way) are refused."""
MAX_BODY_BYTES = 256 * 1024
REJECT_LOG_EVERY_S = 60.0
"""At most one log line per rejection reason this often: anyone can send refused deliveries."""

UNSIGNED_PER_SOURCE = (50.0, 10.0)
"""Deliveries of a provider that signs none (Luma's callbacks) taken from one source
address: a burst of 50, then 10 a second. Each is only a hint (the job is read now), but
anyone can send one, and each costs a database write."""
UNSIGNED_POKE_GAP_S = 1.0
"""An unsigned delivery pokes its job at most this often (Luma retries an update 3 times,
100 ms apart): nothing is recorded for it, so the job's own poked_at is the repeat check."""
MAX_SOURCES = 10_000
"""Source addresses `SourceLimiter` keeps a bucket for (the oldest is forgotten first)."""

RejectReason = Literal["unsigned", "timestamp", "signature", "too_large", "malformed",
                       "unknown_provider", "rate_limited"]
REJECT_REASONS: tuple[RejectReason, ...] = (
    "unsigned", "timestamp", "signature", "too_large", "malformed", "unknown_provider",
    "rate_limited")
"""Why a delivery was refused, the label values of vidpoll_webhooks_rejected_total (a fixed
set: nothing a caller sends becomes a label). unsigned: no timestamp or signature header;
timestamp: not a number or outside the replay window; signature: no signature matches;
too_large: a body over MAX_BODY_BYTES; malformed: signed, but without an event id or job id;
unknown_provider: the path names no provider this server takes webhooks for; rate_limited: an
unsigned provider's delivery from a source that sent more than UNSIGNED_PER_SOURCE allows."""


class WebhookRejected(Exception):
    """The delivery is not provably from its provider, or is too old, or names no job: change
    nothing (the route answers 401, or 400 for `malformed`).

    `reason` is one of REJECT_REASONS; the message is fixed text (never the caller's): it is
    logged, and a `malformed` refusal's is the answer's error."""

    def __init__(self, reason: RejectReason, message: str) -> None:
        super().__init__(message)
        self.reason: RejectReason = reason


class LogSampler:
    """At most one log line per key every `every_s` seconds, counting the ones held back.

    Keys must come from a small fixed set (REJECT_REASONS): the state is one entry per key."""

    def __init__(self, every_s: float = REJECT_LOG_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._every_s = every_s
        self._clock = clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}

    def admit(self, key: str) -> int | None:
        """None: hold this line back (counted); else log it, saying how many lines of this
        key were held back since the last one logged (0 for none)."""
        now = self._clock()
        last = self._last.get(key)
        if last is not None and now - last < self._every_s:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        self._last[key] = now
        return self._held.pop(key, 0)


class SourceLimiter:
    """A token bucket per source address (`burst`, refilled at `per_s` a second), for the
    deliveries of a provider that signs none: at most `max_sources` buckets, the least
    recently used forgotten first (a forgotten source starts full again)."""

    def __init__(self, burst: float = UNSIGNED_PER_SOURCE[0],
                 per_s: float = UNSIGNED_PER_SOURCE[1], max_sources: int = MAX_SOURCES,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._burst = burst
        self._per_s = per_s
        self._max = max_sources
        self._clock = clock
        self._buckets: dict[str, tuple[float, float]] = {}

    def admit(self, source: str) -> bool:
        """Whether one more delivery from `source` is taken now (it spends a token)."""
        now = self._clock()
        tokens, at = self._buckets.pop(source, (self._burst, now))
        tokens = min(self._burst, tokens + (now - at) * self._per_s)
        admitted = tokens >= 1.0
        self._buckets[source] = (tokens - 1.0 if admitted else tokens, now)  # most recent last
        while len(self._buckets) > self._max:
            del self._buckets[next(iter(self._buckets))]
        return admitted


def source_key(address: str) -> str:
    """What one source's budget is kept under: an IPv4 address, or an IPv6 address's /64
    (one host commonly holds a whole /64: per address it would have endless fresh buckets);
    anything else (a name, "-") as given."""
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address[:100]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)
