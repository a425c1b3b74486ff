"""Runway: tasks on Runway's developer API (client, answers' meaning; no webhooks).

`PROVIDER` is what `vidpoll.providers.registry.load("runway")` returns. Its parts are imported
when first used. An account names its key's variable as Runway's own tools call it:
`provider = "runway"`, `api_key_env = "RUNWAYML_API_SECRET"`; `base_url` defaults to
`https://api.dev.runwayml.com`; `api_version` (default `2024-11-06`, the version runwayml
5.24 pins) is sent as `X-Runway-Version` on every call. `submit --model` names the create
endpoint (`image_to_video`, `text_to_video`, `generate/video`, ...); the request body, with
Runway's own `model` field, is sent unchanged. Runway accounts are read from the accounts
file only; the `RUNWAYML_` prefix names the variables vidpoll's messages suggest
(`RUNWAYML_API_KEY_<ACCOUNT>`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from vidpoll.providers.base import AccountOption, ProviderOptions

if TYPE_CHECKING:
    from vidpoll.providers.base import Client, Rules, Webhooks

DEFAULT_BASE_URL = "https://api.dev.runwayml.com"
DEFAULT_API_VERSION = "2024-11-06"
_NO_OPTIONS = ProviderOptions()


class RunwayProvider:
    """Runway behind the provider interface (`vidpoll.providers.base.Provider`)."""

    name = "runway"
    title = "Runway"
    default_base_url = DEFAULT_BASE_URL
    env_prefix = "RUNWAYML"
    """The prefix of the variables vidpoll's messages suggest; Runway's own tools read
    RUNWAYML_API_SECRET: name it with `api_key_env` in the accounts file."""
    account_options = MappingProxyType({
        "api_version": AccountOption("text", default=DEFAULT_API_VERSION,
                                     example=DEFAULT_API_VERSION)})
    """`api_version`: sent as `X-Runway-Version` (required by Runway; a wrong one answers 400)."""
    default_rates: tuple[float | None, float | None] = (None, None)
    """Runway: "No maximum requests-per-minute limit" (its limits are per-model concurrency,
    beyond which tasks wait THROTTLED, and a daily generation cap, answered 429 on create)."""
    cost_units: Mapping[str, str] = MappingProxyType({
        "credit": "Runway credits, an ended task's `cost.credits` (0 when refunded)"})
    """What `RULES.cost` may name."""

    @property
    def rules(self) -> Rules:
        from vidpoll.providers.runway.rules import RULES
        return RULES

    @property
    def webhooks(self) -> Webhooks | None:
        return None  # Runway has no native webhooks: polling alone

    def client(self, base_url: str, api_key: str, *, timeout_s: float,
               max_connections: int, options: ProviderOptions = _NO_OPTIONS) -> Client:
        """A client for one account; `options.extra["api_version"]` is its X-Runway-Version."""
        from vidpoll.providers.runway.client import RunwayClient
        return RunwayClient(base_url, api_key, timeout_s=timeout_s,
                            max_connections=max_connections, options=options)

    def __repr__(self) -> str:
        return "<provider runway>"


PROVIDER = RunwayProvider()
