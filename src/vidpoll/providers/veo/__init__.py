"""Google Veo on the Gemini API: long-running operations behind the provider interface.

`PROVIDER` is what `vidpoll.providers.registry.load("veo")` returns. Its parts are imported
when first used. An account names its key's variable as Google's tools call it:
`provider = "veo"`, `api_key_env = "GEMINI_API_KEY"`; `base_url` (default
`https://generativelanguage.googleapis.com`) may point at a gateway that serves the same
`predictLongRunning` shape. No model id is written here: `submit --model` names it (Google
retires Veo model ids often).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING

from vidpoll.providers.base import AccountOption, ProviderOptions

if TYPE_CHECKING:
    from vidpoll.providers.base import Client, Rules, Webhooks

DEFAULT_BASE_URL = "https://generativelanguage.googleapis.com"
_NO_OPTIONS = ProviderOptions()


class VeoProvider:
    """Veo on the Gemini API (`vidpoll.providers.base.Provider`)."""

    name = "veo"
    title = "Veo (Gemini API)"
    default_base_url = DEFAULT_BASE_URL
    env_prefix = "VEO"
    """The settings without a config file (VEO_API_KEY, ...); Google's own tools read
    GEMINI_API_KEY: name it with `api_key_env` in the accounts file."""
    account_options = MappingProxyType({"api_version": AccountOption("text", "v1beta", "v1beta")})
    """The API version in every path (`v1beta`, where the Gemini API serves Veo)."""
    default_rates: tuple[float | None, float | None] = (None, None)
    """Google publishes Veo's limits per model and billing tier, not as one figure: set
    `status_rate_per_min` / `submit_rate_per_min` to the account's own."""

    @property
    def rules(self) -> Rules:
        from vidpoll.providers.veo.rules import RULES
        return RULES

    @property
    def webhooks(self) -> Webhooks | None:
        from vidpoll.providers.veo.webhooks import WEBHOOKS
        return WEBHOOKS

    def client(self, base_url: str, api_key: str, *, timeout_s: float,
               max_connections: int, options: ProviderOptions = _NO_OPTIONS) -> Client:
        """A client for one account."""
        from vidpoll.providers.veo.client import VeoClient
        return VeoClient(base_url, api_key, timeout_s=timeout_s,
                         max_connections=max_connections, options=options)

    def __repr__(self) -> str:
        return "<provider veo>"


PROVIDER = VeoProvider()
