"""VIDPOLL_TRUSTED_PROXIES: addresses and networks, or one line naming the variable."""

from __future__ import annotations

import ipaddress

import pytest

from vidpoll.config import Settings
from vidpoll.errors import ConfigError


def test_addresses_and_networks_are_read() -> None:
    settings = Settings.from_env({"VIDPOLL_TRUSTED_PROXIES": " 10.0.0.7, 10.1.0.0/16 ,fd00::/8,"})
    assert settings.trusted_proxies == (ipaddress.ip_network("10.0.0.7/32"),
                                        ipaddress.ip_network("10.1.0.0/16"),
                                        ipaddress.ip_network("fd00::/8"))
    assert Settings.from_env({}).trusted_proxies == ()  # nobody's header is believed


@pytest.mark.parametrize("entry", ["nginx.internal", "http://10.0.0.7", "10.0.0.300", "10/8x"])
def test_anything_else_is_one_line_naming_the_variable(entry: str) -> None:
    with pytest.raises(ConfigError, match=r"^VIDPOLL_TRUSTED_PROXIES: .* is not an IP address"):
        Settings.from_env({"VIDPOLL_TRUSTED_PROXIES": f"10.0.0.7, {entry}"})
