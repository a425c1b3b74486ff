"""The fetch guard's pure rules (which addresses and URLs an account may reach), its settings,
and where hooks are imported from. No sockets, no database."""

from __future__ import annotations

import ipaddress
import sys
from pathlib import Path

import pytest
from yarl import URL

from vidpoll.config import Settings, hook_path
from vidpoll.deliver import load_hook
from vidpoll.errors import ConfigError
from vidpoll.fetch_guard import AccountRules, FetchGuard, FetchPolicy, address_rule

REFUSED = {
    "127.0.0.1": "loopback", "127.8.9.10": "loopback", "::1": "loopback",
    "169.254.169.254": "link-local", "fe80::1": "link-local",
    "10.1.2.3": "private", "172.16.0.1": "private", "192.168.1.1": "private",
    "fc00::1": "private", "100.64.0.1": "shared (CGNAT)", "0.0.0.0": "unspecified",
    "::": "unspecified", "224.0.0.1": "multicast", "ff02::1": "multicast",
    "240.0.0.1": "reserved", "192.0.2.1": "private",  # TEST-NET-1: private to Python
    "::ffff:127.0.0.1": "IPv6 form of 127.0.0.1, a loopback",
    "::ffff:169.254.169.254": "IPv6 form of 169.254.169.254, a link-local",
    "2002:7f00:1::": "IPv6 form of 127.0.0.1",  # 6to4
    "64:ff9b::a00:1": "IPv6 form of 10.0.0.1, a private",  # NAT64
}


@pytest.mark.parametrize(("address", "rule"), REFUSED.items())
def test_addresses_that_are_not_public_are_refused(address: str, rule: str) -> None:
    found = address_rule(ipaddress.ip_address(address))
    assert found is not None and rule in found


@pytest.mark.parametrize("address", ["93.184.216.34", "8.8.8.8", "2606:4700:4700::1111",
                                     "::ffff:93.184.216.34"])
def test_public_addresses_pass(address: str) -> None:
    assert address_rule(ipaddress.ip_address(address)) is None


RULES = AccountRules("http://127.0.0.1:8080/v1", frozenset({("cdn.internal", None),
                                                            ("10.0.0.5", 9000)}))


@pytest.mark.parametrize(("url", "why"), [
    ("http://127.0.0.1:8080/media/v.mp4?sig=x", None),  # the API origin
    ("http://127.0.0.1:8081/metrics", "plain http:// to 127.0.0.1:8081"),
    ("https://127.0.0.1:8080/x", "127.0.0.1:8080 is a loopback address"),  # other scheme
    ("http://localhost:8080/x", "plain http:// to localhost:8080"),  # other host
    ("http://cdn.internal/x", None), ("http://CDN.Internal.:81/x", None),  # allow-listed
    ("http://10.0.0.5:9000/x", None), ("http://10.0.0.5:9001/x", "plain http://"),
    ("https://10.0.0.5:9001/x", "10.0.0.5:9001 is a private address"),
    ("https://media.example.com/v.mp4", None),  # its addresses are checked at connect
    ("https://[::ffff:10.0.0.1]/x", "[::ffff:10.0.0.1]:443 is an IPv6 form of 10.0.0.1"),
    ("ftp://media.example.com/v.mp4", "only http:// and https://"),
    ("https://bücher.example/v.mp4", "not ASCII"),
])
def test_which_urls_an_account_may_fetch(url: str, why: str | None) -> None:
    found = FetchGuard.refusal(RULES, URL(url, encoded=True))
    assert found == why if why is None else (found is not None and why in found)
    assert found is None or "on VIDPOLL_MEDIA_ALLOW_HOSTS" in found or why in (
        "only http:// and https://", "not ASCII")


def test_without_an_api_origin_only_https_to_public_names_passes() -> None:
    rules = AccountRules()
    assert FetchGuard.refusal(rules, URL("https://cdn.example/v.mp4")) is None
    assert FetchGuard.refusal(rules, URL("http://cdn.example/v.mp4")) is not None


def test_the_media_settings_and_their_errors_name_the_variable() -> None:
    settings = Settings.from_env({
        "SUME_BASE_URL": "https://api.sume.example/v2",
        "VIDPOLL_MEDIA_ALLOW_HOSTS": "cdn.internal, Media.Example:8080,[fd00::1]:81",
        "VIDPOLL_MEDIA_ALLOW_HOSTS_STUDIO": "studio-cdn.internal",
        "VIDPOLL_DOWNLOAD_MAX_BYTES": "500MiB", "VIDPOLL_DOWNLOAD_DEADLINE_S": "600",
        "VIDPOLL_DOWNLOAD_MIN_BYTES_PER_S": "0"})
    assert settings.media_allow_hosts == {("cdn.internal", None), ("media.example", 8080),
                                          ("fd00::1", 81)}
    assert settings.media_allow_hosts_for("studio") == (
        {("studio-cdn.internal", None)}, "VIDPOLL_MEDIA_ALLOW_HOSTS_STUDIO")
    policy = FetchPolicy.from_settings(settings)
    assert policy.rules("other").origin == ("https", "api.sume.example", 443)
    assert policy.rules("studio").allow_hosts == {("studio-cdn.internal", None)}
    assert policy.rules("default").allow_variable == "VIDPOLL_MEDIA_ALLOW_HOSTS"
    limits = policy.limits
    assert (limits.max_bytes, limits.deadline_s, limits.min_bytes_per_s) == (
        500 * 1024**2, 600.0, 0.0)
    defaults = FetchPolicy.from_settings(Settings.from_env({})).limits
    assert (defaults.max_bytes, defaults.deadline_s, defaults.min_bytes_per_s,
            defaults.rate_window_s, defaults.max_redirects) == (2 * 1024**3, 1800.0, 8192.0,
                                                                30.0, 5)
    for name, value in [("VIDPOLL_MEDIA_ALLOW_HOSTS", "https://cdn.example/"),
                        ("VIDPOLL_MEDIA_ALLOW_HOSTS", "10.0.0.0/8"),
                        ("VIDPOLL_MEDIA_ALLOW_HOSTS_STUDIO", "cdn:99999"),
                        ("VIDPOLL_MEDIA_ALLOW_HOSTS_BAD-NAME!", "cdn"),
                        ("VIDPOLL_DOWNLOAD_MAX_BYTES", "2GB"),
                        ("VIDPOLL_DOWNLOAD_MAX_BYTES", "0"),
                        ("VIDPOLL_DOWNLOAD_DEADLINE_S", "0.5"),
                        ("VIDPOLL_DOWNLOAD_MIN_BYTES_PER_S", "fast")]:
        with pytest.raises(ConfigError) as caught:
            Settings.from_env({name: value})
        message = str(caught.value)
        assert name in message and "\n" not in message, message


def test_hooks_are_not_imported_from_the_working_directory_unless_asked(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "vidpoll_cwd_hook.py").write_text("def done(job):\n    return job\n")
    monkeypatch.chdir(tmp_path)
    # as under the `vidpoll` script: neither '' nor the working directory on sys.path
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.delenv("VIDPOLL_HOOK_PATH", raising=False)
    monkeypatch.delitem(sys.modules, "vidpoll_cwd_hook", raising=False)
    with pytest.raises(ConfigError) as caught:
        load_hook("vidpoll_cwd_hook:done")
    message = str(caught.value)
    assert "No module named 'vidpoll_cwd_hook'" in message and "\n" not in message
    assert "VIDPOLL_HOOK_PATH=." in message
    assert str(tmp_path) not in sys.path
    # asked for: found, and searched after everything else (it cannot shadow a module)
    monkeypatch.setenv("VIDPOLL_HOOK_PATH", ".")
    assert hook_path({"VIDPOLL_HOOK_PATH": "."}) == (str(tmp_path),)
    assert load_hook("vidpoll_cwd_hook:done")(None) is None  # type: ignore[arg-type]
    assert sys.path[-1] == str(tmp_path)
    monkeypatch.delitem(sys.modules, "vidpoll_cwd_hook")
    with pytest.raises(ConfigError, match=r"^VIDPOLL_HOOK_PATH: 'missing' is not a directory"):
        hook_path({"VIDPOLL_HOOK_PATH": "missing"})
