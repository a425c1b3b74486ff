"""What `submit` refuses for the studios' APIs before anything is recorded (issue 29): a Luma
body naming another model than `--model`, a Kling body carrying its own `external_task_id`
(vidpoll sets it from the key); and the create hold after a 429 that names no reset (Runway's
daily cap). Real PostgreSQL; nothing is sent (the refusals come before the intent exists)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from vidpoll import Vidpoll
from vidpoll.config import Settings
from vidpoll.errors import ConfigError
from vidpoll.models import HttpAnswer
from vidpoll.submitter import CREATE_429_PAUSE_MAX_S, CREATE_PAUSE_MAX_S, Submitter, SubmitterConfig

ACCOUNTS = """
[accounts.luma]
provider = "luma"
api_key_env = "LUMAAI_API_KEY"
base_url = "http://127.0.0.1:9/dream-machine/v1"

[accounts.kling]
provider = "kling"
api_key_env = "KLING_AK"
secret_key_env = "KLING_SK"
base_url = "http://127.0.0.1:9"
"""


@pytest.fixture
async def studios(db_url: str, tmp_path: Path) -> AsyncIterator[Vidpoll]:
    config = tmp_path / "vidpoll.toml"
    config.write_text(ACCOUNTS)
    settings = Settings.from_env({"DATABASE_URL": db_url, "VIDPOLL_CONFIG": str(config),
                                  "VIDPOLL_ALLOW_INSECURE_HTTP": "1",
                                  "LUMAAI_API_KEY": "luma-key-not-real-0123456789",
                                  "KLING_AK": "ak-not-real-0123456789",
                                  "KLING_SK": "sk-not-real-0123456789abcdef"}, cwd=tmp_path)
    async with await Vidpoll.open(settings=settings) as handle:
        yield handle


async def test_a_luma_body_naming_another_model_is_refused_and_nothing_is_recorded(studios):
    with pytest.raises(ConfigError) as refused:
        await studios.record({"prompt": "a heron", "model": "ray-flash-2"}, key="k-luma-1",
                             account="luma", model="ray-2")
    assert "luma" in str(refused.value) and "\n" not in str(refused.value)
    assert await studios.store.get_intent("k-luma-1") is None
    # the same body without its own model (or naming the same one) is recorded
    sub = await studios.record({"prompt": "a heron", "model": "ray-2"}, key="k-luma-2",
                               account="luma", model="ray-2")
    assert sub.new and (await studios.store.get_intent("k-luma-2")) is not None


async def test_a_kling_body_with_its_own_external_task_id_is_refused_unrecorded(studios):
    with pytest.raises(ConfigError, match="external_task_id"):
        await studios.record({"prompt": "a fox", "external_task_id": "mine"}, key="k-kling-1",
                             account="kling", model="text2video")
    assert await studios.store.get_intent("k-kling-1") is None
    sub = await studios.record({"prompt": "a fox", "model_name": "kling-v1"}, key="k-kling-2",
                               account="kling", model="text2video")
    assert sub.new


def test_a_create_429_holds_the_account_until_its_named_reset_or_doubling_up_to_an_hour():
    submitter = Submitter(object(), {}, SubmitterConfig())  # type: ignore[arg-type]
    hold = submitter._create_pause_s  # what the fleet's create bucket is paused for
    assert hold("a", HttpAnswer(429, b"{}", retry_after="7200")) == 7200.0  # over max_poll_s
    assert hold("a", HttpAnswer(429, b"{}", retry_after="999999")) == CREATE_PAUSE_MAX_S
    # no reset named (Runway's daily cap): 2 s, then twice as long each 429 in a row ...
    held = [hold("b", HttpAnswer(429, b"{}")) for _ in range(13)]
    assert held[:4] == [2.0, 4.0, 8.0, 16.0] and held[-1] == CREATE_429_PAUSE_MAX_S
    assert hold("c", HttpAnswer(429, b"{}")) == 2.0  # each account its own count
    # ... until a create goes through
    assert hold("b", HttpAnswer(201, b"{}")) is None
    assert hold("b", HttpAnswer(429, b"{}")) == 2.0
