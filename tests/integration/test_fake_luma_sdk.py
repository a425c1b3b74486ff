"""Luma's official SDK (lumaai 1.21.0) drives the fake Luma, unmodified but for its base URL.

The only change from real use is `LumaAI(base_url=<fake>/dream-machine/v1, auth_token=...)`
(the SDK's own constructor arguments). A fake the SDK cannot drive is not Luma. Every end
state is driven (completed with a downloadable video, failed with a failure_reason), with the
sync client (in a worker thread, since it blocks) and the async one; a callback_url receives the
generation on each update; and the SDK's own re-sends of a create — no idempotency key, 2 retries
by default — bill extra generations: one `create` call that met a 500 after billing paid for 3
generations. That is why vidpoll never creates through the SDK.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import aiohttp
import lumaai
import pytest
from aiohttp import web
from lumaai import AsyncLumaAI, LumaAI
from lumaai.types import Generation

from vidpoll.providers.luma.fake import (
    DEFAULT_KEY,
    FAILURE_REASONS,
    FakeLuma,
    LumaFakeConfig,
    start_fake_luma,
)

WAIT_S = 20.0
T = TypeVar("T")


def quick(**overrides: Any) -> LumaFakeConfig:
    base: dict[str, Any] = {"queued_s": 0.05, "processing_s": 0.15, "seed": 5}
    return LumaFakeConfig(**{**base, **overrides})


async def until(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    """Wait until `predicate()` holds (state the fake exposes without HTTP)."""
    async def loop() -> None:
        while True:
            if predicate():
                return
            await asyncio.sleep(0.02)
    await asyncio.wait_for(loop(), timeout_s)


def run_to_end(client: LumaAI, generation_id: str) -> Generation:
    """The loop users write (the SDK has no waiter), polled briskly under a deadline."""
    deadline = time.monotonic() + WAIT_S
    while True:
        generation = client.generations.get(generation_id)
        if generation.state in ("completed", "failed"):
            return generation
        assert time.monotonic() < deadline, "generation never ended"
        time.sleep(0.03)


async def async_run_to_end(client: AsyncLumaAI, generation_id: str) -> Generation:
    async def loop() -> Generation:
        while True:
            generation = await client.generations.get(generation_id)
            if generation.state in ("completed", "failed"):
                return generation
            await asyncio.sleep(0.03)
    return await asyncio.wait_for(loop(), WAIT_S)


async def download(url: str) -> bytes:
    """What a caller does with `assets.video`: a plain GET, no key."""
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        assert resp.status == 200, resp.status
        return await resp.read()


@pytest.fixture
async def served() -> AsyncIterator[Callable[[FakeLuma], Awaitable[str]]]:
    """Serve fakes on loopback; the value is the base URL to give the SDK."""
    runners: list[web.AppRunner] = []

    async def serve(fake: FakeLuma) -> str:
        runner, url = await start_fake_luma(fake)
        runners.append(runner)
        return url

    yield serve
    for runner in runners:
        await runner.cleanup()


@pytest.fixture
async def hook() -> AsyncIterator[tuple[list[dict[str, Any]], str]]:
    """A callback endpoint that answers 200 and keeps what it got."""
    hits: list[dict[str, Any]] = []

    async def handle(request: web.Request) -> web.Response:
        hits.append(await request.json())
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/luma", handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield hits, f"http://127.0.0.1:{runner.addresses[0][1]}/luma"
    await runner.cleanup()


async def test_the_sync_client_creates_polls_lists_deletes_and_reads_credits(
        served: Any) -> None:
    fake = FakeLuma(quick())
    base_url = await served(fake)
    loop = asyncio.get_running_loop()

    def scenario() -> tuple[Generation, Generation, Any, float, float]:
        with LumaAI(base_url=base_url, auth_token=DEFAULT_KEY) as client:
            before = client.credits.get().credit_balance
            created = client.generations.video.create(
                model="ray-2", prompt="a lighthouse in a storm", aspect_ratio="16:9",
                duration="5s", resolution="720p", loop=False)
            done = run_to_end(client, str(created.id))
            page = client.generations.list(limit=1, offset=0)
            after = client.credits.get().credit_balance
            assert done.assets is not None and done.assets.video
            fetched = asyncio.run_coroutine_threadsafe(download(done.assets.video), loop)
            assert fetched.result(WAIT_S) == fake.expected_media(str(created.id))
            client.generations.delete(str(created.id))
            with pytest.raises(lumaai.NotFoundError) as gone:
                client.generations.get(str(created.id))
            assert gone.value.status_code == 404
            assert gone.value.body == {"detail": "Generation not found"}
            assert client.ping.check().message == "pong"
            return created, done, page, before, after

    created, done, page, before, after = await asyncio.to_thread(scenario)
    assert created.state == "queued" and created.assets is None
    assert created.generation_type == "video" and created.created_at is not None
    assert created.created_at.utcoffset() is not None  # ISO 8601 in UTC, parsed by the SDK
    assert done.state == "completed" and done.assets is not None and done.assets.video
    assert done.id == created.id and done.model == "ray-2"
    assert done.to_dict()["request"] == {
        "model": "ray-2", "prompt": "a lighthouse in a storm", "aspect_ratio": "16:9",
        "duration": "5s", "resolution": "720p", "loop": False}
    assert [g.id for g in page.generations] == [created.id]
    assert (page.count, page.has_more, page.limit, page.offset) == (1, False, 1, 0)
    assert before - after == fake.config.price_cents
    assert fake.billed() == [(created.id, fake.generations[str(created.id)].request)]
    assert fake.generations[str(created.id)].deleted


async def test_the_async_client_sees_both_end_states_and_its_errors(served: Any) -> None:
    fake = FakeLuma(quick(outcome_mix={"failed": 1.0}))
    base_url = await served(fake)
    async with AsyncLumaAI(base_url=base_url, auth_token=DEFAULT_KEY) as client:
        failing = await client.generations.create(model="ray-flash-2", prompt="fails")
        failed = await async_run_to_end(client, str(failing.id))
        assert failed.state == "failed" and failed.failure_reason in FAILURE_REASONS
        assert failed.assets is None

        fake.config.outcome_mix = {"completed": 1.0}
        ok = await client.generations.video.create(
            model="ray-2", prompt="a tiger walking in snow",
            keyframes={"frame0": {"type": "image", "url": "https://img.test/tiger.jpg"}})
        done = await async_run_to_end(client, str(ok.id))
        assert done.state == "completed" and done.assets is not None
        assert done.assets.video is not None
        assert await download(done.assets.video) == fake.expected_media(str(ok.id))

        with pytest.raises(lumaai.BadRequestError) as short:
            await client.generations.video.create(model="ray-2", prompt="ab")
        assert short.value.body == {
            "detail": "Prompt is too short, minimum length is 3 characters"}
        with pytest.raises(lumaai.UnprocessableEntityError) as bad_model:
            await client.generations.video.create(
                model="ray-2", prompt="dropped model", extra_body={"model": "ray-1-6"})
        assert isinstance(bad_model.value.body, dict)
        assert bad_model.value.body["detail"][0]["loc"] == ["body", "model"]
        with pytest.raises(lumaai.NotFoundError):
            await client.generations.get("00000000-0000-4000-8000-000000000000")

    async with AsyncLumaAI(base_url=base_url, auth_token="luma-wrong") as wrong:
        with pytest.raises(lumaai.AuthenticationError) as denied:
            await wrong.credits.get()
        assert denied.value.body == {"detail": "Invalid API key is provided"}
    assert len(fake.billed()) == 2 and fake.create_posts == 4


async def test_list_walks_offset_pages_that_shift(served: Any) -> None:
    fake = FakeLuma(quick())
    base_url = await served(fake)
    async with AsyncLumaAI(base_url=base_url, auth_token=DEFAULT_KEY) as client:
        mine = [str((await client.generations.video.create(
            model="ray-2", prompt=f"mine {i}")).id) for i in range(5)]
        fake.config.shift_on_list = 1  # another tool creates one per page we read
        seen: list[str] = []
        offset = 0
        while True:
            page = await client.generations.list(limit=2, offset=offset)
            seen += [str(g.id) for g in page.generations]
            offset += page.count or 0
            if not page.has_more:
                break
    assert set(mine) <= set(seen)  # none skipped,
    assert len(seen) > len(set(seen))  # but some seen twice: offsets shifted under the walk
    foreign = [g.id for g in fake.generations.values() if g.foreign]
    assert foreign and not set(foreign) & set(seen)  # they arrived above the walk
    assert [i for i, _ in fake.billed()] == mine


async def test_a_callback_url_receives_the_generation_on_each_update(
        served: Any, hook: tuple[list[dict[str, Any]], str]) -> None:
    hits, url = hook
    fake = FakeLuma(quick())
    base_url = await served(fake)
    async with AsyncLumaAI(base_url=base_url, auth_token=DEFAULT_KEY) as client:
        created = await client.generations.video.create(
            model="ray-2", prompt="told when done", callback_url=url)
        await until(lambda: len(hits) == 2)
        raw = await client.generations.with_raw_response.get(str(created.id))
        final = raw.http_response.json()
    updates = [Generation.construct(**h) for h in hits]  # the SDK's own model reads them
    assert [u.state for u in updates] == ["dreaming", "completed"]
    assert all(u.id == created.id for u in updates)
    assert hits[1] == final  # the full Generation, as a GET answers it
    assert hits[0]["request"]["callback_url"] == url


async def test_sdk_retries_bill_extra_generations(served: Any) -> None:
    """One `create` call, default retries (2): the SDK re-sends after a 500 or a dropped
    connection with no idempotency key, and every attempt that reached billing is paid."""
    fake = FakeLuma(quick(create_429_retry_after_s=0.05))
    base_url = await served(fake)
    async with AsyncLumaAI(base_url=base_url, auth_token=DEFAULT_KEY) as client:
        fake.script_creates(["5xx_after", "5xx_after", "5xx_after"])
        with pytest.raises(lumaai.InternalServerError):
            await client.generations.video.create(model="ray-2", prompt="paid thrice")
        paid = [r for _, r in fake.billed() if r["prompt"] == "paid thrice"]
        assert len(paid) == 3 and fake.create_posts == 3  # and the caller got only an error

        fake.script_creates(["lose_reply"])
        got = await client.generations.video.create(model="ray-2", prompt="paid twice")
        twice = [i for i, r in fake.billed() if r["prompt"] == "paid twice"]
        assert len(twice) == 2 and got.id == twice[1]  # the first one is an orphan

        fake.script_creates(["429"])  # nothing created: the re-send is the only one
        once = await client.generations.video.create(model="ray-2", prompt="paid once")
        assert [i for i, r in fake.billed() if r["prompt"] == "paid once"] == [once.id]
        assert fake.create_posts == 7

        fake.script_creates(["5xx_after"])
        no_retry = client.with_options(max_retries=0)
        with pytest.raises(lumaai.InternalServerError):
            await no_retry.generations.video.create(model="ray-2", prompt="paid, no answer")
    assert [r["prompt"] for _, r in fake.billed()].count("paid, no answer") == 1
    assert len(fake.billed()) == 7
