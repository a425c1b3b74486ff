"""Google Veo on Vertex AI (the Gemini Enterprise Agent Platform): the same operations as on
the Gemini API over Vertex's surface.

`PROVIDER` is what `vidpoll.providers.registry.load("vertex")` returns. An account names its
Google Cloud project and location and a service-account key file, from which the client mints
OAuth2 access tokens (google-auth; the token endpoint is the key file's `token_uri`):
`provider = "vertex"`, `project = "my-project"`, `location = "us-central1"`,
`credentials_file = "/etc/vidpoll/vertex-sa.json"`; `base_url` defaults to
`https://{location}-aiplatform.googleapis.com`. Its answers mean what Veo's do
(`vidpoll.providers.veo.rules`); a status read is a POST to `…:fetchPredictOperation`, and
videos come back as bytes in the operation or as objects in the user's Cloud Storage bucket.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING

from vidpoll.providers.base import AccountOption, ProviderOptions

if TYPE_CHECKING:
    from vidpoll.providers.base import Client, Rules, Webhooks

DEFAULT_BASE_URL = "https://{location}-aiplatform.googleapis.com"
DEFAULT_LOCATION = "us-central1"
DEFAULT_API_VERSION = "v1"
_NO_OPTIONS = ProviderOptions()


class VertexProvider:
    """Veo on Vertex AI (`vidpoll.providers.base.Provider`)."""

    name = "vertex"
    title = "Veo (Vertex AI)"
    default_base_url = DEFAULT_BASE_URL
    env_prefix = "VERTEX"
    key_setting = "credentials_file"
    """The account's credential is a service-account key file (its path is the `api_key` the
    client gets), not a key in a variable."""
    account_options = MappingProxyType({
        "project": AccountOption("text", None, "my-project"),
        "location": AccountOption("text", DEFAULT_LOCATION, DEFAULT_LOCATION),
        "api_version": AccountOption("text", DEFAULT_API_VERSION, DEFAULT_API_VERSION),
    })
    default_rates: tuple[float | None, float | None] = (None, None)
    """Vertex AI's quotas are per project, model and region (Veo 2: 10 requests a minute):
    set `status_rate_per_min` / `submit_rate_per_min` to the project's own."""

    @property
    def rules(self) -> Rules:
        from vidpoll.providers.veo.rules import RULES
        return RULES

    @property
    def webhooks(self) -> Webhooks | None:
        return None  # Vertex AI documents no webhooks for Veo's operations

    def client(self, base_url: str, api_key: str, *, timeout_s: float,
               max_connections: int, options: ProviderOptions = _NO_OPTIONS) -> Client:
        """A client for one account; `api_key` is the service-account key file's path."""
        from vidpoll.providers.vertex.client import VertexClient
        return VertexClient(base_url, api_key, timeout_s=timeout_s,
                            max_connections=max_connections, options=options)

    def __repr__(self) -> str:
        return "<provider vertex>"


PROVIDER = VertexProvider()
