"""The accounts of the providers with fields of their own (issue 28): Veo's `api_version`,
Vertex AI's `project`, `location` and `credentials_file` (a key file, not a key variable), and
every provider's `on_unknown_create` and `min_poll_s`. Pure: files in tmp_path, the
environment as a dict; every bad file is one line naming the file, the account and the field.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from vidpoll.config import Settings
from vidpoll.errors import ConfigError

SECRET = "AIzaSy-not-a-real-key-0123456789"


def settings(tmp_path: Path, text: str, **env: str) -> Settings:
    path = tmp_path / "accounts.toml"
    path.write_text(text)
    return Settings.from_env({"VIDPOLL_CONFIG": str(path), **env}, cwd=tmp_path)


def refusal(tmp_path: Path, text: str, **env: str) -> str:
    with pytest.raises(ConfigError) as caught:
        settings(tmp_path, text, **env)
    message = str(caught.value)
    assert "\n" not in message and str(tmp_path / "accounts.toml") in message, message
    assert SECRET not in message
    return message


def test_a_veo_account_is_a_key_variable_and_the_real_gemini_api_by_default(tmp_path):
    found = settings(tmp_path, '[accounts.veo]\nprovider = "veo"\n'
                               'api_key_env = "GEMINI_API_KEY"\n', GEMINI_API_KEY=SECRET)
    veo = found.accounts["veo"]
    assert veo.provider == "veo" and veo.api_key == SECRET
    assert veo.base_url == "https://generativelanguage.googleapis.com"
    assert veo.options == {"api_version": "v1beta"}
    assert veo.on_unknown_create == "park" and veo.min_poll_s is None


def test_a_vertex_account_names_its_project_and_key_file_and_gets_its_regional_host(tmp_path):
    key_file = tmp_path / "sa.json"
    key_file.write_text("{}")
    found = settings(tmp_path, f'[accounts.vx]\nprovider = "vertex"\nproject = "my-proj"\n'
                               f'location = "europe-west4"\ncredentials_file = "{key_file}"\n')
    vx = found.accounts["vx"]
    assert vx.api_key == str(key_file) and vx.api_key_env == ""
    assert vx.base_url == "https://europe-west4-aiplatform.googleapis.com"
    assert vx.options == {"project": "my-proj", "location": "europe-west4", "api_version": "v1"}


@pytest.mark.parametrize(("body", "said"), [
    ('project = "p"\n', "credentials_file: missing"),
    ('credentials_file = "{missing}"\nproject = "p"\n', "cannot be read"),
    ('credentials_file = "{key}"\n', "project: missing"),
    ('credentials_file = "{key}"\nproject = "p/../q"\n', "project: must be a name"),
    ('credentials_file = "{key}"\nproject = "p"\nlocation = 7\n', "location: must be a"),
    ('credentials_file = "{key}"\nproject = "p"\napi_key_env = "X"\nplatform_url = "x"\n',
     "platform_url: unknown field"),
])
def test_a_bad_vertex_account_is_one_line_naming_the_field(tmp_path, body, said):
    key_file = tmp_path / "sa.json"
    key_file.write_text("{}")
    text = '[accounts.vx]\nprovider = "vertex"\n' + body.format(
        key=key_file, missing=tmp_path / "nope.json")
    assert said in refusal(tmp_path, text)


@pytest.mark.parametrize(("line", "said"), [
    ('on_unknown_create = "retry"', 'on_unknown_create: must be "park"'),
    ("on_unknown_create = true", 'on_unknown_create: must be "park"'),
    ("min_poll_s = 0", "min_poll_s: must be a number of seconds"),
    ('min_poll_s = "10"', "min_poll_s: must be a number of seconds"),
    ("min_poll_s = nan", "min_poll_s: must be a number of seconds"),
    ('api_version = "v1/../x"', "api_version: must be a name"),
])
def test_the_shared_fields_are_checked(tmp_path, line, said):
    text = f'[accounts.veo]\nprovider = "veo"\napi_key_env = "GEMINI_API_KEY"\n{line}\n'
    assert said in refusal(tmp_path, text, GEMINI_API_KEY=SECRET)


def test_resend_and_a_poll_floor_are_read(tmp_path):
    found = settings(tmp_path, '[accounts.veo]\nprovider = "veo"\napi_key_env = "K"\n'
                               'on_unknown_create = "resend"\nmin_poll_s = 4.5\n', K=SECRET)
    assert found.accounts["veo"].on_unknown_create == "resend"
    assert found.accounts["veo"].min_poll_s == 4.5


def test_a_key_pasted_into_a_providers_own_field_is_never_shown(tmp_path):
    message = refusal(tmp_path, f'[accounts.veo]\nprovider = "veo"\napi_key_env = "K"\n'
                                f'api_version = "{SECRET}!"\n', K="x")
    assert "api_version" in message


def test_a_vertex_account_names_no_key_variable_and_its_key_files_path_is_no_secret(tmp_path):
    key_file = tmp_path / "sa.json"
    key_file.write_text("{}")
    body = f'[accounts.vx]\nprovider = "vertex"\nproject = "p"\ncredentials_file = "{key_file}"\n'
    said = refusal(tmp_path, body + 'api_key_env = "GOOGLE_KEY"\n', GOOGLE_KEY=SECRET)
    assert "api_key_env: a Veo (Vertex AI) account has no key variable" in said
    # the path is what an operator needs in an error: never redacted from logs as a key is
    found = settings(tmp_path, body + '[accounts.veo]\nprovider = "veo"\napi_key_env = "K"\n',
                     K=SECRET)
    assert found.secrets() == [SECRET]


KLING_SECRET = "kling-secret-not-real-0123456789abcdef"


def test_a_kling_account_names_both_key_variables_and_its_secret_is_redacted(tmp_path):
    found = settings(tmp_path, '[accounts.kl]\nprovider = "kling"\napi_key_env = "KLING_AK"\n'
                               'secret_key_env = "KLING_SK"\n',
                     KLING_AK=SECRET, KLING_SK=KLING_SECRET)
    kl = found.accounts["kl"]
    assert kl.api_key == SECRET and kl.options == {"secret_key_env": "KLING_SK"}
    assert kl.option_secrets == {"secret_key_env": KLING_SECRET}
    assert kl.base_url == "https://api-singapore.klingai.com"
    assert KLING_SECRET in found.secrets() and SECRET in found.secrets()
    assert KLING_SECRET not in repr(kl)


@pytest.mark.parametrize(("body", "said"), [
    ('api_key_env = "KLING_AK"\n', "secret_key_env: missing"),
    (f'api_key_env = "KLING_AK"\nsecret_key_env = "{KLING_SECRET}"\n',
     "secret_key_env: is not an environment variable's name"),
    ('api_key_env = "KLING_AK"\nsecret_key_env = 5\n', "secret_key_env: must be"),
])
def test_a_bad_kling_secret_key_field_is_one_line_never_showing_a_value(tmp_path, body, said):
    message = refusal(tmp_path, f'[accounts.kl]\nprovider = "kling"\n{body}',
                      KLING_AK=SECRET, KLING_SK=KLING_SECRET)
    assert said in message and KLING_SECRET not in message, message


def test_an_unset_kling_secret_variable_leaves_the_account_unable_to_sign(tmp_path):
    found = settings(tmp_path, '[accounts.kl]\nprovider = "kling"\napi_key_env = "KLING_AK"\n'
                               'secret_key_env = "KLING_SK"\n', KLING_AK=SECRET)
    assert found.accounts["kl"].option_secrets == {"secret_key_env": ""}


def test_the_kling_client_gets_the_secret_keys_value_from_the_file_account(tmp_path):
    from vidpoll.accounts import client_for

    text = ('[accounts.kl]\nprovider = "kling"\napi_key_env = "KLING_AK"\n'
            'secret_key_env = "KLING_SK"\n')
    signing = client_for(settings(tmp_path, text, KLING_AK=SECRET, KLING_SK=KLING_SECRET), "kl")
    assert signing._keys_problem() is None  # type: ignore[attr-defined]
    unset = client_for(settings(tmp_path, text, KLING_AK=SECRET), "kl")
    problem = unset._keys_problem()  # type: ignore[attr-defined]
    assert problem is not None and "KLING_SK" in problem
