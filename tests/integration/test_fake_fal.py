"""The fake fal against fal's documented behaviour, over real HTTP on loopback.

These tests pin the fake itself (vidpoll's fal adapter is tested against it elsewhere): the
queue (URLs with owner/app only, queue positions under a concurrency limit, failures as
COMPLETED with an error, the result URL before completion, cancel), the platform's request
history (cursor pages, payloads, what is not listed), every create fault and what it bills,
Ed25519 webhooks checked with `cryptography` against the JWKS, and the public CDN with Range
and expiry. Tests wait on observed state with a generous overall timeout, never on timing.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import socket
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from aiohttp import web
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from vidpoll.providers.fal.fake import (
    DEFAULT_ENDPOINT,
    DEFAULT_KEY,
    FakeFal,
    FalFakeConfig,
    start_fake_fal,
)

AUTH = {"Authorization": f"Key {DEFAULT_KEY}"}
APP = "fal-ai/kling-video"
WAIT_S = 15.0


def quick(**overrides: Any) -> FalFakeConfig:
    """A config with short lives, so a test sees every status within a second or two."""
    base: dict[str, Any] = {"processing_s": 0.15, "seed": 7}
    return FalFakeConfig(**{**base, **overrides})


async def eventually(check: Callable[[], Awaitable[Any]], timeout_s: float = WAIT_S) -> Any:
    """Poll `check` until it returns something truthy; fail after `timeout_s`."""
    async def loop() -> Any:
        while True:
            value = await check()
            if value:
                return value
            await asyncio.sleep(0.02)
    return await asyncio.wait_for(loop(), timeout_s)


async def until(predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    """Wait until `predicate()` holds (state the fake exposes without HTTP)."""
    async def check() -> bool:
        return predicate()
    await eventually(check, timeout_s)


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

    async def create(self, input_: Any, *, endpoint: str = DEFAULT_ENDPOINT,
                     webhook: str | None = None, headers: dict[str, str] | None = None,
                     timeout_s: float | None = None) -> tuple[int, Any, dict[str, str]]:
        path = f"/{endpoint}" + (f"?fal_webhook={quote(webhook, safe='')}" if webhook else "")
        return await self.call("POST", path, json_body=input_, headers=headers,
                               timeout_s=timeout_s)

    async def status(self, created: dict[str, Any], logs: bool = False) -> tuple[int, Any]:
        url = created["status_url"] + ("?logs=1" if logs else "")
        status, body, _ = await self.call("GET", url)
        return status, body

    async def until_completed(self, created: dict[str, Any]) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            status, body = await self.status(created, logs=True)
            assert status in (200, 202), body
            return body if body["status"] == "COMPLETED" else None
        result: dict[str, Any] = await eventually(check)
        return result

    async def history(self, **params: str) -> tuple[int, Any, dict[str, str]]:
        query = "&".join(f"{k}={quote(v, safe='')}" for k, v in
                         {"endpoint_id": DEFAULT_ENDPOINT, **params}.items())
        return await self.call("GET", f"/v1/models/requests/by-endpoint?{query}")


@pytest.fixture
async def served() -> AsyncIterator[Callable[[FakeFal], Awaitable[Api]]]:
    """Start fakes on loopback (each with its own client session); stop them all after."""
    runners: list[web.AppRunner] = []
    sessions: list[aiohttp.ClientSession] = []

    async def serve(fake: FakeFal) -> Api:
        runner, url = await start_fake_fal(fake)
        runners.append(runner)
        session = aiohttp.ClientSession()
        sessions.append(session)
        return Api(session, url)

    yield serve
    for session in sessions:
        await session.close()
    for runner in runners:
        await runner.cleanup()


async def test_create_answers_owner_app_urls_and_runs_to_success(served: Any) -> None:
    fake = FakeFal(quick())
    api: Api = await served(fake)
    status, created, _ = await api.create({"prompt": "a cat"})
    assert status == 200, created
    rid = created["request_id"]
    assert uuid.UUID(rid).version == 4 and created["gateway_request_id"] == rid
    base = f"{api.base}/{APP}/requests/{rid}"  # owner/app only: no /v2/master/text-to-video
    assert created["response_url"] == base
    assert created["status_url"] == base + "/status"
    assert created["cancel_url"] == base + "/cancel"

    done = await api.until_completed(created)
    assert "error" not in done and done["metrics"]["inference_time"] > 0
    assert isinstance(done["logs"], list) and done["request_id"] == rid
    status, result, _ = await api.call("GET", created["response_url"])
    assert status == 200
    video = result["video"]
    assert video["url"] == f"{api.base}/files/{rid}/output.mp4"
    assert video["content_type"] == "video/mp4" and video["file_name"] == "output.mp4"
    assert video["file_size"] == fake.config.file_bytes
    async with api.session.get(video["url"]) as resp:  # public: no key needed
        assert resp.status == 200 and await resp.read() == fake.expected_file(rid)
    assert fake.billed(DEFAULT_ENDPOINT, {"prompt": "a cat"}) == 1
    assert fake.stats()["creates"] == 1 and fake.stats()["cdn_reads_with_auth"] == 0


async def test_keys_ids_and_bodies_are_checked(served: Any) -> None:
    fake = FakeFal(quick(endpoints=[DEFAULT_ENDPOINT]))
    api: Api = await served(fake)
    status, body, _ = await api.call("POST", f"/{DEFAULT_ENDPOINT}", json_body={}, auth=False)
    assert status == 401 and body == {"detail": "Missing authorization header"}
    for wrong in ("Key nope:nope", f"Bearer {DEFAULT_KEY}"):
        status, body, _ = await api.call("POST", f"/{DEFAULT_ENDPOINT}", json_body={},
                                         auth=False, headers={"Authorization": wrong})
        assert status == 401 and body == {"detail": "No user found for Key ID and Secret"}
    status, body, _ = await api.call("GET", f"/v1/models/requests/by-endpoint?endpoint_id="
                                            f"{DEFAULT_ENDPOINT}", auth=False)
    assert status == 401

    status, body, headers = await api.create({}, endpoint="fal-ai/unknown-model")
    assert status == 404 and headers["X-Fal-Error-Type"] == body["error_type"]
    status, body, _ = await api.create(["not", "an", "object"])
    assert status == 422 and isinstance(body["detail"], list)
    for path in (f"/{APP}/requests/{uuid.uuid4()}", f"/{APP}/requests/{uuid.uuid4()}/status"):
        status, body, _ = await api.call("GET", path)
        assert status == 404 and body == {"detail": "Request not found"}
    _, created, _ = await api.create({"k": 1})
    status, _, _ = await api.call("GET", f"/fal-ai/other/requests/{created['request_id']}")
    assert status == 404  # the id belongs to another app
    assert fake.stats()["creates"] == 1 and fake.stats()["unauthorized"] == 4


async def test_queue_positions_under_the_concurrency_limit(served: Any) -> None:
    fake = FakeFal(quick(concurrency=2, processing_s=60.0))
    api: Api = await served(fake)
    created = [(await api.create({"n": n}))[1] for n in range(5)]
    assert [c.get("queue_position") for c in created] == [None, None, 0, 1, 2]
    reads = [await api.status(c) for c in created]
    assert [s for s, _ in reads] == [202] * 5  # never rejected for concurrency
    assert [b["status"] for _, b in reads] == ["IN_PROGRESS"] * 2 + ["IN_QUEUE"] * 3
    assert [b.get("queue_position") for _, b in reads[2:]] == [0, 1, 2]
    assert reads[0][1]["logs"] is None  # logs only when asked for
    _, with_logs = await api.status(created[0], logs=True)
    assert with_logs["logs"] and with_logs["logs"][0]["message"]

    # a low-priority request queues behind normal ones that came later
    _, low, _ = await api.create({"n": "low"}, headers={"X-Fal-Queue-Priority": "low"})
    _, normal, _ = await api.create({"n": "normal"})
    assert low["queue_position"] == 3 and normal["queue_position"] == 3
    _, low_now = await api.status(low)
    assert low_now["queue_position"] == 4

    # a slot frees up (a running request is cancelled): the head of the queue starts (FIFO)
    status, body, _ = await api.call("PUT", created[0]["cancel_url"])
    assert status == 202 and body == {"status": "CANCELLATION_REQUESTED"}
    _, head = await api.status(created[2])
    assert head["status"] == "IN_PROGRESS"
    assert [(await api.status(c))[1].get("queue_position") for c in created[3:]] == [0, 1]
    fake.config.concurrency = 10
    assert {(await api.status(c))[1]["status"] for c in created[1:]} == {"IN_PROGRESS"}
    assert fake.phase(low["request_id"]) == "IN_PROGRESS"


async def test_a_cold_start_keeps_a_lone_request_queued(served: Any) -> None:
    fake = FakeFal(quick(start_delay_s=0.3))
    api: Api = await served(fake)
    _, created, _ = await api.create({"k": "cold"})
    assert created["status"] == "IN_QUEUE" and created["queue_position"] == 0
    done = await api.until_completed(created)
    assert "error" not in done


async def test_failures_are_completed_with_an_error(served: Any) -> None:
    fake = FakeFal(quick(outcome_mix={"model_error": 1.0}))
    api: Api = await served(fake)
    _, created, _ = await api.create({"prompt": "flagged"})
    status, body, _ = await api.call("GET", created["response_url"])
    assert status == 400 and body == {"detail": "Request is still in progress"}
    done = await api.until_completed(created)
    assert done["error"] == "The content was flagged by a content checker."
    assert done["error_type"] == "content_policy_violation"
    status, body, headers = await api.call("GET", created["response_url"])
    assert status == 422 and headers["X-Fal-Retryable"] == "false"
    [error] = body["detail"]
    assert set(error) >= {"loc", "msg", "type", "url"}
    assert error["type"] == "content_policy_violation"

    fake.config.outcome_mix = {"request_error": 1.0}
    _, created, _ = await api.create({"prompt": "crashes"})
    done = await api.until_completed(created)
    assert done["error_type"] == "runner_server_error" and done["error"]
    status, body, headers = await api.call("GET", created["response_url"])
    assert status == 500 and body["error_type"] == "runner_server_error"
    assert isinstance(body["detail"], str) and headers["X-Fal-Error-Type"] == "runner_server_error"
    status_ok, _ = await api.status(created)
    assert status_ok == 200  # COMPLETED, even though it failed


async def test_cancel_queued_running_and_completed(served: Any) -> None:
    fake = FakeFal(quick(concurrency=1, processing_s=60.0))
    api: Api = await served(fake)
    _, running, _ = await api.create({"k": "running"})
    _, queued, _ = await api.create({"k": "queued"})
    status, body, _ = await api.call("PUT", queued["cancel_url"])
    assert status == 202 and body == {"status": "CANCELLATION_REQUESTED"}
    status, done = await api.status(queued)  # removed from the queue at once
    assert status == 200 and done["status"] == "COMPLETED"
    assert done["error_type"] == "client_cancelled" and done["metrics"] == {}
    status, body, headers = await api.call("GET", queued["response_url"])
    assert status == 499 and headers["X-Fal-Error-Type"] == "client_cancelled"
    status, body, _ = await api.call("PUT", queued["cancel_url"])
    assert status == 400 and body == {"status": "ALREADY_COMPLETED"}
    status, body, _ = await api.call("PUT", f"/{APP}/requests/{uuid.uuid4()}/cancel")
    assert status == 404 and body == {"status": "NOT_FOUND"}

    # a running request: the app decides; here it does not stop, and runs to success
    fake.config.cancel_in_progress = False
    fake.config.processing_s = 0.2
    fake.config.concurrency = 2
    _, runs_on, _ = await api.create({"k": "runs on"})
    await eventually(lambda: _is(api, runs_on, "IN_PROGRESS"))
    status, _, _ = await api.call("PUT", runs_on["cancel_url"])
    assert status == 202
    done = await api.until_completed(runs_on)
    assert "error" not in done
    # and with the default, a running request stops, as cancelled
    fake.config.cancel_in_progress = True
    status, _, _ = await api.call("PUT", running["cancel_url"])
    assert status == 202
    stopped = await api.until_completed(running)
    assert stopped["error_type"] == "client_cancelled"
    assert "inference_time" in stopped["metrics"]


async def _is(api: Api, created: dict[str, Any], phase: str) -> bool:
    return bool((await api.status(created))[1]["status"] == phase)


async def test_a_start_timeout_ends_an_unstarted_request(served: Any) -> None:
    fake = FakeFal(quick(concurrency=0))
    api: Api = await served(fake)
    _, created, _ = await api.create({"k": "waits"}, headers={"X-Fal-Request-Timeout": "0.3"})
    done = await api.until_completed(created)
    assert done["error_type"] == "request_timeout"
    status, body, headers = await api.call("GET", created["response_url"])
    assert status == 504 and body["error_type"] == "request_timeout"
    assert headers["X-Fal-Request-Timeout-Type"] == "user"
    assert fake.end_kind(created["request_id"]) == "start_timeout"
    assert fake.stats()["started"] == 0
    status, body, headers = await api.create({}, headers={"X-Fal-Request-Timeout": "soon"})
    assert status == 400 and body["error_type"] == "bad_request"
    assert headers["X-Fal-Error-Type"] == "bad_request"


async def test_history_pages_payloads_and_what_is_listed(served: Any) -> None:
    fake = FakeFal(quick(concurrency=1))
    api: Api = await served(fake)
    ids = []
    for n in range(5):
        _, created, _ = await api.create({"n": n})
        ids.append(created["request_id"])
        await api.until_completed(created)
    _, private, _ = await api.create({"n": "private"}, headers={"X-Fal-Store-IO": "0"})
    await api.until_completed(private)
    await api.create({"n": "other"}, endpoint="fal-ai/other-model")

    status, page, _ = await api.history(limit="2", expand="payloads")
    assert status == 200 and page["has_more"] is True
    assert base64.b64decode(page["next_cursor"]) == b"2"  # the documented "Mg==" style
    seen, pages = [], [page]
    while True:
        for item in page["items"]:
            assert set(item) == {"request_id", "endpoint_id", "started_at", "sent_at",
                                 "ended_at", "status_code", "duration", "json_input",
                                 "json_output"}
            assert item["endpoint_id"] == DEFAULT_ENDPOINT and item["status_code"] == 200
            seen.append(item["request_id"])
        if not page["has_more"]:
            assert page["next_cursor"] is None
            break
        _, page, _ = await api.history(limit="2", expand="payloads", cursor=page["next_cursor"])
        pages.append(page)
    assert seen == [private["request_id"], *ids[::-1]]  # newest (by ended_at) first
    assert [len(p["items"]) for p in pages] == [2, 2, 2]
    first = pages[0]["items"]
    assert first[0]["json_input"] is None and first[0]["json_output"] is None  # Store-IO 0
    assert first[1]["json_input"] == {"n": 4}
    assert first[1]["json_output"]["video"]["url"].endswith("/output.mp4")
    assert fake.stats()["lists"] == 1 and fake.stats()["list_pages"] == 3

    # no payloads unless expanded; filters by request id, status and time window
    _, plain, _ = await api.history()
    assert "json_input" not in plain["items"][0] and len(plain["items"]) == 6
    _, one, _ = await api.history(request_id=ids[2])
    assert [i["request_id"] for i in one["items"]] == [ids[2]]
    _, errors, _ = await api.history(status="error")
    assert errors["items"] == []
    _, later, _ = await api.history(start="2999-01-01T00:00:00Z")
    assert later["items"] == []
    _, both, _ = await api.history(endpoint_id=f"{DEFAULT_ENDPOINT},fal-ai/other-model")
    assert len(both["items"]) == 7
    status, body, _ = await api.history(limit="101")
    assert status == 422 and isinstance(body["detail"], list)
    status, _, _ = await api.call("GET", "/v1/models/requests/by-endpoint")
    assert status == 422


async def test_history_leaves_out_requests_that_have_not_started(served: Any) -> None:
    fake = FakeFal(quick(concurrency=1, processing_s=60.0))
    api: Api = await served(fake)
    _, running, _ = await api.create({"k": "running"})
    _, queued, _ = await api.create({"k": "queued"})
    _, page, _ = await api.history(expand="payloads")
    [item] = page["items"]  # the queued one is not listed (by default)
    assert item["request_id"] == running["request_id"]
    assert item["started_at"] and item["ended_at"] is None and item["status_code"] is None
    assert item["duration"] is None and item["json_output"] is None

    fake.config.history_lists_queued = True
    _, page, _ = await api.history(expand="payloads")
    listed = {i["request_id"]: i for i in page["items"]}
    assert listed[queued["request_id"]]["started_at"] is None
    assert listed[queued["request_id"]]["json_input"] == {"k": "queued"}

    fake.config.history_lists_queued = False  # cancelled while queued: never started
    await api.call("PUT", queued["cancel_url"])
    _, page, _ = await api.history()
    assert [i["request_id"] for i in page["items"]] == [running["request_id"]]


@pytest.mark.parametrize(("fault", "bills"), [
    ("ok", 1), ("lose_reply", 1), ("5xx_after", 1), ("5xx_before", 0), ("429", 0),
    ("hang", 1), ("hang_then_create", 1),
])
async def test_each_create_fault_bills_what_it_says(served: Any, fault: str,
                                                     bills: int) -> None:
    fake = FakeFal(quick(hang_s=2.0))
    api: Api = await served(fake)
    fake.script_creates([fault])
    input_ = {"prompt": fault}
    answer: tuple[int, Any, dict[str, str]] | None = None
    try:
        answer = await api.create(input_, timeout_s=0.3)
    except (TimeoutError, aiohttp.ClientError):
        answer = None
    gave_up = time.time()

    if fault == "ok":
        assert answer is not None and answer[0] == 200
    elif fault in ("lose_reply", "hang", "hang_then_create"):
        assert answer is None  # a disconnect or a client timeout: no answer at all
    elif fault == "5xx_after":
        assert answer is not None and answer[0] in (500, 502, 503, 504)
        if answer[0] == 500:
            assert answer[1]["error_type"] == "internal_error"
        else:
            assert "nginx" in answer[1]
    elif fault == "5xx_before":
        assert answer is not None and answer[0] in (500, 503)
    else:
        assert answer is not None and answer[0] == 429
        assert answer[2]["Retry-After"] == "1" and answer[2]["X-Fal-Error-Type"]

    await until(lambda: fake.billed(DEFAULT_ENDPOINT, input_) == bills)
    if fault == "hang_then_create":  # created by a server that went on after the client left
        [r] = fake.requests.values()
        assert r.created >= gave_up
    assert fake.stats()["creates"] == bills and fake.stats()["create_requests"] == 1
    if bills:  # a billed request is real: it shows up in the history and runs
        [r] = fake.requests.values()
        await until(lambda: fake.phase(r.id) == "COMPLETED")
        _, page, _ = await api.history(expand="payloads")
        [listed] = page["items"]
        assert listed["json_input"] == input_ and listed["status_code"] == 200


async def test_a_patient_client_gets_the_held_answer(served: Any) -> None:
    fake = FakeFal(quick(hang_s=0.2))
    api: Api = await served(fake)
    fake.script_creates(["hang", "hang_then_create"])
    for n in range(2):
        status, body, _ = await api.create({"patient": n}, timeout_s=WAIT_S)
        assert status == 200 and body["request_id"] in fake.requests
    assert fake.stats()["creates"] == 2


async def test_fault_rates_and_status_and_list_faults(served: Any) -> None:
    fake = FakeFal(quick(create_fault_rates={"5xx_before": 1.0}, status_5xx=1.0))
    api: Api = await served(fake)
    status, _, _ = await api.create({"x": 1})
    assert status in (500, 503) and not fake.created_inputs()
    fake.config.create_fault_rates = {}
    _, created, _ = await api.create({"x": 2})
    status, _ = await api.status(created)
    assert status in (500, 502, 503, 504)
    fake.config.status_5xx = 0.0
    assert (await api.status(created))[0] in (200, 202)
    await api.until_completed(created)

    fake.script_lists(["5xx", "429", "garbled", "ok"])
    status, _, _ = await api.history()
    assert status in (500, 502, 503, 504)
    status, body, headers = await api.history()
    assert status == 429 and "Retry-After" in headers and body["error_type"]
    status, body, headers = await api.history()
    assert status == 200 and isinstance(body, str)  # truncated JSON
    with pytest.raises(ValueError):
        json.loads(body)
    status, body, _ = await api.history()
    assert status == 200 and len(body["items"]) == 1
    fake.config.list_garbled = 1.0
    assert isinstance((await api.history())[1], str)
    fake.config.retry_after_s = None
    fake.config.list_garbled, fake.config.list_429 = 0.0, 1.0
    status, _, headers = await api.history()
    assert status == 429 and "Retry-After" not in headers
    with pytest.raises(ValueError, match="unknown"):
        fake.script_creates(["explode"])
    with pytest.raises(ValueError, match="unknown"):
        fake.script_lists(["explode"])


async def test_cdn_is_public_ranged_and_expires(served: Any) -> None:
    fake = FakeFal(quick(file_bytes=1000))
    api: Api = await served(fake)
    other = api.base.replace("127.0.0.1", "localhost")
    fake.config.cdn_base_url = other
    _, created, _ = await api.create({"k": "cdn"})
    await api.until_completed(created)
    _, result, _ = await api.call("GET", created["response_url"])
    url = result["video"]["url"]
    rid = created["request_id"]
    assert url.startswith(other + "/files/")
    expected = fake.expected_file(rid)

    async with api.session.get(url, headers={"Range": "bytes=10-19"}) as resp:
        assert resp.status == 206 and resp.headers["Content-Range"] == "bytes 10-19/1000"
        assert await resp.read() == expected[10:20]
    async with api.session.get(url, headers={"Range": "bytes=990-"}) as resp:
        assert resp.status == 206 and await resp.read() == expected[990:]
    async with api.session.get(url, headers={"Range": "bytes=-5"}) as resp:
        assert resp.status == 206 and await resp.read() == expected[-5:]
    async with api.session.get(url, headers={"Range": "bytes=2000-"}) as resp:
        assert resp.status == 416 and resp.headers["Content-Range"] == "bytes */1000"
    async with api.session.head(url) as resp:
        assert resp.status == 200 and resp.headers["Content-Length"] == "1000"
    async with api.session.get(url, headers=AUTH) as resp:  # served, but recorded
        assert resp.status == 200
        assert hashlib.sha256(await resp.read()).digest() == hashlib.sha256(expected).digest()
    assert fake.stats()["cdn_reads_with_auth"] == 1
    assert [r.authorization for r in fake.cdn_reads] == [False] * 5 + [True]
    async with api.session.get(f"{other}/files/{rid}/other.mp4") as resp:
        assert resp.status == 404

    # expiry: the config's default, and a per-request lifecycle that overrides it
    fake.config.media_expiry_s = 0.3
    async def gone(target: str) -> bool:
        async with api.session.get(target) as resp:
            return resp.status == 404
    await eventually(lambda: gone(url))
    fake.config.media_expiry_s = None
    lifecycle = json.dumps({"expiration_duration_seconds": 1})
    _, short, _ = await api.create({"k": "short"},
                                   headers={"X-Fal-Object-Lifecycle-Preference": lifecycle})
    await api.until_completed(short)
    _, short_result, _ = await api.call("GET", short["response_url"])
    async with api.session.get(short_result["video"]["url"]) as resp:
        assert resp.status == 200
    await eventually(lambda: gone(short_result["video"]["url"]))
    status, body, _ = await api.create(
        {}, headers={"X-Fal-Object-Lifecycle-Preference": "never"})
    assert status == 400 and body["error_type"] == "bad_request"


class Receiver:
    """A webhook endpoint on loopback: answers from a script, records every request."""

    def __init__(self) -> None:
        self.answers: list[int] = []
        self.requests: list[tuple[dict[str, str], bytes]] = []

    async def hook(self, request: web.Request) -> web.Response:
        self.requests.append(({k.lower(): v for k, v in request.headers.items()},
                              await request.read()))
        return web.Response(status=self.answers.pop(0) if self.answers else 200)


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    rec = Receiver()
    app = web.Application()
    app.router.add_post("/hook", rec.hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield rec, f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    await runner.cleanup()


async def public_keys(api: Api) -> dict[str, Ed25519PublicKey]:
    """The JWKS, fetched without a key, as cryptography public keys by kid."""
    async with api.session.get(api.base + "/.well-known/jwks.json") as resp:
        assert resp.status == 200
        jwks = await resp.json()
    keys = {}
    for jwk in jwks["keys"]:
        assert jwk["kty"] == "OKP" and jwk["crv"] == "Ed25519"
        raw = base64.urlsafe_b64decode(jwk["x"] + "=" * (-len(jwk["x"]) % 4))
        keys[jwk["kid"]] = Ed25519PublicKey.from_public_bytes(raw)
    return keys


def verifies(keys: dict[str, Ed25519PublicKey], headers: dict[str, str], body: bytes) -> set[str]:
    """The kids whose key verifies this delivery (fal's message, built independently)."""
    message = (f"{headers['x-fal-webhook-request-id']}\n{headers['x-fal-webhook-user-id']}\n"
               f"{headers['x-fal-webhook-timestamp']}\n{hashlib.sha256(body).hexdigest()}")
    good = set()
    for kid, key in keys.items():
        try:
            key.verify(bytes.fromhex(headers["x-fal-webhook-signature"]), message.encode())
        except InvalidSignature:
            continue
        good.add(kid)
    return good


async def test_webhooks_are_signed_with_the_jwks_keys_and_retried(
        served: Any, receiver: tuple[Receiver, str]) -> None:
    rec, hook_url = receiver
    rec.answers = [500, 503]  # two failures, then 200
    fake = FakeFal(quick(webhook_retry_delays_s=(0.05, 0.05, 0.05)))
    api: Api = await served(fake)
    _, created, _ = await api.create({"prompt": "hooked"}, webhook=hook_url)
    await until(lambda: fake.stats()["webhooks_sent"] == 1)
    keys = await public_keys(api)
    assert len(rec.requests) == 3
    for headers, body in rec.requests:
        assert headers["x-fal-webhook-request-id"] == created["request_id"]  # the same id
        assert headers["x-fal-webhook-user-id"] == fake.config.user_id
        assert abs(int(headers["x-fal-webhook-timestamp"]) - time.time()) < 300
        assert verifies(keys, headers, body) == {fake.config.webhook_signing_kid}
        assert verifies(keys, headers, body + b" ") == set()  # the body is covered
        event = json.loads(body)
        assert event["request_id"] == event["gateway_request_id"] == created["request_id"]
        assert event["status"] == "OK" and event["error"] is None
        assert event["payload"]["video"]["url"].endswith("/output.mp4")
    assert [d.status for d in fake.webhook_deliveries] == [500, 503, 200]
    assert [d.attempt for d in fake.webhook_deliveries] == [1, 2, 3]

    # a failed request: status ERROR, the error body as payload
    fake.config.outcome_mix = {"model_error": 1.0}
    _, failed, _ = await api.create({"prompt": "flagged"}, webhook=hook_url)
    await until(lambda: fake.stats()["webhooks_sent"] == 2)
    event = json.loads(rec.requests[-1][1])
    assert event["request_id"] == failed["request_id"] and event["status"] == "ERROR"
    assert event["error"] == "Invalid status code: 422"
    assert event["payload"]["detail"][0]["type"] == "content_policy_violation"
    fake.config.webhook_unserializable = True
    await api.create({"prompt": "odd"}, webhook=hook_url)
    await until(lambda: fake.stats()["webhooks_sent"] == 3)
    event = json.loads(rec.requests[-1][1])
    assert event["payload"] is None and event["payload_error"]


async def test_webhook_key_rotation(served: Any, receiver: tuple[Receiver, str]) -> None:
    rec, hook_url = receiver
    fake = FakeFal(quick())
    api: Api = await served(fake)
    old = fake.config.webhook_signing_kid
    # the same seed and kid give the same key (a restarted fake stays verifiable)
    assert FakeFal(quick()).jwks() == fake.jwks()
    fake.add_webhook_key("fake-fal-webhook-key-2")
    fake.config.webhook_signing_kid = "fake-fal-webhook-key-2"
    await api.create({"prompt": "rotated"}, webhook=hook_url)
    await until(lambda: fake.stats()["webhooks_sent"] == 1)
    keys = await public_keys(api)
    assert set(keys) == {old, "fake-fal-webhook-key-2"}
    headers, body = rec.requests[0]
    assert verifies(keys, headers, body) == {"fake-fal-webhook-key-2"}
    fake.remove_webhook_key(old)
    assert set(await public_keys(api)) == {"fake-fal-webhook-key-2"}
    assert fake.webhook_deliveries[0].kid == "fake-fal-webhook-key-2"


async def test_an_unreachable_webhook_is_retried_then_given_up(served: Any) -> None:
    fake = FakeFal(quick(webhook_retry_delays_s=(0.01, 0.01)))
    api: Api = await served(fake)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/hook"
    await api.create({"prompt": "nobody home"}, webhook=dead)
    await until(lambda: fake.stats()["webhooks_failed"] == 1)
    attempts = fake.webhook_deliveries
    assert [d.attempt for d in attempts] == [1, 2, 3]
    assert all(d.status is None and d.error for d in attempts)
    assert len({d.request_id for d in attempts}) == 1
