"""Sume: the provider of the seed document (client, answers' meaning, webhooks, fake).

`PROVIDER` is what `vidpoll.providers.registry.load("sume")` returns. Its parts are imported
when first used: a command that reads no answer never loads the HTTP client.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from vidpoll.providers.base import ProviderOptions

if TYPE_CHECKING:
    from vidpoll.providers.base import Client, Rules, Webhooks

DEFAULT_BASE_URL = "https://api.sume.com"
_NO_OPTIONS = ProviderOptions()


class SumeProvider:
    """Sume behind the provider interface (`vidpoll.providers.base.Provider`)."""

    name = "sume"
    title = "Sume"
    default_base_url = DEFAULT_BASE_URL
    env_prefix = "SUME"
    """The single-account settings without a config file: SUME_API_KEY, SUME_BASE_URL,
    SUME_API_KEY_<ACCOUNT>, SUME_WEBHOOK_SECRET (as the seed and every earlier release)."""
    default_rates: tuple[float | None, float | None] = (None, None)
    """Sume publishes no limits: an account is paced only by what it sets itself."""
    cost_units: Mapping[str, str] = MappingProxyType({
        "credit": "Sume credits, as a status answer's `usage` reports them (`captured`)",
        "usd": "US dollars, as `usage` reports them in the fields Sume's CLI reads "
               "(`captured_amount_usd_micros` or `..._usd_cents`)",
    })
    """What `RULES.cost` may name: credits (bare `usage` amounts) or dollars (the CLI's
    fields); a failure Sume refunded costs 0."""

    @property
    def rules(self) -> Rules:
        from vidpoll.providers.sume.rules import RULES
        return RULES

    @property
    def webhooks(self) -> Webhooks | None:
        from vidpoll.providers.sume.webhooks import WEBHOOKS
        return WEBHOOKS

    def client(self, base_url: str, api_key: str, *, timeout_s: float,
               max_connections: int, options: ProviderOptions = _NO_OPTIONS) -> Client:
        """A client for one account; `options` are ignored (a Sume create carries none)."""
        from vidpoll.providers.sume.client import SumeClient
        return SumeClient(base_url, api_key, timeout_s=timeout_s,
                          max_connections=max_connections)

    def __repr__(self) -> str:
        return "<provider sume>"


PROVIDER = SumeProvider()
