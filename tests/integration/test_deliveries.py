"""Deliveries after the terminal state: completion hooks and media downloads, at least once,
tracked in the database; real PostgreSQL, real HTTP to the fake's result and media links."""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import os
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest

from vidpoll import download
from vidpoll.deliver import Deliverer, DeliveryConfig
from vidpoll.download import Downloader
from vidpoll.errors import DiskError, DownloadError
from vidpoll.fetch_guard import FetchPolicy
from vidpoll.models import Job
from vidpoll.providers.sume.client import SumeClient
from vidpoll.store import PgStore

from ..conftest import API_KEY, FAST_POLICY, run_until

DONE = [{"sume_status": "completed", "terminal": True}]
FAILED = [{"sume_status": "failed", "terminal": True}]


def make_deliverer(store: PgStore, hooks: dict[str, Any] | None = None,
                   downloader: Downloader | None = None, **kwargs: Any) -> Deliverer:
    kwargs.setdefault("policy", FAST_POLICY)
    kwargs.setdefault("lease_s", 3.0)
    return Deliverer(store, DeliveryConfig(hooks=hooks or {}, **kwargs), downloader)


async def started(deliverer: Deliverer) -> asyncio.Task[None]:
    """Run `deliverer` in the background once its consumers are registered (a job ending
    before that gets no delivery, by design)."""
    task = asyncio.create_task(deliverer.run())
    await deliverer.signals.wait_for(lambda: deliverer.idle or task.done(), 10)
    return task


async def stopped(deliverer: Deliverer, task: asyncio.Task[None]) -> None:
    deliverer.stop()
    await asyncio.wait_for(task, 10)


@pytest.fixture
async def downloader(tmp_path: Path, fake_url: str) -> AsyncIterator[Downloader]:
    async with Downloader(tmp_path / "videos", read_timeout_s=5,
                          policy=FetchPolicy.for_origin(fake_url)) as d:
        yield d


def media_sha(fake: Any, job_id: str) -> str:
    return hashlib.sha256(fake.media_content(job_id, fake.config.media_bytes)).hexdigest()


async def end_jobs(store: PgStore, fake: Any, make_worker: Callable[..., Any],
                   script: list[dict[str, Any]], *job_ids: str) -> None:
    """Let the fake end these jobs as `script` says and a draining worker record it."""
    for job_id in job_ids:
        fake.add_job(job_id, script=script)
        await store.add_job(job_id, delay_s=0)
    await asyncio.wait_for(make_worker(drain=True).run(), 10)


async def until(deliverer: Deliverer, predicate: Callable[[], bool], within_s: float = 10
                ) -> None:
    await deliverer.signals.wait_for(predicate, within_s)


async def test_a_hook_runs_for_each_finished_job_after_its_result(store, fake, make_worker):
    seen: list[Job] = []
    hooks = {"app:done": seen.append}
    deliverer = make_deliverer(store, hooks)
    task = await started(deliverer)
    fake.add_job("c1", script=DONE)
    fake.add_job("f1", script=FAILED)
    await store.add_job("c1", delay_s=0)
    await store.add_job("f1", delay_s=0)
    worker = make_worker(drain=True)
    await asyncio.wait_for(worker.run(), 10)
    await until(deliverer, lambda: len(seen) == 2)
    await stopped(deliverer, task)
    by_id = {j.job_id: j for j in seen}
    assert by_id["c1"].state == "completed" and by_id["c1"].result_state == "fetched"
    assert by_id["c1"].result is not None and by_id["c1"].result["job_id"] == "c1"
    assert by_id["f1"].state == "failed" and by_id["f1"].result is None
    for job_id in ("c1", "f1"):
        [d] = await store.job_deliveries(job_id)
        assert d["consumer"] == "hook:app:done" and d["state"] == "done" and d["attempts"] == 1


async def test_a_job_that_ended_before_the_hook_existed_gets_no_delivery(store, fake,
                                                                        make_worker):
    await end_jobs(store, fake, make_worker, FAILED, "old")
    ran: list[str] = []
    deliverer = make_deliverer(store, {"app:done": lambda job: ran.append(job.job_id)},
                               drain=True)
    deliverer.producers_finished()
    await asyncio.wait_for(deliverer.run(), 10)
    assert ran == [] and await store.job_deliveries("old") == []


async def test_a_drain_ends_as_soon_as_the_pollers_are_done(store):
    # asleep with nothing to deliver (up to idle_max_s, 30 s) while the pollers still run;
    # their end must wake it, or `worker --drain` with a hook lingers half a minute
    deliverer = make_deliverer(store, {"app:done": lambda job: None}, drain=True, listen=False)
    task = await started(deliverer)
    deliverer.producers_finished()
    await asyncio.wait_for(task, 10)  # a third of the idle cap


async def test_a_hook_that_raises_is_retried_with_backoff_and_eventually_runs(
        store, fake, make_worker):
    calls: list[str] = []

    async def flaky(job: Job) -> None:
        calls.append(job.job_id)
        if len(calls) < 3:
            raise RuntimeError("the CRM is down")

    deliverer = make_deliverer(store, {"app:flaky": flaky})
    task = await started(deliverer)
    await end_jobs(store, fake, make_worker, FAILED, "j1")
    await until(deliverer, lambda: deliverer.stats.deliveries_done == 1)
    await stopped(deliverer, task)
    assert calls == ["j1", "j1", "j1"]
    [d] = await store.job_deliveries("j1")
    assert d["state"] == "done" and d["attempts"] == 3 and d["last_error"] is None


async def test_a_hook_that_keeps_failing_is_marked_failed_visibly_and_can_be_retried(
        store, fake, make_worker, caplog):
    def broken(job: Job) -> None:
        raise ValueError(f"cannot publish https://cdn.example/v.mp4?sig=SECRET for {job.job_id}")

    deliverer = make_deliverer(store, {"app:broken": broken}, max_attempts=2)
    task = await started(deliverer)
    await end_jobs(store, fake, make_worker, FAILED, "j1")
    await until(deliverer, lambda: deliverer.stats.deliveries_failed == 1)
    await stopped(deliverer, task)
    assert deliverer.stats.delivery_retries == 1
    [d] = await store.job_deliveries("j1")
    assert d["state"] == "failed" and d["attempts"] == 2
    assert "gave up after 2 tries: ValueError: cannot publish" in d["last_error"]
    assert "SECRET" not in d["last_error"]  # a signed URL in an exception is shown bare
    assert "cannot publish https://cdn.example/v.mp4 for j1" in caplog.text
    assert "SECRET" not in caplog.text
    assert [p["job_id"] for p in await store.failed_deliveries()] == ["j1"]
    assert (await store.delivery_counts())[0]["failed"] == 1
    assert [r["job_id"] for r in await store.retry_deliveries(job_id="j1")] == ["j1"]
    [d] = await store.job_deliveries("j1")
    assert d["state"] == "pending" and d["attempts"] == 0


async def test_a_slow_hook_does_not_stall_polling(store, fake, make_worker):
    entered, release = threading.Event(), threading.Event()

    def slow(job: Job) -> None:  # sync: runs in a thread, blocks until the test says so
        entered.set()
        release.wait(20)

    deliverer = make_deliverer(store, {"app:slow": slow}, concurrency=1)
    task = await started(deliverer)
    fake.add_job("first", script=FAILED)
    await store.add_job("first", delay_s=0)
    try:
        worker = make_worker()
        await run_until(worker, lambda: worker.stats.finished == 1)
        assert await asyncio.to_thread(entered.wait, 10)  # the hook now hangs
        for i in range(5):
            fake.add_job(f"j{i}", script=FAILED)
            await store.add_job(f"j{i}", delay_s=0)
        worker = make_worker()
        await run_until(worker, lambda: worker.stats.finished == 5)  # polled meanwhile
        assert deliverer.stats.deliveries_done == 0 and not release.is_set()
    finally:
        release.set()
    await until(deliverer, lambda: deliverer.stats.deliveries_done == 6)
    await stopped(deliverer, task)


async def test_the_heartbeat_keeps_a_long_delivery_from_being_taken_over(store, fake,
                                                                         make_worker, db_url):
    calls: list[str] = []

    async def long_hook(job: Job) -> None:
        calls.append(job.job_id)
        # run until the lease this attempt began with has been over for a second by the
        # database's clock (the other deliverer wakes to claim it when it ends): a wall-clock
        # sleep would prove nothing on a machine slow enough to stretch the claim instead
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
            cur = await conn.execute("SELECT next_at FROM vidpoll_deliveries "
                                     "WHERE job_id = %s", (job.job_id,))
            row = await cur.fetchone()
            assert row is not None
            while True:
                cur = await conn.execute("SELECT clock_timestamp() > %s + interval '1 s'",
                                         (row[0],))
                over = await cur.fetchone()
                if over is not None and over[0]:
                    return
                await asyncio.sleep(0.05)

    # a lease of 2 s, extended every 2/3 s: a loaded machine may hold this process back for
    # most of a second without the heartbeat missing its turn
    one = make_deliverer(store, {"app:long": long_hook}, lease_s=2.0)
    two = make_deliverer(store, {"app:long": long_hook}, lease_s=2.0)
    tasks = [await started(one), await started(two)]
    await end_jobs(store, fake, make_worker, FAILED, "j1")
    await until(one, lambda: one.stats.deliveries_done + two.stats.deliveries_done == 1)
    await stopped(one, tasks[0])
    await stopped(two, tasks[1])
    assert calls == ["j1"]
    [d] = await store.job_deliveries("j1")
    assert d["state"] == "done" and d["attempts"] == 1


async def test_a_job_that_ends_again_during_its_hook_is_delivered_again(store, fake,
                                                                        make_worker, db_url):
    seen: list[tuple[str, str]] = []
    gate = asyncio.Event()

    async def hook(job: Job) -> None:
        seen.append((job.job_id, job.state))
        if len(seen) == 1:
            await gate.wait()

    deliverer = make_deliverer(store, {"app:h": hook})
    task = await started(deliverer)
    await end_jobs(store, fake, make_worker, FAILED, "j1")
    await until(deliverer, lambda: len(seen) == 1)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        # resumed by an operator, then final again, while the first run still goes on
        await conn.execute("UPDATE video_jobs SET state = 'pending' WHERE job_id = 'j1'")
        await conn.execute("UPDATE video_jobs SET state = 'canceled' WHERE job_id = 'j1'")
    [d] = await store.job_deliveries("j1")
    assert d["state"] == "pending"  # the running attempt keeps its lease:
    assert await store.claim_deliveries("hook:app:h", 1, 5) == []  # no second run beside it
    assert len(seen) == 1
    gate.set()
    await until(deliverer, lambda: len(seen) == 2)
    await until(deliverer, lambda: deliverer.stats.deliveries_done == 2)
    await stopped(deliverer, task)
    assert seen == [("j1", "failed"), ("j1", "canceled")]


async def test_retry_leaves_a_running_delivery_alone(store, fake, make_worker):
    calls: list[int] = []
    gate = asyncio.Event()

    async def hook(job: Job) -> None:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("first try fails")
        await gate.wait()

    deliverer = make_deliverer(store, {"app:h": hook})
    task = await started(deliverer)
    await end_jobs(store, fake, make_worker, FAILED, "j1")
    await until(deliverer, lambda: len(calls) == 2)  # the second try runs now
    assert await store.retry_deliveries(job_id="j1") == []
    gate.set()
    await until(deliverer, lambda: deliverer.stats.deliveries_done == 1)
    await stopped(deliverer, task)
    assert len(calls) == 2


async def test_an_async_hook_past_its_timeout_is_cancelled_and_retried(store, fake,
                                                                       make_worker):
    calls: list[str] = []

    async def hook(job: Job) -> None:
        calls.append(job.job_id)
        if len(calls) == 1:
            await asyncio.sleep(30)
        elif len(calls) == 2:
            raise TimeoutError("the CRM timed out")  # the hook's own, not ours

    deliverer = make_deliverer(store, {"app:h": hook}, hook_timeout_s=0.3)
    task = await started(deliverer)
    await end_jobs(store, fake, make_worker, FAILED, "j1")
    await until(deliverer, lambda: deliverer.stats.delivery_retries == 1)
    [d] = await store.job_deliveries("j1")
    assert d["last_error"] == "the hook ran longer than 0.3s"
    await until(deliverer, lambda: deliverer.stats.delivery_retries == 2)
    [d] = await store.job_deliveries("j1")
    assert d["last_error"] == "TimeoutError: the CRM timed out"
    await until(deliverer, lambda: deliverer.stats.deliveries_done == 1)
    await stopped(deliverer, task)
    assert calls == ["j1"] * 3


async def test_a_delivery_whose_job_row_is_gone_never_blocks_the_others(store, fake,
                                                                         make_worker, db_url):
    ran: list[str] = []
    deliverer = make_deliverer(store, {"app:h": lambda job: ran.append(job.job_id)},
                               concurrency=1)
    await deliverer.prepare()
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("INSERT INTO vidpoll_deliveries (job_id, consumer, next_at) "
                           "VALUES ('deleted-job', 'hook:app:h', now() - interval '1 hour')")
    await end_jobs(store, fake, make_worker, FAILED, "j1")
    task = asyncio.create_task(deliverer.run())
    await until(deliverer, lambda: ran == ["j1"])
    await stopped(deliverer, task)
    assert await store.next_delivery_due_in(["hook:app:h"]) is None


async def test_an_unexpected_download_error_is_recorded_not_lost(store, downloader, db_url):
    deliverer = make_deliverer(store, downloader=downloader)
    await deliverer.prepare()
    await store.add_job("j1", delay_s=60)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute(
            "UPDATE video_jobs SET state = 'completed', result_state = 'fetched', result = "
            """'{"videos": [{"url": "http://127.0.0.1:99999/v.mp4?sig=SECRET"}]}' """
            "WHERE job_id = 'j1'")
    task = asyncio.create_task(deliverer.run())
    # a port out of range once raised a ValueError from aiohttp (retried); the fetch rules
    # now refuse the URL for good
    await until(deliverer, lambda: deliverer.stats.deliveries_failed == 1)
    await stopped(deliverer, task)
    [d] = await store.job_deliveries("j1")
    assert d["state"] == "failed" and "not a valid URL" in d["last_error"]
    assert "SECRET" not in d["last_error"]


async def test_a_delivery_that_never_reported_back_is_failed_not_run_again(store, db_url):
    ran: list[str] = []
    deliverer = make_deliverer(store, {"app:h": lambda job: ran.append(job.job_id)},
                               max_attempts=3)
    await deliverer.prepare()
    await store.add_job("j1", delay_s=60)
    async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as conn:
        await conn.execute("UPDATE video_jobs SET state = 'failed' WHERE job_id = 'j1'")
        # three claims, each lost with its process (a hook that kills the worker)
        await conn.execute("UPDATE vidpoll_deliveries SET attempts = 3 WHERE job_id = 'j1'")
    task = asyncio.create_task(deliverer.run())
    await until(deliverer, lambda: deliverer.stats.deliveries_failed == 1)
    await stopped(deliverer, task)
    assert ran == []
    [d] = await store.job_deliveries("j1")
    assert d["state"] == "failed" and "never reported back" in d["last_error"]


async def test_a_hook_gets_the_downloaded_files(store, fake, fake_url, make_worker, downloader):
    seen: list[Job] = []
    deliverer = make_deliverer(store, {"app:done": seen.append}, downloader)
    task = await started(deliverer)
    await end_jobs(store, fake, make_worker, DONE, "v1")
    await until(deliverer, lambda: len(seen) == 1)
    await stopped(deliverer, task)
    [job] = seen
    [f] = job.files
    data = Path(f.path).read_bytes()
    assert data == fake.media_content("v1", fake.config.media_bytes)
    assert f.size == len(data) and f.sha256 == media_sha(fake, "v1")
    assert Path(f.path).parent == downloader.directory / "v1"
    assert "?" not in f.url and f.url.endswith("/media/v1/video.mp4")
    assert [p.name for p in Path(f.path).parent.iterdir()] == [Path(f.path).name]  # no .part
    assert (await store.job("v1")).files == job.files
    # the CDN never sees the Sume API key
    assert [auth for *_, auth in fake.media_log] == [None]


async def test_an_expired_link_is_refreshed_by_fetching_the_result_again(
        store, fake, make_worker, downloader):
    fake.config.media_expired_first = 1  # the first link handed out is dead on arrival
    deliverer = make_deliverer(store, downloader=downloader)
    task = await started(deliverer)
    fake.add_job("v1", script=DONE)
    await store.add_job("v1", delay_s=0)
    worker = make_worker()
    wtask = asyncio.create_task(worker.run())
    try:
        await until(deliverer, lambda: deliverer.stats.deliveries_done == 1, 15)
    finally:
        worker.stop()
        await wtask
    await stopped(deliverer, task)
    assert [status for _, status, *_ in fake.media_log] == [403, 200]
    assert fake.results_served["v1"] == 2 and worker.stats.results_fetched == 2
    [f] = (await store.job("v1")).files
    assert f.sha256 == media_sha(fake, "v1")


async def test_a_partial_file_is_resumed_with_a_range_request(fake, fake_url, downloader,
                                                              store):
    fake.add_job("v1", script=DONE)
    url = await result_link(fake_url, "v1")
    content = fake.media_content("v1", fake.config.media_bytes)
    folder = downloader.directory / "v1"
    folder.mkdir(parents=True)
    (folder / ".1-video.mp4.part").write_bytes(content[:100_000])  # a crash left this
    [f] = await downloader.download("v1", [url])
    assert fake.media_log[-1][1:3] == (206, "bytes=100000-")
    assert Path(f.path).read_bytes() == content and f.sha256 == media_sha(fake, "v1")
    assert sorted(p.name for p in folder.iterdir()) == ["1-video.mp4"]


async def test_a_server_that_ignores_range_gets_a_clean_restart(fake, fake_url, downloader):
    fake.config.media_ranges = False
    fake.add_job("v1", script=DONE)
    url = await result_link(fake_url, "v1")
    content = fake.media_content("v1", fake.config.media_bytes)
    folder = downloader.directory / "v1"
    folder.mkdir(parents=True)
    (folder / ".1-video.mp4.part").write_bytes(b"garbage from elsewhere" * 100)
    [f] = await downloader.download("v1", [url])
    assert fake.media_log[-1][1] == 200
    assert Path(f.path).read_bytes() == content and f.size == len(content)


async def test_a_partial_longer_than_the_file_is_thrown_away(fake, fake_url, downloader):
    fake.add_job("v1", script=DONE)
    url = await result_link(fake_url, "v1")
    folder = downloader.directory / "v1"
    folder.mkdir(parents=True)
    (folder / ".1-video.mp4.part").write_bytes(b"x" * (fake.config.media_bytes + 10))
    with pytest.raises(DownloadError, match="416"):
        await downloader.download("v1", [url])
    # nothing published, the bad partial emptied
    assert [(p.name, p.stat().st_size) for p in folder.iterdir()] == [(".1-video.mp4.part", 0)]
    [f] = await downloader.download("v1", [url])
    assert Path(f.path).read_bytes() == fake.media_content("v1", fake.config.media_bytes)


async def test_a_full_disk_keeps_the_job_not_downloaded_with_a_clear_error(
        store, fake, make_worker, downloader, monkeypatch):
    # every write fails with ENOSPC, as on a full disk (a .part linked to /dev/full did it
    # until links in the download directory were refused: test_fetch_guard's symlink tests)
    disk_full = threading.Event()
    disk_full.set()
    real_write = download._write

    def write(out: Any, hasher: Any, data: bytes) -> None:
        if disk_full.is_set():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_write(out, hasher, data)

    monkeypatch.setattr(download, "_write", write)
    folder = downloader.directory / "v1"
    deliverer = make_deliverer(store, downloader=downloader)
    task = await started(deliverer)
    await end_jobs(store, fake, make_worker, DONE, "v1")
    await until(deliverer, lambda: deliverer.stats.delivery_retries >= 1)
    [d] = await store.job_deliveries("v1")
    assert d["state"] == "pending" and "the disk is full" in d["last_error"]
    assert (await store.job("v1")).files == ()
    assert not (folder / "1-video.mp4").exists()
    disk_full.clear()  # space freed: the next try completes
    await until(deliverer, lambda: deliverer.stats.deliveries_done == 1, 15)
    await stopped(deliverer, task)
    [f] = (await store.job("v1")).files
    assert f.sha256 == media_sha(fake, "v1")


async def test_an_unusable_download_directory_fails_at_start(store, tmp_path):
    (tmp_path / "a-file").write_text("not a directory")
    downloader = Downloader(tmp_path / "a-file" / "videos")
    with pytest.raises(DiskError, match="not a directory"):
        downloader.check_directory()
    deliverer = make_deliverer(store, downloader=downloader)
    with pytest.raises(DiskError):
        await asyncio.wait_for(deliverer.run(), 10)


async def test_odd_job_ids_never_escape_the_download_directory(fake, fake_url, downloader):
    for job_id in ("../../etc/passwd", "a/b", "..", "ü 名前"):
        fake.add_job(job_id, script=DONE)
        url = await result_link(fake_url, job_id)
        [f] = await downloader.download(job_id, [url])
        path = Path(f.path).resolve()
        assert path.parent.parent == downloader.directory.resolve()
        assert path.read_bytes() == fake.media_content(job_id, fake.config.media_bytes)


async def result_link(fake_url: str, job_id: str) -> str:
    """A fresh signed link, as GET .../result hands it out."""
    async with SumeClient(fake_url, API_KEY) as client:
        answer = await client.read_result(job_id)
    return str(json.loads(answer.body)["videos"][0]["url"])


async def test_a_partial_that_is_already_complete_is_published_not_redone(fake, fake_url,
                                                                          downloader):
    fake.add_job("v1", script=DONE)
    url = await result_link(fake_url, "v1")
    content = fake.media_content("v1", fake.config.media_bytes)
    folder = downloader.directory / "v1"
    folder.mkdir(parents=True)
    (folder / ".1-video.mp4.part").write_bytes(content)  # killed between fsync and rename
    [f] = await downloader.download("v1", [url])
    assert fake.media_log[-1][1] == 416  # nothing left to send
    assert Path(f.path).read_bytes() == content and f.sha256 == media_sha(fake, "v1")
    assert [p.name for p in folder.iterdir()] == ["1-video.mp4"]
