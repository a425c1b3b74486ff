"""Fetches of provider-supplied URLs that cannot be turned against the host.

A media link comes from a provider's answer (or from whoever can write `video_jobs.result`):
it is untrusted input that makes this process open connections and write files. Every such
fetch goes through FetchGuard.get, which follows these rules, per account (AccountRules):

- A URL on the account's own API origin (the scheme, host and port of its base URL) is always
  fetched: the provider is reached there already (and the fakes serve media there).
- Any other URL must be https://; plain http:// only to a host on the account's allow-list
  (VIDPOLL_MEDIA_ALLOW_HOSTS, or VIDPOLL_MEDIA_ALLOW_HOSTS_<ACCOUNT>).
- Every address a host resolves to is checked when the connection is made, by a resolver
  wrapped into aiohttp's connector: the addresses checked are the ones connected to, so a DNS
  answer that changes between a check and the connect (rebinding) changes nothing. A literal
  IP host is checked before (aiohttp never resolves one). Refused unless the host is the API
  origin's or allow-listed: loopback, link-local (169.254.169.254: cloud metadata), private,
  shared (CGNAT), reserved, multicast, unspecified and any other non-global address, and the
  IPv6 forms that carry one (IPv4-mapped, 6to4, NAT64).
- Redirects are followed here, one hop at a time, each checked by the same rules, at most
  FetchLimits.max_redirects. The account's own headers (a token its media needs) are sent to
  its API origin only, never to a host a redirect leads to.
- A body larger than FetchLimits.max_bytes is refused on its Content-Length (or Content-Range)
  before a byte is read, and cut off while streaming; one try (redirects and body) ends after
  deadline_s; a body that brings fewer than min_bytes_per_s * rate_window_s bytes in any
  rate_window_s spent waiting for it is cut off (so a byte a minute cannot hold a delivery
  slot for ever while the lease heartbeat keeps the delivery alive; time the caller spends
  between reads, on a slow disk, does not count against the server).

A refused URL or a file too large raise DownloadRefused: permanent, naming the host and the
rule, never the query string. A deadline, a stall or a transport error raise DownloadError:
the delivery retries with backoff and the partial file is resumed. No cookies are kept, no
proxy from the environment is used, and bodies are taken as stored (no decompression: the
size limit counts the bytes that reach the disk, and a compressed bomb stays compressed).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import re
import socket
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from types import TracebackType

import aiohttp
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.resolver import DefaultResolver
from yarl import URL

from vidpoll.config import (
    DEFAULT_DOWNLOAD_DEADLINE_S,
    DEFAULT_DOWNLOAD_MAX_BYTES,
    DEFAULT_DOWNLOAD_MIN_BYTES_PER_S,
    MEDIA_ALLOW_HOSTS_VARIABLE,
    AllowedHost,
    Settings,
)
from vidpoll.errors import DownloadError, DownloadRefused
from vidpoll.media import redact_urls, shown_url

REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 5
DEFAULT_RATE_WINDOW_S = 30.0
"""The minimum rate is judged over windows this long (a pause shorter than it costs nothing
if the window's bytes still make the rate)."""
MAX_BYTES_VARIABLE = "VIDPOLL_DOWNLOAD_MAX_BYTES"
DEADLINE_VARIABLE = "VIDPOLL_DOWNLOAD_DEADLINE_S"
MIN_RATE_VARIABLE = "VIDPOLL_DOWNLOAD_MIN_BYTES_PER_S"

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Origin = tuple[str, str, int]
"""Scheme, lower-case host (an IP address in one spelling) and port of a URL."""

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
_SHARED = ipaddress.IPv4Network("100.64.0.0/10")
_CONTENT_RANGE_TOTAL = re.compile(r"bytes \d+-\d+/(\d+)")


def address_rule(address: Address) -> str | None:
    """Why a connection to `address` is refused unless its host is trusted (`a loopback
    address`, ...), or None for a global unicast address."""
    if isinstance(address, ipaddress.IPv6Address):
        inner = address.ipv4_mapped or address.sixtofour or (
            ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF) if address in _NAT64 else None)
        if inner is not None:  # judged by the IPv4 address it reaches
            rule = address_rule(inner)
            return None if rule is None else f"an IPv6 form of {inner}, {rule}"
    if address.is_unspecified:
        return "an unspecified address"
    if address.is_loopback:
        return "a loopback address"
    if address.is_link_local:
        return "a link-local address (cloud metadata lives at 169.254.169.254)"
    if address.is_multicast:
        return "a multicast address"
    if isinstance(address, ipaddress.IPv4Address) and address in _SHARED:
        return "a shared (CGNAT) address"
    if address.is_reserved:
        return "a reserved address"
    if address.is_private:
        return "a private address"
    if not address.is_global:
        return "not a global address"
    return None


def _address(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _norm_host(host: str) -> str:
    """A host as allow-lists and origins hold it: lower case, no trailing dot, an IP address
    in its one compressed spelling."""
    host = host.lower().rstrip(".")
    address = _address(host)
    return host if address is None else str(address)


def origin_of(url: str | URL) -> Origin | None:
    """The origin of an absolute http(s) URL; None for anything else."""
    try:
        parsed = url if isinstance(url, URL) else URL(url, encoded=True)
        scheme, host, port = parsed.scheme.lower(), parsed.raw_host, parsed.port
    except ValueError:
        return None
    if scheme not in ("http", "https") or not host or port is None:
        return None
    return scheme, _norm_host(host), port


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class AccountRules:
    """What one account's provider-supplied URLs may reach."""

    api_base_url: str | None = None
    """Its API's base URL: a URL on the same scheme, host and port is always fetched."""
    allow_hosts: frozenset[AllowedHost] = frozenset()
    """Hosts (any port, or one) that may be reached over plain http:// and at any address."""
    allow_variable: str = MEDIA_ALLOW_HOSTS_VARIABLE
    """The setting that holds allow_hosts (refusals name it)."""
    api_headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    """Headers the account's media needs (a provider's token): sent to its API origin and,
    over https only, to its `header_hosts`; never to any other host."""
    header_hosts: frozenset[str] = frozenset()
    """The provider's own file hosts (`Client.media_auth_hosts`): a name matches itself and
    its subdomains."""

    @property
    def origin(self) -> Origin | None:
        """The API origin, if the account has one."""
        return None if self.api_base_url is None else origin_of(self.api_base_url)

    def gets_headers(self, url: URL) -> bool:
        """Whether a request to `url` carries `api_headers`: the API origin, or https to one
        of the provider's file hosts."""
        if not self.api_headers:
            return False
        if self.origin is not None and origin_of(url) == self.origin:
            return True
        if url.scheme.lower() != "https" or not self.header_hosts:
            return False
        host = _norm_host(url.raw_host or "")
        return any(host == h or host.endswith("." + h) for h in self.header_hosts)

    def allows(self, host: str, port: int) -> bool:
        """Whether `host:port` is on the allow-list."""
        return (host, None) in self.allow_hosts or (host, port) in self.allow_hosts

    def trusts_addresses_of(self, host: str, port: int) -> bool:
        """Whether connections to `host:port` skip the address check: the API origin's host
        and port, or an allow-listed host."""
        origin = self.origin
        return (origin is not None and origin[1:] == (host, port)) or self.allows(host, port)


@dataclass(frozen=True)
class FetchLimits:
    """How much of one file a fetch may take, and how long."""

    max_bytes: int = DEFAULT_DOWNLOAD_MAX_BYTES
    deadline_s: float = DEFAULT_DOWNLOAD_DEADLINE_S
    """One try of one file: redirects, connects and the whole body."""
    min_bytes_per_s: float = DEFAULT_DOWNLOAD_MIN_BYTES_PER_S
    """0: no minimum rate."""
    rate_window_s: float = DEFAULT_RATE_WINDOW_S
    max_redirects: int = MAX_REDIRECTS


@dataclass(frozen=True)
class FetchPolicy:
    """The rules of every account (`default` for an account not in `accounts`) and the
    limits of every fetch."""

    default: AccountRules = field(default_factory=AccountRules)
    accounts: Mapping[str, AccountRules] = field(default_factory=dict)
    limits: FetchLimits = field(default_factory=FetchLimits)

    def rules(self, account: str) -> AccountRules:
        """The rules of `account`."""
        return self.accounts.get(account, self.default)

    @classmethod
    def for_origin(cls, api_base_url: str, *,
                   allow_hosts: frozenset[AllowedHost] = frozenset(),
                   limits: FetchLimits | None = None) -> FetchPolicy:
        """Every account's API at `api_base_url` (one provider, as today), one allow-list."""
        return cls(AccountRules(api_base_url, allow_hosts), limits=limits or FetchLimits())

    @classmethod
    def from_settings(cls, settings: Settings,
                      headers: Mapping[str, Mapping[str, str]] | None = None,
                      header_hosts: Mapping[str, frozenset[str]] | None = None) -> FetchPolicy:
        """The policy the settings give: each account's base URL is its API origin (the
        default provider's base URL for an account not configured);
        VIDPOLL_MEDIA_ALLOW_HOSTS[_<ACCOUNT>] and VIDPOLL_DOWNLOAD_* as documented.
        `headers`: by account, what its media needs on its API origin (Client.media_headers),
        and on its provider's file hosts (`header_hosts`: Client.media_auth_hosts)."""
        def rules(account: str) -> AccountRules:
            hosts, variable = settings.media_allow_hosts_for(account)
            found = settings.accounts.get(account)
            base = found.base_url if found is not None else settings.sume_base_url
            return AccountRules(base, hosts, variable, (headers or {}).get(account, {}),
                                (header_hosts or {}).get(account, frozenset()))

        named = {*settings.media_allow_hosts_by_account, *settings.accounts}
        return cls(rules("default"), {a: rules(a) for a in named},
                   FetchLimits(max_bytes=settings.download_max_bytes,
                               deadline_s=settings.download_deadline_s,
                               min_bytes_per_s=settings.download_min_bytes_per_s))


class _AddressRefused(OSError):
    """Raised inside aiohttp's connector by the checking resolver; carries the rule."""


class _CheckingResolver(AbstractResolver):
    """Resolves through `inner`, then refuses the whole answer if any address in it is one
    the account may not reach: aiohttp connects to exactly the addresses returned here."""

    def __init__(self, inner: AbstractResolver, rules: AccountRules) -> None:
        self._inner = inner
        self._rules = rules

    async def resolve(self, host: str, port: int = 0,
                      family: socket.AddressFamily = socket.AF_INET) -> list[ResolveResult]:
        found = await self._inner.resolve(host, port, family)
        name = _norm_host(host)
        if self._rules.trusts_addresses_of(name, port):
            return found
        for info in found:
            address = _address(info["host"].partition("%")[0])
            rule = "not an IP address" if address is None else address_rule(address)
            if rule is not None:
                raise _AddressRefused(f"{name} resolves to {info['host']}, {rule}, and is not "
                                      f"on {self._rules.allow_variable}")
        return found

    async def close(self) -> None:
        """The inner resolver is closed by the guard that owns it."""


class Fetched:
    """The final answer of a checked chain of redirects; read() enforces the limits."""

    def __init__(self, resp: aiohttp.ClientResponse, shown: str, held: int,
                 limits: FetchLimits) -> None:
        self.status = resp.status
        self.headers = resp.headers
        self.shown = shown
        """The URL asked for, shown (no query string)."""
        self._resp = resp
        self._held = held
        self._limits = limits
        self.received = 0
        """Body bytes read so far."""
        self._loop = asyncio.get_running_loop()
        # the rate counts time spent waiting for the body only: hashing a resumed partial or
        # a slow disk between reads is not the server's slowness
        self._window_left_s = limits.rate_window_s
        self._window_bytes = 0

    def check_announced(self) -> None:
        """DownloadRefused if the answer announces more than max_bytes in all (with what a
        206 continues)."""
        total = None
        length = self.headers.get("Content-Length", "")
        if self.status in (200, 206) and length.isdigit():
            total = int(length) + (self._held if self.status == 206 else 0)
        match = _CONTENT_RANGE_TOTAL.fullmatch(self.headers.get("Content-Range", ""))
        if self.status == 206 and match is not None:
            total = max(total or 0, int(match.group(1)))
        if total is not None and total > self._limits.max_bytes:
            raise DownloadRefused(
                f"{self.shown}: the file is {total} bytes, more than {MAX_BYTES_VARIABLE} "
                f"({self._limits.max_bytes}); not downloaded")

    async def read(self) -> bytes:
        """The next piece of the body, b"" at its end; DownloadRefused past max_bytes,
        DownloadError when a window of rate_window_s brought too few bytes."""
        limits = self._limits
        while True:
            wait_s: float | None = None
            if limits.min_bytes_per_s > 0:
                if self._window_left_s <= 0:
                    if self._window_bytes < limits.min_bytes_per_s * limits.rate_window_s:
                        raise DownloadError(
                            f"{self.shown}: {self._window_bytes} bytes in "
                            f"{limits.rate_window_s:g}s, slower than {MIN_RATE_VARIABLE} "
                            f"({limits.min_bytes_per_s:g}); resumed next time")
                    self._window_left_s = limits.rate_window_s
                    self._window_bytes = 0
                wait_s = self._window_left_s
            started = self._loop.time()
            try:
                async with asyncio.timeout(wait_s) as window:
                    chunk = await self._resp.content.readany()
            except TimeoutError:
                if window.expired():  # the window ended with the read waiting: judge it
                    self._window_left_s = 0
                    continue
                raise
            self._window_left_s -= self._loop.time() - started
            self._window_bytes += len(chunk)
            self.received += len(chunk)
            start = self._held if self.status == 206 else 0
            if start + self.received > limits.max_bytes:
                raise DownloadRefused(
                    f"{self.shown}: the body goes past {MAX_BYTES_VARIABLE} "
                    f"({limits.max_bytes} bytes); not downloaded")
            return chunk


class FetchGuard:
    """The one way provider-supplied URLs are fetched (module docstring: the rules)."""

    def __init__(self, policy: FetchPolicy | None = None, *, connect_timeout_s: float = 15.0,
                 read_timeout_s: float = 60.0, max_connections: int = 8,
                 resolver: AbstractResolver | None = None,
                 headers: Mapping[str, str] | None = None) -> None:
        self.policy = policy or FetchPolicy()
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s,
                                              sock_read=read_timeout_s)
        self._max_connections = max_connections
        self._resolver = resolver
        self._own_resolver: AbstractResolver | None = None
        self._headers = {"User-Agent": "vidpoll", **(headers or {})}
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        self._open = False

    async def __aenter__(self) -> FetchGuard:
        self._open = True
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self._open = False
        sessions, self._sessions = self._sessions, {}
        for session in sessions.values():
            await session.close()
        if self._own_resolver is not None:
            await self._own_resolver.close()
            self._own_resolver = None

    def _session(self, account: str) -> aiohttp.ClientSession:
        """One session per account: its connector's resolver checks by that account's rules
        (a pooled connection is only ever one its own rules let through)."""
        assert self._open, "use `async with FetchGuard(...)`"
        session = self._sessions.get(account)
        if session is None:
            inner = self._resolver
            if inner is None:
                if self._own_resolver is None:
                    self._own_resolver = DefaultResolver()
                inner = self._own_resolver
            resolver = _CheckingResolver(inner, self.policy.rules(account))
            session = aiohttp.ClientSession(
                timeout=self._timeout, raise_for_status=False, auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(), trust_env=False, headers=self._headers,
                connector=aiohttp.TCPConnector(limit=self._max_connections, resolver=resolver))
            self._sessions[account] = session
        return session

    @contextlib.asynccontextmanager
    async def get(self, account: str, url: str, *, headers: Mapping[str, str] | None = None,
                  held: int = 0) -> AsyncIterator[Fetched]:
        """GET `url` (sent byte for byte: re-encoding would break a signature) for `account`,
        following and checking redirects; yields the final answer, whatever its status.
        `held`: bytes already held (a Range request), counted toward max_bytes."""
        shown = shown_url(url)
        limits = self.policy.limits
        session = self._session(account)
        try:
            async with asyncio.timeout(limits.deadline_s) as deadline:
                resp = await self._follow(session, self.policy.rules(account), url, shown,
                                          dict(headers or {}))
                try:
                    fetched = Fetched(resp, shown, held, limits)
                    fetched.check_announced()
                    yield fetched
                except BaseException:
                    resp.close()  # a body left unread: drop the connection, never drain it
                    raise
                resp.release()
        except TimeoutError as exc:
            if deadline.expired():
                raise DownloadError(f"{shown}: not done within {limits.deadline_s:g}s "
                                    f"({DEADLINE_VARIABLE}); resumed next time") from None
            raise DownloadError(f"{shown}: {type(exc).__name__}: "
                                f"{redact_urls(str(exc))[:200]}") from exc
        except aiohttp.ClientError as exc:
            raise DownloadError(f"{shown}: {type(exc).__name__}: "
                                f"{redact_urls(str(exc))[:200]}") from exc

    async def _follow(self, session: aiohttp.ClientSession, rules: AccountRules, url: str,
                      shown: str, headers: dict[str, str]) -> aiohttp.ClientResponse:
        try:
            current = URL(url, encoded=True)
        except ValueError:
            raise DownloadRefused(f"{shown} refused: not a valid URL") from None
        hops = self.policy.limits.max_redirects
        for hop in range(hops + 1):
            where = "" if hop == 0 else f"its redirect {hop}: "
            try:
                if hop:
                    where = f"its redirect {hop} to {shown_url(str(current))}: "
                why = self.refusal(rules, current)
            except ValueError:  # yarl parses lazily: a port out of range, say
                why = "not a valid URL"
            if why is not None:
                raise DownloadRefused(f"{shown} refused: {where}{why}")
            sent = dict(headers)
            if rules.gets_headers(current):
                sent.update(rules.api_headers)
            try:
                resp = await session.get(current, headers=sent, allow_redirects=False)
            except aiohttp.ClientConnectorError as exc:
                if isinstance(exc.os_error, _AddressRefused):
                    raise DownloadRefused(f"{shown} refused: {where}{exc.os_error}") from None
                raise
            except aiohttp.InvalidURL:
                raise DownloadRefused(f"{shown} refused: {where}not a valid URL") from None
            location = resp.headers.get("Location")
            if resp.status not in REDIRECT_STATUSES or location is None:
                return resp
            resp.close()
            try:
                target = URL(location, encoded=True)
                current = current.join(target)  # absolute, scheme-relative or relative
            except ValueError:
                raise DownloadRefused(f"{shown} refused: {where}its redirect {hop + 1} is not "
                                      "a valid URL") from None
        raise DownloadRefused(f"{shown} refused: more than {hops} redirects")

    @staticmethod
    def refusal(rules: AccountRules, url: URL) -> str | None:
        """Why `url` may not be fetched for an account with `rules`, or None (its addresses,
        unless literal, are checked again when connecting)."""
        scheme = url.scheme.lower()
        if scheme not in ("http", "https"):
            return f"only http:// and https:// are fetched, not {scheme or 'no scheme'}"
        raw = url.raw_host or ""
        if not raw or not raw.isascii():
            return "no host, or one that is not ASCII (IDNA-encoded)"
        host, port = _norm_host(raw), url.port or (443 if scheme == "https" else 80)
        if (rules.origin is not None and origin_of(url) == rules.origin) or rules.allows(
                host, port):
            return None
        named = _host_port(raw.lower(), port)
        if scheme == "http":
            return (f"plain http:// to {named}, which is neither the account's API origin "
                    f"nor on {rules.allow_variable}")
        address = _address(host)
        rule = None if address is None else address_rule(address)
        if rule is not None:
            return f"{named} is {rule}, and is not on {rules.allow_variable}"
        return None
