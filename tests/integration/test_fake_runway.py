"""The fake Runway developer API against Runway's documented behaviour, over real HTTP on
loopback with aiohttp as the client.

These pin the fake itself (vidpoll's adapter is tested against it elsewhere; the official SDK
drives it in test_fake_runway_sdk.py): auth and the version header, light body validation in
Runway's shape, a task's life (PENDING, THROTTLED per model under the concurrency limit,
RUNNING with progress, the three ends with their cost), cancel and delete, signed output URLs
that expire on a trigger and come back fresh on the next read (GET, HEAD, Range), the daily cap,
and every create fault with what it bills. Tests wait on observed state, never on a sleep.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from vidpoll.providers.runway.fake import (
    DEFAULT_KEY,
    DEFAULT_VERSION,
    FakeRunway,
    RunwayFakeConfig,
    start_fake_runway,
)

HEADERS = {"Authorization": f"Bearer {DEFAULT_KEY}", "X-Runway-Version": DEFAULT_VERSION}
WAIT_S = 15.0
T2V = {"model": "gen4.5", "promptText": "a lighthouse at dusk", "ratio": "1280:720",
       "duration": 5}
I2V = {"model": "gen4_turbo", "promptImage": "https://example.com/a.png", "ratio": "1280:720",
       "duration": 10}
ISO_MS = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


async def eventually(check: Callable[[], Awaitable[Any]], timeout_s: float = WAIT_S) -> Any:
    """Poll `check` every 20 ms until it returns something truthy; fail after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = await check()
        if result:
            return result
        assert time.monotonic() < deadline, "condition never held"
        await asyncio.sleep(0.02)


class Api:
    """A running fake and an aiohttp session pointed at it."""

    def __init__(self, fake: FakeRunway, url: str, session: aiohttp.ClientSession) -> None:
        self.fake = fake
        self.url = url
        self.session = session

    async def call(self, method: str, path: str, *, json: Any = None,
                   headers: dict[str, str] | None = None,
                   timeout_s: float = 10.0) -> tuple[int, Any]:
        async with self.session.request(
                method, self.url + path, json=json,
                headers=HEADERS if headers is None else headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.content_type == "application/json":
                return resp.status, await resp.json()
            return resp.status, (await resp.text()) or None

    async def create(self, body: dict[str, Any] | None = None,
                     endpoint: str = "text_to_video") -> str:
        status, answer = await self.call("POST", f"/v1/{endpoint}", json=body or T2V)
        assert status == 200, answer
        return str(answer["id"])

    async def task(self, task_id: str) -> dict[str, Any]:
        status, answer = await self.call("GET", f"/v1/tasks/{task_id}")
        assert status == 200, answer
        return dict(answer)

    async def until(self, task_id: str, *statuses: str) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            body = await self.task(task_id)
            return body if body["status"] in statuses else None
        return dict(await eventually(check))


@pytest.fixture
async def start() -> AsyncIterator[Callable[..., Awaitable[Api]]]:
    runners: list[web.AppRunner] = []
    session = aiohttp.ClientSession()

    async def make(**overrides: Any) -> Api:
        fake = FakeRunway(RunwayFakeConfig(**{"processing_s": 0.15, "seed": 7, **overrides}))
        runner, url = await start_fake_runway(fake)
        runners.append(runner)
        return Api(fake, url, session)

    yield make
    await session.close()
    for runner in runners:
        await runner.cleanup()


async def test_auth_and_version_header_refusals(start: Callable[..., Awaitable[Api]]) -> None:
    api = await start()
    assert api.url.startswith("http://127.0.0.1:") and not api.url.endswith("/")
    for headers in ({"X-Runway-Version": DEFAULT_VERSION},
                    {"Authorization": "Bearer key_wrong", "X-Runway-Version": DEFAULT_VERSION},
                    {"Authorization": DEFAULT_KEY, "X-Runway-Version": DEFAULT_VERSION}):
        status, body = await api.call("POST", "/v1/text_to_video", json=T2V, headers=headers)
        assert status == 401 and isinstance(body["error"], str)
        status, body = await api.call("GET", "/v1/tasks/x", headers=headers)
        assert status == 401 and set(body) == {"error"}
    key_only = {"Authorization": HEADERS["Authorization"]}
    status, body = await api.call("POST", "/v1/text_to_video", json=T2V, headers=key_only)
    assert status == 400 and set(body) == {"error", "docUrl"}
    status, body = await api.call("GET", "/v1/tasks/x",
                                  headers={**key_only, "X-Runway-Version": "2020-01-01"})
    assert status == 400 and "X-Runway-Version" in body["error"] and body["docUrl"]
    # every POST to a create endpoint counts, refused or not; none billed
    assert api.fake.billed() == [] and api.fake.create_posts == 4 and api.fake.status_reads == 4
    api.fake.config.versions.add("2099-01-01")
    status, _ = await api.call("GET", "/v1/tasks/x",
                               headers={**key_only, "X-Runway-Version": "2099-01-01"})
    assert status == 404


async def test_create_validation_and_answers(start: Callable[..., Awaitable[Api]]) -> None:
    api = await start(models=["gen4.5", "gen4_turbo"])
    status, body = await api.call("POST", "/v1/text_to_video", json=["not", "an", "object"])
    assert status == 400 and body["error"] == "Validation of body failed"
    assert body["issues"][0]["path"] == [] and body["docUrl"]
    status, body = await api.call("POST", "/v1/text_to_video", json={"promptText": "x"})
    assert status == 400 and [i["path"] for i in body["issues"]] == [["model"]]
    assert body["issues"][0]["code"] == "invalid_type"
    status, body = await api.call("POST", "/v1/image_to_video", json={"model": "gen4_turbo"})
    assert status == 400 and [i["path"] for i in body["issues"]] == [["promptImage"]]
    status, body = await api.call("POST", "/v1/text_to_video", json={**T2V, "model": "gen9"})
    assert status == 400 and body["issues"][0]["code"] == "invalid_union"
    status, body = await api.call("POST", "/v1/no_such_thing", json=T2V)
    assert status == 404 and "error" in body
    status, _ = await api.call("GET", "/v1/text_to_video")
    assert status == 405
    assert api.fake.billed() == []

    status, body = await api.call("POST", "/v1/image_to_video", json=I2V)
    assert status == 200 and set(body) == {"id", "estimatedCost"}
    assert body["estimatedCost"] == {"credits": 100}  # 10 credits/s x duration 10
    status, routed = await api.call("POST", "/v1/generate/video",
                                    json={"configId": "my-router", "input": {"duration": 8}})
    assert status == 200 and routed["routing"]["model"] == "gen4.5"
    assert routed["routing"]["estimatedCost"] == {"credits": 80}
    for endpoint, payload in (("video_to_video", {"model": "aleph2", "videoUri": "https://v"}),
                              ("video_upscale", {"model": "m", "videoUri": "https://v"}),
                              ("character_performance",
                               {"model": "act_two", "character": {}, "reference": {}})):
        api.fake.config.models = None
        assert await api.create(payload, endpoint)
    billed = api.fake.billed()
    assert [b for _, b in billed][:2] == [I2V, {"configId": "my-router", "input": {"duration": 8}}]
    assert [api.fake.tasks[t].endpoint for t, _ in billed] == [
        "image_to_video", "generate/video", "video_to_video", "video_upscale",
        "character_performance"]
    assert api.fake.tasks[billed[0][0]].body == I2V and api.fake.create_posts == 9


async def test_a_task_runs_to_success_with_fresh_urls_each_read(
        start: Callable[..., Awaitable[Api]]) -> None:
    api = await start(pending_s=0.1, processing_s=0.4, output_count=2)
    task_id = await api.create()
    first = await api.task(task_id)
    assert first["status"] == "PENDING" and first["estimatedCost"] == {"credits": 50}
    assert ISO_MS.fullmatch(first["createdAt"]) and first["id"] == task_id
    running = await api.until(task_id, "RUNNING")
    assert 0.0 <= running["progress"] < 1.0 and "cost" not in running
    later = await eventually(lambda: _progressed(api, task_id, running["progress"]))
    assert later["progress"] > running["progress"]
    done = await api.until(task_id, "SUCCEEDED")
    assert done["cost"] == {"credits": 50} and "estimatedCost" not in done
    assert len(done["output"]) == 2 and api.fake.tasks[task_id].status == "SUCCEEDED"
    again = await api.task(task_id)
    assert again["output"] != done["output"]  # a new `_jwt` on every read
    for old, new in zip(done["output"], again["output"], strict=True):
        assert old.split("?")[0] == new.split("?")[0]
        assert old.startswith(f"{api.url}/cdn/{task_id}/") and "?_jwt=" in old
    assert api.fake.status_reads >= 5


async def _progressed(api: Api, task_id: str, progress: float) -> dict[str, Any] | None:
    body = await api.task(task_id)
    return body if body.get("progress", 0) > progress or body["status"] != "RUNNING" else None


async def test_outcomes_are_seeded_and_finish_forces_an_end(
        start: Callable[..., Awaitable[Api]]) -> None:
    mix = {"SUCCEEDED": 1.0, "FAILED": 1.0}
    drawn = []
    for _ in range(2):
        api = await start(outcome_mix=mix, processing_s=0.0, pending_s=0.0)
        ids = [await api.create() for _ in range(10)]
        drawn.append([(await api.until(i, "SUCCEEDED", "FAILED"))["status"] for i in ids])
    assert drawn[0] == drawn[1] and set(drawn[0]) == {"SUCCEEDED", "FAILED"}
    failed = await api.task(ids[drawn[1].index("FAILED")])
    assert failed["failure"] and failed["failureCode"].startswith("INTERNAL.")
    assert failed["cost"] == {"credits": 0} and "output" not in failed

    api = await start(processing_s=60.0)
    forced = {outcome: await api.create() for outcome in ("SUCCEEDED", "FAILED", "CANCELLED")}
    await api.until(forced["SUCCEEDED"], "RUNNING")
    for outcome, task_id in forced.items():
        api.fake.finish(task_id, outcome)
        body = await api.task(task_id)
        assert body["status"] == outcome and api.fake.tasks[task_id].status == outcome
    assert (await api.task(forced["SUCCEEDED"]))["output"]
    with pytest.raises(ValueError):
        api.fake.finish(forced["FAILED"], "DONE")


async def test_concurrency_throttles_per_model_in_submission_order(
        start: Callable[..., Awaitable[Api]]) -> None:
    api = await start(concurrency=1, pending_s=0.0, processing_s=0.25)
    ids = [await api.create() for _ in range(3)]
    other = await api.create(I2V, "image_to_video")
    assert (await api.until(ids[0], "RUNNING"))["status"] == "RUNNING"
    assert (await api.task(ids[1]))["status"] == "THROTTLED"
    assert (await api.task(ids[2]))["status"] == "THROTTLED"
    throttled = await api.task(ids[2])
    assert throttled["estimatedCost"] == {"credits": 50} and "progress" not in throttled
    # another model has its own limit
    assert (await api.until(other, "RUNNING", "SUCCEEDED"))["status"] in {"RUNNING", "SUCCEEDED"}
    for task_id in ids:
        await api.until(task_id, "SUCCEEDED")
    tasks = [api.fake.tasks[i] for i in ids]
    starts = [t.started for t in tasks if t.started is not None]
    assert len(starts) == 3 and starts == sorted(starts)
    for before, after in itertools.pairwise(tasks):
        assert after.started is not None and before.ended is not None
        assert after.started >= before.ended - 1e-9  # one at a time
    status, org = await api.call("GET", "/v1/organization")
    assert status == 200
    assert org["tier"]["models"]["gen4.5"] == {"maxConcurrentGenerations": 1,
                                               "maxDailyGenerations": None}
    assert org["usage"]["models"] == {"gen4.5": {"dailyGenerations": 3},
                                      "gen4_turbo": {"dailyGenerations": 1}}
    assert org["creditBalance"] == 100_000 - 3 * 50 - 100


async def test_cancel_then_delete_and_refunds(start: Callable[..., Awaitable[Api]]) -> None:
    api = await start(concurrency=1, pending_s=0.0, processing_s=30.0)
    running, throttled, queued = [await api.create() for _ in range(3)]
    await api.until(running, "RUNNING")
    await api.until(throttled, "THROTTLED")
    status, body = await api.call("DELETE", f"/v1/tasks/{throttled}")
    assert status == 204 and body is None
    cancelled = await api.task(throttled)
    assert cancelled["status"] == "CANCELLED" and cancelled["cost"] == {"credits": 0}
    assert (await api.call("DELETE", f"/v1/tasks/{running}"))[0] == 204
    assert (await api.task(running))["cost"] == {"credits": 50}  # RUNNING: not refunded
    # the freed slot goes to the next task in line
    assert (await api.until(queued, "RUNNING"))["status"] == "RUNNING"
    # a second DELETE deletes the ended task: gone for good, but still billed
    assert (await api.call("DELETE", f"/v1/tasks/{throttled}"))[0] == 204
    status, body = await api.call("GET", f"/v1/tasks/{throttled}")
    assert (status, body) == (404, {"error": "Could not find Task"})
    assert (await api.call("DELETE", f"/v1/tasks/{throttled}")) == (
        404, {"error": "Could not find Task"})
    assert (await api.call("GET", "/v1/tasks/00000000-0000-4000-8000-000000000000"))[0] == 404
    assert api.fake.tasks[throttled].deleted and len(api.fake.billed()) == 3

    gone = await start(cancel_deletes=True, processing_s=30.0)
    task_id = await gone.create()
    assert (await gone.call("DELETE", f"/v1/tasks/{task_id}"))[0] == 204
    assert (await gone.call("GET", f"/v1/tasks/{task_id}"))[0] == 404
    assert gone.fake.tasks[task_id].status == "CANCELLED"


async def test_signed_outputs_expire_on_trigger_and_refresh(
        start: Callable[..., Awaitable[Api]]) -> None:
    api = await start(processing_s=0.0, pending_s=0.0, media_bytes=3000)
    first, second = await api.create(), await api.create()
    url = (await api.until(first, "SUCCEEDED"))["output"][0]
    other_url = (await api.until(second, "SUCCEEDED"))["output"][0]
    expected = api.fake.media_bytes(first)
    assert expected[4:8] == b"ftyp" and len(expected) == 3000
    session = api.session
    async with session.get(url) as resp:
        assert resp.status == 200 and await resp.read() == expected
        assert resp.headers["Content-Type"] == "video/mp4"
    async with session.head(url) as resp:
        assert resp.status == 200 and resp.headers["Content-Length"] == "3000"
    async with session.get(url, headers={"Range": "bytes=1000-"}) as resp:
        assert resp.status == 206 and await resp.read() == expected[1000:]
        assert resp.headers["Content-Range"] == "bytes 1000-2999/3000"
    async with session.get(url, headers={"Range": "bytes=5000-"}) as resp:
        assert resp.status == 416
    bare = url.split("?")[0]
    for bad in (bare, bare + "?_jwt=nonsense", bare + "?_jwt=" + other_url.split("_jwt=")[1]):
        async with session.get(bad) as resp:
            assert resp.status == 403 and "AccessDenied" in await resp.text()

    assert api.fake.expire_outputs(first) >= 1
    async with session.get(url) as resp:
        assert resp.status == 403 and "AccessDenied" in await resp.text()
    async with session.get(other_url) as resp:  # only that task's URLs expired
        assert resp.status == 200
    fresh = (await api.task(first))["output"][0]
    assert fresh != url and fresh.split("?")[0] == bare
    async with session.get(fresh) as resp:
        assert resp.status == 200 and await resp.read() == expected
    api.fake.expire_outputs()
    async with session.get(fresh) as resp:
        assert resp.status == 403
    async with session.get(other_url) as resp:
        assert resp.status == 403

    reads = api.fake.media_reads
    assert [r.status for r in reads[:4]] == [200, 200, 206, 416]
    assert [r.valid for r in reads] == [True] * 4 + [False] * 4 + [True, True, False, False]
    assert reads[1].method == "HEAD" and reads[2].range == "bytes=1000-"
    assert all(r.path == f"/cdn/{first}/0.mp4" for r in reads[:8])
    assert not any(r.authorization or "?" in r.path for r in reads)


async def test_daily_cap_answers_429_until_reset(start: Callable[..., Awaitable[Api]]) -> None:
    api = await start(daily_cap=2)
    await api.create()
    await api.create()
    async with api.session.post(api.url + "/v1/text_to_video", json=T2V,
                                headers=HEADERS) as resp:
        assert resp.status == 429 and "Retry-After" not in resp.headers
        assert await resp.json() == {"error": "Your daily task limit has been reached."}
    assert await api.create(I2V, "image_to_video")  # the cap is per model
    assert len(api.fake.billed()) == 3 and api.fake.daily_count("gen4.5") == 2
    api.fake.config.daily_cap_retry_after_s = 30.0
    async with api.session.post(api.url + "/v1/text_to_video", json=T2V,
                                headers=HEADERS) as resp:
        assert resp.status == 429 and resp.headers["Retry-After"] == "30"
    api.fake.reset_daily_cap()
    assert await api.create() and len(api.fake.billed()) == 4


async def test_create_faults_and_what_they_bill(start: Callable[..., Awaitable[Api]]) -> None:
    api = await start(hang_s=0.3, fivexx_status=503)
    api.fake.script_creates(["lose_reply", "5xx_after", "5xx_before", "429", None, "ok"])
    with pytest.raises(aiohttp.ClientError):
        await api.call("POST", "/v1/text_to_video", json=T2V)
    assert len(api.fake.billed()) == 1
    status, body = await api.call("POST", "/v1/text_to_video", json=T2V)
    assert status == 503 and "error" in body and len(api.fake.billed()) == 2
    status, body = await api.call("POST", "/v1/text_to_video", json=T2V)
    assert status == 503 and len(api.fake.billed()) == 2
    status, body = await api.call("POST", "/v1/text_to_video", json=T2V)
    assert status == 429 and len(api.fake.billed()) == 2
    await api.create()
    await api.create()
    assert len(api.fake.billed()) == 4
    with pytest.raises(ValueError):
        api.fake.script_creates(["explode"])

    # hang: billed at once, the client gives up first
    api.fake.script_creates(["hang"])
    with pytest.raises(TimeoutError):
        await api.call("POST", "/v1/text_to_video", json=T2V, timeout_s=0.1)
    assert len(api.fake.billed()) == 5
    # hang_then_create: nothing yet when the client gives up, created hang_s later anyway
    api.fake.script_creates(["hang_then_create"])
    with pytest.raises(TimeoutError):
        await api.call("POST", "/v1/text_to_video", json=T2V, timeout_s=0.1)
    assert len(api.fake.billed()) == 5
    await eventually(lambda: _billed_at_least(api.fake, 6))
    # a patient client gets the answer of a hang_then_create
    api.fake.script_creates(["hang_then_create"])
    status, body = await api.call("POST", "/v1/text_to_video", json=T2V)
    assert status == 200 and body["id"] == api.fake.billed()[-1][0]
    assert api.fake.create_posts == 9

    api.fake.status_5xx = 2
    task_id = body["id"]
    assert (await api.call("GET", f"/v1/tasks/{task_id}"))[0] == 503
    assert (await api.call("GET", f"/v1/tasks/{task_id}"))[0] == 503
    assert (await api.call("GET", f"/v1/tasks/{task_id}"))[0] == 200


async def _billed_at_least(fake: FakeRunway, count: int) -> bool:
    return len(fake.billed()) >= count
