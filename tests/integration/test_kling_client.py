"""The Kling client against the fake Kling (vidpoll.providers.kling.fake) over real HTTP on
loopback.

What is checked: a create's path and body (unchanged, plus the external id derived from the
key), reads under the handle's endpoint, the JWT on every call (the fake verifies it: HS256,
`iss` the access key, a life of at most 1805 s), one token for many calls, a new one before it
expires and after Kling says it expired (the call sent once more, never billed twice), a code
other than 0 under HTTP 200 turned into its status (and what the core then decides), a
repeated external id answered 409, the look-up by key (found, absent, failing), what is refused
unsent (keys missing or unsendable, an endpoint or a body Kling cannot take), and the keys and
the token never in a body, a detail, a repr or a log line."""

from __future__ import annotations

import json
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import jwt
import pytest
from aiohttp import web

from vidpoll.models import (
    RECONCILING,
    REJECTED,
    ClaimedIntent,
    ClaimedJob,
    HttpAnswer,
    SubmitOutcome,
)
from vidpoll.policy import AuthPause, PollPolicy, decide, decide_submit
from vidpoll.providers.base import Pending, ProviderOptions, Terminal
from vidpoll.providers.kling.client import KlingClient
from vidpoll.providers.kling.fake import (
    DEFAULT_ACCESS_KEY,
    DEFAULT_SECRET_KEY,
    FakeKling,
    KlingFakeConfig,
    start_fake_kling,
)
from vidpoll.providers.kling.rules import RULES, external_task_id

ENDPOINT = "text2video"
BODY = {"model_name": "kling-v2-6", "prompt": "a heron at dawn", "mode": "std",
        "duration": "5", "aspect_ratio": "16:9", "cfg_scale": 0.5}


def options(secret: str = DEFAULT_SECRET_KEY) -> ProviderOptions:
    return ProviderOptions(extra={"secret_key_env": "KLING_SECRET_KEY"},
                           secrets={"secret_key_env": secret})


@asynccontextmanager
async def kling(access: str = DEFAULT_ACCESS_KEY, secret: str = DEFAULT_SECRET_KEY,
                **config: Any) -> AsyncIterator[tuple[FakeKling, KlingClient]]:
    fake = FakeKling(KlingFakeConfig(**{"queue_s": 0.02, "processing_s": 0.2,
                                        "file_bytes": 4096, **config}))
    runner, url = await start_fake_kling(fake)
    try:
        async with KlingClient(url, access, timeout_s=2.0, options=options(secret)) as client:
            yield fake, client
    finally:
        await runner.cleanup()


def parsed(answer: HttpAnswer) -> dict[str, Any]:
    value = json.loads(answer.body)
    assert isinstance(value, dict)
    return value


async def create(client: KlingClient, key: str = "k-1", body: dict[str, Any] = BODY,
                 model: str = ENDPOINT) -> str:
    answer = await client.create_video(body, key, model)
    assert answer.status == 200, (answer.status, answer.body)
    task_id = RULES.created_job_id(parsed(answer))
    assert task_id is not None
    return task_id


# ---- creates and reads ----------------------------------------------------------------------

async def test_a_create_sends_the_body_unchanged_plus_the_external_id_and_reads_it_back(
        ) -> None:
    async with kling() as (fake, client):
        key = "3f2b8c1e-7a4d-4e0b-9c1a-5d6e7f8a9b0c"
        answer = await client.create_video({**BODY, "image": "https://in.example/a.png"}, key,
                                           "image2video")
        assert answer.status == 200
        body = parsed(answer)
        task_id = RULES.created_job_id(body)
        assert task_id is not None and task_id.isdigit()
        assert RULES.created_handle(body, "image2video") == {"endpoint": "image2video"}
        [(billed_id, sent)] = fake.billed()
        assert billed_id == task_id and fake.tasks[task_id].endpoint == "image2video"
        assert sent == {**BODY, "image": "https://in.example/a.png",
                        "external_task_id": external_task_id(key)}
        assert external_task_id(key) == key  # a UUID goes as it is

        # read under the handle's endpoint; without it, text2video (where Kling has no such
        # task: its own 404, in its envelope)
        read = await client.read_status(task_id, {"endpoint": "image2video"})
        assert read.status == 200 and isinstance(RULES.read_status(parsed(read)), Pending)
        missing = await client.read_status(task_id)
        assert missing.status == 404 and RULES.error_code(parsed(missing))[0] == "1203"
        fake.finish(task_id, "succeed")
        done = await client.read_result(task_id, {"endpoint": "image2video"})
        assert RULES.read_status(parsed(done)) == Terminal("succeed", "succeeded")
        assert RULES.media_urls(parsed(done)) == [fake.media_url(task_id)]
        # a handle naming no endpoint is not sent anywhere
        odd = await client.read_status(task_id, {"endpoint": "../x"})
        assert odd.status is None and "not sent" in odd.detail


async def test_every_call_carries_a_jwt_the_fake_accepts_one_token_for_many_calls() -> None:
    async with kling() as (fake, client):
        task_id = await create(client)
        for _ in range(5):
            assert (await client.read_status(task_id, {"endpoint": ENDPOINT})).status == 200
        assert client.tokens_minted == 1 and len(fake.tokens_seen) == 1
        [claims] = fake.tokens_seen
        assert set(claims) == {"iss", "exp", "nbf"} and claims["iss"] == DEFAULT_ACCESS_KEY
        assert claims["exp"] - claims["nbf"] <= 1805
        assert claims["nbf"] <= time.time() < claims["exp"] <= time.time() + 1800
        assert fake.stats()["unauthorized"] == 0


async def test_a_token_is_minted_again_before_it_expires() -> None:
    async with kling() as (fake, client):
        # the first token minted 1600 s "ago" (200 s left: valid, yet under the margin)
        offset = [-1600.0]
        client._clock = lambda: time.time() + offset[0]
        task_id = await create(client)
        assert client.tokens_minted == 1
        offset[0] = 0.0
        assert (await client.read_status(task_id, {"endpoint": ENDPOINT})).status == 200
        assert (await client.read_status(task_id, {"endpoint": ENDPOINT})).status == 200
        assert client.tokens_minted == 2 and len(fake.tokens_seen) == 2
        first, second = fake.tokens_seen
        assert second["exp"] - first["exp"] >= 1599
        assert fake.stats()["unauthorized"] == 0 and client.token_retries == 0


@pytest.mark.parametrize("how", ["issued_before", "seen"])
async def test_a_token_kling_calls_expired_is_replaced_and_the_call_sent_once_more(
        how: str) -> None:
    async with kling() as (fake, client):
        task_id = await create(client, "first")
        if how == "seen":
            fake.expire_seen_tokens()
        else:
            fake.reject_tokens_issued_before(time.time())
        # a create refused for its token is no create: sent again at once, billed once
        second = await client.create_video(BODY, "second", ENDPOINT)
        assert second.status == 200
        assert client.token_retries == 1 and client.tokens_minted == 2
        assert fake.stats()["unauthorized"] == 1 and len(fake.billed()) == 2
        # the new token is kept for later calls
        assert (await client.read_status(task_id, {"endpoint": ENDPOINT})).status == 200
        assert client.tokens_minted == 2 and fake.stats()["unauthorized"] == 1


async def test_a_token_refused_twice_is_a_401_the_core_pauses_on() -> None:
    async with kling() as (fake, client):
        await create(client)
        fake.reject_tokens_issued_before(time.time() + 3600)  # every token: a server clock ahead
        answer = await client.create_video(BODY, "k-2", ENDPOINT)
        assert answer.status == 401 and RULES.error_code(parsed(answer))[0] == "1004"
        assert client.token_retries == 1 and len(fake.billed()) == 1
        assert isinstance(decide_submit(_intent(), answer, _now(), PollPolicy(), _rng(), RULES),
                          AuthPause)


# ---- the envelope ---------------------------------------------------------------------------

@pytest.mark.parametrize(("code", "status", "state"), [
    (5000, 500, RECONCILING), (5001, 503, RECONCILING), (5002, 504, RECONCILING),
    (1302, 429, "queued"), (4321, 502, RECONCILING), (1201, 400, REJECTED)])
async def test_a_code_under_http_200_is_answered_with_its_status_and_decided_so(
        code: int, status: int, state: str) -> None:
    async with kling(code_under_200=code) as (fake, client):
        fake.script_creates(["code_under_200"])
        answer = await client.create_video(BODY, "k", ENDPOINT)
        assert answer.status == status and parsed(answer)["code"] == code
        decision = decide_submit(_intent(), answer, _now(), PollPolicy(), _rng(), RULES)
        assert isinstance(decision, SubmitOutcome) and decision.state == state
        assert fake.billed() == []
        # a read so answered is that status too (never a task: no "succeed" from an error)
        task_id = await create(client, "k-read")
        fake.script_reads(["code_under_200"])
        read = await client.read_status(task_id, {"endpoint": ENDPOINT})
        assert read.status == status
        outcome = decide(_job(task_id), read, _now(), PollPolicy(), _rng(), RULES)
        assert getattr(outcome, "read_ok", False) is False


async def test_kling_s_own_error_statuses_stand_as_sent() -> None:
    async with kling(fivexx_status=503) as (fake, client):
        fake.script_creates(["5xx_after", "429"])
        first = await client.create_video(BODY, "a", ENDPOINT)
        assert first.status == 503 and parsed(first)["code"] == 5001
        second = await client.create_video(BODY, "b", ENDPOINT)
        assert second.status == 429 and parsed(second)["code"] == 1302
        invalid = await client.create_video({"prompt": ""}, "c", ENDPOINT)
        assert invalid.status == 400 and RULES.error_code(parsed(invalid))[0] == "1201"


@pytest.mark.parametrize("repeated", ["refuse", "return_existing", "accept"])
async def test_a_repeated_external_id(repeated: str) -> None:
    async with kling(repeated_external_id=repeated) as (fake, client):
        task_id = await create(client, "same")
        again = await client.create_video(BODY, "same", ENDPOINT)
        if repeated == "refuse":
            # a 409 (the core's "not now": an unknown outcome, looked up, never rejected)
            assert again.status == 409 and "external_task_id" in parsed(again)["message"]
            decision = decide_submit(_intent(), again, _now(), PollPolicy(), _rng(), RULES)
            assert isinstance(decision, SubmitOutcome) and decision.state == RECONCILING
            assert len(fake.billed()) == 1
        elif repeated == "return_existing":
            assert again.status == 200 and RULES.created_job_id(parsed(again)) == task_id
            assert len(fake.billed()) == 1
        else:  # the worst case: billed again (only vidpoll's look-up prevents it)
            assert again.status == 200 and RULES.created_job_id(parsed(again)) != task_id
            assert len(fake.billed()) == 2


# ---- the look-up by key ---------------------------------------------------------------------

async def test_find_created_finds_the_task_by_its_external_id() -> None:
    async with kling() as (fake, client):
        key = "Intent/With:Odd Chars"  # sent as a hash of it
        task_id = await create(client, key, model="image2video",
                               body={**BODY, "image": "https://in.example/a.png"})
        page = await client.find_created("image2video", key)
        assert page.failure is None and not page.detail and page.calls == 1
        [found] = page.entries
        assert found.job_id == task_id and found.handle == {"endpoint": "image2video"}
        assert found.entry["task_info"]["external_task_id"] == external_task_id(key)
        assert found.created_at is not None
        assert abs((found.created_at - _now()).total_seconds()) < 10
        assert fake.status_reads == 1


async def test_find_created_says_absent_when_kling_has_no_such_task() -> None:
    async with kling() as (fake, client):
        await create(client, "made")
        page = await client.find_created(ENDPOINT, "never-made")
        assert page.entries == () and page.failure is None and not page.detail
        assert not page.final and fake.status_reads == 1


@pytest.mark.parametrize(("fault", "status"), [("5xx", 500), ("429", 429),
                                               ("code_under_200", 500)])
async def test_find_created_fails_on_anything_else(fault: str, status: int) -> None:
    async with kling() as (fake, client):
        await create(client, "made")
        fake.script_reads([fault])
        page = await client.find_created(ENDPOINT, "made")
        assert page.entries == () and page.failure is not None
        assert page.failure.status == status and page.detail


async def test_find_created_fails_on_an_answer_that_is_not_kling_s() -> None:
    fake = FakeKling(KlingFakeConfig())
    runner, url = await start_fake_kling(fake)
    try:
        # a base URL with a path the fake does not serve: aiohttp's plain 404, no envelope
        async with KlingClient(url + "/elsewhere", DEFAULT_ACCESS_KEY,
                               options=options()) as client:
            page = await client.find_created(ENDPOINT, "k")
            assert page.entries == () and page.failure is not None
            assert page.failure.status == 404 and "HTTP 404" in page.detail
        async with KlingClient(url, DEFAULT_ACCESS_KEY, options=options()) as client:
            # and never another's task: an id that is one of Kling's task ids is not sent as it is
            task_id = await create(client, "a")
            page = await client.find_created(ENDPOINT, task_id)
            assert page.entries == () and page.failure is None  # looked up by its hash
    finally:
        await runner.cleanup()


# ---- refused unsent -------------------------------------------------------------------------

@pytest.mark.parametrize(("access", "secret", "said"), [
    (DEFAULT_ACCESS_KEY, "", "KLING_SECRET_KEY"),
    ("", DEFAULT_SECRET_KEY, "access key is empty"),
    ("AK-bad\nkey", DEFAULT_SECRET_KEY, "control character")])
async def test_keys_that_cannot_be_used_are_a_401_unsent(access: str, secret: str,
                                                         said: str) -> None:
    async with kling(access=access, secret=secret) as (fake, client):
        answers = [await client.create_video(BODY, "k", ENDPOINT),
                   await client.read_status("1", {"endpoint": ENDPOINT})]
        for answer in answers:
            assert answer.status == 401 and answer.transport_error is None
            assert said in answer.detail and RULES.error_code(parsed(answer))[0] == "1000"
            assert "AK-bad" not in answer.detail + answer.body.decode()
        assert isinstance(decide_submit(_intent(), answers[0], _now(), PollPolicy(), _rng(),
                                        RULES), AuthPause)
        page = await client.find_created(ENDPOINT, "k")
        assert page.failure is not None and page.final and page.calls == 0
        assert fake.create_posts == 0 and fake.status_reads == 0


async def test_an_endpoint_or_a_body_kling_cannot_take_is_refused_unsent() -> None:
    async with kling() as (fake, client):
        for model, body in ((None, BODY), ("../x", BODY), ("Text2Video", BODY),
                            (ENDPOINT, {**BODY, "external_task_id": "mine"})):
            answer = await client.create_video(body, "k", model)
            assert answer.status == 400 and "not sent" in parsed(answer)["message"]
            decision = decide_submit(_intent(), answer, _now(), PollPolicy(), _rng(), RULES)
            assert isinstance(decision, SubmitOutcome) and decision.state == REJECTED
        assert fake.create_posts == 0


# ---- secrets --------------------------------------------------------------------------------

class Echo:
    """A server that says back everything it was sent, the Authorization header and the
    body, in every form (an error body, a success, escaped, in a URL's query)."""

    def __init__(self) -> None:
        self.tokens: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        header = request.headers.get("Authorization", "")
        token = header.removeprefix("Bearer ")
        self.tokens.append(token)
        sent = await request.text()
        said = (f"bad {header} for {sent} ({DEFAULT_SECRET_KEY}, {DEFAULT_ACCESS_KEY}) "
                f"{token.replace('.', '%2E')}")
        if request.method == "POST":
            return web.json_response({"code": 1002, "message": said, "request_id": "r"},
                                     status=401)
        return web.json_response({"code": 0, "message": said, "request_id": "r", "data": {
            "task_id": "1", "task_status": "processing", "echo": said,
            "url": f"https://h/x?token={token}&s={DEFAULT_SECRET_KEY}"}})


async def test_the_keys_and_the_token_never_come_back_in_a_body_a_detail_a_repr_or_a_log(
        caplog: pytest.LogCaptureFixture) -> None:
    echo = Echo()
    app = web.Application()
    app.router.add_post("/v1/videos/{endpoint}", echo.handle)
    app.router.add_get("/v1/videos/{endpoint}/{id}", echo.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    caplog.set_level(logging.DEBUG)
    try:
        async with KlingClient(url, DEFAULT_ACCESS_KEY, options=options()) as client:
            answers = [await client.create_video(BODY, "k", ENDPOINT),
                       await client.read_status("1", {"endpoint": ENDPOINT})]
            page = await client.find_created(ENDPOINT, "k")
            token = echo.tokens[0]
            assert jwt.decode(token, DEFAULT_SECRET_KEY, algorithms=["HS256"])["iss"] == (
                DEFAULT_ACCESS_KEY)
            shown = [repr(client), repr(page), page.detail]
            for answer in answers:
                shown += [answer.body.decode(), answer.detail, repr(answer)]
            shown += [r.getMessage() for r in caplog.records]
            text = "\n".join(shown)
            for secret in (DEFAULT_SECRET_KEY, DEFAULT_ACCESS_KEY, *set(echo.tokens),
                           token.replace(".", "%2E")):
                assert secret not in text
            assert "<redacted>" in answers[0].body.decode()
            assert "<redacted>" in answers[1].body.decode()
    finally:
        await runner.cleanup()


# ---- helpers: what the core would decide ---------------------------------------------------

def _intent() -> ClaimedIntent:
    return ClaimedIntent("k", uuid.uuid4(), BODY, attempts=1, consecutive_errors=0,
                         account="a", model=ENDPOINT)


def _job(job_id: str) -> ClaimedJob:
    return ClaimedJob(job_id, uuid.uuid4(), due_at=_now(), polling_since=_now(), polls=1,
                      consecutive_errors=0, not_found_count=0, account="a")


def _now() -> datetime:
    return datetime.now(UTC)


def _rng() -> random.Random:
    return random.Random(0)
