"""Runway's official SDK (runwayml 5.24.0) drives the fake Runway, unmodified except for its base
URL and API key.

A fake the SDK cannot drive is not Runway. Both clients are used: `RunwayML` (synchronous, httpx;
run in a worker thread while the fake serves in the test's event loop) and `AsyncRunwayML`.

One concession to the clock: `wait_for_task_output` sleeps 4.5-7.5 s before every poll
(`runwayml.lib.polling.POLL_TIME` = 6 +- `POLL_JITTER` / 2, module constants read at each
call). The tests that use it set those two constants to a few tens of milliseconds; the SDK's
code is not touched.

The last tests show why vidpoll must never create through the SDK: it retries a create (no
idempotency key exists) after a 5xx or a lost reply, and each attempt that reached Runway is a
separate paid task.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import pytest
import runwayml
from aiohttp import web
from runwayml import AsyncRunwayML, RunwayML
from runwayml.lib import polling
from runwayml.lib.polling import TaskFailedError, TaskTimeoutError
from runwayml.types import ImageToVideoCreateResponse, TextToVideoCreateResponse

from vidpoll.providers.runway.fake import (
    DEFAULT_KEY,
    FakeRunway,
    RunwayFakeConfig,
    start_fake_runway,
)

WAIT_S = 20.0
PROMPT_IMAGE = "https://example.com/first-frame.png"
T = TypeVar("T")


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await asyncio.wait_for(asyncio.to_thread(fn, *args, **kwargs), WAIT_S)


async def eventually(check: Callable[[], Awaitable[T | None]]) -> T:
    """Poll `check` every 20 ms until it returns something truthy; fail after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while True:
        result = await check()
        if result:
            return result
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.02)


class Setup:
    """Fakes started by a test, and the SDK clients pointed at them (closed at the end)."""

    def __init__(self) -> None:
        self.runners: list[web.AppRunner] = []
        self.sync_clients: list[RunwayML] = []
        self.async_clients: list[AsyncRunwayML] = []

    async def fake(self, **overrides: Any) -> tuple[FakeRunway, str]:
        fake = FakeRunway(RunwayFakeConfig(**{"processing_s": 0.15, "pending_s": 0.02,
                                              "seed": 11, **overrides}))
        runner, url = await start_fake_runway(fake)
        self.runners.append(runner)
        return fake, url

    def sync_client(self, url: str, **options: Any) -> RunwayML:
        client = RunwayML(**{"base_url": url, "api_key": DEFAULT_KEY, "max_retries": 0,
                             **options})
        self.sync_clients.append(client)
        return client

    def async_client(self, url: str, **options: Any) -> AsyncRunwayML:
        client = AsyncRunwayML(**{"base_url": url, "api_key": DEFAULT_KEY, "max_retries": 0,
                                  **options})
        self.async_clients.append(client)
        return client


@pytest.fixture
async def setup() -> AsyncIterator[Setup]:
    made = Setup()
    yield made
    for client in made.async_clients:
        await client.close()
    for sync in made.sync_clients:
        sync.close()
    for runner in made.runners:
        await runner.cleanup()


@pytest.fixture
def brisk_polling(monkeypatch: pytest.MonkeyPatch) -> None:
    """wait_for_task_output polls every ~50 ms instead of every ~6 s."""
    monkeypatch.setattr(polling, "POLL_TIME", 0.05)
    monkeypatch.setattr(polling, "POLL_JITTER", 0.02)


async def download(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    """A plain GET with no API key (the output URL's signature is the credential)."""
    async with aiohttp.ClientSession() as session, session.get(url, headers=headers) as resp:
        return resp.status, await resp.read()


async def test_sync_client_creates_polls_and_downloads_with_fresh_urls(setup: Setup) -> None:
    fake, url = await setup.fake(processing_s=0.2, output_count=2)
    client = setup.sync_client(url)
    created = await in_thread(
        client.image_to_video.create, model="gen4_turbo", prompt_image=PROMPT_IMAGE,
        prompt_text="a slow dolly shot", ratio="1280:720", duration=5)
    assert isinstance(created, ImageToVideoCreateResponse)
    assert created.id in fake.tasks and created.estimated_cost.credits == 50
    [(task_id, body)] = fake.billed()
    assert task_id == created.id and fake.tasks[task_id].endpoint == "image_to_video"
    assert body == {"model": "gen4_turbo", "promptImage": PROMPT_IMAGE,
                    "promptText": "a slow dolly shot", "ratio": "1280:720", "duration": 5}

    seen: list[str] = []

    async def ended() -> Any:
        task = await in_thread(client.tasks.retrieve, created.id)
        seen.append(task.status)
        if task.status == "RUNNING":
            assert 0.0 <= task.progress < 1.0 and task.estimated_cost.credits == 50
        return task if task.status == "SUCCEEDED" else None

    done = await eventually(ended)
    assert isinstance(done, runwayml.types.task_retrieve_response.Succeeded)
    assert "RUNNING" in seen and done.cost.credits == 50 and done.id == created.id
    assert len(done.output) == 2 and done.created_at.tzinfo is not None
    for index, output in enumerate(done.output):
        status, data = await download(output)
        assert status == 200 and data == fake.media_bytes(created.id, index)
    status, tail = await download(done.output[0], {"Range": "bytes=100-"})
    assert status == 206 and tail == fake.media_bytes(created.id)[100:]
    assert all(read.valid and not read.authorization for read in fake.media_reads)

    fake.expire_outputs()
    status, _ = await download(done.output[0])
    assert status == 403
    fresh = await in_thread(client.tasks.retrieve, created.id)
    assert isinstance(fresh, runwayml.types.task_retrieve_response.Succeeded)
    assert fresh.output[0] != done.output[0]
    assert fresh.output[0].split("?")[0] == done.output[0].split("?")[0]
    status, data = await download(fresh.output[0])
    assert status == 200 and data == fake.media_bytes(created.id)
    assert [r.valid for r in fake.media_reads][-2:] == [False, True]


async def test_async_client_text_to_video_and_wait_for_task_output(
        setup: Setup, brisk_polling: None) -> None:
    fake, url = await setup.fake()
    client = setup.async_client(url)
    created = await client.text_to_video.create(
        model="gen4.5", prompt_text="a lighthouse at dusk", ratio="1280:720", duration=8)
    assert isinstance(created, TextToVideoCreateResponse)
    assert created.estimated_cost.credits == 80
    assert fake.billed() == [(created.id, {"model": "gen4.5",
                                           "promptText": "a lighthouse at dusk",
                                           "ratio": "1280:720", "duration": 8})]
    done = await asyncio.wait_for(created.wait_for_task_output(timeout=WAIT_S), WAIT_S)
    assert isinstance(done, runwayml.types.task_retrieve_response.Succeeded)
    assert done.status == "SUCCEEDED" and done.cost.credits == 80 and fake.status_reads >= 1
    status, data = await download(done.output[0])
    assert status == 200 and data[4:8] == b"ftyp" and data == fake.media_bytes(created.id)

    # wait_for_task_output also hangs off a retrieved task
    again = await client.text_to_video.create(
        model="gen4.5", prompt_text="again", ratio="720:1280", duration=5)
    pending = await client.tasks.retrieve(again.id)
    assert pending.status in {"PENDING", "RUNNING"}
    assert (await pending.wait_for_task_output(timeout=WAIT_S)).status == "SUCCEEDED"


async def test_a_failed_task_raises_with_its_failure_code(
        setup: Setup, brisk_polling: None) -> None:
    _, url = await setup.fake(outcome_mix={"FAILED": 1.0}, failure_code="SAFETY.INPUT.TEXT",
                              failure="The prompt was rejected.")
    client = setup.async_client(url)
    created = await client.text_to_video.create(
        model="gen4.5", prompt_text="x", ratio="1280:720", duration=5)
    with pytest.raises(TaskFailedError) as caught:
        await asyncio.wait_for(created.wait_for_task_output(timeout=WAIT_S), WAIT_S)
    failed = caught.value.task_details
    assert isinstance(failed, runwayml.types.task_retrieve_response.Failed)
    assert failed.failure == "The prompt was rejected."
    assert failed.failure_code == "SAFETY.INPUT.TEXT" and failed.cost.credits == 0
    # the sync helper raises on FAILED too
    sync = setup.sync_client(url)
    task = await in_thread(sync.tasks.retrieve, created.id)
    with pytest.raises(TaskFailedError):
        await in_thread(task.wait_for_task_output, timeout=WAIT_S)


async def test_cancel_while_running_async_wait_fails_sync_wait_spins(
        setup: Setup, brisk_polling: None) -> None:
    fake, url = await setup.fake(processing_s=60.0)
    client = setup.async_client(url)
    created = await client.image_to_video.create(
        model="gen4_turbo", prompt_image=PROMPT_IMAGE, ratio="1280:720", duration=5)

    async def running() -> Any:
        task = await client.tasks.retrieve(created.id)
        return task if task.status == "RUNNING" else None

    await eventually(running)
    await client.tasks.delete(created.id)
    cancelled = await client.tasks.retrieve(created.id)
    assert isinstance(cancelled, runwayml.types.task_retrieve_response.Cancelled)
    assert cancelled.cost.credits == 50  # cancelled while RUNNING: not refunded
    with pytest.raises(TaskFailedError) as caught:
        await asyncio.wait_for(created.wait_for_task_output(timeout=WAIT_S), WAIT_S)
    assert caught.value.task_details.status == "CANCELLED"

    # runwayml 5.24's sync helper does not treat CANCELLED as an end: it polls on until its
    # timeout, then raises TaskTimeoutError carrying the CANCELLED task
    sync = setup.sync_client(url)
    task = await in_thread(sync.tasks.retrieve, created.id)
    reads = fake.status_reads
    with pytest.raises(TaskTimeoutError) as spun:
        await in_thread(task.wait_for_task_output, timeout=0.3)
    assert spun.value.task_details.status == "CANCELLED" and fake.status_reads - reads >= 3

    # deleting the ended task removes it
    await client.tasks.delete(created.id)
    with pytest.raises(runwayml.NotFoundError) as missing:
        await client.tasks.retrieve(created.id)
    assert missing.value.body == {"error": "Could not find Task"}
    with pytest.raises(runwayml.NotFoundError):
        await client.tasks.delete(created.id)


async def test_throttled_while_over_the_concurrency_limit(setup: Setup) -> None:
    fake, url = await setup.fake(concurrency=1, processing_s=0.12)
    client = setup.async_client(url)
    ids = [(await client.text_to_video.create(
        model="gen4.5", prompt_text=f"shot {n}", ratio="1280:720", duration=5)).id
        for n in range(3)]

    async def first_running_others_throttled() -> bool:
        statuses = [(await client.tasks.retrieve(i)).status for i in ids]
        return statuses == ["RUNNING", "THROTTLED", "THROTTLED"]

    await eventually(first_running_others_throttled)
    throttled = await client.tasks.retrieve(ids[2])
    assert isinstance(throttled, runwayml.types.task_retrieve_response.Throttled)
    assert throttled.estimated_cost.credits == 50

    async def all_succeeded() -> bool:
        return all([(await client.tasks.retrieve(i)).status == "SUCCEEDED" for i in ids])

    await eventually(all_succeeded)
    starts = [fake.tasks[i].started for i in ids]
    assert None not in starts and starts == sorted(s for s in starts if s is not None)
    org = await client.organization.retrieve()
    assert org.tier.models["gen4.5"].max_concurrent_generations == 1
    assert org.usage.models["gen4.5"].daily_generations == 3


def create_sync(client: RunwayML) -> str:
    return client.text_to_video.create(model="gen4.5", prompt_text="one video, please",
                                       ratio="1280:720", duration=5).id


async def create_async(client: AsyncRunwayML) -> str:
    created = await client.text_to_video.create(model="gen4.5", prompt_text="one video, please",
                                                ratio="1280:720", duration=5)
    return created.id


async def test_the_sdk_retries_a_create_that_billed(setup: Setup) -> None:
    fake, url = await setup.fake(processing_s=30.0, fivexx_status=502)

    # a 502 after the task was created: the SDK's one retry creates a second paid task
    fake.script_creates(["5xx_after", None])
    retried = await in_thread(create_sync, setup.sync_client(url, max_retries=1))
    billed = fake.billed()
    assert len(billed) == 2 and fake.create_posts == 2
    assert billed[1][0] == retried and billed[0][1] == billed[1][1]
    assert billed[0][1] == {"model": "gen4.5", "promptText": "one video, please",
                            "ratio": "1280:720", "duration": 5}
    orphan = billed[0][0]
    assert fake.tasks[orphan].status in {"PENDING", "RUNNING"}  # unseen by the caller, paid

    # a lost reply: the same
    fake.script_creates(["lose_reply", None])
    again = await create_async(setup.async_client(url, max_retries=1))
    assert len(fake.billed()) == 4 and fake.billed()[3][0] == again

    # with no retries the caller sees only an error, yet a task was created and billed
    fake.script_creates(["5xx_after"])
    with pytest.raises(runwayml.InternalServerError) as caught:
        await create_async(setup.async_client(url))
    assert caught.value.status_code == 502 and len(fake.billed()) == 5
    # ...while a 5xx before creation bills nothing
    fake.script_creates(["5xx_before"])
    with pytest.raises(runwayml.InternalServerError):
        await create_async(setup.async_client(url))
    assert len(fake.billed()) == 5 and fake.create_posts == 6


async def test_the_daily_cap_answers_429_and_the_sdk_retries_it(setup: Setup) -> None:
    # Runway documents no Retry-After on this 429; the fake sends a tiny one here only so the
    # SDK's retry (which honours it) is quick
    fake, url = await setup.fake(daily_cap=1, daily_cap_retry_after_s=0.01)
    client = setup.async_client(url, max_retries=2)
    await client.text_to_video.create(model="gen4.5", prompt_text="a", ratio="1280:720",
                                      duration=5)
    with pytest.raises(runwayml.RateLimitError) as caught:
        await client.text_to_video.create(model="gen4.5", prompt_text="b", ratio="1280:720",
                                          duration=5)
    assert caught.value.body == {"error": "Your daily task limit has been reached."}
    assert fake.create_posts == 4 and len(fake.billed()) == 1  # 1 + (1 + 2 retries)
    fake.reset_daily_cap()
    await client.text_to_video.create(model="gen4.5", prompt_text="b", ratio="1280:720",
                                      duration=5)
    assert len(fake.billed()) == 2


async def test_refusals_map_to_the_sdk_exceptions(setup: Setup) -> None:
    fake, url = await setup.fake()
    with pytest.raises(runwayml.AuthenticationError) as auth:
        await setup.async_client(url, api_key="key_wrong").tasks.retrieve("x")
    assert isinstance(auth.value.body, dict) and "error" in auth.value.body
    with pytest.raises(runwayml.BadRequestError) as version:
        await setup.async_client(url, runway_version="2020-01-01").tasks.retrieve("x")
    assert isinstance(version.value.body, dict) and set(version.value.body) == {"error",
                                                                                "docUrl"}
    client = setup.async_client(url)
    with pytest.raises(runwayml.NotFoundError):
        await client.tasks.retrieve("00000000-0000-4000-8000-000000000000")
    with pytest.raises(runwayml.BadRequestError) as invalid:
        await client.text_to_video.create(model="gen4.5", prompt_text="x", ratio="1280:720",
                                          duration=5, extra_body={"promptText": 7})
    assert isinstance(invalid.value.body, dict)
    assert invalid.value.body["error"] == "Validation of body failed"
    assert invalid.value.body["issues"][0]["path"] == ["promptText"]
    assert fake.billed() == []
