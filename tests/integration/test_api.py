"""The Python API: the README's example as written, and wait() on NOTIFY and without it."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import psycopg
import pytest

import vidpoll.api
from vidpoll import ConfigError, DatabaseUnavailable, IntentRejected, Vidpoll
from vidpoll.config import Settings
from vidpoll.deliver import hook_name

from ..conftest import API_KEY


def readme_example(repo_root: Path) -> str:
    text = (repo_root / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.DOTALL)
    example = next(b for b in blocks if "Vidpoll.open()" in b)
    # the example ends with asyncio.run(main()); here the test's loop runs main() itself
    assert example.rstrip().endswith("asyncio.run(main())")
    return example.rstrip().removesuffix("asyncio.run(main())")


async def test_the_readme_example_runs(repo_root, monkeypatch, capsys, store, fake, fake_url,
                                       db_url, make_worker):
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("SUME_BASE_URL", fake_url)
    monkeypatch.setenv("SUME_API_KEY", API_KEY)
    monkeypatch.setenv("VIDPOLL_FIRST_POLL_S", "0.05")
    namespace: dict[str, Any] = {}
    exec(readme_example(repo_root), namespace)  # the README's own code, unchanged
    # a poller only: with a submitter beside it, either could send first
    poller = make_worker()
    task = asyncio.create_task(poller.run())
    try:
        await asyncio.wait_for(namespace["main"](), 30)
    finally:
        poller.stop()
        await task
    job_id = fake.by_key["order-1234-clip-1"]
    assert capsys.readouterr().out.splitlines() == [f"submitted {job_id}",
                                                    f"{job_id} completed"]
    assert fake.billed == 1


async def finish(db_url: str, job_id: str, state: str = "completed") -> None:
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("UPDATE video_jobs SET state = %s WHERE job_id = %s", (state, job_id))


async def read_once(vp: Vidpoll, waiter: asyncio.Task[object]) -> None:
    """Until wait() has read the pending row once: a change after that only reaches it by
    NOTIFY (or by its fallback re-read), never by its first read."""
    async with asyncio.timeout(10):
        while vp.wait_reads < 1 and not waiter.done():  # noqa: ASYNC110 (bounded)
            await asyncio.sleep(0.005)
    assert vp.wait_reads == 1


async def test_wait_wakes_on_notify(vp, store, db_url, monkeypatch):
    monkeypatch.setattr(vidpoll.api, "WAIT_FALLBACK_S", 60.0)  # only a NOTIFY can wake it
    await store.add_job("j1")
    waiter = asyncio.create_task(vp.wait("j1", timeout=20))
    await read_once(vp, waiter)
    assert not waiter.done()
    await finish(db_url, "j1")
    job = await asyncio.wait_for(waiter, 10)
    # set by hand, not by a worker: the database stamps finished_at anyway (0009's trigger)
    assert job.state == "completed" and job.finished_at is not None


async def test_wait_falls_back_to_reading_when_a_notify_is_missed(vp, store, db_url,
                                                                  monkeypatch):
    monkeypatch.setattr(vidpoll.api, "WAIT_FALLBACK_S", 0.1)
    await store.add_job("j1")
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("ALTER TABLE video_jobs DISABLE TRIGGER vidpoll_jobs_done")
    waiter = asyncio.create_task(vp.wait("j1", timeout=20))
    await read_once(vp, waiter)
    await finish(db_url, "j1", "failed")
    job = await asyncio.wait_for(waiter, 10)
    assert job.state == "failed"


async def test_wait_errors(vp, store):
    await store.add_job("j1")
    with pytest.raises(TimeoutError):
        await vp.wait("j1", timeout=0.3)
    with pytest.raises(LookupError):
        await vp.wait("nope", timeout=5)
    with pytest.raises(LookupError):
        await vp.wait(key="nope", timeout=5)


async def test_submit_raises_on_rejection_and_wait_too(vp, fake):
    with pytest.raises(IntentRejected) as info:
        await vp.submit({"prompt": ""}, key="bad")
    assert info.value.code == "invalid_request"
    with pytest.raises(IntentRejected):
        await vp.wait(key="bad", timeout=5)
    again = await vp.intent("bad")
    assert again is not None and again.state == "rejected"


async def test_submit_without_sending(vp, fake):
    sub = await vp.submit({"prompt": "x"}, send_now=False)
    assert sub.state == "queued" and sub.new and fake.creates == 0
    assert sub.reason is not None and "worker" in sub.reason


async def test_submit_without_an_api_key_records_nothing(db_url, fake_url, store):
    settings = Settings.from_env({"DATABASE_URL": db_url, "SUME_BASE_URL": fake_url})
    async with await Vidpoll.open(settings=settings) as handle:
        with pytest.raises(ConfigError, match="SUME_API_KEY"):
            await handle.submit({"prompt": "x"})
    assert await store.intent_counts() == {}


async def test_an_error_after_the_commit_names_the_key(vp, fake, monkeypatch):
    async def database_went_away(*args: object, **kwargs: object) -> None:
        raise DatabaseUnavailable("PostgreSQL is unavailable")

    # the claim fails after the intent was committed (as a real outage between the two would)
    monkeypatch.setattr(vidpoll.api, "submit_now", database_went_away)
    with pytest.raises(DatabaseUnavailable) as info:
        await vp.submit({"prompt": "x"}, key="order-7")
    assert any("order-7" in note for note in info.value.__notes__)
    intent = await vp.intent("order-7")
    assert intent is not None and intent.state == "queued" and fake.creates == 0


def readme_hook(repo_root: Path) -> dict[str, Any]:
    text = (repo_root / "README.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", text, re.DOTALL)
                 if "def publish" in b)
    namespace: dict[str, Any] = {}
    exec(block, namespace)  # the README's own hook, unchanged
    return namespace


async def test_the_readme_hook_runs_in_process_with_the_files(
        repo_root, tmp_path, capsys, vp, store, fake, make_worker):
    publish = readme_hook(repo_root)["publish"]
    fake.add_job("c1", script=[{"sume_status": "completed", "terminal": True}])
    fake.add_job("f1", script=[{"sume_status": "FAILED", "terminal": True}])
    async with vp.deliveries(on_terminal=publish, download_dir=tmp_path / "videos") as d:
        await d.signals.wait_for(lambda: d.idle, 10)  # registered before any job ends
        for job_id in ("c1", "f1"):
            await store.add_job(job_id, delay_s=0)
        await asyncio.wait_for(make_worker(drain=True).run(), 10)
        await d.signals.wait_for(lambda: d.stats.deliveries_done == 3, 10)
    size = fake.config.media_bytes
    assert sorted(capsys.readouterr().out.splitlines()) == [
        f"c1 ready: {tmp_path / 'videos' / 'c1' / '1-video.mp4'} ({size} bytes)",
        "f1 ended failed"]
    # tracked under the function's own module:qualname
    assert {r["consumer"] for r in await store.delivery_counts()} == {
        "download", f"hook:{hook_name(publish)}"}


async def test_wait_with_result_returns_once_the_result_is_in(vp, store, fake, make_worker):
    fake.add_job("c1", script=[{"sume_status": "completed", "terminal": True}])
    await store.add_job("c1", delay_s=0)
    worker = make_worker()
    task = asyncio.create_task(worker.run())
    try:
        job = await vp.wait("c1", timeout=10, with_result=True)
    finally:
        worker.stop()
        await task
    assert job.state == "completed" and job.result_state == "fetched"
    assert job.result is not None and job.result["videos"][0]["url"].startswith("http")
