"""Luma: Dream Machine generations (client, answers' meaning, callbacks).

`PROVIDER` is what `vidpoll.providers.registry.load("luma")` returns. Its parts are imported
when first used: a command that reads no answer never loads the HTTP client.

An account names its key's variable as Luma's own tools call it: `provider = "luma"`,
`api_key_env = "LUMAAI_API_KEY"`; `submit --model ray-2` names the model. Luma accounts
are read from the accounts file only; the `LUMAAI_` prefix names the variables vidpoll's
messages suggest (`LUMAAI_API_KEY_<ACCOUNT>`). Luma's callbacks are unsigned:
`/webhooks/luma` needs no secret, and a delivery only makes its job due now.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from vidpoll.providers.base import ProviderOptions

if TYPE_CHECKING:
    from vidpoll.providers.base import Client, Rules, Webhooks

DEFAULT_BASE_URL = "https://api.lumalabs.ai/dream-machine/v1"
CREATES_PER_MIN = 20.0
"""Luma's published limit on video creates for an account on its "Build" tier ("Create API
requests/min", Ray: 20; with 10 concurrent generations: docs.lumalabs.ai/docs/rate-limits).
A "Scale" account's is higher: `submit_rate_per_min` in its accounts table."""
_NO_OPTIONS = ProviderOptions()


class LumaProvider:
    """Luma's Dream Machine behind the provider interface (`vidpoll.providers.base.Provider`)."""

    name = "luma"
    title = "Luma"
    default_base_url = DEFAULT_BASE_URL
    env_prefix = "LUMAAI"
    """The prefix of the variables vidpoll's messages suggest (LUMAAI_API_KEY_<ACCOUNT>);
    LUMAAI_API_KEY is the variable Luma's SDKs read: name it with `api_key_env`."""
    default_rates: tuple[float | None, float | None] = (None, CREATES_PER_MIN)
    """(status reads, creates) a minute: Luma publishes no limit on reads (nor on the list a
    look-up pages through), and 20 video creates a minute on its Build tier."""

    @property
    def rules(self) -> Rules:
        from vidpoll.providers.luma.rules import RULES
        return RULES

    @property
    def webhooks(self) -> Webhooks | None:
        from vidpoll.providers.luma.webhooks import WEBHOOKS
        return WEBHOOKS

    def client(self, base_url: str, api_key: str, *, timeout_s: float,
               max_connections: int, options: ProviderOptions = _NO_OPTIONS) -> Client:
        """A client for one account; `options.webhook_url` is every create's `callback_url`."""
        from vidpoll.providers.luma.client import LumaClient
        return LumaClient(base_url, api_key, timeout_s=timeout_s,
                          max_connections=max_connections, options=options)

    def __repr__(self) -> str:
        return "<provider luma>"


PROVIDER = LumaProvider()
