"""The fake Kling against Kling's documented behaviour, over real HTTP on loopback.

Kling has no official Python SDK, so the client side here is what Kling's docs show: the
PyJWT token sample from the "General Information" page, used unmodified, and plain HTTP
calls (aiohttp). These pin the fake itself (vidpoll's adapter is tested against it
elsewhere): the envelope, the JWT refusals 1001-1004, creates and their documented checks,
reads by task_id or external_task_id, the list, the public expiring media with Range,
callbacks, every scripted fault and what it bills, and repeated external_task_ids.
Tests wait on observed state with a generous overall timeout.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import jwt
import pytest
from aiohttp import web

from vidpoll.providers.kling.fake import (
    DEFAULT_ACCESS_KEY,
    DEFAULT_SECRET_KEY,
    FakeKling,
    KlingFakeConfig,
    start_fake_kling,
)

WAIT_S = 15.0
T2V = "/v1/videos/text2video"
I2V = "/v1/videos/image2video"
# The text-to-video body as Kling's "Create Task" table lists it.
BODY = {"model_name": "kling-v1", "prompt": "a cat on a skateboard", "negative_prompt": "blur",
        "cfg_scale": 0.5, "mode": "std", "aspect_ratio": "16:9", "duration": "5"}
OTHER_AK = "AKfake-other-account-0123456789abcdef"
OTHER_SK = "SKfake-other-account-secret-0123456789abcdef-0123456789"


# Kling's documented token sample, copied unmodified from the "General Information" page
# (app.klingai.com/global/dev/document-api/apiReference/commonInfo, "API Authentication",
# Python tab). Only the trailing lint/type marks are ours: the docs' lines are long, their
# function is untyped and names its result before returning it.
def encode_jwt_token(ak, sk):  # type: ignore[no-untyped-def]
    headers = {
        "alg": "HS256",
        "typ": "JWT"
    }
    payload = {
        "iss": ak,
        "exp": int(time.time()) + 1800, # The valid time, in this example, represents the current time+1800s(30min)  # noqa: E501
        "nbf": int(time.time()) - 5 # The time when it starts to take effect, in this example, represents the current time -5s  # noqa: E501
    }
    token = jwt.encode(payload, sk, headers=headers)
    return token  # noqa: RET504


def documented_token(ak: str = DEFAULT_ACCESS_KEY, sk: str = DEFAULT_SECRET_KEY) -> str:
    """A token minted by the documented sample."""
    return str(encode_jwt_token(ak, sk))  # type: ignore[no-untyped-call]


def bearer(ak: str = DEFAULT_ACCESS_KEY, sk: str = DEFAULT_SECRET_KEY) -> dict[str, str]:
    """The headers Kling's docs show: a fresh documented token on each request."""
    return {"Authorization": f"Bearer {documented_token(ak, sk)}",
            "Content-Type": "application/json"}


def custom_token(claims: dict[str, Any], sk: str = DEFAULT_SECRET_KEY) -> str:
    """A token with chosen claims (for the refusals the docs' sample cannot produce)."""
    return jwt.encode(claims, sk, algorithm="HS256", headers={"alg": "HS256", "typ": "JWT"})


async def eventually(check: Callable[[], Awaitable[Any]], timeout_s: float = WAIT_S) -> Any:
    """Poll `check` every 20 ms until it returns something truthy; fail after `timeout_s`."""
    async def loop() -> Any:
        while True:
            value = await check()
            if value:
                return value
            await asyncio.sleep(0.02)
    return await asyncio.wait_for(loop(), timeout_s)


async def until(predicate: Callable[[], bool]) -> None:
    async def check() -> bool:
        return predicate()
    await eventually(check)


class Api:
    """Plain HTTP to the fake: (status, parsed JSON or bytes, headers)."""

    def __init__(self, session: aiohttp.ClientSession, base: str) -> None:
        self.session, self.base = session, base

    async def call(self, method: str, path: str, *, json_body: Any = None,
                   headers: dict[str, str] | None = None, timeout_s: float | None = None,
                   data: bytes | None = None) -> tuple[int, Any, dict[str, str]]:
        url = path if path.startswith("http") else self.base + path
        sent = bearer() if headers is None else headers
        timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s else None
        async with self.session.request(method, url, json=json_body, data=data, headers=sent,
                                        timeout=timeout) as resp:
            raw = await resp.read()
            try:
                body: Any = json.loads(raw)
            except ValueError:
                body = raw
            return resp.status, body, dict(resp.headers)

    async def create(self, body: Any = None, path: str = T2V,
                     **kwargs: Any) -> tuple[int, Any, dict[str, str]]:
        return await self.call("POST", path, json_body=BODY if body is None else body,
                               **kwargs)

    async def ended(self, task_or_external_id: str, path: str = T2V) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            status, body, _ = await self.call("GET", f"{path}/{task_or_external_id}")
            assert status == 200 and body["code"] == 0, body
            data: dict[str, Any] = body["data"]
            return data if data["task_status"] in ("succeed", "failed") else None
        result: dict[str, Any] = await eventually(check)
        return result


@pytest.fixture
async def served() -> AsyncIterator[Callable[[FakeKling], Awaitable[Api]]]:
    """Start fakes on loopback, each with its own client session; stop them all after."""
    runners: list[web.AppRunner] = []
    sessions: list[aiohttp.ClientSession] = []

    async def serve(fake: FakeKling) -> Api:
        runner, url = await start_fake_kling(fake)
        runners.append(runner)
        session = aiohttp.ClientSession()
        sessions.append(session)
        return Api(session, url)

    yield serve
    for session in sessions:
        await session.close()
    for runner in runners:
        await runner.cleanup()


def kling(**overrides: Any) -> FakeKling:
    config = KlingFakeConfig(**{"queue_s": 0.03, "processing_s": 0.12, "seed": 7,
                                "file_bytes": 1000, **overrides})
    return FakeKling(config)


def assert_envelope(body: Any, code: int = 0) -> None:
    assert body["code"] == code
    assert isinstance(body["message"], str) and body["message"]
    uuid.UUID(body["request_id"])  # a UUID, as in the docs' 1303 example
    if code == 0:
        assert body["message"] == "SUCCEED" and "data" in body
    else:
        assert set(body) == {"code", "message", "request_id"}


# ---- the life of a task ----

async def test_text2video_runs_to_success_readable_by_both_ids(served: Any) -> None:
    fake = kling()
    api: Api = await served(fake)
    before_ms = int(time.time() * 1000)
    status, body, _ = await api.create({**BODY, "external_task_id": "order-17"})
    assert status == 200
    assert_envelope(body)
    created = body["data"]
    assert set(created) == {"task_id", "task_status", "task_info", "created_at", "updated_at"}
    task_id = created["task_id"]
    assert re.fullmatch(r"\d{18}", task_id)
    assert created["task_status"] == "submitted"
    assert created["task_info"] == {"external_task_id": "order-17"}
    assert before_ms <= created["created_at"] <= int(time.time() * 1000)

    # the same task by task_id and by external_task_id, in the same path segment
    status, by_id, _ = await api.call("GET", f"{T2V}/{task_id}")
    status2, by_external, _ = await api.call("GET", f"{T2V}/order-17")
    assert status == status2 == 200
    assert by_id["data"]["task_id"] == by_external["data"]["task_id"] == task_id
    assert by_id["data"]["task_status"] in ("submitted", "processing", "succeed")

    done = await api.ended("order-17")
    assert done["task_status"] == "succeed" and done["task_status_msg"] == ""
    assert done["task_info"] == {"external_task_id": "order-17"}
    assert done["created_at"] == created["created_at"] <= done["updated_at"]
    assert done["final_unit_deduction"] == "1"
    [video] = done["task_result"]["videos"]
    assert set(video) == {"id", "url", "duration"} and video["duration"] == "5"
    assert video["url"] == f"{api.base}/cdn/{task_id}/video.mp4"

    task = fake.tasks[task_id]
    assert (task.endpoint, task.external_task_id) == ("text2video", "order-17")
    assert task.body == {**BODY, "external_task_id": "order-17"}
    assert task.created_at == created["created_at"]
    assert fake.billed() == [(task_id, {**BODY, "external_task_id": "order-17"})]
    assert fake.create_posts == 1 and fake.status_reads >= 3


async def test_media_is_public_ranged_and_cleared(served: Any) -> None:
    fake = kling()
    api: Api = await served(fake)
    _, body, _ = await api.create()
    done = await api.ended(body["data"]["task_id"])
    url = done["task_result"]["videos"][0]["url"]
    task_id = body["data"]["task_id"]

    status, data, headers = await api.call("GET", url, headers={})  # no credential
    assert status == 200 and data == fake.video_bytes(task_id) and len(data) == 1000
    assert headers["Content-Type"] == "video/mp4"
    status, part, headers = await api.call("GET", url, headers={"Range": "bytes=10-19"})
    assert status == 206 and part == fake.video_bytes(task_id)[10:20]
    assert headers["Content-Range"] == "bytes 10-19/1000"
    status, empty, headers = await api.call("HEAD", url, headers={})
    assert status == 200 and empty == b"" and headers["Content-Length"] == "1000"

    fake.expire_media(task_id)  # "cleared after 30 days"
    status, _, _ = await api.call("GET", url, headers={})
    assert status == 404
    status, _, _ = await api.call("GET", f"{api.base}/cdn/123/video.mp4", headers={})
    assert status == 404


async def test_image2video_and_a_failed_task(served: Any) -> None:
    fake = kling(outcome_mix={"failed": 1.0}, failure_messages=("Image pixel is invalid",))
    api: Api = await served(fake)
    body = {"model_name": "kling-v2-6", "image": "https://example.test/a.png",
            "prompt": "she smiles", "duration": "10", "mode": "pro",
            "callback_url": "", "external_task_id": ""}  # "" as the docs' examples send
    status, created, _ = await api.create(body, path=I2V)
    assert status == 200 and created["data"]["task_info"] == {}
    task_id = created["data"]["task_id"]
    done = await api.ended(task_id, path=I2V)
    assert done["task_status"] == "failed"
    assert done["task_status_msg"] == "Image pixel is invalid"
    assert done["task_result"] == {} and done["final_unit_deduction"] == "0"
    assert fake.tasks[task_id].callback_url is None
    status, _, _ = await api.call("GET", f"{api.base}/cdn/{task_id}/video.mp4", headers={})
    assert status == 404


async def test_finish_and_seeded_outcomes(served: Any) -> None:
    fake = kling(processing_s=60.0)
    api: Api = await served(fake)
    _, body, _ = await api.create()
    task_id = body["data"]["task_id"]
    await until(lambda: fake.view(task_id)["task_status"] == "processing")
    fake.finish(task_id, "failed", "content risk control")
    _, read, _ = await api.call("GET", f"{T2V}/{task_id}")
    assert read["data"]["task_status"] == "failed"
    assert read["data"]["task_status_msg"] == "content risk control"
    with pytest.raises(ValueError, match="already ended"):
        fake.finish(task_id, "succeed")

    runs = []
    for _ in range(2):
        seeded = kling(outcome_mix={"succeed": 1.0, "failed": 1.0}, jitter_s=5.0, seed=3)
        seeded_api: Api = await served(seeded)
        for n in range(6):
            await seeded_api.create({**BODY, "prompt": f"take {n}"})
        runs.append([(t.outcome, t.run_s) for t in seeded.tasks.values()])
    assert runs[0] == runs[1] and len({o for o, _ in runs[0]}) == 2


async def test_list_is_per_endpoint_newest_first_and_paged(served: Any) -> None:
    fake = kling()
    api: Api = await served(fake)
    ids = []
    for n in range(3):
        _, body, _ = await api.create({**BODY, "prompt": f"clip {n}"})
        ids.append(body["data"]["task_id"])
    await api.create({"image": "https://example.test/b.png"}, path=I2V)

    status, body, _ = await api.call("GET", T2V)
    assert status == 200 and [t["task_id"] for t in body["data"]] == ids[::-1]
    status, body, _ = await api.call("GET", f"{T2V}?pageNum=2&pageSize=2")
    assert status == 200 and [t["task_id"] for t in body["data"]] == [ids[0]]
    assert set(body["data"][0]) >= {"task_id", "task_status", "task_info", "created_at"}
    for query in ("pageNum=0", "pageSize=501", "pageNum=1001", "pageSize=x"):
        status, body, _ = await api.call("GET", f"{T2V}?{query}")
        assert status == 400
        assert_envelope(body, 1201)
    assert fake.list_reads == 6


# ---- authentication ----

async def test_jwt_refusals_carry_klings_codes(served: Any) -> None:
    fake = kling()
    api: Api = await served(fake)
    now = int(time.time())
    cases: list[tuple[dict[str, str], int]] = [
        ({}, 1001),
        ({"Authorization": ""}, 1001),
        ({"Authorization": "Bearer "}, 1001),
        ({"Authorization": f"Basic {documented_token()}"}, 1002),
        ({"Authorization": "Bearer not-a-jwt"}, 1002),
        (bearer(sk="SKwrong-secret-of-the-right-length-0123456789abcdef"), 1002),
        (bearer(ak="AKunknown-0123456789abcdef"), 1002),
        ({"Authorization": "Bearer " + custom_token({"iss": DEFAULT_ACCESS_KEY,
                                                     "nbf": now - 5})}, 1002),  # no exp
        ({"Authorization": "Bearer " + custom_token({"iss": DEFAULT_ACCESS_KEY,
                                                     "exp": now + 1800,
                                                     "nbf": now + 600})}, 1003),
        ({"Authorization": "Bearer " + custom_token({"iss": DEFAULT_ACCESS_KEY,
                                                     "exp": now - 1,
                                                     "nbf": now - 1805})}, 1004),
    ]
    for headers, code in cases:
        status, body, _ = await api.create(headers=headers)
        assert status == 401, (headers, body)
        assert_envelope(body, code)
        status, body, _ = await api.call("GET", f"{T2V}/123", headers=headers)
        assert status == 401 and body["code"] == code
    assert fake.billed() == [] and fake.create_posts == len(cases)
    assert fake.stats()["unauthorized"] == 2 * len(cases)

    status, body, _ = await api.create()  # the documented token passes
    assert status == 200
    assert_envelope(body)


async def test_tokens_seen_and_server_side_expiry(served: Any) -> None:
    fake = kling()
    api: Api = await served(fake)
    token = documented_token()
    headers = {"Authorization": f"Bearer {token}"}
    status, _, _ = await api.call("GET", T2V, headers=headers)
    assert status == 200
    seen = fake.tokens_seen[-1]
    assert seen["iss"] == DEFAULT_ACCESS_KEY
    assert seen["exp"] - seen["nbf"] == 1805  # the docs' sample: now + 1800, now - 5
    count = len(fake.tokens_seen)
    await api.call("GET", T2V, headers=headers)
    assert len(fake.tokens_seen) == count  # the same token is recorded once

    now = int(time.time())
    fake.reject_tokens_issued_before(now - 2)
    old = custom_token({"iss": DEFAULT_ACCESS_KEY, "iat": now - 10, "exp": now + 1790})
    status, body, _ = await api.call("GET", T2V, headers={"Authorization": f"Bearer {old}"})
    assert status == 401 and body["code"] == 1004
    status, _, _ = await api.call("GET", T2V)  # a docs' token minted now: nbf + 5 >= now - 2
    assert status == 200

    # Tokens minted by the docs' sample in the same second are identical, so a token
    # that must pass after expire_seen_tokens() needs other claims (here an iat).
    fake.expire_seen_tokens()
    status, body, _ = await api.call("GET", T2V, headers=headers)
    assert status == 401 and body["code"] == 1004
    now = int(time.time())
    fresh = custom_token({"iss": DEFAULT_ACCESS_KEY, "iat": now, "exp": now + 1800,
                          "nbf": now - 5})
    status, _, _ = await api.call("GET", T2V, headers={"Authorization": f"Bearer {fresh}"})
    assert status == 200


async def test_accounts_and_endpoints_do_not_see_each_others_tasks(served: Any) -> None:
    fake = kling(extra_accounts={OTHER_AK: OTHER_SK})
    api: Api = await served(fake)
    _, body, _ = await api.create({**BODY, "external_task_id": "mine"})
    task_id = body["data"]["task_id"]
    other = bearer(OTHER_AK, OTHER_SK)
    for path, headers in ((f"{I2V}/{task_id}", bearer()), (f"{I2V}/mine", bearer()),
                          (f"{T2V}/{task_id}", other), (f"{T2V}/mine", other),
                          (f"{T2V}/999999999999999999", bearer())):
        status, answer, _ = await api.call("GET", path, headers=headers)
        assert status == 404, path
        assert_envelope(answer, 1203)
    status, answer, _ = await api.call("GET", T2V, headers=other)
    assert status == 200 and answer["data"] == []
    # another account may use the same external_task_id
    status, answer, _ = await api.create({**BODY, "external_task_id": "mine"}, headers=other)
    assert status == 200 and fake.tasks[answer["data"]["task_id"]].access_key == OTHER_AK

    for method, path in (("POST", "/v1/videos/omni-video"), ("DELETE", T2V),
                         ("GET", "/v1/nothing/here")):
        status, answer, _ = await api.call(method, path, json_body=BODY)
        assert status == 404, (method, path)
        assert_envelope(answer, 1202)


# ---- create checks and repeated external ids ----

async def test_documented_create_checks(served: Any) -> None:
    fake = kling()
    api: Api = await served(fake)
    status, body, _ = await api.call("POST", T2V, data=b"{not json",
                                     headers={**bearer(), "Content-Type": "application/json"})
    assert status == 400
    assert_envelope(body, 1200)
    for bad in ([1, 2], {"prompt": ""}, {**BODY, "prompt": "x" * 2501},
                {**BODY, "negative_prompt": "x" * 2501}, {**BODY, "mode": "turbo"},
                {**BODY, "aspect_ratio": "4:3"}, {**BODY, "duration": "20"},
                {**BODY, "cfg_scale": 1.5}, {**BODY, "external_task_id": 17},
                {**BODY, "callback_url": "ftp://x"}):
        status, body, _ = await api.create(bad)
        assert status == 400, bad
        assert_envelope(body, 1200 if isinstance(bad, list) else 1201)
    status, body, _ = await api.create({"prompt": "no image"}, path=I2V)
    assert status == 400 and body["code"] == 1201
    status, body, _ = await api.create({**BODY, "model_name": "kling-v9"})
    assert status == 404
    assert_envelope(body, 1203)
    assert fake.billed() == []
    for fine in ({**BODY, "duration": "3"}, {**BODY, "duration": 10},
                 {"multi_shot": True, "multi_prompt": [{"index": 1, "prompt": "a"}]}):
        status, body, _ = await api.create(fine)
        assert status == 200, (fine, body)
    assert len(fake.billed()) == 3


@pytest.mark.parametrize("mode", ["refuse", "accept", "return_existing"])
async def test_repeated_external_task_id(served: Any, mode: str) -> None:
    fake = kling(repeated_external_id=mode, processing_s=60.0)
    api: Api = await served(fake)
    first_body = {**BODY, "external_task_id": "job-1"}
    _, first, _ = await api.create(first_body)
    first_id = first["data"]["task_id"]
    status, again, _ = await api.create({**BODY, "prompt": "again", "external_task_id": "job-1"})
    if mode == "refuse":
        assert status == 400
        assert_envelope(again, 1201)
        assert "external_task_id" in again["message"]
        assert [t for t, _ in fake.billed()] == [first_id]
        # across endpoints too: unique within the account
        status, other, _ = await api.create({"image": "https://example.test/c.png",
                                             "external_task_id": "job-1"}, path=I2V)
        assert status == 400 and other["code"] == 1201
    elif mode == "accept":
        assert status == 200 and again["data"]["task_id"] != first_id
        assert len(fake.billed()) == 2
        _, read, _ = await api.call("GET", f"{T2V}/job-1")
        assert read["data"]["task_id"] == again["data"]["task_id"]  # the newest
    else:
        assert status == 200
        assert_envelope(again)
        assert again["data"]["task_id"] == first_id
        assert again["data"]["task_info"] == {"external_task_id": "job-1"}
        assert fake.billed() == [(first_id, first_body)]


async def test_concurrency_limit_answers_1303(served: Any) -> None:
    fake = kling(concurrency_limit=1, processing_s=60.0)
    api: Api = await served(fake)
    _, first, _ = await api.create()
    status, body, _ = await api.create()
    assert status == 429
    assert_envelope(body, 1303)
    assert body["message"] == "parallel task over resource pack limit"
    fake.finish(first["data"]["task_id"], "succeed")
    status, _, _ = await api.create()
    assert status == 200 and len(fake.billed()) == 2


# ---- faults ----

@pytest.mark.parametrize(("fault", "bills"), [
    (None, 1), ("lose_reply", 1), ("5xx_after", 1), ("5xx_before", 0), ("429", 0),
    ("code_under_200", 0), ("hang", 1), ("hang_then_create", 1),
])
async def test_each_create_fault_bills_what_it_says(served: Any, fault: str | None,
                                                    bills: int) -> None:
    fake = kling(hang_s=0.3, processing_s=60.0)
    api: Api = await served(fake)
    fake.script_creates([fault])
    answer: tuple[int, Any, dict[str, str]] | None
    try:
        answer = await api.create(timeout_s=0.1 if fault and "hang" in fault else WAIT_S)
    except (aiohttp.ClientError, TimeoutError):
        answer = None
    if fault in ("lose_reply", "hang", "hang_then_create"):
        assert answer is None
    else:
        assert answer is not None
        status, body, _ = answer
        expected = {None: (200, 0), "5xx_after": (500, 5000), "5xx_before": (500, 5000),
                    "429": (429, 1302), "code_under_200": (200, 5000)}[fault]
        assert (status, body["code"]) == expected
        assert_envelope(body, expected[1])
    if fault == "hang":
        assert len(fake.billed()) == 1  # created before the answer was held
    if fault == "hang_then_create":
        assert fake.billed() == []  # still working after the client left
    await until(lambda: len(fake.billed()) == bills)
    assert fake.create_posts == 1


async def test_fivexx_status_and_read_faults(served: Any) -> None:
    fake = kling(fivexx_status=503, code_under_200=1302)
    api: Api = await served(fake)
    fake.script_creates(["5xx_before", "code_under_200", "ok"])
    status, body, _ = await api.create()
    assert (status, body["code"]) == (503, 5001)
    status, body, _ = await api.create()
    assert (status, body["code"]) == (200, 1302) and "data" not in body
    status, body, _ = await api.create()
    task_id = body["data"]["task_id"]
    fake.config.fivexx_status = 504
    fake.script_reads(["5xx", "429", "code_under_200", None])
    answers = [await api.call("GET", f"{T2V}/{task_id}") for _ in range(4)]
    assert [(s, b["code"]) for s, b, _ in answers] == [(504, 5002), (429, 1302), (200, 1302),
                                                      (200, 0)]
    with pytest.raises(ValueError, match="unknown"):
        fake.script_reads(["boom"])


# ---- callbacks ----

async def test_callbacks_post_the_task_object_on_status_changes(served: Any) -> None:
    received: list[dict[str, Any]] = []
    answers = [500]  # the first delivery fails once

    async def hook(request: web.Request) -> web.Response:
        received.append(await request.json())
        return web.Response(status=answers.pop(0) if answers else 200)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        fake = kling(callback_retry_delays_s=(0.02,))
        api: Api = await served(fake)
        _, body, _ = await api.create({**BODY, "external_task_id": "cb-1",
                                       "callback_url": f"http://127.0.0.1:{port}/hook"})
        task_id = body["data"]["task_id"]
        await until(lambda: any(r["task_status"] == "succeed" for r in received))
        assert [r["task_status"] for r in received] == ["processing", "processing", "succeed"]
        final = received[-1]
        assert "code" not in final and final["task_id"] == task_id  # no envelope
        assert final["task_info"] == {"external_task_id": "cb-1"}
        assert final["task_result"]["videos"][0]["url"].endswith(f"/cdn/{task_id}/video.mp4")
        assert [(c.task_status, c.attempt, c.status) for c in fake.callbacks] == [
            ("processing", 1, 500), ("processing", 2, 200), ("succeed", 1, 200)]
    finally:
        await runner.cleanup()
