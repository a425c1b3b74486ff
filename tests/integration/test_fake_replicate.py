"""The fake Replicate against Replicate's documented behaviour, over real HTTP on loopback.

These tests pin the fake itself (vidpoll's Replicate adapter is tested against it elsewhere):
both create endpoints, the life of a prediction, list pages and filters, every create fault and
what it bills, the rate limits' 429, the authenticated file host with Range, data removal,
deadlines (Cancel-After), and Standard Webhooks signatures checked two independent ways.
Tests wait on observed state with a generous overall timeout, never on timing.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import re
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from decimal import Decimal
from typing import Any
from urllib.parse import parse_qs, urlsplit

import aiohttp
import pytest
from aiohttp import web
from standardwebhooks.webhooks import Webhook

from vidpoll.providers.base import CURRENCY, Cost
from vidpoll.providers.replicate.fake import (
    DEFAULT_MODEL,
    DEFAULT_TOKEN,
    DEFAULT_VERSIONS,
    FakeReplicate,
    ReplicateFakeConfig,
    canonical,
    start_fake_replicate,
)
from vidpoll.providers.replicate.rules import RULES as REPLICATE_RULES

AUTH = {"Authorization": f"Bearer {DEFAULT_TOKEN}"}
WAIT_S = 15.0


def quick(**overrides: Any) -> ReplicateFakeConfig:
    """A config with short lives, so a test sees every status within a second or two."""
    base: dict[str, Any] = {"starting_s": 0.05, "processing_s": 0.15, "seed": 7}
    return ReplicateFakeConfig(**{**base, **overrides})


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
                   headers: dict[str, str] | None = None,
                   timeout_s: float | None = None) -> tuple[int, Any, dict[str, str]]:
        url = path if path.startswith("http") else self.base + path
        timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s else None
        async with self.session.request(method, url, json=json_body,
                                        headers={**AUTH, **(headers or {})},
                                        timeout=timeout) as resp:
            text = await resp.text()
            try:
                body: Any = json.loads(text)
            except ValueError:
                body = text
            return resp.status, body, dict(resp.headers)

    async def create(self, input_: dict[str, Any], **extra: Any) -> tuple[int, Any, dict[str, str]]:
        headers = extra.pop("headers", None)
        timeout_s = extra.pop("timeout_s", None)
        return await self.call("POST", "/v1/predictions",
                               json_body={"version": DEFAULT_VERSIONS[-1], "input": input_,
                                          **extra},
                               headers=headers, timeout_s=timeout_s)

    async def get(self, pid: str) -> dict[str, Any]:
        status, body, _ = await self.call("GET", f"/v1/predictions/{pid}")
        assert status == 200, body
        assert isinstance(body, dict)
        return body

    async def until_status(self, pid: str, *statuses: str) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            body = await self.get(pid)
            return body if body["status"] in statuses else None
        result: dict[str, Any] = await eventually(check)
        return result


@pytest.fixture
async def served() -> AsyncIterator[Callable[[FakeReplicate], Awaitable[Api]]]:
    """Start fakes on loopback (each with its own client session); stop them all after."""
    runners: list[web.AppRunner] = []
    sessions: list[aiohttp.ClientSession] = []

    async def serve(fake: FakeReplicate) -> Api:
        runner, url = await start_fake_replicate(fake)
        runners.append(runner)
        session = aiohttp.ClientSession()
        sessions.append(session)
        return Api(session, url)

    yield serve
    for session in sessions:
        await session.close()
    for runner in runners:
        await runner.cleanup()


def billed(fake: FakeReplicate, input_: dict[str, Any]) -> int:
    return fake.created_inputs()[(DEFAULT_MODEL, DEFAULT_VERSIONS[-1], canonical(input_))]


async def test_creates_via_both_endpoints_and_runs_to_success(served: Any) -> None:
    fake = FakeReplicate(quick())
    api: Api = await served(fake)

    status, created, _ = await api.create({"prompt": "a cat"})
    assert status == 201, created
    assert re.fullmatch(r"[0-9a-z]{26}", created["id"])
    assert created["status"] == "starting"
    assert created["model"] == DEFAULT_MODEL and created["version"] == DEFAULT_VERSIONS[-1]
    assert created["input"] == {"prompt": "a cat"} and created["output"] is None
    assert created["source"] == "api" and created["data_removed"] is False
    assert created["created_at"].endswith("Z") and created["completed_at"] is None
    assert created["urls"]["get"] == f"{api.base}/v1/predictions/{created['id']}"
    assert created["urls"]["cancel"] == created["urls"]["get"] + "/cancel"

    # the models endpoint runs the latest version; `version` may also name owner/name:id
    status, by_model, _ = await api.call("POST", f"/v1/models/{DEFAULT_MODEL}/predictions",
                                         json_body={"input": {"prompt": "a dog"}})
    assert status == 201 and by_model["version"] == DEFAULT_VERSIONS[-1]
    status, pinned, _ = await api.call(
        "POST", "/v1/predictions",
        json_body={"version": f"{DEFAULT_MODEL}:{DEFAULT_VERSIONS[0]}", "input": {}})
    assert status == 201 and pinned["version"] == DEFAULT_VERSIONS[0]

    done = await api.until_status(created["id"], "succeeded", "failed", "canceled", "aborted")
    assert done["status"] == "succeeded"
    assert done["started_at"] and done["completed_at"] and done["error"] is None
    assert set(done["metrics"]) == {"predict_time", "total_time"}
    url = done["output"]
    assert url == f"{api.base}/files/{created['id']}/output.mp4"
    async with api.session.get(url, headers=AUTH) as resp:
        assert resp.status == 200
        assert await resp.read() == fake.expected_file(created["id"], "output.mp4")
    assert fake.stats()["creates"] == 3


async def test_tokens_versions_and_inputs_are_checked(served: Any) -> None:
    fake = FakeReplicate(quick())
    api: Api = await served(fake)
    async with api.session.get(api.base + "/v1/predictions") as resp:
        assert resp.status == 401
        assert await resp.json() == {"title": "Unauthenticated", "status": 401,
                                     "detail": "You did not pass an authentication token"}
    status, body, _ = await api.call("GET", "/v1/predictions",
                                     headers={"Authorization": "Bearer wrong"})
    assert status == 401 and body["detail"] == "You did not pass a valid authentication token"
    status, _, _ = await api.call("GET", "/v1/predictions",
                                  headers={"Authorization": f"Token {DEFAULT_TOKEN}"})
    assert status == 200

    status, body, _ = await api.call("POST", "/v1/predictions",
                                     json_body={"version": "f" * 64, "input": {}})
    assert status == 422 and body["title"] == "Invalid version or not permitted"
    status, body, _ = await api.call("POST", "/v1/models/nobody/nothing/predictions",
                                     json_body={"input": {}})
    assert status == 404 and body == {"detail": "Not found."}
    status, body, _ = await api.call("POST", "/v1/predictions",
                                     json_body={"version": DEFAULT_VERSIONS[0]})
    assert status == 422 and body["title"] == "Input validation failed"
    status, body, _ = await api.create("not an object")  # type: ignore[arg-type]
    assert status == 422 and body["invalid_fields"][0]["field"] == "input"
    status, body, _ = await api.call("GET", "/v1/predictions/doesnotexist")
    assert status == 404 and body == {"detail": "Not found."}
    assert fake.stats()["creates"] == 0 and not fake.created_inputs()


async def test_list_pages_newest_first_and_filters_by_creation_time(served: Any) -> None:
    fake = FakeReplicate(quick(list_page_size=3))
    api: Api = await served(fake)
    ids = []
    for n in range(8):
        _, body, _ = await api.create({"n": n})
        ids.append(body["id"])

    status, first, _ = await api.call("GET", "/v1/predictions")
    assert status == 200 and first["previous"] is None
    seen, page, pages = [], first, [first]
    while True:
        seen += [r["id"] for r in page["results"]]
        assert all(set(r) >= {"id", "model", "version", "input", "status", "source",
                              "created_at", "urls"} for r in page["results"])
        if page["next"] is None:
            break
        parts = urlsplit(page["next"])
        assert f"{parts.scheme}://{parts.netloc}" == api.base and "cursor" in parse_qs(parts.query)
        _, page, _ = await api.call("GET", page["next"])
        pages.append(page)
    assert seen == ids[::-1]
    assert [len(p["results"]) for p in pages] == [3, 3, 2]
    _, back, _ = await api.call("GET", pages[1]["previous"])
    assert [r["id"] for r in back["results"]] == [r["id"] for r in first["results"]]
    assert fake.stats()["lists"] == 1 and fake.stats()["list_pages"] == 4

    # created_after is inclusive, created_before exclusive; filters survive into `next`
    everything = {r["id"]: r["created_at"] for p in pages for r in p["results"]}
    low, high = everything[ids[2]], everything[ids[6]]
    got, url = [], f"/v1/predictions?created_after={low}&created_before={high}"
    while url:
        _, page, _ = await api.call("GET", url)
        got += [r["id"] for r in page["results"]]
        url = page["next"]

    def when(text: str) -> datetime:
        return datetime.fromisoformat(text)

    expected = [i for i in ids[::-1] if when(low) <= when(everything[i]) < when(high)]
    assert got == expected and ids[2] in got and ids[6] not in got

    status, body, _ = await api.call("GET", "/v1/predictions?created_after=yesterday")
    assert status == 400
    status, body, _ = await api.call("GET", "/v1/predictions?cursor=garbage")
    assert status == 404 and body == {"detail": "Invalid cursor"}


@pytest.mark.parametrize(("fault", "bills"), [
    ("ok", 1), ("lose_reply", 1), ("5xx_after", 1), ("5xx_before", 0), ("429", 0),
    ("hang", 1), ("hang_then_create", 1),
])
async def test_each_create_fault_bills_what_it_says(served: Any, fault: str,
                                                     bills: int) -> None:
    fake = FakeReplicate(quick(hang_s=2.0))
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
        assert answer is not None and answer[0] == 201
    elif fault in ("lose_reply", "hang", "hang_then_create"):
        assert answer is None  # a disconnect or a client timeout: no answer at all
    elif fault == "5xx_after":
        assert answer is not None and answer[0] in (500, 502, 503, 504)
    elif fault == "5xx_before":
        assert answer is not None and answer[0] in (500, 503)
    else:
        assert answer is not None and answer[0] == 429
        assert answer[1]["detail"].startswith("Request was throttled.")

    await until(lambda: billed(fake, input_) == bills)
    if fault == "hang_then_create":  # created by a server that went on after the client left
        [p] = fake.predictions.values()
        assert p.created >= gave_up
    assert fake.stats()["creates"] == bills and fake.stats()["create_requests"] == 1
    if bills:  # a billed prediction is real: it shows up in the list and runs
        _, page, _ = await api.call("GET", "/v1/predictions")
        [listed] = page["results"]
        assert listed["input"] == input_
        await api.until_status(listed["id"], "succeeded")


async def test_fault_rates_and_list_and_status_faults(served: Any) -> None:
    fake = FakeReplicate(quick(create_fault_rates={"5xx_before": 1.0}, status_5xx=1.0))
    api: Api = await served(fake)
    status, _, _ = await api.create({"x": 1})
    assert status in (500, 503) and not fake.created_inputs()
    fake.config.create_fault_rates = {}
    _, created, _ = await api.create({"x": 2})
    status, body, _ = await api.call("GET", f"/v1/predictions/{created['id']}")
    assert status in (500, 502, 503, 504)
    fake.config.status_5xx = 0.0
    assert (await api.get(created["id"]))["id"] == created["id"]

    fake.script_lists(["5xx", "429", "ok"])
    status, _, _ = await api.call("GET", "/v1/predictions")
    assert status in (500, 502, 503, 504)
    status, body, headers = await api.call("GET", "/v1/predictions")
    assert status == 429 and "Retry-After" in headers
    status, body, _ = await api.call("GET", "/v1/predictions")
    assert status == 200 and len(body["results"]) == 1
    with pytest.raises(ValueError, match="unknown"):
        fake.script_creates(["explode"])


async def test_rate_limits_answer_replicates_429(served: Any) -> None:
    fake = FakeReplicate(quick(create_rate_per_min=6, create_burst=2,
                               other_rate_per_min=6, other_burst=3))
    api: Api = await served(fake)
    answers = [await api.create({"n": n}) for n in range(3)]
    assert [a[0] for a in answers] == [201, 201, 429]
    status, body, headers = answers[2]
    match = re.fullmatch(r"Request was throttled\. Your rate limit resets in ~(\d+)s\.",
                         body["detail"])
    assert match and int(match[1]) >= 1
    assert headers["Retry-After"] == match[1]
    assert len(fake.created_inputs()) == 2

    pid = answers[0][1]["id"]
    reads = [(await api.call("GET", f"/v1/predictions/{pid}"))[0] for _ in range(4)]
    assert reads == [200, 200, 200, 429]
    fake.config.send_retry_after = False
    status, _, headers = await api.call("GET", f"/v1/predictions/{pid}")
    assert status == 429 and "Retry-After" not in headers
    assert fake.stats()["throttled"] == 3
    # files are another host in reality: never throttled
    await until(lambda: fake.view(pid)["status"] == "succeeded")
    async with api.session.get(fake.view(pid)["output"], headers=AUTH) as resp:
        assert resp.status == 200


async def test_files_need_the_token_and_honour_range(served: Any) -> None:
    fake = FakeReplicate(quick(output_shape="object", file_bytes=1000))
    api: Api = await served(fake)
    _, created, _ = await api.create({"prompt": "files"})
    done = await api.until_status(created["id"], "succeeded")
    video = done["output"]["video"]
    assert done["output"]["thumbnail"].endswith("/thumbnail.jpg")
    expected = fake.expected_file(created["id"], "output.mp4")
    assert len(expected) == 1000

    async with api.session.get(video) as resp:
        assert resp.status == 401
    async with api.session.get(video, headers={**AUTH, "Range": "bytes=10-19"}) as resp:
        assert resp.status == 206
        assert resp.headers["Content-Range"] == "bytes 10-19/1000"
        assert await resp.read() == expected[10:20]
    async with api.session.get(video, headers={**AUTH, "Range": "bytes=990-"}) as resp:
        assert resp.status == 206 and await resp.read() == expected[990:]
    async with api.session.get(video, headers={**AUTH, "Range": "bytes=-5"}) as resp:
        assert resp.status == 206 and await resp.read() == expected[-5:]
    async with api.session.get(video, headers={**AUTH, "Range": "bytes=2000-"}) as resp:
        assert resp.status == 416 and resp.headers["Content-Range"] == "bytes */1000"
    async with api.session.head(video, headers=AUTH) as resp:
        assert resp.status == 200 and resp.headers["Content-Length"] == "1000"
        assert resp.headers["Accept-Ranges"] == "bytes"
    async with api.session.get(video, headers=AUTH) as resp:
        assert hashlib.sha256(await resp.read()).digest() == hashlib.sha256(expected).digest()
    async with api.session.get(f"{api.base}/files/{created['id']}/other.mp4",
                               headers=AUTH) as resp:
        assert resp.status == 404


async def test_output_shapes_and_outcomes(served: Any) -> None:
    fake = FakeReplicate(quick(output_shape="list"))
    api: Api = await served(fake)
    _, created, _ = await api.create({"k": "list"})
    done = await api.until_status(created["id"], "succeeded")
    assert isinstance(done["output"], list) and len(done["output"]) == 2
    async with api.session.get(done["output"][1], headers=AUTH) as resp:
        assert await resp.read() == fake.expected_file(created["id"], "output_1.mp4")

    fake.config.outcome_mix = {"failed": 1.0}
    _, created, _ = await api.create({"k": "fails"})
    failed = await api.until_status(created["id"], "failed", "succeeded")
    assert failed["status"] == "failed" and failed["error"] and failed["output"] is None

    fake.config.outcome_mix = {"aborted": 1.0}
    _, created, _ = await api.create({"k": "aborts"})
    aborted = await api.until_status(created["id"], "aborted", "succeeded")
    assert aborted["status"] == "aborted" and aborted["started_at"] is None


async def test_files_on_another_origin(served: Any) -> None:
    fake = FakeReplicate(quick())
    api: Api = await served(fake)
    other = api.base.replace("127.0.0.1", "localhost")
    fake.config.files_base_url = other
    _, created, _ = await api.create({"k": "cdn"})
    done = await api.until_status(created["id"], "succeeded")
    assert done["output"].startswith(other + "/files/")
    async with api.session.get(done["output"], headers=AUTH) as resp:
        assert resp.status == 200


async def test_data_is_removed_after_retention(served: Any) -> None:
    fake = FakeReplicate(quick(data_retention_s=0.3))
    api: Api = await served(fake)
    _, created, _ = await api.create({"prompt": "ephemeral"})
    done = await api.until_status(created["id"], "succeeded")
    url = done["output"]

    async def removed() -> dict[str, Any] | None:
        body = await api.get(created["id"])
        return body if body["data_removed"] else None

    gone: dict[str, Any] = await eventually(removed)
    assert gone["status"] == "succeeded"
    assert gone["output"] is None and gone["input"] == {} and gone["logs"] == ""
    async with api.session.get(url, headers=AUTH) as resp:
        assert resp.status == 404
    _, page, _ = await api.call("GET", "/v1/predictions")
    assert page["results"][0]["input"] == {}


async def test_cancel_after_aborts_before_start_and_cancels_after(served: Any) -> None:
    fake = FakeReplicate(quick(starting_s=60.0))
    api: Api = await served(fake)
    _, early, _ = await api.create({"k": "queued"}, headers={"Cancel-After": "300ms"})
    assert early["deadline"]
    aborted = await api.until_status(early["id"], "aborted", "canceled", "succeeded")
    assert aborted["status"] == "aborted" and aborted["started_at"] is None

    fake.config.starting_s, fake.config.processing_s = 0.0, 60.0
    _, running, _ = await api.create({"k": "running"}, headers={"Cancel-After": "0.3"})
    canceled = await api.until_status(running["id"], "aborted", "canceled", "succeeded")
    assert canceled["status"] == "canceled" and canceled["started_at"]
    assert "predict_time" in canceled["metrics"]

    status, body, _ = await api.create({"k": "bad"}, headers={"Cancel-After": "soon"})
    assert status == 400

    _, manual, _ = await api.create({"k": "manual"})
    status, body, _ = await api.call("POST", f"/v1/predictions/{manual['id']}/cancel")
    assert status == 200 and body["status"] == "canceled"
    status, body, _ = await api.call("POST", f"/v1/predictions/{manual['id']}/cancel")
    assert status == 200 and body["status"] == "canceled"


async def test_ended_predictions_report_the_predict_time_the_ledger_sums(served: Any) -> None:
    """What is billed (issue 30): the predict time of each prediction that ran, read over
    HTTP by Replicate's rules; none for an aborted one or one canceled before it started."""
    fake = FakeReplicate(quick())
    api: Api = await served(fake)
    ended: dict[str, dict[str, Any]] = {}
    for outcome in ("succeeded", "failed", "aborted"):
        fake.config.outcome_mix = {outcome: 1.0}
        _, created, _ = await api.create({"k": outcome})
        ended[outcome] = await api.until_status(created["id"], outcome)
    fake.config.starting_s = 60.0
    _, early, _ = await api.create({"k": "canceled early"})
    await api.call("POST", f"/v1/predictions/{early['id']}/cancel")
    ended["canceled"] = await api.until_status(early["id"], "canceled")

    costs = {o: REPLICATE_RULES.cost(body, REPLICATE_RULES.words[o])
             for o, body in ended.items()}
    ledger = fake.ledger()
    for outcome in ("succeeded", "failed"):
        seconds = ended[outcome]["metrics"]["predict_time"]
        assert seconds > 0
        assert costs[outcome] == Cost(Decimal(str(seconds)), "predict_second")
        assert ledger["jobs"][ended[outcome]["id"]] == Decimal(str(seconds))
    assert costs["aborted"] == Cost(Decimal(0), CURRENCY)
    assert "predict_time" not in ended["aborted"]["metrics"]
    assert "predict_time" not in ended["canceled"]["metrics"] and costs["canceled"] is None
    assert sorted(ledger["unbilled"]) == sorted([ended["aborted"]["id"], early["id"]])
    assert ledger["predict_seconds"] == sum(
        (c.amount for c in costs.values() if c is not None), Decimal(0))


class Receiver:
    """A webhook endpoint on loopback: answers from a script, records every request."""

    def __init__(self, answers: list[int]) -> None:
        self.answers = answers
        self.requests: list[tuple[str, dict[str, str], bytes]] = []
        self.redirect_target_hits = 0

    async def hook(self, request: web.Request) -> web.Response:
        self.requests.append((request.path, dict(request.headers), await request.read()))
        status = self.answers.pop(0) if self.answers else 204
        if status in (301, 302, 307, 308):
            return web.Response(status=status, headers={"Location": "/elsewhere"})
        return web.Response(status=status)

    async def elsewhere(self, request: web.Request) -> web.Response:
        self.redirect_target_hits += 1
        return web.Response(status=204)


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    rec = Receiver([])
    app = web.Application()
    app.router.add_post("/hook", rec.hook)
    app.router.add_post("/elsewhere", rec.elsewhere)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    yield rec, f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    await runner.cleanup()


def hmac_check(secret: str, headers: dict[str, str], body: bytes) -> list[bool]:
    """Our own Standard Webhooks check: one verdict per signature in the header."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    want = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return [sig.partition(",")[2] == want for sig in headers["webhook-signature"].split()]


async def test_webhooks_are_signed_filtered_and_retried(served: Any,
                                                        receiver: tuple[Receiver, str]) -> None:
    rec, hook_url = receiver
    rec.answers = [500, 307]  # a failure, then a redirect (not followed), then 204
    fake = FakeReplicate(quick(webhook_retry_delays_s=(0.05, 0.05, 0.05)))
    api: Api = await served(fake)
    _, created, _ = await api.create({"prompt": "hooked"}, webhook=hook_url,
                                     webhook_events_filter=["completed"])

    await until(lambda: fake.stats()["webhooks_sent"] == 1)
    assert len(rec.requests) == 3 and rec.redirect_target_hits == 0
    ids = {lower(h)["webhook-id"] for _, h, _ in rec.requests}
    assert len(ids) == 1 and ids.pop().startswith("msg_")
    for _, raw_headers, body in rec.requests:
        headers = lower(raw_headers)
        assert hmac_check(fake.config.webhook_secret, headers, body) == [True]
        Webhook(fake.config.webhook_secret).verify(body, headers)
        event = json.loads(body)
        assert event["id"] == created["id"] and event["status"] == "succeeded"
    assert [d.status for d in fake.webhook_deliveries] == [500, 307, 204]
    assert {d.event for d in fake.webhook_deliveries} == {"completed"}

    status, secret, _ = await api.call("GET", "/v1/webhooks/default/secret")
    assert status == 200 and secret == {"key": fake.config.webhook_secret}


async def test_webhook_rotation_signs_with_both_secrets(served: Any,
                                                        receiver: tuple[Receiver, str]) -> None:
    rec, hook_url = receiver
    old = "whsec_" + base64.b64encode(b"an older secret, still accepted").decode()
    fake = FakeReplicate(quick(webhook_old_secret=old))
    api: Api = await served(fake)
    await api.create({"prompt": "rotated"}, webhook=hook_url)  # no filter: every event

    await until(lambda: fake.stats()["webhooks_sent"] == 4)
    assert [d.event for d in fake.webhook_deliveries] == ["start", "logs", "output",
                                                          "completed"]
    assert json.loads(rec.requests[-1][2])["status"] == "succeeded"
    for _, raw_headers, body in rec.requests:
        headers = lower(raw_headers)
        assert hmac_check(fake.config.webhook_secret, headers, body) == [True, False]
        assert hmac_check(old, headers, body) == [False, True]
        Webhook(old).verify(body, headers)
        Webhook(fake.config.webhook_secret).verify(body, headers)


def lower(headers: dict[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in headers.items()}


async def test_a_patient_client_gets_the_held_answer(served: Any) -> None:
    fake = FakeReplicate(quick(hang_s=0.2))
    api: Api = await served(fake)
    fake.script_creates(["hang", "hang_then_create"])
    for n in range(2):
        status, body, _ = await api.create({"patient": n}, timeout_s=WAIT_S)
        assert status == 201 and body["input"] == {"patient": n}
    assert fake.stats()["creates"] == 2


async def test_an_unreachable_webhook_is_retried_then_given_up(served: Any) -> None:
    fake = FakeReplicate(quick(webhook_retry_delays_s=(0.01, 0.01)))
    api: Api = await served(fake)
    dead = free_url()
    await api.create({"prompt": "nobody home"}, webhook=dead, webhook_events_filter=["completed"])
    await until(lambda: fake.stats()["webhooks_failed"] == 1)
    attempts = fake.webhook_deliveries
    assert [d.attempt for d in attempts] == [1, 2, 3]
    assert all(d.status is None and d.error for d in attempts)
    assert len({d.webhook_id for d in attempts}) == 1


def free_url() -> str:
    """A loopback URL nothing listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}/hook"
