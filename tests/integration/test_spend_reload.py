"""SIGHUP in a running `vidpoll worker`: the accounts file's prices and caps are read again, a
raised cap lets held intents go at once, and a file with a mistake changes nothing (the
worker goes on under the old caps). A real worker process, the fake Sume over HTTP."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from vidpoll.providers.sume.fake import FakeSume
from vidpoll.store import PgStore

from ..conftest import API_KEY
from .test_process import cli_env, spawn_worker, wait_for

pytestmark = pytest.mark.slow

ACCOUNT = ('[accounts.default]\nprovider = "sume"\napi_key_env = "SPEND_KEY"\n'
           'base_url = "{url}"\nprice_per_job = 0.50\ncap_per_day = {cap}\n')


async def test_sighup_raises_the_cap_of_a_running_worker(
        store: PgStore, fake: FakeSume, fake_url: str, db_url: str, tmp_path: Path) -> None:
    config = tmp_path / "vidpoll.toml"
    config.write_text(ACCOUNT.format(url=fake_url, cap="1.0"))
    for n in range(4):
        await store.add_intent(f"r-{n}", {"prompt": f"clip {n}"})
    env = cli_env(db_url, fake_url, VIDPOLL_CONFIG=str(config), SPEND_KEY=API_KEY,
                  VIDPOLL_ALLOW_INSECURE_HTTP="1")
    proc = await spawn_worker(env, "--concurrency", "4")
    try:
        async def held() -> int:
            return len(await store.list_intents("held"))

        await wait_for(lambda: fake.creates >= 2, 30, "two creates under the cap")
        async with asyncio.timeout(30):  # the other two wait, held, with their reason
            # (held by another process, in the database: no event here to wait on)
            while await held() < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.02)
        assert fake.creates == 2
        config.write_text("[accounts.default\n")  # a mistake: the old caps stay
        proc.send_signal(signal.SIGHUP)
        await wait_for(lambda: b"SIGHUP: the settings were not reloaded" in proc.err(), 30,
                       "the bad file refused")
        assert proc.returncode is None and fake.creates == 2
        config.write_text(ACCOUNT.format(url=fake_url, cap="2.0"))
        proc.send_signal(signal.SIGHUP)
        await wait_for(lambda: fake.creates == 4, 30, "the held intents sent after the raise")
        assert b"SIGHUP: prices and caps reloaded for default" in proc.err()
        assert await held() == 0
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            await proc.wait()
    assert fake.creates == 4 and proc.returncode == 0, proc.err().decode()[-2000:]
