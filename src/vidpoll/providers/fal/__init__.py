"""fal: requests on fal.ai's queue (client, answers' meaning, webhooks).

`PROVIDER` is what `vidpoll.providers.registry.load("fal")` returns. Its parts are imported
when first used: a command that reads no answer never loads the HTTP client.

An account names its key's variable as fal's own tools call it: `provider = "fal"`,
`api_key_env = "FAL_KEY"` (`key_id:key_secret`). Its own fields: `platform_url` (fal's
platform API, whose request history reconciles an unanswered create; default
https://api.fal.ai) and `jwks_url` (where fal publishes its webhook keys). fal accounts are read
from the accounts file only; the `FAL_` prefix names the variables vidpoll's messages suggest
(`FAL_API_KEY_<ACCOUNT>`, `FAL_WEBHOOK_SECRET`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from vidpoll.providers.base import AccountOption, ProviderOptions

if TYPE_CHECKING:
    from vidpoll.providers.base import Client, Rules, Webhooks

DEFAULT_BASE_URL = "https://queue.fal.run"
DEFAULT_PLATFORM_URL = "https://api.fal.ai"
DEFAULT_JWKS_URL = "https://rest.fal.ai/.well-known/jwks.json"
"""Where fal publishes its webhook keys (implementations that checked fal's docs in 2026 use
`rest.fal.ai`; older pages said `rest.alpha.fal.ai`): an account may name another."""
_NO_OPTIONS = ProviderOptions()


class FalProvider:
    """fal behind the provider interface (`vidpoll.providers.base.Provider`)."""

    name = "fal"
    title = "fal"
    default_base_url = DEFAULT_BASE_URL
    """The queue (creates, status and result reads)."""
    env_prefix = "FAL"
    """The settings without a config file: FAL_API_KEY, FAL_BASE_URL, FAL_API_KEY_<ACCOUNT>,
    FAL_WEBHOOK_SECRET (fal's own tools read FAL_KEY: name it with `api_key_env` in the
    accounts file)."""
    default_rates: tuple[float | None, float | None] = (None, None)
    """fal documents no request-rate limit, only concurrency ("requests are never rejected due
    to concurrency limits": they queue)."""

    @property
    def account_options(self) -> Mapping[str, AccountOption]:
        """`platform_url` (the request history's host: the key goes there too), `jwks_url`
        (fal's webhook keys) and `start_timeout_s` (sent as `X-Fal-Request-Timeout`: fal
        drops a request not started by then, unprocessed; off unless set)."""
        return {
            "platform_url": AccountOption("url", DEFAULT_PLATFORM_URL,
                                          example=DEFAULT_PLATFORM_URL),
            "jwks_url": AccountOption("url", DEFAULT_JWKS_URL, example=DEFAULT_JWKS_URL),
            "start_timeout_s": AccountOption("seconds", "", example="600"),
        }

    @property
    def rules(self) -> Rules:
        from vidpoll.providers.fal.rules import RULES
        return RULES

    @property
    def webhooks(self) -> Webhooks | None:
        from vidpoll.providers.fal.webhooks import WEBHOOKS
        return WEBHOOKS

    def client(self, base_url: str, api_key: str, *, timeout_s: float,
               max_connections: int, options: ProviderOptions = _NO_OPTIONS) -> Client:
        """A client for one account; `options.webhook_url` goes with every create,
        `options.extra["platform_url"]` is where the request history is read."""
        from vidpoll.providers.fal.client import FalClient
        return FalClient(base_url, api_key, timeout_s=timeout_s,
                         max_connections=max_connections, options=options)

    def __repr__(self) -> str:
        return "<provider fal>"


PROVIDER = FalProvider()
