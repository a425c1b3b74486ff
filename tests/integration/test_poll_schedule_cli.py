"""`vidpoll worker` hands each account's poll schedule settings to its poller: an account
with `poll_schedule = "fixed"` says so in the rows it reads, one without says why it has no
plan yet (a real worker process, the fake Sume answering without a poll hint)."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from vidpoll.providers.sume.fake import FakeSume
from vidpoll.store import PgStore

from ..conftest import API_KEY
from .test_process import cli_env, spawn_worker, wait_for

RUNNING = {"sume_status": "running", "terminal": False}  # no next_poll_after_seconds


@pytest.mark.parametrize(("schedule", "said"), [
    ("fixed", "the account's poll_schedule is fixed"),
    # the first read may come before the summary is read: either says there is no plan yet
    ("learned", ("render times not read yet", "100 are needed to learn")),
])
async def test_the_accounts_poll_schedule_reaches_the_worker(
        store: PgStore, fake: FakeSume, fake_url: str, db_url: str, tmp_path: Path,
        schedule: str, said: str | tuple[str, ...]) -> None:
    config = tmp_path / "vidpoll.toml"
    config.write_text(f'[accounts.default]\nprovider = "sume"\napi_key_env = "SUME_API_KEY"\n'
                      f'base_url = "{fake_url}"\npoll_schedule = "{schedule}"\n')
    fake.add_job("s1", script=[dict(RUNNING)] * 50)
    await store.add_job("s1", delay_s=0)
    proc = await spawn_worker(cli_env(db_url, fake_url, VIDPOLL_CONFIG=str(config),
                                      SUME_API_KEY=API_KEY), "--poll-only")

    def reason() -> str | None:
        with psycopg.connect(db_url) as conn:
            row = conn.execute("SELECT poll_reason FROM video_jobs WHERE polls > 0").fetchone()
        return row[0] if row else None

    try:
        await wait_for(lambda: reason() is not None, 60, "a read")
    finally:
        proc.terminate()
        await proc.wait()
    got = reason()
    assert got is not None and got.startswith("fixed 15s: "), got
    assert any(words in got for words in ((said,) if isinstance(said, str) else said)), got
