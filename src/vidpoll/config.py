"""Settings from the environment (and CLI flags), checked once with clear errors."""

from __future__ import annotations

import ipaddress
import os
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar
from urllib.parse import urlsplit

import platformdirs

from vidpoll.errors import ConfigError, InvalidIntent
from vidpoll.models import DEFAULT_ACCOUNT
from vidpoll.policy import Budget, PollPolicy, validate_account

T = TypeVar("T")
ProxyNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
TRUSTED_PROXIES_VARIABLE = "VIDPOLL_TRUSTED_PROXIES"

DEFAULT_SUME_BASE_URL = "https://api.sume.com"
DEFAULT_HTTP_TIMEOUT_S = 15.0
DEFAULT_LEASE_MARGIN_S = 10.0
DEFAULT_MAX_ACTIVE = 50
DEFAULT_FIRST_POLL_S = 15.0
ALLOW_INSECURE_HTTP_VARIABLE = "VIDPOLL_ALLOW_INSECURE_HTTP"
"""Set to 1 to send the API key over plain http:// to a host that is not loopback."""
EMBEDDED_VARIABLE = "VIDPOLL_EMBEDDED"
"""off: with DATABASE_URL unset, refuse instead of starting the embedded PostgreSQL."""
ROOT_HOME = Path("/var/lib/vidpoll")
"""VIDPOLL_HOME's default as root: its parents are world-traversable on any usual system, so
the embedded server (run as its own user) never needs a directory's permissions loosened."""
DEFAULT_EVENTS_RETENTION_S = 90 * 86400.0
"""`jobs prune` deletes the history of jobs gone from video_jobs older than this."""
WEBHOOK_RETENTION_MARGIN_S = 3600.0
"""Kept beyond the replay window (twice the webhook tolerance, see `webhook_replay_s`)."""
MEDIA_ALLOW_HOSTS_VARIABLE = "VIDPOLL_MEDIA_ALLOW_HOSTS"
"""Hosts (`host` or `host:port`, comma-separated) media may come from over plain http:// or at
a private address; `VIDPOLL_MEDIA_ALLOW_HOSTS_<ACCOUNT>` replaces it for one account."""
HOOK_PATH_VARIABLE = "VIDPOLL_HOOK_PATH"
"""Directories (os.pathsep-separated) hooks are imported from too, after everything else on
sys.path; the working directory is never put there unasked."""
DEFAULT_DOWNLOAD_MAX_BYTES = 2 * 1024**3
"""VIDPOLL_DOWNLOAD_MAX_BYTES: a media file larger than this is refused (2 GiB)."""
DEFAULT_DOWNLOAD_DEADLINE_S = 1800.0
"""VIDPOLL_DOWNLOAD_DEADLINE_S: one file's try, redirects and body included, ends after this
(what it fetched is resumed next try)."""
DEFAULT_DOWNLOAD_MIN_BYTES_PER_S = 8192.0
"""VIDPOLL_DOWNLOAD_MIN_BYTES_PER_S: a body slower than this over 30 s spent waiting for it is
cut off (and retried)."""
AllowedHost = tuple[str, int | None]
"""An allow-list entry: a lower-case host name or IP address (no brackets), and a port or None
for any port."""


def default_home() -> Path:
    """VIDPOLL_HOME when unset: /var/lib/vidpoll as root, else the user's data directory."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return ROOT_HOME
    return Path(platformdirs.user_data_dir("vidpoll"))


def embedded_allowed(env: Mapping[str, str]) -> bool:
    """Whether VIDPOLL_EMBEDDED lets a command fall back to the embedded PostgreSQL."""
    return _on_off(env, EMBEDDED_VARIABLE, True)


def parse_duration(text: str, name: str) -> float | None:
    """Seconds of `90d`, `12h`, `30m`, `45s` or a bare number of seconds; None for `off` or
    `never` (keep for ever). A ConfigError naming `name` otherwise."""
    raw = text.strip().lower()
    if raw in ("off", "never"):
        return None
    units = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
    scale = units.get(raw[-1:], 1.0)
    number = raw[:-1] if raw[-1:] in units else raw
    try:
        value = float(number) * scale
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not a duration (like 90d, 12h, 30m, 45s, or "
                          "off)") from None
    if not 0 < value < float("inf"):
        raise ConfigError(f"{name}={text!r} must be a positive duration (or off)")
    return value


def webhook_replay_s(tolerance_s: float) -> float:
    """How long a received webhook's event id and signature must be kept: a delivery is
    accepted while its timestamp is within the tolerance of now, either way, so one received
    at R may be replayed until R + 2 x tolerance."""
    return 2 * tolerance_s


def loopback_hostname(host: str) -> bool:
    """Whether `host` (a URL's host, brackets removed) is this machine: `localhost`,
    127.0.0.0/8 or ::1. Anything else, a name that merely resolves to loopback included, is
    not: a name can be made to resolve anywhere."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _shape(url: str) -> str:
    """A URL's scheme, host, port and path (never its query, fragment or credentials)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return f"{parts.scheme}://{host}{parts.path}"


def check_text(env: Mapping[str, str], name: str) -> str:
    """The variable's value without surrounding whitespace, or a ConfigError naming it (never
    its value: it may be a secret) if a control character or a space is left inside (a key
    pasted with its line break, a tab): it would be sent as typed, and refused."""
    value = env.get(name, "").strip()
    if any(ch.isspace() or unicodedata.category(ch).startswith("C") for ch in value):
        raise ConfigError(f"{name} holds a control character or a space (not shown: it may "
                          "be a secret); set it to the bare value, on one line")
    return value


def check_base_url(base: str, allow_insecure_http: bool = False) -> str:
    """`base` if it is a usable Sume base URL, else a ConfigError saying why (showing at most
    its scheme, host, port and path: never a query string or credentials).

    Plain http:// sends the API key (and reads answers) in clear text, so it is refused for
    any host but loopback (the fake Sume, the demo and tests) unless explicitly allowed."""
    like = "like https:// then the host and path, e.g. https://api.sume.com"
    if not base.startswith(("http://", "https://")):
        raise ConfigError(f"SUME_BASE_URL must start with http:// or https:// ({like})")
    try:
        parts = urlsplit(base)
        host = parts.hostname or ""
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError as exc:
        why = ("its [IPv6] host is not closed with ]" if "IPv6" in str(exc) else
               "its port is not a number from 0 to 65535")
        raise ConfigError(f"SUME_BASE_URL is not a valid URL: {why} (not shown)") from None
    if not host:
        raise ConfigError(f"SUME_BASE_URL has no host ({like})")
    if base.startswith("http://") and not loopback_hostname(host) and not allow_insecure_http:
        raise ConfigError(
            f"SUME_BASE_URL {_shape(base)} is plain http:// to {host!r}, which is not "
            f"loopback: the API key would cross the network in clear text. Use https://, or "
            f"set {ALLOW_INSECURE_HTTP_VARIABLE}=1 if a trusted network really needs it")
    # the client sends the key as a Bearer header; credentials in the URL would clash with it
    # (aiohttp refuses both at once), and a query or fragment would be dropped or misplaced
    if "@" in parts.netloc:  # not echoed: it may hold a password
        raise ConfigError("SUME_BASE_URL must not carry credentials (user:password@); the "
                          "API key goes in SUME_API_KEY")
    if "\\" in base or parts.query or parts.fragment:
        what = ("a backslash" if "\\" in base else "a query string (?...)" if parts.query
                else "a fragment (#...)")
        raise ConfigError(f"SUME_BASE_URL must be a scheme, a host, an optional port and an "
                          f"optional path, without {what} (not shown); {like}")
    return base


def _max_active(env: Mapping[str, str]) -> int | None:
    raw = env.get("VIDPOLL_MAX_ACTIVE", "").strip().lower()
    if raw == "":
        return DEFAULT_MAX_ACTIVE
    if raw in ("none", "unlimited"):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"VIDPOLL_MAX_ACTIVE={raw!r} must be a positive integer or "
                          "'unlimited'") from None
    if value < 1:
        raise ConfigError(f"VIDPOLL_MAX_ACTIVE={raw!r} must be at least 1 (or 'unlimited')")
    return value


def _on_off(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw in ("on", "true", "1", "yes"):
        return True
    if raw in ("off", "false", "0", "no"):
        return False
    raise ConfigError(f"{name}={raw!r} must be on or off")


def _float(env: Mapping[str, str], name: str, default: float, *, minimum: float = 0.0) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not value >= minimum or value == float("inf"):
        raise ConfigError(f"{name}={raw!r} must be a finite number >= {minimum:g}")
    return value


@dataclass(frozen=True)
class Settings:
    """Everything vidpoll reads from its environment."""

    database_url: str | None = None
    sume_base_url: str = DEFAULT_SUME_BASE_URL
    sume_api_key: str = field(default="", repr=False)
    http_timeout_s: float = DEFAULT_HTTP_TIMEOUT_S
    home: Path = field(default_factory=default_home)
    policy: PollPolicy = field(default_factory=PollPolicy)
    max_active: int | None = DEFAULT_MAX_ACTIVE
    first_poll_s: float = DEFAULT_FIRST_POLL_S
    account_keys: Mapping[str, str] = field(default_factory=dict, repr=False)
    """API keys by account name: `default` from SUME_API_KEY, others from SUME_API_KEY_<NAME>."""
    status_rates: Mapping[str, float] = field(default_factory=dict)
    """Status reads per minute by account (fleet-wide); an account not here is unlimited."""
    submit_rates: Mapping[str, float] = field(default_factory=dict)
    """Creates per minute by account (fleet-wide); an account not here is unlimited."""
    rate_burst: float | None = None
    webhook_secret: str = field(default="", repr=False)
    webhook_tolerance_s: float = 300.0
    dashboard_token: str = field(default="", repr=False)
    """VIDPOLL_DASHBOARD_TOKEN: required by `vidpoll serve` bound beyond loopback."""
    metrics_token: str = field(default="", repr=False)
    trusted_proxies: tuple[ProxyNetwork, ...] = ()
    """VIDPOLL_TRUSTED_PROXIES: the reverse proxies whose X-Forwarded-For `serve` believes
    (their addresses or networks); nobody's by default."""
    """VIDPOLL_METRICS_TOKEN: `vidpoll serve`'s /metrics and /readyz answer only to it (or to
    the dashboard token) as `Authorization: Bearer`."""
    prepared_statements: bool = True
    """VIDPOLL_DB_PREPARE=off: no server-side prepared statements (PgBouncer before 1.21 in
    transaction mode loses them between transactions)."""
    embedded: bool = True
    """VIDPOLL_EMBEDDED=off: with DATABASE_URL unset, refuse instead of using the embedded
    PostgreSQL (a deployment that must never record a paid job in a private database)."""
    events_retention_s: float | None = DEFAULT_EVENTS_RETENTION_S
    """VIDPOLL_EVENTS_RETENTION: `jobs prune` deletes the history (video_job_events) of jobs no
    longer in video_jobs once all of it is older than this; None: kept for ever."""
    webhook_events_retention_s: float | None = None
    """VIDPOLL_WEBHOOK_EVENTS_RETENTION: None (unset) for the replay window plus an hour,
    inf for `off` (kept for ever); `webhook_retention_s()` is the retention in force."""
    media_allow_hosts: frozenset[AllowedHost] = frozenset()
    """VIDPOLL_MEDIA_ALLOW_HOSTS: hosts every account's media may come from over plain http://
    or at a private address (vidpoll.fetch_guard)."""
    media_allow_hosts_by_account: Mapping[str, frozenset[AllowedHost]] = field(
        default_factory=dict)
    """VIDPOLL_MEDIA_ALLOW_HOSTS_<ACCOUNT>: replaces the list above for one account."""
    download_max_bytes: int = DEFAULT_DOWNLOAD_MAX_BYTES
    download_deadline_s: float = DEFAULT_DOWNLOAD_DEADLINE_S
    download_min_bytes_per_s: float = DEFAULT_DOWNLOAD_MIN_BYTES_PER_S
    """0: no minimum rate (the deadline still holds)."""

    def media_allow_hosts_for(self, account: str) -> tuple[frozenset[AllowedHost], str]:
        """The media allow-list of `account` and the variable that set it (for messages)."""
        own = self.media_allow_hosts_by_account.get(account)
        if own is not None:
            return own, f"{MEDIA_ALLOW_HOSTS_VARIABLE}_{account.upper()}"
        return self.media_allow_hosts, MEDIA_ALLOW_HOSTS_VARIABLE

    def webhook_retention_s(self) -> float | None:
        """How old a webhook event (the replay de-duplication) `jobs prune` deletes; None:
        never. Never less than the replay window (from_env refuses a shorter setting)."""
        if self.webhook_events_retention_s == float("inf"):
            return None
        return (self.webhook_events_retention_s
                or webhook_replay_s(self.webhook_tolerance_s) + WEBHOOK_RETENTION_MARGIN_S)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read DATABASE_URL, SUME_*, VIDPOLL_* (see README for the list)."""
        env = os.environ if env is None else env
        base = check_base_url(check_text(env, "SUME_BASE_URL") or DEFAULT_SUME_BASE_URL,
                              _on_off(env, ALLOW_INSECURE_HTTP_VARIABLE, False))
        home = env.get("VIDPOLL_HOME", "").strip()
        policy = PollPolicy(
            min_poll_s=_float(env, "VIDPOLL_MIN_POLL_S", 1.0, minimum=0.01),
            max_poll_s=_float(env, "VIDPOLL_MAX_POLL_S", 3600.0, minimum=0.01),
            max_age_s=_float(env, "VIDPOLL_MAX_POLL_AGE_S", 48 * 3600.0, minimum=1.0),
            not_found_max_tries=int(_float(env, "VIDPOLL_NOT_FOUND_MAX_TRIES", 8, minimum=1)),
            not_found_max_age_s=_float(env, "VIDPOLL_NOT_FOUND_MAX_AGE_S", 3600.0),
            backoff_max_s=_float(env, "VIDPOLL_BACKOFF_MAX_S", 300.0, minimum=0.01),
        )
        if policy.min_poll_s > policy.max_poll_s:
            raise ConfigError("VIDPOLL_MIN_POLL_S must not exceed VIDPOLL_MAX_POLL_S")
        keys = _account_keys(env)
        tolerance = _float(env, "VIDPOLL_WEBHOOK_TOLERANCE_S", 300.0, minimum=1.0)
        return cls(
            database_url=env.get("DATABASE_URL", "").strip() or None,
            sume_base_url=base,
            sume_api_key=check_text(env, "SUME_API_KEY"),
            http_timeout_s=_float(env, "VIDPOLL_HTTP_TIMEOUT", DEFAULT_HTTP_TIMEOUT_S,
                                  minimum=0.1),
            home=Path(home) if home else default_home(),
            policy=policy,
            max_active=_max_active(env),
            first_poll_s=_float(env, "VIDPOLL_FIRST_POLL_S", DEFAULT_FIRST_POLL_S),
            account_keys=keys,
            status_rates=_rates(env, "VIDPOLL_STATUS_RATE_PER_MIN", keys),
            submit_rates=_rates(env, "VIDPOLL_SUBMIT_RATE_PER_MIN", keys),
            rate_burst=_float(env, "VIDPOLL_RATE_BURST", 0.0, minimum=1.0) or None,
            webhook_secret=check_text(env, "SUME_WEBHOOK_SECRET"),
            webhook_tolerance_s=tolerance,
            dashboard_token=check_text(env, "VIDPOLL_DASHBOARD_TOKEN"),
            metrics_token=check_text(env, "VIDPOLL_METRICS_TOKEN"),
            trusted_proxies=parse_networks(env.get(TRUSTED_PROXIES_VARIABLE, ""),
                                           TRUSTED_PROXIES_VARIABLE),
            prepared_statements=_on_off(env, "VIDPOLL_DB_PREPARE", True),
            embedded=embedded_allowed(env),
            events_retention_s=_retention(env, "VIDPOLL_EVENTS_RETENTION",
                                          DEFAULT_EVENTS_RETENTION_S),
            webhook_events_retention_s=_webhook_retention(env, tolerance),
            media_allow_hosts=parse_allow_hosts(env.get(MEDIA_ALLOW_HOSTS_VARIABLE, ""),
                                                MEDIA_ALLOW_HOSTS_VARIABLE),
            media_allow_hosts_by_account=_account_allow_hosts(env),
            download_max_bytes=_bytes(env, "VIDPOLL_DOWNLOAD_MAX_BYTES",
                                      DEFAULT_DOWNLOAD_MAX_BYTES),
            download_deadline_s=_float(env, "VIDPOLL_DOWNLOAD_DEADLINE_S",
                                       DEFAULT_DOWNLOAD_DEADLINE_S, minimum=1.0),
            download_min_bytes_per_s=_float(env, "VIDPOLL_DOWNLOAD_MIN_BYTES_PER_S",
                                            DEFAULT_DOWNLOAD_MIN_BYTES_PER_S),
        )

    def require_api_key(self, account: str = DEFAULT_ACCOUNT) -> str:
        """The API key of `account`, or a ConfigError saying how to set it."""
        key = self.account_keys.get(account) or (
            self.sume_api_key if account == DEFAULT_ACCOUNT else "")
        if not key:
            raise ConfigError(f"{key_variable(account)} is not set; export the Sume API key "
                              f"of account {account!r} first")
        return key

    def budget(self, kind: str, account: str) -> Budget | None:
        """The fleet-wide budget of `account` for 'status' or 'create' calls; None: unlimited."""
        rates = self.status_rates if kind == "status" else self.submit_rates
        per_min = rates.get(account)
        return None if per_min is None else Budget.per_minute(per_min, self.rate_burst)

    def budgets(self, kind: str, accounts: Sequence[str]) -> dict[str, Budget]:
        """The budgets of `accounts` that have one."""
        found = {a: self.budget(kind, a) for a in accounts}
        return {a: b for a, b in found.items() if b is not None}


def key_variable(account: str) -> str:
    """The environment variable that holds an account's API key."""
    return "SUME_API_KEY" if account == DEFAULT_ACCOUNT else f"SUME_API_KEY_{account.upper()}"


def _by_account(env: Mapping[str, str], prefix: str,
                read: Callable[[str], T]) -> dict[str, T]:
    """`<prefix><ACCOUNT>` variables that are set and not empty, by account, each read by
    `read(variable name)`; an account name that is not one is a ConfigError naming it."""
    found: dict[str, T] = {}
    for name, value in env.items():
        if name.startswith(prefix) and value.strip():
            account = name.removeprefix(prefix).lower()
            try:
                validate_account(account)
            except InvalidIntent as exc:
                raise ConfigError(f"{name}: {exc}") from None
            found[account] = read(name)
    return found


def _account_keys(env: Mapping[str, str]) -> dict[str, str]:
    keys: dict[str, str] = {}
    default = check_text(env, "SUME_API_KEY")
    if default:
        keys[DEFAULT_ACCOUNT] = default
    keys.update(_by_account(env, "SUME_API_KEY_", lambda name: check_text(env, name)))
    return keys


_HOST_NAME = re.compile(r"[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?(\.[a-z0-9_]([a-z0-9_-]*[a-z0-9_])?)*")


def parse_networks(raw: str, name: str) -> tuple[ProxyNetwork, ...]:
    """A comma-separated list of IP addresses and networks (`10.0.0.7, 10.1.0.0/16, fd00::/8`);
    a ConfigError naming `name` for an entry that is neither (a host name, a URL)."""
    found: list[ProxyNetwork] = []
    for item in raw.split(","):
        entry = item.strip()
        if not entry:
            continue
        try:
            found.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ConfigError(f"{name}: {entry!r} is not an IP address or network (like "
                              "10.0.0.7, 10.1.0.0/16 or fd00::/8; no names)") from None
    return tuple(found)


def parse_allow_hosts(raw: str, name: str) -> frozenset[AllowedHost]:
    """A comma-separated list of `host`, `host:port`, `[ipv6]` or `[ipv6]:port` (an IP address
    is a host too); a ConfigError naming `name` for an entry that is none of these (a URL, a
    path, a network range)."""
    found: set[AllowedHost] = set()
    for item in raw.split(","):
        entry = item.strip().lower()
        if not entry:
            continue
        host, port = entry, ""
        bracketed = entry.startswith("[")  # an IPv6 address, with a port or not
        if bracketed:
            host, _, rest = entry[1:].partition("]")
            port = rest[1:] if rest.startswith(":") else "x" if rest else ""
        elif entry.count(":") == 1:  # more than one: an IPv6 address without a port
            host, port = entry.split(":")
        host = host.rstrip(".")
        version: int
        try:
            version = ipaddress.ip_address(host).version
        except ValueError:
            version = 0
        valid_host = version == 6 if bracketed else bool(version or _HOST_NAME.fullmatch(host))
        if not valid_host or entry.endswith(":") or (
                port and not (port.isdigit() and 0 < int(port) < 65536)):
            raise ConfigError(f"{name}: {entry!r} is not a host or host:port (like "
                              "media.example.com, cdn.internal:8080 or [fd00::1]:8080; no "
                              "scheme, path or network range)")
        if version:  # one spelling of each address, as the fetch guard compares them
            host = str(ipaddress.ip_address(host))
        found.add((host, int(port) if port else None))
    return frozenset(found)


def _account_allow_hosts(env: Mapping[str, str]) -> dict[str, frozenset[AllowedHost]]:
    """VIDPOLL_MEDIA_ALLOW_HOSTS_<ACCOUNT> by account (set and not empty)."""
    return _by_account(env, MEDIA_ALLOW_HOSTS_VARIABLE + "_",
                       lambda name: parse_allow_hosts(env[name], name))


_BYTE_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4}


def _bytes(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    match = re.fullmatch(r"(\d+)\s*([a-z]*)", raw.lower())
    if match is None or match.group(2) not in _BYTE_UNITS or int(match.group(1)) < 1:
        raise ConfigError(f"{name}={raw!r} must be a positive number of bytes (like "
                          "2147483648, 500MiB or 2GiB)")
    return int(match.group(1)) * _BYTE_UNITS[match.group(2)]


def hook_path(env: Mapping[str, str]) -> tuple[str, ...]:
    """The absolute directories of VIDPOLL_HOOK_PATH (os.pathsep-separated; a relative one
    counts from the working directory), or a ConfigError naming one that is not a directory."""
    found: list[str] = []
    for entry in env.get(HOOK_PATH_VARIABLE, "").split(os.pathsep):
        if not entry.strip():
            continue
        path = os.path.abspath(entry.strip())
        if not os.path.isdir(path):
            raise ConfigError(f"{HOOK_PATH_VARIABLE}: {entry.strip()!r} is not a directory")
        found.append(path)
    return tuple(found)


def _rates(env: Mapping[str, str], name: str, keys: Mapping[str, str]) -> dict[str, float]:
    """`NAME` for every account, `NAME_<ACCOUNT>` for one; unset or empty means unlimited."""
    rates: dict[str, float] = {}
    base = env.get(name, "").strip()
    for account in {DEFAULT_ACCOUNT, *keys}:
        own = f"{name}_{account.upper()}"
        if env.get(own, "").strip():
            rates[account] = _float(env, own, 0.0, minimum=0.001)
        elif base:
            rates[account] = _float(env, name, 0.0, minimum=0.001)
    return rates


def _retention(env: Mapping[str, str], name: str, default: float | None) -> float | None:
    raw = env.get(name, "").strip()
    return parse_duration(raw, name) if raw else default


def _webhook_retention(env: Mapping[str, str], tolerance_s: float) -> float | None:
    name = "VIDPOLL_WEBHOOK_EVENTS_RETENTION"
    raw = env.get(name, "").strip()
    if not raw:
        return None
    value = check_webhook_retention(parse_duration(raw, name), tolerance_s, name)
    return float("inf") if value is None else value


def check_webhook_retention(value: float | None, tolerance_s: float,
                            name: str) -> float | None:
    """`value` if webhook events may be deleted that soon (None: never), else a ConfigError
    saying why."""
    replay = webhook_replay_s(tolerance_s)
    if value is not None and value < replay:
        raise ConfigError(f"{name} must be at least {replay:g}s (twice "
                          "VIDPOLL_WEBHOOK_TOLERANCE_S): a delivery deleted sooner could be "
                          "replayed and accepted as new")
    return value
