"""fal's official SDK (fal_client 1.0.3) drives the fake fal, unmodified but for its base URL.

The only change is the SDK's queue URL constant (`fal_client.client.QUEUE_URL_FORMAT`, built
from `FAL_QUEUE_RUN_HOST` at import time, with an https scheme, so the env var alone cannot
point it at a plain-HTTP loopback server); the key comes from FAL_KEY as in real use. A fake the
SDK cannot drive is not fal. Every end state is driven: success, a model error, a request error,
cancelled while queued, cancelled while running, a start timeout, a client timeout (the SDK
cancels), and the SDK's own re-sends of a create (billed twice), which is why vidpoll must not
submit through it.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import fal_client
import fal_client.client
import pytest
from aiohttp import web
from fal_client import Completed, FalClientHTTPError, FalClientTimeoutError, InProgress, Queued

from vidpoll.providers.fal.fake import (
    DEFAULT_ENDPOINT,
    DEFAULT_KEY,
    FakeFal,
    FalFakeConfig,
    start_fake_fal,
)

WAIT_S = 20.0


def quick(**overrides: Any) -> FalFakeConfig:
    base: dict[str, Any] = {"processing_s": 0.2, "seed": 11}
    return FalFakeConfig(**{**base, **overrides})


async def until(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    """Wait until `predicate()` holds (state the fake exposes without HTTP)."""
    async def loop() -> None:
        while True:
            if predicate():
                return
            await asyncio.sleep(0.02)
    await asyncio.wait_for(loop(), timeout_s)


@pytest.fixture
async def sdk(monkeypatch: pytest.MonkeyPatch
              ) -> AsyncIterator[Callable[[FakeFal], Awaitable[fal_client.AsyncClient]]]:
    """Serve a fake and point a fresh fal_client.AsyncClient at it (base URL and key only)."""
    runners: list[web.AppRunner] = []
    clients: list[fal_client.AsyncClient] = []
    monkeypatch.setenv("FAL_KEY", DEFAULT_KEY)

    async def make(fake: FakeFal) -> fal_client.AsyncClient:
        runner, url = await start_fake_fal(fake)
        runners.append(runner)
        monkeypatch.setattr(fal_client.client, "QUEUE_URL_FORMAT", url + "/")
        client = fal_client.AsyncClient()
        clients.append(client)
        return client

    yield make
    for client in clients:
        with_http = client.__dict__.get("_client")  # only if the SDK opened one
        if with_http is not None:
            await (await client._client).aclose()
    for runner in runners:
        await runner.cleanup()


async def test_submit_status_with_queue_positions_and_result(sdk: Any) -> None:
    fake = FakeFal(quick(concurrency=1, processing_s=0.5))
    client: fal_client.AsyncClient = await sdk(fake)
    first = await client.submit(DEFAULT_ENDPOINT, {"prompt": "first"})
    second = await client.submit(DEFAULT_ENDPOINT, {"prompt": "second"})
    third = await client.submit(DEFAULT_ENDPOINT, {"prompt": "third"}, priority="low")
    assert "/v2/master" not in first.status_url  # owner/app only, from the create answer
    assert isinstance(await first.status(), InProgress)
    assert await second.status() == Queued(position=0)
    assert await third.status() == Queued(position=1)
    running = await first.status(with_logs=True)
    assert isinstance(running, InProgress) and running.logs

    result = await first.get()
    assert result["video"]["url"].endswith("/output.mp4")
    done = await first.status(with_logs=True)
    assert isinstance(done, Completed) and done.error is None
    assert done.metrics["inference_time"] > 0
    # by request id alone (a restarted worker): the SDK builds the URLs from the base URL
    again = await client.result(DEFAULT_ENDPOINT, first.request_id)
    assert again == result
    status = await client.status(DEFAULT_ENDPOINT, second.request_id)
    assert isinstance(status, InProgress | Completed)
    assert (await third.get())["video"]["file_name"] == "output.mp4"
    assert fake.billed(DEFAULT_ENDPOINT, {"prompt": "first"}) == 1
    assert fake.stats()["creates"] == 3


async def test_subscribe_reports_every_phase(sdk: Any) -> None:
    fake = FakeFal(quick(concurrency=1, processing_s=0.3))
    client: fal_client.AsyncClient = await sdk(fake)
    ahead = await client.submit(DEFAULT_ENDPOINT, {"prompt": "ahead"})
    updates: list[Any] = []
    enqueued: list[str] = []
    result = await client.subscribe(DEFAULT_ENDPOINT, {"prompt": "subscribed"}, with_logs=True,
                                    on_enqueue=enqueued.append,
                                    on_queue_update=updates.append)
    assert result["video"]["content_type"] == "video/mp4"
    kinds = [type(u).__name__ for u in updates]
    assert kinds[0] == "Queued" and "InProgress" in kinds and kinds[-1] == "Completed"
    assert enqueued and enqueued[0] in fake.requests
    assert isinstance(await ahead.status(), Completed)


async def test_a_model_error_raises_with_the_detail_list(sdk: Any) -> None:
    fake = FakeFal(quick(outcome_mix={"model_error": 1.0}))
    client: fal_client.AsyncClient = await sdk(fake)
    handle = await client.submit(DEFAULT_ENDPOINT, {"prompt": "flagged"})
    with pytest.raises(FalClientHTTPError) as raised:
        await handle.get()
    err = raised.value
    assert err.status_code == 422
    assert isinstance(err.message, list)  # the SDK passes the detail list through as-is
    assert err.message[0]["type"] == "content_policy_violation"
    status = await handle.status()
    assert isinstance(status, Completed)
    assert status.error_type == "content_policy_violation" and status.error


async def test_a_request_error_raises_with_its_error_type(sdk: Any) -> None:
    fake = FakeFal(quick(outcome_mix={"request_error": 1.0}))
    client: fal_client.AsyncClient = await sdk(fake)
    with pytest.raises(FalClientHTTPError) as raised:
        await client.subscribe(DEFAULT_ENDPOINT, {"prompt": "crashes"})
    assert raised.value.status_code == 500
    assert raised.value.error_type == "runner_server_error"
    assert raised.value.response_headers["x-fal-error-type"] == "runner_server_error"
    assert fake.stats()["creates"] == 1  # a failed result read is not re-submitted


async def test_cancel_while_queued_and_while_running(sdk: Any) -> None:
    fake = FakeFal(quick(concurrency=1, processing_s=60.0))
    client: fal_client.AsyncClient = await sdk(fake)
    running = await client.submit(DEFAULT_ENDPOINT, {"prompt": "running"})
    queued = await client.submit(DEFAULT_ENDPOINT, {"prompt": "queued"})
    await queued.cancel()
    status = await queued.status()
    assert isinstance(status, Completed) and status.error_type == "client_cancelled"
    with pytest.raises(FalClientHTTPError) as raised:
        await queued.get()
    assert raised.value.status_code == 499
    with pytest.raises(FalClientHTTPError) as again:
        await queued.cancel()
    assert again.value.status_code == 400
    assert json.loads(again.value.message) == {"status": "ALREADY_COMPLETED"}

    await client.cancel(DEFAULT_ENDPOINT, running.request_id)  # by id, URLs from the base
    stopped = await running.status()
    assert isinstance(stopped, Completed) and stopped.error_type == "client_cancelled"


async def test_a_start_timeout_and_a_client_timeout(sdk: Any) -> None:
    fake = FakeFal(quick(concurrency=0))  # nothing ever starts
    client: fal_client.AsyncClient = await sdk(fake)
    handle = await client.submit(DEFAULT_ENDPOINT, {"prompt": "waits"}, start_timeout=1.1)
    with pytest.raises(FalClientHTTPError) as raised:
        await handle.get()
    assert raised.value.status_code == 504 and raised.value.error_type == "request_timeout"
    assert fake.stats()["result_reads"] == 1  # the SDK honours the user timeout: no retry

    with pytest.raises(FalClientTimeoutError) as timed_out:
        await client.subscribe(DEFAULT_ENDPOINT, {"prompt": "impatient"}, client_timeout=1.2)
    rid = timed_out.value.request_id
    assert rid in fake.requests
    await until(lambda: fake.stats()["cancels"] >= 1)  # the SDK cancels on its way out
    await until(lambda: fake.end_kind(rid) in ("cancelled", "start_timeout"))


@pytest.mark.parametrize(("fault", "status", "bills", "raises"), [
    ("lose_reply", None, 2, None),   # a transport error: re-sent
    ("5xx_after", 502, 2, None),     # an ingress (nginx) page: re-sent
    ("5xx_after", 503, 2, None),
    ("5xx_after", 504, 2, None),
    ("5xx_after", 500, 1, 500),      # fal's own JSON 500: raised, not re-sent
    ("5xx_before", 503, 1, None),    # nothing created, re-sent, created once
    ("5xx_before", 500, 0, 500),
    ("429", None, 1, None),          # re-sent after a pause, created once
    ("hang", None, 1, None),         # the SDK waits (default_timeout 120 s)
    ("hang_then_create", None, 1, None),
])
async def test_what_the_sdk_submit_bills_under_each_fault(
        sdk: Any, fault: str, status: int | None, bills: int, raises: int | None) -> None:
    """fal_client re-sends a submit after a lost reply and after an ingress 502/503/504: each
    re-send of a created request is a second paid request (PROVIDERS.md Updates)."""
    fake = FakeFal(quick(hang_s=0.3))
    if status is not None:
        fake.config.after_5xx_statuses = fake.config.before_5xx_statuses = (status,)
    client: fal_client.AsyncClient = await sdk(fake)
    fake.script_creates([fault])
    input_ = {"prompt": f"{fault} {status}"}
    if raises is None:
        handle = await client.submit(DEFAULT_ENDPOINT, input_)
        assert (await handle.get())["video"]
    else:
        with pytest.raises(FalClientHTTPError) as raised:
            await client.submit(DEFAULT_ENDPOINT, input_)
        assert raised.value.status_code == raises
        assert raised.value.error_type == "internal_error"
    assert fake.billed(DEFAULT_ENDPOINT, input_) == bills
    patient = fault in ("hang", "hang_then_create")
    assert fake.stats()["create_requests"] == (1 if raises or patient else 2)


async def test_the_sync_client_in_a_thread_and_a_webhook(sdk: Any) -> None:
    fake = FakeFal(quick())
    await sdk(fake)  # serves the fake and sets the base URL and key
    hits: list[dict[str, Any]] = []

    async def hook(request: web.Request) -> web.Response:
        hits.append(await request.json())
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    hook_url = f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    sync = fal_client.SyncClient()
    try:
        result = await asyncio.to_thread(sync.subscribe, DEFAULT_ENDPOINT, {"prompt": "sync"})
        assert result["video"]["url"].endswith("/output.mp4")
        handle = await asyncio.to_thread(sync.submit, DEFAULT_ENDPOINT, {"prompt": "hooked"},
                                         webhook_url=hook_url)
        await until(lambda: bool(hits))
        assert hits[0]["request_id"] == handle.request_id and hits[0]["status"] == "OK"
        assert await asyncio.to_thread(handle.get) == hits[0]["payload"]
    finally:
        if "_client" in sync.__dict__:
            sync._client.close()
        await runner.cleanup()
