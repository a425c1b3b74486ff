"""A key held in any variable an accounts file names is redacted from logs and from say(),
whatever that variable is called (logs.add_secrets, called with Settings.secrets())."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from vidpoll import logs
from vidpoll.config import Settings

KEY = "r8_Xq7LmZp2VtN4sK9wQ1bC3dF5gH6j"


def test_a_key_in_an_oddly_named_variable_never_reaches_the_log(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], own_logging: None) -> None:
    (tmp_path / "vidpoll.toml").write_text(
        '[accounts.rep]\nprovider = "sume"\napi_key_env = "MY_VENDOR_THING"\n')
    settings = Settings.from_env({"MY_VENDOR_THING": KEY}, cwd=tmp_path)
    assert settings.accounts["rep"].api_key == KEY
    logs.setup("info", "text", secrets=[])
    logging.getLogger("vidpoll.test").warning("the provider echoed %s back", KEY)
    assert KEY in capsys.readouterr().err  # not known yet: the name says nothing
    logs.add_secrets(settings.secrets())
    logging.getLogger("vidpoll.test").warning("the provider echoed %s back", KEY)
    said = logs.say("error", f"refused {KEY}")
    err = capsys.readouterr().err
    assert KEY not in err and "<redacted>" in err
    assert KEY not in said and "<redacted>" in said
