"""Settings from the environment (and CLI flags), checked once with clear errors."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import platformdirs

from vidpoll.errors import ConfigError
from vidpoll.policy import PollPolicy

DEFAULT_SUME_BASE_URL = "https://api.sume.com"
DEFAULT_HTTP_TIMEOUT_S = 15.0
DEFAULT_LEASE_MARGIN_S = 10.0
DEFAULT_MAX_ACTIVE = 50
DEFAULT_FIRST_POLL_S = 15.0


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
    home: Path = field(default_factory=lambda: Path(platformdirs.user_data_dir("vidpoll")))
    policy: PollPolicy = field(default_factory=PollPolicy)
    max_active: int | None = DEFAULT_MAX_ACTIVE
    first_poll_s: float = DEFAULT_FIRST_POLL_S

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read DATABASE_URL, SUME_*, VIDPOLL_* (see README for the list)."""
        env = os.environ if env is None else env
        base = env.get("SUME_BASE_URL", "").strip() or DEFAULT_SUME_BASE_URL
        if not base.startswith(("http://", "https://")):
            raise ConfigError(f"SUME_BASE_URL={base!r} must start with http:// or https://")
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
        return cls(
            database_url=env.get("DATABASE_URL", "").strip() or None,
            sume_base_url=base,
            sume_api_key=env.get("SUME_API_KEY", "").strip(),
            http_timeout_s=_float(env, "VIDPOLL_HTTP_TIMEOUT", DEFAULT_HTTP_TIMEOUT_S,
                                  minimum=0.1),
            home=Path(home) if home else Path(platformdirs.user_data_dir("vidpoll")),
            policy=policy,
            max_active=_max_active(env),
            first_poll_s=_float(env, "VIDPOLL_FIRST_POLL_S", DEFAULT_FIRST_POLL_S),
        )

    def require_api_key(self) -> str:
        """The API key, or a ConfigError saying how to set it."""
        if not self.sume_api_key:
            raise ConfigError("SUME_API_KEY is not set; export your Sume API key first")
        return self.sume_api_key
