"""Kling: video tasks on Kling AI's API (client, answers' meaning).

`PROVIDER` is what `vidpoll.providers.registry.load("kling")` returns. Its parts are imported
when first used. An account holds two keys: `provider = "kling"`, `api_key_env` naming the
variable of the ACCESS key (the JWT's `iss`) and `secret_key_env` the variable of the SECRET
key (what signs it); `base_url` defaults to Kling's global API root,
https://api-singapore.klingai.com (Kling's "General Information" page: "The API endpoint for
the new system has been updated from https://api.klingai.com to
https://api-singapore.klingai.com. This API is suitable for users whose servers are located
outside of China"; accounts made on the China site use https://api-beijing.klingai.com, their
keys do not work on the other). `submit --model` names the create's path word (`text2video`,
`image2video`, ...).

No webhooks: Kling's callbacks (`callback_url`, "Callback Protocol") carry no documented
signature, so vidpoll neither asks for them nor serves a route; it polls.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from vidpoll.providers.base import AccountOption, ProviderOptions

if TYPE_CHECKING:
    from vidpoll.providers.base import Client, Rules, Webhooks

DEFAULT_BASE_URL = "https://api-singapore.klingai.com"
SECRET_KEY_OPTION = "secret_key_env"
_NO_OPTIONS = ProviderOptions()


class KlingProvider:
    """Kling behind the provider interface (`vidpoll.providers.base.Provider`)."""

    name = "kling"
    title = "Kling"
    default_base_url = DEFAULT_BASE_URL
    """The API root, without `/v1` (a trailing `/v1` is dropped)."""
    env_prefix = "KLING"
    """The prefix of the variables vidpoll's messages suggest (KLING_API_KEY_<ACCOUNT>, the
    access key); the secret key's variable is named by `secret_key_env`."""
    default_rates: tuple[float | None, float | None] = (None, None)
    """Kling documents concurrency per resource pack (1302/1303 answers), no request rate."""
    cost_units: Mapping[str, str] = MappingProxyType({
        "unit": "Kling resource-package units, a task's `final_unit_deduction`"})
    """What `RULES.cost` may name (a task paid from the account's balance has no figure)."""
    webhooks: Webhooks | None = None
    """Kling's callbacks are not documented as signed: none are served (a hint anyone could
    forge would only make reads due; polling needs none)."""

    @property
    def account_options(self) -> Mapping[str, AccountOption]:
        """`secret_key_env`: the variable holding the account's secret key (required; its value
        reaches the client in `ProviderOptions.secrets`, redacted from logs)."""
        return {SECRET_KEY_OPTION: AccountOption("secret_env", default=None,
                                                 example="KLING_SECRET_KEY")}

    @property
    def rules(self) -> Rules:
        from vidpoll.providers.kling.rules import RULES
        return RULES

    def client(self, base_url: str, api_key: str, *, timeout_s: float,
               max_connections: int, options: ProviderOptions = _NO_OPTIONS) -> Client:
        """A client for one account: `api_key` is the access key,
        `options.secrets["secret_key_env"]` the secret key."""
        from vidpoll.providers.kling.client import KlingClient
        return KlingClient(base_url, api_key, timeout_s=timeout_s,
                           max_connections=max_connections, options=options)

    def __repr__(self) -> str:
        return "<provider kling>"


PROVIDER = KlingProvider()
