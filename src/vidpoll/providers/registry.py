"""Providers by name: `vidpoll/providers/<name>/__init__.py` defines `PROVIDER`.

A provider's modules are imported only when something asks for it by name (an account's
configuration, `migrate` writing every provider's words): the core never names one, and a
command that needs none starts without them. `register` adds one from elsewhere (a test's toy
provider, a plugin).
"""

from __future__ import annotations

import importlib
import pkgutil
import re
from typing import Any

from vidpoll.errors import ConfigError
from vidpoll.models import LOCAL_TERMINAL_STATES, PENDING
from vidpoll.providers.base import Provider

DEFAULT_PROVIDER = "sume"
"""The provider of an account that names none: the seed's, so a seed installation's settings
(`SUME_API_KEY`, `SUME_BASE_URL`) keep working unchanged."""

_NAME = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
_extra: dict[str, Provider] = {}
_loaded: dict[str, Provider] = {}


def register(provider: Provider) -> None:
    """Make `provider` known by its name (tests, plugins); a folder's own wins no ties."""
    if not _NAME.match(provider.name):
        raise ValueError(f"provider name {provider.name!r}: lower-case letters, digits, _")
    _extra[provider.name] = provider


def unregister(name: str) -> None:
    """Forget a provider `register` added (tests)."""
    _extra.pop(name, None)
    _loaded.pop(name, None)


def names() -> list[str]:
    """Every provider there is: the folders under vidpoll/providers, and registered ones."""
    here = importlib.import_module(__package__ or "vidpoll.providers")
    folders = [m.name for m in pkgutil.iter_modules(here.__path__) if m.ispkg]
    return sorted(set(folders) | set(_extra))


def load(name: str) -> Provider:
    """The provider called `name`; ConfigError naming the known ones when there is none."""
    if name in _extra:
        return _extra[name]
    if name in _loaded:
        return _loaded[name]
    known = names()
    if not _NAME.match(name) or name not in known:
        raise ConfigError(f"unknown provider {name[:40]!r} (known: {', '.join(known)})")
    module = importlib.import_module(f"{__package__}.{name}")
    provider: Provider = module.PROVIDER
    _loaded[name] = provider
    return provider


def job_states() -> tuple[str, ...]:
    """What a job list may be filtered by: pending, finished, every provider's terminal words
    (`state` keeps the provider's own), and vidpoll's own gave_up and not_found."""
    words = {w for name in names() for w in load(name).rules.words}
    return (PENDING, "finished", *sorted(words - LOCAL_TERMINAL_STATES - {PENDING}),
            *sorted(LOCAL_TERMINAL_STATES))


DURATION_KEY_MAX = 64


def duration_key_of(provider: str, payload: dict[str, Any], model: str | None) -> str | None:
    """What of a create request changes how long its render takes (the provider's optional
    `Rules.duration_key`: the clip length, ...), recorded with the intent and its job so that
    learned schedules group renders by it; None when the provider knows none, or its rules
    fail on this request (a key is a refinement: never a reason to refuse one)."""
    try:
        rules = load(provider).rules
    except ConfigError:
        return None
    return rules_duration_key(rules, payload, model)


def rules_duration_key(rules: object, payload: dict[str, Any],
                       model: str | None) -> str | None:
    """`duration_key_of` with the provider's rules at hand."""
    try:
        keyed = getattr(rules, "duration_key", None)
        key = keyed(payload, model) if keyed is not None else None
    except Exception:  # an optional helper of the provider must not block a submit
        return None
    return key[:DURATION_KEY_MAX] if isinstance(key, str) and key else None
