"""The clients of configured accounts: each account's provider (found by name in the
registry) builds its client for the account's base URL and key. The one place the core turns
an account into HTTP; it never names a provider."""

from __future__ import annotations

from collections.abc import Mapping

from vidpoll.config import Settings, key_variable
from vidpoll.providers import registry
from vidpoll.providers.base import Client, Provider, ProviderOptions


def provider_of(settings: Settings, account: str) -> Provider:
    """The provider of `account` (ConfigError for an unknown account)."""
    found = settings.accounts.get(account)
    name = found.provider if found is not None else registry.DEFAULT_PROVIDER
    return registry.load(name)


def client_for(settings: Settings, account: str, *, timeout_s: float | None = None,
               max_connections: int = 100) -> Client:
    """A client for `account` with its key (ConfigError naming the variable when it has none),
    to be entered with `async with`."""
    found = settings.account(account)
    return registry.load(found.provider).client(
        found.base_url, found.api_key,
        timeout_s=settings.http_timeout_s if timeout_s is None else timeout_s,
        max_connections=max_connections,
        options=ProviderOptions(webhook_url=found.webhook_url, extra=found.options,
                                secrets=found.option_secrets))


def media_auth(settings: Settings) -> tuple[dict[str, Mapping[str, str]],
                                            dict[str, frozenset[str]]]:
    """By account with a key: the headers its media downloads carry, and the provider's file
    hosts that get them besides the API origin (for `Downloader.from_settings`)."""
    headers: dict[str, Mapping[str, str]] = {}
    hosts: dict[str, frozenset[str]] = {}
    for name, account in settings.accounts.items():
        if account.api_key:
            client = client_for(settings, name)
            headers[name], hosts[name] = client.media_headers(), client.media_auth_hosts()
    return headers, hosts


def title_of(settings: Settings, account: str) -> str:
    """The provider's name as people write it ("Sume"), for messages about `account`."""
    return provider_of(settings, account).title


def key_variable_of(settings: Settings, account: str) -> str:
    """The environment variable that holds the key of `account`."""
    found = settings.accounts.get(account)
    return found.api_key_env if found is not None and found.api_key_env else key_variable(
        account)


def base_url_setting(settings: Settings, account: str) -> str:
    """Where the base URL of `account` is set, as a message names it."""
    found = settings.accounts.get(account)
    if found is not None and found.source == "file":
        return f"base_url of [accounts.{account}] in {settings.config_file}"
    return f"{provider_of(settings, account).env_prefix}_BASE_URL"
