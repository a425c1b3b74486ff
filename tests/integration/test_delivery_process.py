"""kill -9 in the middle of a download and of a hook: nothing half-done is published or
lost; a restarted worker finishes both. The worker runs as a real subprocess."""

from __future__ import annotations

import asyncio
import hashlib
import signal
from pathlib import Path

from .test_process import cli_env, spawn_worker, wait_for
from .test_submit_process import run_cli

DONE = [{"sume_status": "completed", "terminal": True}]
FAILED = [{"sume_status": "failed", "terminal": True}]


def size_of(path: Path) -> int:
    return path.stat().st_size if path.exists() else 0


async def test_kill_9_mid_download_publishes_nothing_and_a_restart_resumes(
        store, fake, fake_url, db_url, tmp_path):
    fake.config.media_bytes = 3 * 1024 * 1024
    fake.config.media_bytes_per_s = 1024 * 1024  # about three seconds per file
    fake.add_job("v1", script=DONE)
    await store.add_job("v1", delay_s=0)
    videos = tmp_path / "videos"
    final, part = videos / "v1" / "1-video.mp4", videos / "v1" / ".1-video.mp4.part"
    env = cli_env(db_url, fake_url)
    args = ("--poll-only", "--download-dir", str(videos), "--lease-seconds", "6")
    proc = await spawn_worker(env, *args)
    try:
        await wait_for(lambda: size_of(part) >= 1024 * 1024, 20, "a partial download")
    finally:
        proc.kill()
        await proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not final.exists() and 0 < size_of(part) < fake.config.media_bytes
    [d] = await store.job_deliveries("v1")
    assert d["state"] == "pending" and d["detail"] is None

    fake.config.media_bytes_per_s = None
    resumed_at = size_of(part)
    proc = await spawn_worker(env, *args, "--drain")
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    content = fake.media_content("v1", fake.config.media_bytes)
    assert final.read_bytes() == content and not part.exists()
    assert ("v1", 206, f"bytes={resumed_at}-", None) in fake.media_log  # resumed, not redone
    [d] = await store.job_deliveries("v1")
    assert d["state"] == "done" and d["attempts"] == 2
    assert d["detail"]["files"][0]["sha256"] == hashlib.sha256(content).hexdigest()
    code, out, _ = await run_cli(env, "jobs", "show", "v1", "--json")
    assert code == 0 and "sig=" not in out and "/media/v1/video.mp4" in out  # no signature
    assert "sig=" not in err.decode()  # nor in the worker's log


async def test_a_hook_is_not_lost_when_its_worker_is_killed(store, fake, fake_url, db_url,
                                                            tmp_path):
    fake.add_job("j1", script=FAILED)
    await store.add_job("j1", delay_s=0)
    log, block = tmp_path / "hook.log", tmp_path / "block"
    block.touch()
    env = cli_env(db_url, fake_url, HOOK_LOG=str(log), HOOK_BLOCK=str(block))
    args = ("--poll-only", "--on-terminal", "tests.integration.hook_fixtures:record",
            "--lease-seconds", "6")
    proc = await spawn_worker(env, *args)
    try:
        await wait_for(lambda: log.exists() and "start j1" in log.read_text(), 20,
                       "the hook running")
    finally:
        proc.kill()
        await proc.wait()
    assert log.read_text() == "start j1\n"  # killed inside the hook
    block.unlink()
    proc = await spawn_worker(env, *args, "--drain")
    _, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    assert log.read_text().splitlines() == ["start j1", "start j1", "done j1 failed files=0"]
    [d] = await store.job_deliveries("j1")
    assert d["consumer"] == "hook:tests.integration.hook_fixtures:record"
    assert d["state"] == "done" and d["attempts"] == 2
    code, out, _ = await run_cli(env, "deliveries", "list")
    assert code == 0 and "hook:tests.integration.hook_fixtures:record: 0 pending" in out


async def test_a_hook_that_cannot_be_imported_is_refused_at_start(db_url, fake_url):
    proc = await spawn_worker(cli_env(db_url, fake_url), "--on-terminal", "no_such_mod:fn")
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2 and b"cannot import 'no_such_mod'" in err


async def test_an_unwritable_download_dir_is_refused_at_start(db_url, fake_url, tmp_path):
    (tmp_path / "file").write_text("x")
    proc = await spawn_worker(cli_env(db_url, fake_url), "--download-dir",
                              str(tmp_path / "file" / "videos"))
    _, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 2 and b"not a directory" in err, err
