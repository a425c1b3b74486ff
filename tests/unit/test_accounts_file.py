"""Accounts in a config file (VIDPOLL_CONFIG, else ./vidpoll.toml) and in the environment.

Pure: files in tmp_path, the environment as a dict. Every bad file is one line naming the
file, the account and the field, and never a value that may be a secret.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from vidpoll.config import (
    DEFAULT_SUME_BASE_URL,
    Account,
    Settings,
    environment_accounts,
    read_accounts_file,
)
from vidpoll.errors import ConfigError
from vidpoll.policy import Budget
from vidpoll.providers import registry

SECRET = "sk-live-9f8e7d6c5b4a3210"
"""A key someone might paste into the file: no message may ever hold it."""

GOOD = """
[accounts.rep]
provider = "sume"                    # sume (default) | replicate | fal | veo | runway | luma
base_url = "http://127.0.0.1:9000"   # optional: the API root; default the provider's public URL
api_key_env = "REPLICATE_API_TOKEN"  # the environment variable that holds the key
status_rate_per_min = 3000           # optional, as today's per-account settings
"""


def from_file(tmp_path: Path, text: str | bytes, **env: str) -> Settings:
    path = tmp_path / "accounts.toml"
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return Settings.from_env({"VIDPOLL_CONFIG": str(path), **env}, cwd=tmp_path)


def refusal(tmp_path: Path, text: str | bytes, **env: str) -> str:
    """The one line a bad file is refused with (checked: one line, names the file)."""
    with pytest.raises(ConfigError) as caught:
        from_file(tmp_path, text, **env)
    message = str(caught.value)
    assert "\n" not in message and "\r" not in message, message
    assert str(tmp_path / "accounts.toml") in message, message
    return message


# --- the good shape ---------------------------------------------------------------------------

def test_the_documented_shape_is_one_account_with_its_provider_url_key_and_rate(tmp_path):
    settings = from_file(tmp_path, GOOD, REPLICATE_API_TOKEN=f" {SECRET}\n")
    rep = settings.accounts["rep"]
    assert rep == Account(name="rep", provider="sume", base_url="http://127.0.0.1:9000",
                          api_key=SECRET, api_key_env="REPLICATE_API_TOKEN",
                          status_rate_per_min=3000.0, submit_rate_per_min=None,
                          webhook_secret="", webhook_secret_env="", source="file")
    assert settings.config_file == tmp_path / "accounts.toml"
    assert settings.account("rep") is rep
    assert settings.require_api_key("rep") == SECRET
    assert settings.account_keys == {"rep": SECRET}
    assert settings.status_rates == {"rep": 3000.0}
    assert settings.budget("status", "rep") == Budget.per_minute(3000)
    assert settings.budget("create", "rep") is None  # unlimited
    assert settings.secrets() == [SECRET]
    assert SECRET not in repr(settings) and SECRET not in repr(rep)
    # a file account replaces the keyless `default` of the environment
    assert set(settings.accounts) == {"rep"}


def test_provider_and_base_url_default_and_every_optional_field_is_read(tmp_path):
    settings = from_file(tmp_path, """
        [accounts.main]
        api_key_env = "MAIN_KEY"
        submit_rate_per_min = 10.5
        webhook_secret_env = "MAIN_WEBHOOK_SECRET"
        """.replace("\n        ", "\n"), MAIN_KEY="k-main", MAIN_WEBHOOK_SECRET="whsec-main")
    main = settings.accounts["main"]
    assert (main.provider, main.base_url) == (registry.DEFAULT_PROVIDER, DEFAULT_SUME_BASE_URL)
    assert (main.api_key, main.submit_rate_per_min, main.status_rate_per_min) == (
        "k-main", 10.5, None)
    assert (main.webhook_secret, main.webhook_secret_env) == ("whsec-main",
                                                              "MAIN_WEBHOOK_SECRET")
    assert "whsec-main" not in repr(main)
    assert settings.secrets() == ["whsec-main", "k-main"]


def test_an_empty_file_or_empty_accounts_table_defines_no_account(tmp_path):
    assert set(from_file(tmp_path, "").accounts) == {"default"}  # the environment's, keyless
    assert set(from_file(tmp_path, "[accounts]\n").accounts) == {"default"}


def test_a_file_account_without_its_key_is_still_an_account(tmp_path):
    settings = from_file(tmp_path, GOOD)
    assert settings.accounts["rep"].api_key == ""
    assert settings.account_keys == {}  # the worker serves it not, and says why
    with pytest.raises(ConfigError, match=r"^REPLICATE_API_TOKEN is not set; export the Sume "
                                          r"API key of account 'rep' first$"):
        settings.account("rep")
    with pytest.raises(ConfigError, match="REPLICATE_API_TOKEN is not set"):
        settings.require_api_key("rep")


def test_an_unknown_account_lists_the_known_ones_and_how_to_add_it(tmp_path):
    settings = from_file(tmp_path, GOOD, REPLICATE_API_TOKEN="k", SUME_API_KEY_ACME="k2")
    with pytest.raises(ConfigError) as caught:
        settings.account("nope")
    assert str(caught.value) == (
        f"unknown account 'nope' (known: acme, rep): SUME_API_KEY_NOPE is not set; export "
        f"it, or define [accounts.nope] in {tmp_path / 'accounts.toml'}")
    with pytest.raises(ConfigError, match=r"^unknown account 'No pe' \(known: acme, rep\)$"):
        settings.account("No pe")


def test_rates_come_from_the_file_then_the_accounts_variable_then_the_fleets(tmp_path):
    text = GOOD + """
[accounts.two]
api_key_env = "TWO_KEY"

[accounts.three]
api_key_env = "THREE_KEY"
submit_rate_per_min = 5
"""
    settings = from_file(tmp_path, text, VIDPOLL_STATUS_RATE_PER_MIN="120",
                         VIDPOLL_STATUS_RATE_PER_MIN_REP="60",
                         VIDPOLL_STATUS_RATE_PER_MIN_TWO="30",
                         VIDPOLL_SUBMIT_RATE_PER_MIN_THREE="7")
    assert settings.status_rates == {"rep": 3000.0, "two": 30.0, "three": 120.0,
                                     "default": 120.0}  # as before: the fleet's rate
    assert settings.submit_rates == {"three": 5.0}


# --- the environment, as before any file -----------------------------------------------------

def test_without_a_file_the_environment_gives_todays_accounts(tmp_path):
    env = {"SUME_API_KEY": "sk-a", "SUME_API_KEY_ACME": "sk-b", "SUME_API_KEY_BIG_CO": "sk-c",
           "SUME_BASE_URL": "http://localhost:9000/api", "SUME_WEBHOOK_SECRET": "whsec-x",
           "VIDPOLL_STATUS_RATE_PER_MIN": "120", "VIDPOLL_STATUS_RATE_PER_MIN_ACME": "60",
           "VIDPOLL_SUBMIT_RATE_PER_MIN_BIG_CO": "10"}
    settings = Settings.from_env(env, cwd=tmp_path)
    assert settings.config_file is None
    assert settings.accounts == {
        "default": Account("default", "sume", "http://localhost:9000/api", "sk-a",
                           "SUME_API_KEY", 120.0, None, "whsec-x", "SUME_WEBHOOK_SECRET",
                           "environment"),
        "acme": Account("acme", "sume", "http://localhost:9000/api", "sk-b",
                        "SUME_API_KEY_ACME", 60.0, None, "whsec-x", "SUME_WEBHOOK_SECRET",
                        "environment"),
        "big_co": Account("big_co", "sume", "http://localhost:9000/api", "sk-c",
                          "SUME_API_KEY_BIG_CO", 120.0, 10.0, "whsec-x",
                          "SUME_WEBHOOK_SECRET", "environment"),
    }
    # the settings of earlier releases, unchanged
    assert settings.account_keys == {"default": "sk-a", "acme": "sk-b", "big_co": "sk-c"}
    assert (settings.sume_base_url, settings.sume_api_key, settings.webhook_secret) == (
        "http://localhost:9000/api", "sk-a", "whsec-x")
    assert settings.status_rates == {"default": 120.0, "acme": 60.0, "big_co": 120.0}
    assert settings.submit_rates == {"big_co": 10.0}
    assert settings.require_api_key() == "sk-a"
    assert settings.require_api_key("big_co") == "sk-c"


def test_with_nothing_set_default_is_a_keyless_account_as_before(tmp_path):
    settings = Settings.from_env({}, cwd=tmp_path)
    assert settings.accounts == {"default": Account(
        "default", "sume", DEFAULT_SUME_BASE_URL, "", "SUME_API_KEY",
        webhook_secret_env="SUME_WEBHOOK_SECRET")}
    assert settings.account_keys == {} and settings.status_rates == {}
    with pytest.raises(ConfigError, match=r"^SUME_API_KEY is not set"):
        settings.require_api_key()
    with pytest.raises(ConfigError, match="SUME_API_KEY_ACME is not set"):
        settings.require_api_key("acme")


def test_the_environments_names_are_built_from_the_providers_prefix():
    toy = SimpleNamespace(name="toy", default_base_url="https://api.toy.example",
                          env_prefix="TOY", default_rates=(None, None))
    found = environment_accounts({"TOY_API_KEY_TEAM": "t-1", "TOY_WEBHOOK_SECRET": "w",
                                  "SUME_API_KEY": "not-this-one"},
                                 toy, "https://api.toy.example")  # type: ignore[arg-type]
    assert found == {
        "default": Account("default", "toy", "https://api.toy.example", "", "TOY_API_KEY",
                           webhook_secret="w", webhook_secret_env="TOY_WEBHOOK_SECRET"),
        "team": Account("team", "toy", "https://api.toy.example", "t-1", "TOY_API_KEY_TEAM",
                        webhook_secret="w", webhook_secret_env="TOY_WEBHOOK_SECRET"),
    }
    assert "default" not in environment_accounts({}, toy, "https://x.example",  # type: ignore[arg-type]
                                                 keyless_default=False)


# --- file and environment together ------------------------------------------------------------

def test_file_and_environment_accounts_merge_and_the_files_win_a_shared_name(tmp_path):
    text = GOOD + """
[accounts.default]
api_key_env = "MY_DEFAULT_KEY"
base_url = "https://sume.internal.example"
"""
    settings = from_file(tmp_path, text, REPLICATE_API_TOKEN="k-rep", MY_DEFAULT_KEY="k-mine",
                         SUME_API_KEY="k-env-default", SUME_API_KEY_ACME="k-acme",
                         SUME_API_KEY_REP="k-env-rep", SUME_BASE_URL="https://env.example",
                         SUME_WEBHOOK_SECRET="whsec-env")
    assert {n: a.source for n, a in settings.accounts.items()} == {
        "rep": "file", "default": "file", "acme": "environment"}
    assert settings.account_keys == {"rep": "k-rep", "default": "k-mine", "acme": "k-acme"}
    # the environment's accounts keep SUME_BASE_URL; the file's take theirs or the public URL
    assert settings.accounts["acme"].base_url == "https://env.example"
    assert settings.accounts["acme"].webhook_secret == "whsec-env"
    assert settings.accounts["default"].base_url == "https://sume.internal.example"
    assert settings.accounts["default"].webhook_secret == ""  # names none
    # the single-value settings of earlier releases follow account `default`
    assert settings.sume_base_url == "https://sume.internal.example"
    assert settings.sume_api_key == "k-mine"
    assert settings.webhook_secret == ""


def test_a_file_without_default_leaves_the_environments_default(tmp_path):
    settings = from_file(tmp_path, GOOD, SUME_API_KEY="k-env",
                         SUME_BASE_URL="https://env.example")
    assert settings.accounts["default"].source == "environment"
    assert (settings.sume_api_key, settings.sume_base_url) == ("k-env", "https://env.example")
    unset = from_file(tmp_path, GOOD)  # no SUME_API_KEY: no keyless default beside the file's
    assert set(unset.accounts) == {"rep"}
    with pytest.raises(ConfigError, match=r"unknown account 'default' \(known: rep\): "
                                          r"SUME_API_KEY is not set"):
        unset.require_api_key()


# --- where the file is ------------------------------------------------------------------------

def test_vidpoll_config_pointing_nowhere_is_an_error_naming_it(tmp_path):
    missing = tmp_path / "nope" / "vidpoll.toml"
    with pytest.raises(ConfigError) as caught:
        Settings.from_env({"VIDPOLL_CONFIG": str(missing)}, cwd=tmp_path)
    assert str(caught.value) == f"VIDPOLL_CONFIG: {missing} does not exist"


def test_vidpoll_config_may_be_relative_to_the_working_directory(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "a.toml").write_text(GOOD)
    settings = Settings.from_env({"VIDPOLL_CONFIG": "conf/a.toml"}, cwd=tmp_path)
    assert settings.config_file == tmp_path / "conf" / "a.toml"
    assert "rep" in settings.accounts


def test_vidpoll_toml_in_the_working_directory_is_read_when_vidpoll_config_is_unset(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert Settings.from_env({}).config_file is None  # none there: none read
    (tmp_path / "vidpoll.toml").write_text(GOOD)
    settings = Settings.from_env({"VIDPOLL_CONFIG": "  "})  # blank is unset
    assert settings.config_file == tmp_path / "vidpoll.toml"
    assert settings.accounts["rep"].base_url == "http://127.0.0.1:9000"
    other = tmp_path / "other.toml"
    other.write_text("")
    assert "rep" not in Settings.from_env({"VIDPOLL_CONFIG": str(other)}).accounts


def test_a_working_directory_removed_under_us_holds_no_file(tmp_path, monkeypatch):
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert Settings.from_env({}).config_file is None


def test_an_unreadable_file_is_one_line(tmp_path):
    (tmp_path / "accounts.toml").mkdir()
    with pytest.raises(ConfigError, match=r"accounts\.toml: cannot be read \(Is a directory\)"):
        Settings.from_env({"VIDPOLL_CONFIG": str(tmp_path / "accounts.toml")}, cwd=tmp_path)


# --- bad files: one line, the file, the account, the field, never a secret --------------------

def account(*lines: str) -> str:
    return "\n".join(["[accounts.rep]", *lines]) + "\n"


KEYED = 'api_key_env = "REP_KEY"'

# (what, the file, the field, words the message must hold)
BAD_FIELDS = [
    ("unknown provider", account('provider = "nosuch"', KEYED), "provider",
     "unknown provider 'nosuch' (known: {known})"),
    ("provider not a string", account("provider = 3", KEYED), "provider",
     "must be a provider's name"),
    ("a key as the provider", account(f'provider = "{SECRET}"', KEYED), "provider",
     "must be a provider's name"),
    ("no api_key_env", account('provider = "sume"'), "api_key_env",
     'missing; every account in the file names the environment variable that holds its key '
     '(like api_key_env = "SUME_API_KEY_REP", then export it)'),
    ("the key in api_key_env", account(f'api_key_env = "{SECRET}"'), "api_key_env",
     'keys never go in the file: set api_key_env = "NAME" and export NAME'),
    ("a mixed-case token in api_key_env", account('api_key_env = "r8_AbCdEf0123456789xyz"'),
     "api_key_env", "keys never go in the file"),
    ("api_key_env starting with a digit", account('api_key_env = "1KEY"'), "api_key_env",
     "is not an environment variable's name"),
    ("api_key_env not a string", account("api_key_env = 42"), "api_key_env",
     "must be a string, the name of an environment variable"),
    ("api_key in the file", account(KEYED, f'api_key = "{SECRET}"'), "api_key",
     'keys never go in the file: set api_key_env = "NAME" and export NAME'),
    ("key in the file", account(KEYED, f'key = "{SECRET}"'), "key", "keys never go in"),
    ("token in the file", account(KEYED, f'token = "{SECRET}"'), "token", "keys never go in"),
    ("access_token in the file", account(KEYED, f'access_token = "{SECRET}"'), "access_token",
     "keys never go in"),
    ("password in the file", account(KEYED, 'password = "hunter2"'), "password",
     "keys never go in"),
    ("a short key in the file", account(KEYED, 'apiKey = "abc"'), "apiKey",
     "keys never go in"),
    ("a webhook secret in the file", account(KEYED, f'webhook_secret = "{SECRET}"'),
     "webhook_secret",
     'secrets never go in the file: set webhook_secret_env = "NAME" and export NAME'),
    ("a key under another name", account(KEYED, f'extra = "{SECRET}"'), "extra",
     "keys never go in"),
    ("a key inside a table", account(KEYED, f'headers = {{ Authorization = "{SECRET}" }}'),
     "headers", "keys never go in"),
    ("a typo", account(KEYED, "status_rate_per_minute = 10"), "status_rate_per_minute",
     "unknown field (did you mean status_rate_per_min? allowed for Sume: provider, "
     "base_url, api_key_env, webhook_secret_env, status_rate_per_min, submit_rate_per_min, "
     "webhook_url, on_unknown_create, min_poll_s, currency, price_per_job, prices, "
     "unit_prices, cap_per_day, cap_per_month, cap_timezone, cap_per_key_prefix, "
     "max_creates_per_hour, poll_schedule, detect_p95_s, overdue_factor)"),
    ("a target as text", account(KEYED, 'detect_p95_s = "5"'), "detect_p95_s",
     "must be a number from 0.1 to 3600, without quotes (like detect_p95_s = 5)"),
    ("a zero target", account(KEYED, "detect_p95_s = 0"), "detect_p95_s",
     "must be a number from 0.1 to 3600"),
    ("an unknown schedule", account(KEYED, 'poll_schedule = "smart"'), "poll_schedule",
     'must be "learned" (the default: reads planned from the model\'s render times) or '
     '"fixed"'),
    ("an overdue factor under 1", account(KEYED, "overdue_factor = 0.5"), "overdue_factor",
     "must be a number from 1 to 100"),
    ("an unknown field", account(KEYED, "colour = 'red'"), "colour",
     "unknown field (allowed for Sume: provider, base_url"),
    ("webhook_secret_env holding the secret", account(KEYED, f'webhook_secret_env = '
                                                             f'"{SECRET}"'),
     "webhook_secret_env", "secrets never go in the file"),
    ("a rate as a string", account(KEYED, 'status_rate_per_min = "3000"'),
     "status_rate_per_min", "must be a number of calls a minute, without quotes"),
    ("a rate of true", account(KEYED, "submit_rate_per_min = true"), "submit_rate_per_min",
     "must be a number"),
    ("a negative rate", account(KEYED, "status_rate_per_min = -5"), "status_rate_per_min",
     "must be a positive number of calls a minute (at least 0.001; like "
     "status_rate_per_min = 3000), not -5"),
    ("a zero rate", account(KEYED, "submit_rate_per_min = 0"), "submit_rate_per_min",
     "must be a positive number"),
    ("an infinite rate", account(KEYED, "status_rate_per_min = inf"), "status_rate_per_min",
     "must be a positive number"),
    ("a rate of nan", account(KEYED, "status_rate_per_min = nan"), "status_rate_per_min",
     "must be a positive number"),
    ("base_url not a string", account(KEYED, "base_url = 9000"), "base_url",
     "must be a string"),
    ("base_url without a scheme", account(KEYED, 'base_url = "api.sume.com"'), "base_url",
     "must start with http:// or https://"),
    ("base_url over http to another host", account(KEYED, 'base_url = "http://sume.lan"'),
     "base_url", "plain http://"),
    ("base_url with credentials", account(KEYED, f'base_url = "https://u:{SECRET}@h.example"'),
     "base_url", "must not carry credentials"),
    ("base_url with a query", account(KEYED, f'base_url = "https://h.example/?k={SECRET}"'),
     "base_url", "without a query string"),
]


@pytest.mark.parametrize(("text", "field", "words"),
                         [case[1:] for case in BAD_FIELDS], ids=[c[0] for c in BAD_FIELDS])
def test_a_bad_field_is_one_line_naming_the_file_the_account_and_the_field(
        tmp_path, text, field, words):
    message = refusal(tmp_path, text, REP_KEY="k-rep")
    assert f"[accounts.rep] {field}: " in message, message
    assert words.format(known=", ".join(registry.names())) in message, message
    assert SECRET not in message and "hunter2" not in message, message
    assert "r8_AbCdEf" not in message and "k-rep" not in message, message


def test_a_bad_account_name_is_one_line_naming_it(tmp_path):
    message = refusal(tmp_path, '[accounts.Rep]\napi_key_env = "REP_KEY"\n')
    assert message.endswith("accounts.toml: [accounts] 'Rep': account name 'Rep' must be 1-63 "
                            "lower-case letters, digits or '_', starting with a letter or "
                            "digit"), message


def test_an_account_that_is_not_a_table_never_shows_its_value(tmp_path):
    message = refusal(tmp_path, f'[accounts]\nrep = "{SECRET}"\n')
    assert "[accounts.rep]: must be a table of fields" in message
    assert SECRET not in message


@pytest.mark.parametrize(("text", "words"), [
    ("[workers]\ncount = 3\n", "unknown table [workers] (allowed: [accounts.NAME] tables)"),
    ("verbose = true\n", "unknown setting 'verbose' (allowed: [accounts.NAME] tables)"),
    (f'api_key = "{SECRET}"\n', 'api_key: keys never go in the file'),
    ("accounts = 3\n", "accounts must be tables, one per account"),
])
def test_anything_but_accounts_at_the_top_is_refused(tmp_path, text, words):
    message = refusal(tmp_path, text)
    assert words in message and SECRET not in message, message


@pytest.mark.parametrize("text", [
    "[accounts.rep\n",
    f'[accounts.rep]\napi_key_env = "{SECRET}\n',  # an unclosed string holding a key
    f'[accounts.rep]\napi_key_env = {SECRET}\n',
    '[accounts.rep]\napi_key_env = "A"\n[accounts.rep]\napi_key_env = "B"\n',
])
def test_a_file_that_is_not_toml_is_tomllibs_line_and_column_and_nothing_of_the_file(
        tmp_path, text):
    message = refusal(tmp_path, text)
    assert "is not valid TOML: " in message, message
    assert re.search(r"\(at (line \d+, column \d+|end of document)\)$", message), message
    assert SECRET not in message and SECRET[:8] not in message, message


def test_a_file_that_is_not_utf8_is_one_line(tmp_path):
    message = refusal(tmp_path, b'[accounts.rep]\napi_key_env = "\xff\xfe"\n')
    assert message.endswith("accounts.toml: is not UTF-8 text (line 2)"), message


def test_a_key_variable_holding_a_line_break_names_the_file_account_field_and_variable(
        tmp_path):
    message = refusal(tmp_path, GOOD, REPLICATE_API_TOKEN="sk-ab\ncd-secret")
    assert "[accounts.rep] api_key_env: REPLICATE_API_TOKEN holds a control character" in message
    assert "cd-secret" not in message


def test_plain_http_to_another_host_is_allowed_when_asked(tmp_path):
    text = account(KEYED, 'base_url = "http://sume.lan:8080/v"')
    settings = from_file(tmp_path, text, VIDPOLL_ALLOW_INSECURE_HTTP="1")
    assert settings.accounts["rep"].base_url == "http://sume.lan:8080/v"


def test_the_file_reader_is_usable_alone(tmp_path):
    path = tmp_path / "a.toml"
    path.write_text(GOOD)
    assert read_accounts_file(path, {"REPLICATE_API_TOKEN": "k"})["rep"].api_key == "k"


def test_a_replicate_account_gets_replicates_published_limits_and_a_webhook_url(tmp_path):
    settings = from_file(tmp_path, """
[accounts.rep]
provider = "replicate"
api_key_env = "REPLICATE_API_TOKEN"
webhook_url = "https://hooks.example.com/webhooks/replicate"

[accounts.slow]
provider = "replicate"
api_key_env = "REPLICATE_API_TOKEN"
submit_rate_per_min = 6
""", REPLICATE_API_TOKEN="r8_abc")
    rep, slow = settings.accounts["rep"], settings.accounts["slow"]
    assert (rep.status_rate_per_min, rep.submit_rate_per_min) == (3000.0, 600.0)
    assert rep.webhook_url == "https://hooks.example.com/webhooks/replicate"
    assert rep.base_url == "https://api.replicate.com"
    assert (slow.status_rate_per_min, slow.submit_rate_per_min) == (3000.0, 6.0)
    assert slow.webhook_url is None
    assert settings.budget("create", "rep") is not None


@pytest.mark.parametrize("value, why", [
    ('"http://hooks.example.com/x"', "plain http://"),
    ('"https://hooks.example.com/x?token=abc"', "query string"),
    ("42", "must be a string"),
])
def test_a_bad_webhook_url_is_a_clear_error(tmp_path, value, why):
    with pytest.raises(ConfigError) as err:
        from_file(tmp_path, f"""
[accounts.rep]
provider = "replicate"
api_key_env = "REPLICATE_API_TOKEN"
webhook_url = {value}
""", REPLICATE_API_TOKEN="r8_abc")
    assert "webhook_url" in str(err.value) and why in str(err.value)
    assert "abc" not in str(err.value).replace("r8_abc", "")
