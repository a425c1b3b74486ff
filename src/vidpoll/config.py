"""Settings from the environment, the accounts file and CLI flags, checked once with clear
errors.

Accounts come from the TOML file `VIDPOLL_CONFIG` names (default `vidpoll.toml` in the
working directory, if there is one) and, as before any file existed, from the default
provider's environment variables (`SUME_API_KEY`, `SUME_API_KEY_<NAME>`, `SUME_BASE_URL`,
`SUME_WEBHOOK_SECRET` for Sume: the names are built from the provider's `env_prefix`). Keys
are only ever read from the environment; the file names the variables that hold them.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import re
import tomllib
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar
from urllib.parse import urlsplit

import platformdirs

from vidpoll.errors import ConfigError, InvalidIntent
from vidpoll.models import DEFAULT_ACCOUNT
from vidpoll.policy import Budget, PollPolicy, validate_account
from vidpoll.providers import registry
from vidpoll.providers.base import AccountOption, Provider
from vidpoll.schedule import DEFAULT_DETECT_P95_S, DEFAULT_OVERDUE_FACTOR
from vidpoll.spend import NO_SPEND, SPEND_FIELDS, AccountSpend, parse_account_spend

T = TypeVar("T")
ProxyNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
TRUSTED_PROXIES_VARIABLE = "VIDPOLL_TRUSTED_PROXIES"

DEFAULT_SUME_BASE_URL = "https://api.sume.com"
"""Sume's public API (kept for callers; settings take the provider's `default_base_url`)."""
CONFIG_VARIABLE = "VIDPOLL_CONFIG"
"""The accounts file; unset: `DEFAULT_CONFIG_FILE` in the working directory, if it exists."""
DEFAULT_CONFIG_FILE = "vidpoll.toml"
STATUS_RATE_VARIABLE = "VIDPOLL_STATUS_RATE_PER_MIN"
SUBMIT_RATE_VARIABLE = "VIDPOLL_SUBMIT_RATE_PER_MIN"
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


def check_base_url(base: str, allow_insecure_http: bool = False, *,
                   name: str = "SUME_BASE_URL", key_name: str = "SUME_API_KEY",
                   example: str = DEFAULT_SUME_BASE_URL) -> str:
    """`base` if it is a usable API base URL, else a ConfigError saying why (showing at most
    its scheme, host, port and path: never a query string or credentials). `name` is where
    the URL was set (a variable, a field of the accounts file), `key_name` where the key goes,
    `example` a URL to show.

    Plain http:// sends the API key (and reads answers) in clear text, so it is refused for
    any host but loopback (the fake Sume, the demo and tests) unless explicitly allowed."""
    like = f"like https:// then the host and path, e.g. {example}"
    if not base.startswith(("http://", "https://")):
        raise ConfigError(f"{name} must start with http:// or https:// ({like})")
    try:
        parts = urlsplit(base)
        host = parts.hostname or ""
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError as exc:
        why = ("its [IPv6] host is not closed with ]" if "IPv6" in str(exc) else
               "its port is not a number from 0 to 65535")
        raise ConfigError(f"{name} is not a valid URL: {why} (not shown)") from None
    if not host:
        raise ConfigError(f"{name} has no host ({like})")
    if base.startswith("http://") and not loopback_hostname(host) and not allow_insecure_http:
        raise ConfigError(
            f"{name} {_shape(base)} is plain http:// to {host!r}, which is not "
            f"loopback: the API key would cross the network in clear text. Use https://, or "
            f"set {ALLOW_INSECURE_HTTP_VARIABLE}=1 if a trusted network really needs it")
    # the client sends the key as a Bearer header; credentials in the URL would clash with it
    # (aiohttp refuses both at once), and a query or fragment would be dropped or misplaced
    if "@" in parts.netloc:  # not echoed: it may hold a password
        raise ConfigError(f"{name} must not carry credentials (user:password@); the "
                          f"API key goes in {key_name}")
    if "\\" in base or parts.query or parts.fragment:
        what = ("a backslash" if "\\" in base else "a query string (?...)" if parts.query
                else "a fragment (#...)")
        raise ConfigError(f"{name} must be a scheme, a host, an optional port and an "
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


AccountSource = Literal["file", "environment"]


@dataclass(frozen=True)
class Account:
    """One account: its provider, where the provider's API is, its key (read from the
    environment variable `api_key_env`; empty when that is unset) and its budgets."""

    name: str
    provider: str
    base_url: str
    api_key: str = field(default="", repr=False)
    """Empty when `api_key_env` is unset: still an account (a worker skips it, a submit for
    it names the variable to export)."""
    api_key_env: str = ""
    status_rate_per_min: float | None = None
    """Fleet-wide status reads a minute; None: unlimited."""
    submit_rate_per_min: float | None = None
    """Fleet-wide creates a minute; None: unlimited."""
    webhook_secret: str = field(default="", repr=False)
    webhook_secret_env: str = ""
    """The variable `webhook_secret` came from; empty when none was named."""
    source: AccountSource = "environment"
    """Where the account is defined: the accounts file, or the provider's variables."""
    webhook_url: str | None = None
    """Where the provider should call when a job ends (`vidpoll serve`'s webhook route), for
    a provider whose creates name one; None: creates ask for no webhook."""
    options: Mapping[str, str] = field(default_factory=dict)
    """The provider's own fields (`Provider.account_options`), checked, defaults filled in."""
    on_unknown_create: str = "park"
    """For a provider with neither an idempotency key nor records to look a create up in:
    `park` an unknown create for an operator (the default), or `resend` it (may bill twice)."""
    min_poll_s: float | None = None
    """The floor between two reads of one job; None: the provider's (`Rules.min_poll_s`)."""
    option_secrets: Mapping[str, str] = field(default_factory=dict, repr=False)
    """By `secret_env` field of the provider (Kling's `secret_key_env`): the value of the
    variable it names (empty when unset)."""
    spend: AccountSpend = NO_SPEND
    """Prices and caps (vidpoll.spend): none unless the accounts file sets them."""
    timing: AccountTiming = field(default_factory=lambda: AccountTiming())
    """How its hint-less jobs are read (vidpoll.schedule): learned or fixed, the target."""


POLL_SCHEDULES = ("learned", "fixed")
TIMING_FIELDS = ("poll_schedule", "detect_p95_s", "overdue_factor")


@dataclass(frozen=True, slots=True)
class AccountTiming:
    """`poll_schedule`, `detect_p95_s`, `overdue_factor` of an `[accounts.NAME]` table."""

    schedule: str = "learned"
    """`learned`: reads planned from the render times of the job's model once it has
    enough history (vidpoll.schedule); `fixed`: the fixed interval, always."""
    detect_p95_s: float = DEFAULT_DETECT_P95_S
    """The detection delay a learned schedule aims at (95 % of ends seen within it)."""
    overdue_factor: float = DEFAULT_OVERDUE_FACTOR
    """A job running past its model's p99 render time times this is overdue."""


@dataclass(frozen=True)
class Settings:
    """Everything vidpoll reads from its environment."""

    database_url: str | None = None
    sume_base_url: str = DEFAULT_SUME_BASE_URL
    """The default provider's base URL: account `default`'s if it is that provider's, else
    `<PREFIX>_BASE_URL` or the provider's public URL (one for every account: prefer
    `accounts[name].base_url`)."""
    sume_api_key: str = field(default="", repr=False)
    """Account `default`'s key if it is the default provider's, else `<PREFIX>_API_KEY`."""
    http_timeout_s: float = DEFAULT_HTTP_TIMEOUT_S
    home: Path = field(default_factory=default_home)
    policy: PollPolicy = field(default_factory=PollPolicy)
    max_active: int | None = DEFAULT_MAX_ACTIVE
    first_poll_s: float = DEFAULT_FIRST_POLL_S
    accounts: Mapping[str, Account] = field(default_factory=dict)
    """Every account by name: the accounts file's, and the environment's for names the file
    does not define (see `load_accounts`)."""
    config_file: Path | None = None
    """The accounts file read (VIDPOLL_CONFIG, or ./vidpoll.toml); None: there was none."""
    account_keys: Mapping[str, str] = field(default_factory=dict, repr=False)
    """API keys of the accounts that have one, by name (derived from `accounts`)."""
    status_rates: Mapping[str, float] = field(default_factory=dict)
    """Status reads per minute by account (fleet-wide); an account not here is unlimited."""
    submit_rates: Mapping[str, float] = field(default_factory=dict)
    """Creates per minute by account (fleet-wide); an account not here is unlimited."""
    rate_burst: float | None = None
    webhook_secret: str = field(default="", repr=False)
    """Account `default`'s webhook secret if it is the default provider's, else
    `<PREFIX>_WEBHOOK_SECRET` (prefer `accounts[name].webhook_secret`)."""
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
    def from_env(cls, env: Mapping[str, str] | None = None, *,
                 cwd: Path | None = None) -> Settings:
        """Read DATABASE_URL, SUME_*, VIDPOLL_* (see README for the list) and the accounts
        file (VIDPOLL_CONFIG, else `vidpoll.toml` in `cwd`, the working directory)."""
        env = os.environ if env is None else env
        insecure = _on_off(env, ALLOW_INSECURE_HTTP_VARIABLE, False)
        provider = registry.load(registry.DEFAULT_PROVIDER)
        base = environment_base_url(env, provider, insecure)
        home = env.get("VIDPOLL_HOME", "").strip()
        policy = PollPolicy(
            min_poll_s=_float(env, "VIDPOLL_MIN_POLL_S", 1.0, minimum=0.01),
            max_poll_s=_float(env, "VIDPOLL_MAX_POLL_S", 3600.0, minimum=0.01),
            max_age_s=_float(env, "VIDPOLL_MAX_POLL_AGE_S", 48 * 3600.0, minimum=1.0),
            not_found_max_tries=int(_float(env, "VIDPOLL_NOT_FOUND_MAX_TRIES", 8, minimum=1)),
            not_found_max_age_s=_float(env, "VIDPOLL_NOT_FOUND_MAX_AGE_S", 3600.0),
            backoff_max_s=_float(env, "VIDPOLL_BACKOFF_MAX_S", 300.0, minimum=0.01),
            reconcile_settle_s=_float(env, "VIDPOLL_RECONCILE_SETTLE_S", 10.0, minimum=0.0),
            reconcile_deadline_s=_float(env, "VIDPOLL_RECONCILE_DEADLINE_S", 600.0,
                                        minimum=1.0),
        )
        if policy.min_poll_s > policy.max_poll_s:
            raise ConfigError("VIDPOLL_MIN_POLL_S must not exceed VIDPOLL_MAX_POLL_S")
        config_file = config_path(env, cwd)
        accounts = load_accounts(env, config_file)
        # the single-value settings of earlier releases: account `default`'s when it is the
        # default provider's, else that provider's own variables
        default = accounts.get(DEFAULT_ACCOUNT)
        if default is None or default.provider != provider.name:
            default = Account(DEFAULT_ACCOUNT, provider.name, base,
                              check_text(env, f"{provider.env_prefix}_API_KEY"),
                              webhook_secret=check_text(
                                  env, f"{provider.env_prefix}_WEBHOOK_SECRET"))
        tolerance = _float(env, "VIDPOLL_WEBHOOK_TOLERANCE_S", 300.0, minimum=1.0)
        return cls(
            database_url=env.get("DATABASE_URL", "").strip() or None,
            sume_base_url=default.base_url,
            sume_api_key=default.api_key,
            http_timeout_s=_float(env, "VIDPOLL_HTTP_TIMEOUT", DEFAULT_HTTP_TIMEOUT_S,
                                  minimum=0.1),
            home=Path(home) if home else default_home(),
            policy=policy,
            max_active=_max_active(env),
            first_poll_s=_float(env, "VIDPOLL_FIRST_POLL_S", DEFAULT_FIRST_POLL_S),
            accounts=accounts,
            config_file=config_file,
            account_keys={a.name: a.api_key for a in accounts.values() if a.api_key},
            status_rates=_rates(env, STATUS_RATE_VARIABLE, accounts, "status"),
            submit_rates=_rates(env, SUBMIT_RATE_VARIABLE, accounts, "submit"),
            rate_burst=_float(env, "VIDPOLL_RATE_BURST", 0.0, minimum=1.0) or None,
            webhook_secret=default.webhook_secret,
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

    def account(self, name: str) -> Account:
        """The account called `name`, with its key; a ConfigError naming the known accounts
        when there is none, or the variable to export when its key is unset."""
        found = self.accounts.get(name)
        if found is None:
            known = ", ".join(sorted(self.accounts)) or "none"
            problem = f"unknown account {name[:64]!r} (known: {known})"
            if validate_account_name(name):
                where = self.config_file or DEFAULT_CONFIG_FILE
                problem += (f": {key_variable(name)} is not set; export it, or define "
                            f"[accounts.{name}] in {where}")
            raise ConfigError(problem)
        if not found.api_key:  # the wording of earlier releases
            title = registry.load(found.provider).title
            raise ConfigError(f"{found.api_key_env} is not set; export the {title} API key "
                              f"of account {name!r} first")
        return found

    def require_api_key(self, account: str = DEFAULT_ACCOUNT) -> str:
        """The API key of `account`, or a ConfigError saying how to set it."""
        return self.account(account).api_key

    def secrets(self) -> list[str]:
        """Every account's key and webhook secret that is set (for redacting logs: the file
        may name variables `logs.secrets_from_env` does not know)."""
        # a key read from a variable; not a key file's path (Vertex AI: `credentials_file`,
        # no secret, and what an operator needs to see in an error)
        found = {s for a in self.accounts.values()
                 for s in ((a.api_key if a.api_key_env or a.source != "file" else ""),
                           a.webhook_secret, *a.option_secrets.values())}
        return sorted((s for s in found if s), key=len, reverse=True)

    def budget(self, kind: str, account: str) -> Budget | None:
        """The fleet-wide budget of `account` for 'status' or 'create' calls; None: unlimited."""
        rates = self.status_rates if kind == "status" else self.submit_rates
        per_min = rates.get(account)
        return None if per_min is None else Budget.per_minute(per_min, self.rate_burst)

    def budgets(self, kind: str, accounts: Sequence[str]) -> dict[str, Budget]:
        """The budgets of `accounts` that have one."""
        found = {a: self.budget(kind, a) for a in accounts}
        return {a: b for a, b in found.items() if b is not None}

    def spends(self, accounts: Sequence[str] | None = None) -> dict[str, AccountSpend]:
        """The prices and caps (vidpoll.spend) of `accounts` (None: every account) that this
        process knows of."""
        names = self.accounts if accounts is None else accounts
        return {a: self.accounts[a].spend for a in names if a in self.accounts}

    def timings(self, accounts: Sequence[str] | None = None
                ) -> tuple[dict[str, AccountTiming], dict[str, str]]:
        """(how each of `accounts` reads jobs whose provider gives no hint, its provider):
        what `WorkerConfig.timings` and `.providers` take (None: every account)."""
        names = [a for a in (self.accounts if accounts is None else accounts)
                 if a in self.accounts]
        return ({a: self.accounts[a].timing for a in names},
                {a: self.accounts[a].provider for a in names})


def key_variable(account: str) -> str:
    """The environment variable that holds the key of `account` when the environment (not
    the accounts file) defines it: `<PREFIX>_API_KEY` for `default`, else
    `<PREFIX>_API_KEY_<NAME>`, with the default provider's prefix (`SUME`)."""
    prefix = registry.load(registry.DEFAULT_PROVIDER).env_prefix
    if account == DEFAULT_ACCOUNT:
        return f"{prefix}_API_KEY"
    return f"{prefix}_API_KEY_{account.upper()}"


def validate_account_name(name: str) -> bool:
    """Whether `name` is a valid account name (`policy.validate_account`, as a test)."""
    try:
        validate_account(name)
    except InvalidIntent:
        return False
    return True


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


# --- accounts --------------------------------------------------------------------------------

FILE_FIELDS = ("provider", "base_url", "api_key_env", "webhook_secret_env",
               "status_rate_per_min", "submit_rate_per_min", "webhook_url",
               "on_unknown_create", "min_poll_s", *SPEND_FIELDS, *TIMING_FIELDS)
"""What an `[accounts.NAME]` table of any provider may hold; `api_key_env` is required
(unless the provider's `key_setting` names another field), besides its own fields
(`Provider.account_options`)."""
UNKNOWN_CREATE_CHOICES = ("park", "resend")
_ENV_NAME = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")
"""A variable `api_key_env` / `webhook_secret_env` may name: upper-case, as by convention (a
mixed-case value is far more likely a pasted key than a variable's name)."""
_PROVIDER_WORD = re.compile(r"[a-z][a-z0-9_]{0,31}")
_SECRET_NAME = re.compile(
    r"(?:^|[^a-z])(?:api_?key|key|keys|token|secret|password|passwd|pwd|credentials?|bearer|"
    r"auth|authorization)(?:$|[^a-z])")
_KEYS_NEVER = 'keys never go in the file: set api_key_env = "NAME" and export NAME'
_SECRETS_NEVER = ('secrets never go in the file: set webhook_secret_env = "NAME" and export '
                  'NAME')


def config_path(env: Mapping[str, str], cwd: Path | None = None) -> Path | None:
    """The accounts file: VIDPOLL_CONFIG (relative to `cwd`, the working directory), which
    must exist; unset or empty: `vidpoll.toml` in `cwd` if it exists, else None."""
    try:
        here = Path.cwd() if cwd is None else cwd
    except OSError:  # the working directory was removed: relative paths find nothing there
        here = Path()
    named = env.get(CONFIG_VARIABLE, "").strip()
    if named:
        path = here / Path(named).expanduser()
        if not path.exists():
            raise ConfigError(f"{CONFIG_VARIABLE}: {path} does not exist")
        return path
    path = here / DEFAULT_CONFIG_FILE
    return path if path.exists() else None


def load_accounts(env: Mapping[str, str], config_file: Path | None) -> dict[str, Account]:
    """Every account: the file's, then the default provider's environment accounts whose
    names the file does not define (a file account of the same name wins). Without a file
    account, `default` is always one (keyless when its variable is unset), as before."""
    insecure = _on_off(env, ALLOW_INSECURE_HTTP_VARIABLE, False)
    found = {} if config_file is None else read_accounts_file(config_file, env, insecure)
    provider = registry.load(registry.DEFAULT_PROVIDER)
    from_env = environment_accounts(env, provider, environment_base_url(env, provider,
                                                                        insecure),
                                    keyless_default=not found)
    return found | {n: a for n, a in from_env.items() if n not in found}


def environment_base_url(env: Mapping[str, str], provider: Provider,
                         allow_insecure_http: bool) -> str:
    """`<PREFIX>_BASE_URL`, checked, or the provider's public URL when it is unset."""
    name = f"{provider.env_prefix}_BASE_URL"
    return check_base_url(check_text(env, name) or provider.default_base_url,
                          allow_insecure_http, name=name,
                          key_name=f"{provider.env_prefix}_API_KEY",
                          example=provider.default_base_url)


def environment_accounts(env: Mapping[str, str], provider: Provider, base_url: str, *,
                         keyless_default: bool = True) -> dict[str, Account]:
    """The accounts `provider`'s variables define, without a file: `<PREFIX>_API_KEY` for
    `default` (there even when unset if `keyless_default`), `<PREFIX>_API_KEY_<NAME>` for
    `name`; all at `base_url`, with `<PREFIX>_WEBHOOK_SECRET` and VIDPOLL_*_RATE_PER_MIN."""
    variable = f"{provider.env_prefix}_API_KEY"
    keys = {DEFAULT_ACCOUNT: (variable, check_text(env, variable))}
    keys.update(_by_account(env, variable + "_", lambda name: (name, check_text(env, name))))
    secret_variable = f"{provider.env_prefix}_WEBHOOK_SECRET"
    secret = check_text(env, secret_variable)
    status_default, create_default = provider.default_rates
    return {name: Account(
        name, provider.name, base_url, key, variable_name,
        _rate(env, STATUS_RATE_VARIABLE, name, None, status_default),
        _rate(env, SUBMIT_RATE_VARIABLE, name, None, create_default),
        secret, secret_variable, "environment")
        for name, (variable_name, key) in keys.items()
        if key or (name == DEFAULT_ACCOUNT and keyless_default)}


def read_accounts_file(path: Path, env: Mapping[str, str],
                       allow_insecure_http: bool = False) -> dict[str, Account]:
    """The accounts `path` defines, keys read from the variables it names; a ConfigError of
    one line naming the file, the account and the field for anything wrong (never a value
    that may be a secret: only the names of fields and variables)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read "
                          f"({exc.strerror or type(exc).__name__})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ConfigError(f"{path}: is not UTF-8 text (line {line})") from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # says what and where (line, column), no content
        raise ConfigError(f"{path}: is not valid TOML: {exc}") from None
    for key, value in document.items():
        if key == "accounts":
            continue
        if _secret_like(key, value):
            raise ConfigError(f"{path}: {key[:64]}: {_KEYS_NEVER}")
        what = f"table [{key[:64]}]" if isinstance(value, dict) else f"setting {key[:64]!r}"
        raise ConfigError(f"{path}: unknown {what} (allowed: [accounts.NAME] tables)")
    tables = document.get("accounts", {})
    if not isinstance(tables, dict):
        raise ConfigError(f"{path}: accounts must be tables, one per account "
                          "([accounts.NAME] with provider, api_key_env, ...)")
    return {name: _file_account(path, name, table, env, allow_insecure_http)
            for name, table in tables.items()}


def _file_account(path: Path, name: str, table: Any, env: Mapping[str, str],
                  allow_insecure_http: bool) -> Account:
    """One `[accounts.NAME]` table, checked field by field."""
    try:
        validate_account(name)
    except InvalidIntent as exc:
        raise ConfigError(f"{path}: [accounts] {name[:64]!r}: {exc}") from None
    at = f"{path}: [accounts.{name}]"
    if not isinstance(table, dict):
        raise ConfigError(f"{at}: must be a table of fields (provider, api_key_env, ...), "
                          "not a single value (not shown)")
    # the provider first (its own fields are allowed too), without reading anything else
    named = table.get("provider", registry.DEFAULT_PROVIDER)
    provider = (_file_provider(at, named) if isinstance(named, str)
                and _PROVIDER_WORD.fullmatch(named) else None)
    own: Mapping[str, AccountOption] = getattr(provider, "account_options", {}) or {}
    key_setting: str = getattr(provider, "key_setting", "api_key_env")
    allowed = (*FILE_FIELDS, *own, *((key_setting,) if key_setting not in FILE_FIELDS else ()))
    for key, value in table.items():  # a key written into the file first: the worst mistake
        if key not in allowed and _secret_like(key, value):
            never = _SECRETS_NEVER if "webhook" in key.lower() else _KEYS_NEVER
            raise ConfigError(f"{at} {key[:64]}: {never} (the value is not shown)")
    provider = _file_provider(at, named)
    for key in table:
        if key not in allowed:
            near = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean {near[0]}? " if near else ""
            raise ConfigError(f"{at} {key[:64]}: unknown field ({hint}allowed for "
                              f"{provider.title}: {', '.join(allowed)})")
    options = {field_name: _file_option(at, field_name, spec, table.get(field_name),
                                        allow_insecure_http)
               for field_name, spec in own.items()}
    options = {k: v for k, v in options.items() if v != ""}  # optional fields left unset
    option_secrets = {field_name: _file_secret(at, field_name, env, options[field_name])
                      for field_name, spec in own.items()
                      if spec.kind == "secret_env" and field_name in options}
    if key_setting != "api_key_env":
        if "api_key_env" in table:
            raise ConfigError(f"{at} api_key_env: a {provider.title} account has no key "
                              f"variable; it names its credentials with {key_setting}")
        if key_setting not in table:
            raise ConfigError(f"{at} {key_setting}: missing; a {provider.title} account names "
                              f"its credentials with {key_setting}")
        key_env = ""
        credential = _file_option(at, key_setting, AccountOption("path"), table[key_setting],
                                  allow_insecure_http)
    elif "api_key_env" not in table:
        raise ConfigError(
            f"{at} api_key_env: missing; every account in the file names the environment "
            f"variable that holds its key (like api_key_env = "
            f"\"{provider.env_prefix}_API_KEY_{name.upper()}\", then export it)")
    else:
        key_env = _variable_name(at, "api_key_env", table["api_key_env"], _KEYS_NEVER)
        credential = _file_secret(at, "api_key_env", env, key_env)
    default_base = _default_base_url(provider, options)
    base = table.get("base_url", default_base)
    if not isinstance(base, str):
        raise ConfigError(f"{at} base_url: must be a string (like base_url = "
                          f"\"{default_base}\")")
    try:
        base = check_base_url(base, allow_insecure_http, name="the URL",
                              key_name=f"the credential {key_setting} names",
                              example=default_base)
    except ConfigError as exc:
        raise ConfigError(f"{at} base_url: {exc}") from None
    on_unknown = table.get("on_unknown_create", "park")
    if on_unknown not in UNKNOWN_CREATE_CHOICES:
        raise ConfigError(f"{at} on_unknown_create: must be \"park\" (the default: an unknown "
                          f"create waits for an operator) or \"resend\" (sent again: may bill "
                          f"twice)")
    min_poll = table.get("min_poll_s")
    if min_poll is not None and (isinstance(min_poll, bool)
                                 or not isinstance(min_poll, int | float)
                                 or not math.isfinite(min_poll) or not 0.01 <= min_poll <= 3600):
        raise ConfigError(f"{at} min_poll_s: must be a number of seconds from 0.01 to 3600, "
                          f"without quotes (like min_poll_s = 10)")
    timing = _file_timing(at, table)
    secret_env = ""
    if "webhook_secret_env" in table:
        secret_env = _variable_name(at, "webhook_secret_env", table["webhook_secret_env"],
                                    _SECRETS_NEVER)
    status_default, create_default = provider.default_rates
    return Account(
        name, provider.name, base, credential, key_env,
        _rate(env, STATUS_RATE_VARIABLE, name, _file_rate(at, "status_rate_per_min", table),
              status_default),
        _rate(env, SUBMIT_RATE_VARIABLE, name, _file_rate(at, "submit_rate_per_min", table),
              create_default),
        _file_secret(at, "webhook_secret_env", env, secret_env) if secret_env else "",
        secret_env, "file", _file_webhook_url(at, table, allow_insecure_http), options,
        on_unknown, None if min_poll is None else float(min_poll), option_secrets,
        parse_account_spend(at, table, getattr(provider, "cost_units", None),
                            provider.rules.takes_model), timing)


def _file_timing(at: str, table: Mapping[str, Any]) -> AccountTiming:
    """The account's poll schedule settings; a refusal names the field and what it takes."""
    schedule = table.get("poll_schedule", "learned")
    if schedule not in POLL_SCHEDULES:
        raise ConfigError(f"{at} poll_schedule: must be \"learned\" (the default: reads "
                          f"planned from the model's render times) or \"fixed\"")

    def number(name: str, default: float, low: float, high: float, example: str) -> float:
        value = table.get(name, default)
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not math.isfinite(value) or not low <= value <= high):
            raise ConfigError(f"{at} {name}: must be a number from {low:g} to {high:g}, "
                              f"without quotes (like {name} = {example})")
        return float(value)

    return AccountTiming(schedule,
                         number("detect_p95_s", DEFAULT_DETECT_P95_S, 0.1, 3600, "5"),
                         number("overdue_factor", DEFAULT_OVERDUE_FACTOR, 1, 100, "2"))


def _default_base_url(provider: Provider, options: Mapping[str, str]) -> str:
    """The provider's public URL, its own fields filled in where it names them
    (`https://{location}-aiplatform.googleapis.com`)."""
    base: str = provider.default_base_url
    try:
        return base.format_map(options) if "{" in base else base
    except (KeyError, ValueError, IndexError):
        return base


_OPTION_TEXT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,199}")


def _file_option(at: str, field_name: str, spec: AccountOption, value: Any,
                 allow_insecure_http: bool) -> str:
    """One of a provider's own fields (or its credential file), checked by its kind."""
    example = f" (like {field_name} = \"{spec.example}\")" if spec.example else ""
    if value is None:
        if spec.default is None:
            raise ConfigError(f"{at} {field_name}: missing; every account of this provider "
                              f"names it{example}")
        return spec.default
    if spec.kind == "secret_env":
        return _variable_name(at, field_name, value,
                              f'secrets never go in the file: set {field_name} = "NAME" and '
                              f'export NAME')
    if spec.kind == "seconds":
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not math.isfinite(value) or not 1 <= value <= 86400):
            raise ConfigError(f"{at} {field_name}: must be a number of seconds from 1 to "
                              f"86400, without quotes (like {field_name} = "
                              f"{spec.example or 600})")
        return f"{float(value):g}"
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{at} {field_name}: must be a non-empty string{example}")
    value = value.strip()
    if spec.kind == "url":
        try:
            return check_base_url(value, allow_insecure_http, name="the URL",
                                  key_name="the account's credential",
                                  example=spec.example or "https://...")
        except ConfigError as exc:
            raise ConfigError(f"{at} {field_name}: {exc}") from None
    if spec.kind == "path":
        path = Path(value).expanduser()
        try:
            with path.open("rb"):
                pass
        except OSError as exc:
            raise ConfigError(f"{at} {field_name}: {path} cannot be read "
                              f"({exc.strerror or type(exc).__name__})") from None
        return str(path)
    if not _OPTION_TEXT.fullmatch(value):
        raise ConfigError(f"{at} {field_name}: must be a name of letters, digits, '.', '_', "
                          f"':' or '-' (at most 200){example}")
    return str(value)


def _file_provider(at: str, value: Any) -> Provider:
    known = ", ".join(registry.names())
    if not isinstance(value, str) or not _PROVIDER_WORD.fullmatch(value):
        raise ConfigError(f"{at} provider: must be a provider's name (known: {known}; the "
                          "value is not shown)")
    try:
        return registry.load(value)
    except ConfigError as exc:  # the registry's own words: unknown provider 'x' (known: ...)
        raise ConfigError(f"{at} provider: {exc}") from None


def _variable_name(at: str, field_name: str, value: Any, never: str) -> str:
    """`value` if it can be an environment variable's name, else a ConfigError that never
    shows it (a value that is not a name is most likely the key itself)."""
    if not isinstance(value, str):
        raise ConfigError(f"{at} {field_name}: must be a string, the name of an environment "
                          f"variable (like {field_name} = \"NAME\")")
    if not _ENV_NAME.fullmatch(value):
        raise ConfigError(f"{at} {field_name}: is not an environment variable's name "
                          f"(upper-case letters, digits and _, not starting with a digit; "
                          f"the value is not shown); {never}")
    return value


def _file_secret(at: str, field_name: str, env: Mapping[str, str], variable: str) -> str:
    """The value of the variable a field names (empty when unset), checked by `check_text`."""
    try:
        return check_text(env, variable)
    except ConfigError as exc:
        raise ConfigError(f"{at} {field_name}: {exc}") from None


def _file_rate(at: str, field_name: str, table: Mapping[str, Any]) -> float | None:
    value = table.get(field_name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{at} {field_name}: must be a number of calls a minute, without "
                          f"quotes (like {field_name} = 3000)")
    if not (math.isfinite(value) and value >= 0.001):
        raise ConfigError(f"{at} {field_name}: must be a positive number of calls a minute "
                          f"(at least 0.001; like {field_name} = 3000), not {value!r}")
    return float(value)


def _secret_like(key: str, value: Any) -> bool:
    """Whether a field that is not an allowed one holds a key: its name says so (unless it
    is a `..._env` field naming a variable: a typo of an allowed one), or a value in it looks
    like one."""
    named = bool(_SECRET_NAME.search(key.lower()))
    if named and key.lower().endswith("_env") and isinstance(value, str) \
            and _ENV_NAME.fullmatch(value):
        named = False
    return named or _holds_secret(value)


def _holds_secret(value: Any) -> bool:
    """Whether `value`, or a string or name inside it, looks like a key: a word of 16
    characters or more, without spaces or ://, mixing digits with letters."""
    if isinstance(value, dict):
        return any(_SECRET_NAME.search(str(k).lower()) or _holds_secret(v)
                   for k, v in value.items())
    if isinstance(value, list):
        return any(_holds_secret(v) for v in value)
    if not isinstance(value, str):
        return False
    return (len(value) >= 16 and not any(ch.isspace() for ch in value) and "://" not in value
            and any(ch.isdigit() for ch in value) and any(ch.isalpha() for ch in value))


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


def _rates(env: Mapping[str, str], name: str, accounts: Mapping[str, Account],
           kind: Literal["status", "submit"]) -> dict[str, float]:
    """Each account's rate, and `default`'s when no account is called so (`name` alone, as
    before accounts had a provider); absent: unlimited."""
    rates = {a.name: (a.status_rate_per_min if kind == "status" else a.submit_rate_per_min)
             for a in accounts.values()}
    if DEFAULT_ACCOUNT not in rates:
        rates[DEFAULT_ACCOUNT] = _rate(env, name, DEFAULT_ACCOUNT, None)
    return {a: r for a, r in rates.items() if r is not None}


def _rate(env: Mapping[str, str], name: str, account: str, own: float | None,
          default: float | None = None) -> float | None:
    """An account's rate: its own (from the file), else `NAME_<ACCOUNT>`, else `NAME`, else
    its provider's published limit (`default`); None: unlimited."""
    if own is not None:
        return own
    for variable in (f"{name}_{account.upper()}", name):
        if env.get(variable, "").strip():
            return _float(env, variable, 0.0, minimum=0.001)
    return default


def _file_webhook_url(at: str, table: Mapping[str, Any], allow_insecure_http: bool) -> str | None:
    """`webhook_url`, checked: https:// (plain http:// only to loopback, or when insecure
    http is allowed), no credentials, query or fragment (a secret never goes in the file)."""
    value = table.get("webhook_url")
    if value is None:
        return None
    example = "https://hooks.example.com/webhooks/replicate"
    if not isinstance(value, str):
        raise ConfigError(f"{at} webhook_url: must be a string (like webhook_url = "
                          f"\"{example}\")")
    try:
        return check_base_url(value, allow_insecure_http, name="the URL",
                              key_name="webhook_secret_env", example=example)
    except ConfigError as exc:
        raise ConfigError(f"{at} webhook_url: {exc}") from None


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
