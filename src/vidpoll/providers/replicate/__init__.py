"""Replicate: predictions on Replicate's hosted models (client, answers' meaning, webhooks).

`PROVIDER` is what `vidpoll.providers.registry.load("replicate")` returns. Its parts are
imported when first used: a command that reads no answer never loads the HTTP client.

An account names its token's variable in the accounts file, as Replicate's own tools call it:
`provider = "replicate"`, `api_key_env = "REPLICATE_API_TOKEN"`. The `REPLICATE_` prefix
(`REPLICATE_API_KEY`, `REPLICATE_BASE_URL`, ...) serves only an installation without an
accounts file whose default provider is Replicate.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from vidpoll.providers.base import ProviderOptions

if TYPE_CHECKING:
    from vidpoll.providers.base import Client, Rules, Webhooks

DEFAULT_BASE_URL = "https://api.replicate.com"
CREATES_PER_MIN = 600.0
"""Replicate's published limit on creating predictions (docs/topics/predictions/rate-limits)."""
CALLS_PER_MIN = 3000.0
"""Its limit on every other endpoint: status reads and the list a look-up pages through."""
_NO_OPTIONS = ProviderOptions()


class ReplicateProvider:
    """Replicate behind the provider interface (`vidpoll.providers.base.Provider`)."""

    name = "replicate"
    title = "Replicate"
    default_base_url = DEFAULT_BASE_URL
    env_prefix = "REPLICATE"
    """The settings without a config file: REPLICATE_API_KEY, REPLICATE_BASE_URL,
    REPLICATE_API_KEY_<ACCOUNT>, REPLICATE_WEBHOOK_SECRET (Replicate's own tools read
    REPLICATE_API_TOKEN: name it with `api_key_env` in the accounts file)."""
    default_rates: tuple[float | None, float | None] = (CALLS_PER_MIN, CREATES_PER_MIN)
    """(status reads, creates) a minute: the published limits (a look-up's list calls are
    paced with the reads, whose 3,000 they share)."""
    cost_units: Mapping[str, str] = MappingProxyType({
        "predict_second": "seconds a prediction ran (`metrics.predict_time`), what Replicate "
                          "bills models priced by time; not models priced per output"})
    """What `RULES.cost` may name; an `aborted` prediction costs 0."""

    @property
    def rules(self) -> Rules:
        from vidpoll.providers.replicate.rules import RULES
        return RULES

    @property
    def webhooks(self) -> Webhooks | None:
        from vidpoll.providers.replicate.webhooks import WEBHOOKS
        return WEBHOOKS

    def client(self, base_url: str, api_key: str, *, timeout_s: float,
               max_connections: int, options: ProviderOptions = _NO_OPTIONS) -> Client:
        """A client for one account; `options.webhook_url` goes with every create."""
        from vidpoll.providers.replicate.client import ReplicateClient
        return ReplicateClient(base_url, api_key, timeout_s=timeout_s,
                               max_connections=max_connections, options=options)

    def __repr__(self) -> str:
        return "<provider replicate>"


PROVIDER = ReplicateProvider()
