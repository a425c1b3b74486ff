"""The fake Luma against Luma's documented behaviour, over real HTTP on loopback (aiohttp).

These tests pin the fake itself (vidpoll's Luma adapter is tested against it elsewhere): auth
and Luma's `{"detail"}` errors, the create's 201 Generation with the request echoed exactly,
queued -> dreaming -> completed | failed from elapsed time, delete, credits pre-charged and
refunded, offset pages that shift when generations arrive mid-walk, every create, list and
status fault and what it bills, unsigned callbacks retried on anything but 200, and the media
CDN with Range and triggered expiry. Tests wait on observed state, never on a clock.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from vidpoll.providers.luma.fake import (
    API_PREFIX,
    DEFAULT_KEY,
    FAILURE_REASONS,
    FakeLuma,
    LumaFakeConfig,
    start_fake_luma,
)

AUTH = {"Authorization": f"Bearer {DEFAULT_KEY}"}
WAIT_S = 20.0


def quick(**overrides: Any) -> LumaFakeConfig:
    """A config with short lives, so a test sees every state within a fraction of a second."""
    base: dict[str, Any] = {"queued_s": 0.05, "processing_s": 0.15, "seed": 3}
    return LumaFakeConfig(**{**base, **overrides})


async def until(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    """Wait until `predicate()` holds (state the fake exposes without HTTP)."""
    async def loop() -> None:
        while True:
            if predicate():
                return
            await asyncio.sleep(0.02)
    await asyncio.wait_for(loop(), timeout_s)


class Api:
    """A thin aiohttp client for the fake: (status, parsed JSON or text, headers)."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session, self.base = session, base

    async def call(self, method: str, path: str, *, json_body: Any = None,
                   headers: dict[str, str] | None = None, auth: bool = True,
                   timeout_s: float | None = None) -> tuple[int, Any, dict[str, str]]:
        url = path if path.startswith("http") else self.base + path
        timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s else None
        async with self.session.request(method, url, json=json_body,
                                        headers={**(AUTH if auth else {}), **(headers or {})},
                                        timeout=timeout) as resp:
            text = await resp.text()
            try:
                body: Any = json.loads(text)
            except ValueError:
                body = text
            return resp.status, body, dict(resp.headers)

    async def create(self, body: Any, **kw: Any) -> tuple[int, Any, dict[str, str]]:
        return await self.call("POST", "/generations/video", json_body=body, **kw)

    async def get(self, gid: str) -> tuple[int, Any]:
        status, body, _ = await self.call("GET", f"/generations/{gid}")
        return status, body

    async def until_state(self, gid: str, *states: str) -> dict[str, Any]:
        async def loop() -> dict[str, Any]:
            while True:
                status, body = await self.get(gid)
                assert status == 200, body
                if body["state"] in states:
                    return dict(body)
                await asyncio.sleep(0.02)
        return await asyncio.wait_for(loop(), WAIT_S)

    async def page(self, **params: int) -> dict[str, Any]:
        query = "&".join(f"{k}={v}" for k, v in params.items())
        status, body, _ = await self.call("GET", f"/generations?{query}")
        assert status == 200, body
        return dict(body)

    async def credits(self) -> float:
        status, body, _ = await self.call("GET", "/credits")
        assert status == 200, body
        return float(body["credit_balance"])


@pytest.fixture
async def served() -> AsyncIterator[Callable[[FakeLuma], Awaitable[Api]]]:
    """Start fakes on loopback (each with its own client session); stop them all after."""
    runners: list[web.AppRunner] = []
    sessions: list[aiohttp.ClientSession] = []

    async def serve(fake: FakeLuma) -> Api:
        runner, url = await start_fake_luma(fake)
        runners.append(runner)
        session = aiohttp.ClientSession()
        sessions.append(session)
        return Api(session, url)

    yield serve
    for session in sessions:
        await session.close()
    for runner in runners:
        await runner.cleanup()


class Receiver:
    """A callback endpoint answering the statuses it is told to, in order (then 200)."""

    def __init__(self, statuses: list[int] | None = None) -> None:
        self.statuses = list(statuses or [])
        self.hits: list[tuple[float, dict[str, str], dict[str, Any]]] = []

    async def handle(self, request: web.Request) -> web.Response:
        self.hits.append((time.monotonic(), dict(request.headers), await request.json()))
        return web.Response(status=self.statuses.pop(0) if self.statuses else 200)


@pytest.fixture
async def receiver() -> AsyncIterator[Callable[[Receiver], Awaitable[str]]]:
    runners: list[web.AppRunner] = []

    async def serve(r: Receiver) -> str:
        app = web.Application()
        app.router.add_post("/hook", r.handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        return f"http://127.0.0.1:{runner.addresses[0][1]}/hook"

    yield serve
    for runner in runners:
        await runner.cleanup()


async def test_auth_and_the_base_url(served: Any) -> None:
    fake = FakeLuma(quick())
    api: Api = await served(fake)
    assert api.base.endswith(API_PREFIX) and fake.api_key == DEFAULT_KEY
    status, body, _ = await api.call("GET", "/ping")
    assert (status, body) == (200, {"message": "pong"})
    status, body, _ = await api.call("GET", "/credits", auth=False)
    assert (status, body) == (401, {"detail": "Not authenticated"})
    for header in (f"Bearer {DEFAULT_KEY}x", f"Basic {DEFAULT_KEY}", DEFAULT_KEY):
        status, body, _ = await api.call("GET", "/credits", auth=False,
                                         headers={"Authorization": header})
        assert (status, body) == (401, {"detail": "Invalid API key is provided"}), header
    status, _, _ = await api.create({"model": "ray-2", "prompt": "no key"}, auth=False)
    assert status == 401 and fake.billed() == [] and fake.create_posts == 1


async def test_create_echoes_the_request_and_runs_to_completion(served: Any) -> None:
    fake = FakeLuma(quick())
    api: Api = await served(fake)
    before = await api.credits()
    request = {"model": "ray-flash-2", "prompt": "a koi pond in the rain",
               "aspect_ratio": "9:16", "duration": "5s", "resolution": "720p", "loop": False,
               "keyframes": {"frame0": {"type": "image", "url": "https://img.test/a.jpg"}},
               "callback_url": "http://127.0.0.1:9/never", "x_unknown": {"kept": [1, 2]}}
    status, created, _ = await api.create(request)
    assert status == 201, created
    gid = created["id"]
    assert uuid.UUID(gid).version == 4
    assert created["state"] == "queued" and created["failure_reason"] is None
    assert created["assets"] is None and created["generation_type"] == "video"
    assert created["model"] == "ray-flash-2" and created["request"] == request
    stamp = datetime.fromisoformat(created["created_at"].replace("Z", "+00:00"))
    assert stamp.tzinfo is not None and created["created_at"].endswith("Z")
    assert abs(stamp.timestamp() - time.time()) < 5
    g = fake.generations[gid]
    assert g.request == request and not g.foreign and isinstance(g.created_at, float)
    assert fake.billed() == [(gid, request)]
    assert await api.credits() == before - fake.config.price_cents  # pre-charged

    dreaming = await api.until_state(gid, "dreaming", "completed")
    assert dreaming["state"] == "dreaming" and dreaming["assets"] is None
    done = await api.until_state(gid, "completed")
    assert done["assets"]["video"] == f"{fake.origin}/cdn/{gid}/video.mp4"
    assert done["request"] == request and done["created_at"] == created["created_at"]
    assert fake.status_reads >= 2
    assert await api.credits() == before - fake.config.price_cents

    # the older path of the first docs
    status, old, _ = await api.call("POST", "/generations",
                                    json_body={"model": "ray-2", "prompt": "old path"})
    assert status == 201 and old["state"] == "queued" and len(fake.billed()) == 2


async def test_invalid_creates_answer_in_lumas_shapes_and_bill_nothing(served: Any) -> None:
    fake = FakeLuma(quick())
    api: Api = await served(fake)
    cases: list[tuple[Any, int, Any]] = [
        ({"prompt": "no model"}, 422, ["body", "model"]),
        ({"model": "ray-1-6", "prompt": "dropped model"}, 422, ["body", "model"]),
        ({"model": "ray-2", "prompt": "wide", "aspect_ratio": "2:1"}, 422,
         ["body", "aspect_ratio"]),
        ({"model": "ray-2", "prompt": "loopy", "loop": "yes"}, 422, ["body", "loop"]),
        ({"model": "ray-2", "prompt": "hook", "callback_url": "not a url"}, 422,
         ["body", "callback_url"]),
        ({"model": "ray-2", "prompt": "frame",
          "keyframes": {"frame0": {"type": "video", "url": "u"}}}, 422,
         ["body", "keyframes", "frame0", "type"]),
        (["not", "an", "object"], 422, ["body"]),
        ({"model": "ray-2"}, 400, "Prompt is required"),
        ({"model": "ray-2", "prompt": "ab"}, 400,
         "Prompt is too short, minimum length is 3 characters"),
        ({"model": "ray-2", "prompt": "x" * 5001}, 400,
         "Prompt is too long, maximum length is 5000 characters"),
        ({"model": "ray-2", "prompt": "none", "keyframes": {"frame0": None}}, 400,
         "No keyframes provided"),
        ({"model": "ray-2", "prompt": "both", "loop": True,
          "keyframes": {"frame0": {"type": "image", "url": "https://i/a.jpg"},
                        "frame1": {"type": "image", "url": "https://i/b.jpg"}}}, 400,
         "Loop is not supported for keyframes"),
    ]
    for body, want_status, want in cases:
        status, answer, _ = await api.create(body)
        assert status == want_status, (body, answer)
        if want_status == 422:
            assert answer["detail"][0]["loc"] == want, answer
        else:
            assert answer == {"detail": want}
    # an image keyframe makes the prompt optional
    status, _, _ = await api.create({"model": "ray-2", "keyframes": {
        "frame0": {"type": "image", "url": "https://i/a.jpg"}}})
    assert status == 201
    status, answer, _ = await api.call("POST", "/generations/video",
                                       headers={"Content-Type": "application/json"})
    assert status == 422 and answer["detail"][0]["type"] == "json_invalid"
    assert len(fake.billed()) == 1 and fake.create_posts == len(cases) + 2


async def test_failures_refunds_finish_and_blacklisted_words(served: Any) -> None:
    fake = FakeLuma(quick(outcome_mix={"failed": 1.0}, blacklisted_words=("forbidden",)))
    api: Api = await served(fake)
    start = await api.credits()
    _, created, _ = await api.create({"model": "ray-2", "prompt": "fails by the mix"})
    failed = await api.until_state(created["id"], "failed")
    assert failed["failure_reason"] in FAILURE_REASONS and failed["assets"] is None
    assert await api.credits() == start  # refunded once failed

    fake.config.outcome_mix = {"completed": 1.0}
    fake.config.processing_s = 60.0
    _, bad, _ = await api.create({"model": "ray-2", "prompt": "a FORBIDDEN thing"})
    _, held, _ = await api.create({"model": "ray-2", "prompt": "forced to end"})
    _, other, _ = await api.create({"model": "ray-2", "prompt": "forced to fail"})
    assert await api.credits() == start - 3 * fake.config.price_cents
    fake.finish(held["id"], "completed")
    media = fake.media_url(held["id"])
    async with api.session.get(media) as resp:
        assert resp.status == 200
    fake.expire_media()  # every generation so far
    async with api.session.get(media) as resp:
        assert resp.status == 403
    fake.finish(other["id"], "failed", "Frame moderation failed")
    fake.finish(bad["id"], "failed")
    assert (await api.get(held["id"]))[1]["state"] == "completed"
    assert (await api.get(other["id"]))[1]["failure_reason"] == "Frame moderation failed"
    assert (await api.get(bad["id"]))[1]["failure_reason"] == "Contains blacklisted words"
    with pytest.raises(ValueError):
        fake.finish(held["id"], "failed")
    assert await api.credits() == start - fake.config.price_cents
    assert len(fake.billed()) == 4  # every create was paid at the time; refunds are credits


async def test_unknown_ids_delete_and_media(served: Any) -> None:
    fake = FakeLuma(quick(media_bytes=1000))
    api: Api = await served(fake)
    assert await api.get(str(uuid.uuid4())) == (404, {"detail": "Generation not found"})
    status, _, _ = await api.call("DELETE", f"/generations/{uuid.uuid4()}")
    assert status == 404
    _, a, _ = await api.create({"model": "ray-2", "prompt": "kept"})
    _, b, _ = await api.create({"model": "ray-2", "prompt": "deleted"})
    done = await api.until_state(a["id"], "completed")
    await api.until_state(b["id"], "completed")
    url = done["assets"]["video"]

    async with api.session.get(url) as resp:  # public: no Authorization
        assert resp.status == 200 and resp.headers["Accept-Ranges"] == "bytes"
        assert await resp.read() == fake.expected_media(a["id"])
    async with api.session.get(url, headers={"Range": "bytes=10-19"}) as resp:
        assert resp.status == 206 and resp.headers["Content-Range"] == "bytes 10-19/1000"
        assert await resp.read() == fake.expected_media(a["id"])[10:20]
    async with api.session.get(url, headers={"Range": "bytes=-5"}) as resp:
        assert resp.status == 206 and await resp.read() == fake.expected_media(a["id"])[-5:]
    async with api.session.get(url, headers={"Range": "bytes=5000-"}) as resp:
        assert resp.status == 416
    async with api.session.head(url) as resp:
        assert resp.status == 200 and resp.headers["Content-Length"] == "1000"

    status, body, _ = await api.call("DELETE", f"/generations/{b['id']}")
    assert (status, body) == (204, "")
    assert (await api.get(b["id"]))[0] == 404
    assert [g["id"] for g in (await api.page())["generations"]] == [a["id"]]
    async with api.session.get(f"{fake.origin}/cdn/{b['id']}/video.mp4") as resp:
        assert resp.status == 404
    assert fake.generations[b["id"]].deleted and len(fake.billed()) == 2

    fake.expire_media(id=a["id"])
    async with api.session.get(url) as resp:
        assert resp.status == 403
    assert (await api.get(a["id"]))[1]["assets"]["video"] == url  # the URL itself stays
    assert [r.status for r in fake.media_reads] == [200, 206, 206, 416, 200, 404, 403]


async def test_list_pages_newest_first_and_limits(served: Any) -> None:
    fake = FakeLuma(quick(list_limit_max=5))
    api: Api = await served(fake)
    ids = []
    for i in range(7):
        _, g, _ = await api.create({"model": "ray-2", "prompt": f"prompt number {i}"})
        ids.append(g["id"])
    newest_first = ids[::-1]
    first = await api.page(limit=3)
    assert [g["id"] for g in first["generations"]] == newest_first[:3]
    assert (first["count"], first["has_more"], first["limit"], first["offset"]) == (3, True, 3, 0)
    last = await api.page(limit=3, offset=6)
    assert [g["id"] for g in last["generations"]] == newest_first[6:]
    assert (last["count"], last["has_more"]) == (1, False)
    capped = await api.page(limit=50)
    assert capped["limit"] == 5 and capped["count"] == 5 and capped["has_more"]
    assert (await api.page())["limit"] == 5  # the default 100, cut to this fake's max
    assert capped["generations"][0]["request"] == {"model": "ray-2",
                                                   "prompt": "prompt number 6"}
    for query in ("limit=0", "limit=x", "offset=-1"):
        status, body, _ = await api.call("GET", f"/generations?{query}")
        assert status == 422 and isinstance(body["detail"], list), query
    assert (await api.page(offset=99))["generations"] == []


async def test_pages_shift_when_generations_arrive_mid_walk(served: Any) -> None:
    fake = FakeLuma(quick())
    api: Api = await served(fake)
    mine = []
    for i in range(6):
        _, g, _ = await api.create({"model": "ray-2", "prompt": f"mine {i}"})
        mine.append(g["id"])
    foreign = fake.add_foreign_generations(2)
    assert all(fake.generations[f].foreign for f in foreign)
    assert [i for i, _ in fake.billed()] == mine  # foreign ones are not ours to pay
    top = await api.page(limit=2)
    assert [g["id"] for g in top["generations"]] == foreign[::-1]
    assert top["generations"][0]["request"]["prompt"] not in {f"mine {i}" for i in range(6)}

    fake.config.shift_on_list = 1
    pages: list[dict[str, Any]] = []
    fake.on_list_page = lambda _fake, body: pages.append(body)
    seen: list[str] = []
    offset = 0
    while True:
        page = await api.page(limit=3, offset=offset)
        seen += [g["id"] for g in page["generations"]]
        offset += page["count"]
        if not page["has_more"]:
            break
    assert len(pages) == fake.list_reads - 1
    assert set(mine + foreign) <= set(seen)  # none skipped
    assert len(seen) > len(set(seen))  # but some seen twice: each page pushed the rest down
    assert len(fake.generations) == 8 + len(pages)


async def test_list_and_status_faults(served: Any) -> None:
    fake = FakeLuma(quick(create_429_retry_after_s=2, status_5xx=2))
    api: Api = await served(fake)
    _, g, _ = await api.create({"model": "ray-2", "prompt": "faults"})
    fake.script_lists(["5xx", "429", "garbled", None])
    status, body, _ = await api.call("GET", "/generations")
    assert (status, body) == (500, "Internal Server Error")
    status, body, headers = await api.call("GET", "/generations")
    assert status == 429 and body == {"detail": "Too many requests"}
    assert headers["Retry-After"] == "2"
    async with api.session.get(api.base + "/generations", headers=AUTH) as resp:
        assert resp.status == 200
        with pytest.raises(ValueError):
            json.loads(await resp.text())
    assert (await api.page())["count"] == 1
    assert [(await api.get(g["id"]))[0] for _ in range(3)] == [500, 500, 200]
    assert fake.list_reads == 4 and fake.status_reads == 3
    with pytest.raises(ValueError):
        fake.script_lists(["nope"])


@pytest.mark.parametrize(("fault", "status", "billed"), [
    ("5xx_after", 500, 1),
    ("5xx_before", 500, 0),
    ("429", 429, 0),
])
async def test_create_faults_that_answer(served: Any, fault: str, status: int,
                                         billed: int) -> None:
    fake = FakeLuma(quick())
    api: Api = await served(fake)
    fake.script_creates([fault])
    request = {"model": "ray-2", "prompt": f"fault {fault}"}
    got, _, _ = await api.create(request)
    assert got == status and len(fake.billed()) == billed
    got, _, _ = await api.create(request)  # the script is used up: normal again
    assert got == 201 and len(fake.billed()) == billed + 1


async def test_a_lost_reply_and_hangs_bill_what_they_say(served: Any) -> None:
    fake = FakeLuma(quick(hang_s=0.4))
    api: Api = await served(fake)
    fake.script_creates(["lose_reply", "hang", "hang_then_create", None])
    with pytest.raises(aiohttp.ClientError):
        await api.create({"model": "ray-2", "prompt": "lost reply"})
    assert [r["prompt"] for _, r in fake.billed()] == ["lost reply"]

    with pytest.raises(TimeoutError):
        await api.create({"model": "ray-2", "prompt": "hang"}, timeout_s=0.15)
    assert [r["prompt"] for _, r in fake.billed()][-1] == "hang"  # created at once

    with pytest.raises(TimeoutError):
        await api.create({"model": "ray-2", "prompt": "late"}, timeout_s=0.15)
    assert len(fake.billed()) == 2  # not yet: held first
    await until(lambda: len(fake.billed()) == 3)  # created once held, the client long gone
    status, _, _ = await api.create({"model": "ray-2", "prompt": "normal"})
    assert status == 201 and fake.create_posts == 4
    with pytest.raises(ValueError):
        fake.script_creates(["explode"])


async def test_rate_limits_and_credits_refuse_creates(served: Any) -> None:
    fake = FakeLuma(quick(processing_s=60.0, max_concurrent=1))
    api: Api = await served(fake)
    req = {"model": "ray-2", "prompt": "limits"}
    _, first, _ = await api.create(req)
    status, body, headers = await api.create(req)
    assert (status, body) == (429, {"detail": "Too many requests"})
    assert "Retry-After" not in headers
    fake.finish(first["id"], "completed")
    assert (await api.create(req))[0] == 201
    fake.config.max_concurrent = None
    fake.config.creates_per_minute = 3
    assert (await api.create(req))[0] == 201
    assert (await api.create(req))[0] == 429  # 3 accepted in the last minute
    fake.config.creates_per_minute = None
    fake.config.start_credits = fake.config.price_cents * 3.5
    assert (await api.create(req))[0] == 402
    assert len(fake.billed()) == 3


async def test_callbacks_send_the_generation_on_each_update(served: Any,
                                                            receiver: Any) -> None:
    fake = FakeLuma(quick())
    api: Api = await served(fake)
    r = Receiver()
    url = await receiver(r)
    request = {"model": "ray-2", "prompt": "called back", "callback_url": url}
    _, g, _ = await api.create(request)
    await until(lambda: len(r.hits) == 2)
    states = [body["state"] for _, _, body in r.hits]
    assert states == ["dreaming", "completed"]
    final = (await api.get(g["id"]))[1]
    assert r.hits[1][2] == final  # the full Generation, as a GET answers it
    assert r.hits[0][2]["request"] == request
    for _, headers, _ in r.hits:
        assert headers["Content-Type"] == "application/json"
        assert not any("signature" in h.lower() for h in headers)
    assert [(c.state, c.attempt, c.status) for c in fake.callbacks] == [
        ("dreaming", 1, 200), ("completed", 1, 200)]


async def test_callbacks_retry_anything_but_200(served: Any, receiver: Any) -> None:
    fake = FakeLuma(quick(outcome_mix={"failed": 1.0}))
    api: Api = await served(fake)
    r = Receiver([204, 500, 503, 202, 500])  # dreaming: 4 attempts, all refused; then 500, 200
    url = await receiver(r)
    _, g, _ = await api.create({"model": "ray-2", "prompt": "picky hook",
                                "callback_url": url})
    await until(lambda: len(r.hits) == 6)
    attempts = [(c.state, c.attempt, c.status) for c in fake.callbacks]
    assert attempts == [("dreaming", 1, 204), ("dreaming", 2, 500), ("dreaming", 3, 503),
                        ("dreaming", 4, 202), ("failed", 1, 500), ("failed", 2, 200)]
    gaps = [b[0] - a[0] for a, b in zip(r.hits[:3], r.hits[1:4], strict=True)]
    assert all(gap >= 0.09 for gap in gaps)  # 100 ms apart
    assert r.hits[-1][2]["failure_reason"] in FAILURE_REASONS

    fake.config.callback_retries = 1
    _, lost, _ = await api.create({"model": "ray-2", "prompt": "nobody listens",
                                   "callback_url": "http://127.0.0.1:9/hook"})
    await until(lambda: sum(1 for c in fake.callbacks if c.generation_id == lost["id"]) == 4)
    errors = [c for c in fake.callbacks if c.generation_id == lost["id"]]
    assert all(c.status is None and c.error for c in errors)
    assert g["id"] != lost["id"]
