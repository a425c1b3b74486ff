"""Runway's client against the fake Runway (vidpoll.providers.runway.fake) over real HTTP on
loopback.

What is checked: a create goes to `/v1/{endpoint}` (one or two path words) with the body
unchanged, the key as a Bearer token and the account's `api_version` as `X-Runway-Version`
(the fake refuses a call without either); a task is read at `/v1/tasks/{id}`; Runway's 404
"Could not find Task" is its own answer (a job's `not_found`, never a wrong URL); a 429's
Retry-After comes through; a status body's output URLs come back without their `_jwt`
signature while `fresh_media` hands back signed ones (fresh on each read, the key never sent
to the CDN), or the answer that holds none; a key no header can carry, a model that cannot be
an endpoint and an api_version that cannot be a header are answered unsent."""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest

from vidpoll.models import ClaimedIntent, ClaimedJob, ErrorClass, HttpAnswer, Outcome
from vidpoll.policy import AuthPause, PollPolicy, decide, decide_submit, is_misrouted
from vidpoll.providers import registry
from vidpoll.providers.base import Pending, ProviderOptions, Terminal
from vidpoll.providers.runway.client import RunwayClient
from vidpoll.providers.runway.fake import (
    DEFAULT_KEY,
    FakeRunway,
    RunwayFakeConfig,
    start_fake_runway,
)
from vidpoll.providers.runway.rules import ERROR_CODE, RULES

BODY = {"model": "gen4_turbo", "promptImage": "https://example.com/heron.png",
        "promptText": "a heron at dawn", "ratio": "1280:720", "duration": 5, "seed": 7}
ENDPOINT = "image_to_video"
WAIT_S = 20.0


def registry_options() -> ProviderOptions:
    """The options an account of Runway gets with every field left to its default."""
    own = registry.load("runway").account_options  # type: ignore[attr-defined]
    return ProviderOptions(extra={k: v.default for k, v in own.items() if v.default})


@asynccontextmanager
async def serving(key: str = DEFAULT_KEY, options: ProviderOptions | None = None,
                  **config: Any) -> AsyncIterator[tuple[FakeRunway, RunwayClient]]:
    fake = FakeRunway(RunwayFakeConfig(**{"processing_s": 3600.0, "pending_s": 0.0,
                                          "media_bytes": 2048, "seed": 3, **config}))
    runner, url = await start_fake_runway(fake)
    try:
        async with RunwayClient(url, key, timeout_s=3.0,
                                options=options or registry_options()) as client:
            yield fake, client
    finally:
        await runner.cleanup()


async def eventually(check: Callable[[], Awaitable[Any]], timeout_s: float = WAIT_S,
                     what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


def parsed(answer: HttpAnswer) -> dict[str, Any]:
    value = json.loads(answer.body)
    assert isinstance(value, dict)
    return value


async def created(client: RunwayClient, body: dict[str, Any] = BODY,
                  endpoint: str = ENDPOINT) -> str:
    answer = await client.create_video(body, "key-1", endpoint)
    assert answer.status == 200, answer
    job_id = RULES.created_job_id(parsed(answer))
    assert job_id is not None
    return job_id


async def fetch(url: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        return resp.status, await resp.read()


# ---- creates and reads ---------------------------------------------------------------------

async def test_a_create_sends_the_body_unchanged_with_the_key_and_version_and_reads_by_get(
        ) -> None:
    async with serving() as (fake, client):
        job_id = await created(client)
        # the fake answers 401 without `Authorization: Bearer <key>` and 400 without the
        # X-Runway-Version it knows: the create went through with both
        assert fake.billed() == [(job_id, BODY)]  # every field as submit gave it
        assert fake.tasks[job_id].endpoint == ENDPOINT
        answer = await client.read_status(job_id)
        assert answer.status == 200
        assert RULES.read_status(parsed(answer)) == Pending("running", None,
                                                            detail="progress 0%")
        assert fake.status_reads == 1
        assert client.shown_status_url(job_id) == f"{client.base_url}/v1/tasks/{job_id}"
        assert client.shown_create_url() == f"{client.base_url}/v1/ENDPOINT"
        assert dict(client.media_headers()) == {} and client.media_auth_hosts() == frozenset()


async def test_the_two_word_endpoint_and_a_base_url_ending_in_v1() -> None:
    async with serving() as (fake, plain), RunwayClient(
            f"{plain.base_url}/v1/", DEFAULT_KEY, options=registry_options()) as client:
        body = {"configId": "cfg_1", "input": {"promptText": "a heron", "duration": 4}}
        job_id = await created(client, body, "generate/video")
        assert fake.tasks[job_id].endpoint == "generate/video"
        assert fake.tasks[job_id].body == body
        assert client.shown_status_url(job_id) == f"{plain.base_url}/v1/tasks/{job_id}"


async def test_the_version_sent_is_the_accounts_api_version() -> None:
    options = ProviderOptions(extra={"api_version": "2099-01-01"})
    async with serving(options=options, versions={"2099-01-01"}) as (fake, client):
        await created(client)
    # the default version, to a server that no longer knows it: Runway's own 400 refusal
    async with serving(versions={"2099-01-01"}) as (fake, client):
        answer = await client.create_video(BODY, "k", ENDPOINT)
        assert answer.status == 400 and fake.billed() == []
        body = parsed(answer)
        assert "docUrl" in body
        assert RULES.error_code(body)[0] == ERROR_CODE
        # a final refusal, never an unknown create
        decision = decide_submit(_intent(), answer, _now(), PollPolicy(), _rng(), RULES)
        assert not isinstance(decision, AuthPause) and decision.state == "rejected"


async def test_a_body_runway_refuses_is_rejected_with_its_issues() -> None:
    async with serving() as (fake, client):
        answer = await client.create_video({"model": "gen4_turbo"}, "k", ENDPOINT)
        assert answer.status == 400 and fake.billed() == []
        code, message = RULES.error_code(parsed(answer))
        assert code == ERROR_CODE and message is not None
        assert message.startswith("Validation of body failed (promptImage: ")


async def test_runways_404_is_its_own_answer_never_a_wrong_url() -> None:
    async with serving() as (_, client):
        for job_id in ("no-such-task", str(uuid.uuid4()), "a/../b", "x?y=1"):
            answer = await client.read_status(job_id)
            assert answer.status == 404, job_id
            body = parsed(answer)
            assert RULES.error_code(body) == (ERROR_CODE, "Could not find Task")
            assert not is_misrouted(404, body, RULES)
        # the worker's decision: a `not_found` read of the job, not a paused account
        job = ClaimedJob("no-such-task", uuid.uuid4(), _now(), _now(), polls=1,
                         consecutive_errors=0, not_found_count=0)
        outcome = decide(job, answer, _now(), PollPolicy(), _rng(), RULES)
        assert isinstance(outcome, Outcome) and outcome.error_class is ErrorClass.NOT_FOUND


async def test_a_429_passes_its_retry_after_through() -> None:
    async with serving(daily_cap=1, daily_cap_retry_after_s=3600) as (fake, client):
        await created(client)
        answer = await client.create_video(BODY, "k2", ENDPOINT)
        assert answer.status == 429 and answer.retry_after == "3600"
        assert RULES.error_code(parsed(answer)) == (
            ERROR_CODE, "Your daily task limit has been reached.")
        assert len(fake.billed()) == 1


# ---- outputs: stored without their signature, fresh ones for the download ------------------

async def test_stored_outputs_hold_no_signature_and_fresh_media_hands_out_signed_ones() -> None:
    async with serving(output_count=2) as (fake, client):
        job_id = await created(client)
        fake.finish(job_id, "SUCCEEDED")
        answer = await client.read_status(job_id)
        assert answer.status == 200
        body = parsed(answer)
        assert RULES.read_status(body) == Terminal("succeeded", "succeeded")
        stored = RULES.media_urls(body)
        assert len(stored) == 2 and "_jwt" not in answer.body.decode()
        assert all("?" not in url for url in stored)
        assert [u.rsplit("/", 1)[1] for u in stored] == ["0.mp4", "1.mp4"]
        # a URL without its signature is refused by the CDN
        assert (await fetch(stored[0]))[0] == 403

        fresh = await client.fresh_media(job_id, None)
        assert isinstance(fresh, list) and len(fresh) == 2
        assert [u.split("?")[0] for u in fresh] == stored  # same files, same order
        assert all("?_jwt=" in u for u in fresh)
        for index, url in enumerate(fresh):
            assert await fetch(url) == (200, fake.media_bytes(job_id, index))
        assert not any(read.authorization for read in fake.media_reads)  # no key to the CDN

        # expired: every URL handed out so far is refused; a fresh read signs anew
        assert fake.expire_outputs(job_id) >= 2
        assert (await fetch(fresh[0]))[0] == 403
        again = await client.fresh_media(job_id)
        assert isinstance(again, list) and again != fresh
        assert await fetch(again[1]) == (200, fake.media_bytes(job_id, 1))


@pytest.mark.parametrize("outcome", ["FAILED", "CANCELLED", None])
async def test_fresh_media_of_a_task_without_outputs_is_the_answer(outcome: str | None) -> None:
    async with serving() as (fake, client):
        job_id = await created(client)
        if outcome is not None:
            fake.finish(job_id, outcome)
        got = await client.fresh_media(job_id)
        assert isinstance(got, HttpAnswer) and got.status == 200
        assert got.detail.startswith("the task ended" if outcome else "the task has not ended")
        assert "_jwt" not in got.body.decode()


async def test_fresh_media_of_a_deleted_task_is_runways_404() -> None:
    async with serving() as (fake, client):
        job_id = await created(client)
        fake.finish(job_id, "SUCCEEDED")
        fake.tasks[job_id].deleted = True  # as DELETE of an ended task does
        got = await client.fresh_media(job_id)
        assert isinstance(got, HttpAnswer) and got.status == 404
        assert RULES.error_code(parsed(got)) == (ERROR_CODE, "Could not find Task")
        # a server error is an answer too (tried again later by the downloader)
        fake.status_5xx = 1
        got = await client.fresh_media(job_id)
        assert isinstance(got, HttpAnswer) and got.status == 502


# ---- calls answered unsent ------------------------------------------------------------------

async def test_a_key_no_header_can_carry_is_a_refused_key_never_an_unknown_create() -> None:
    async with serving(key="key_bad\nsecret-part") as (fake, client):
        assert client.key_problem is not None
        for answer in (await client.create_video(BODY, "k", ENDPOINT),
                       await client.read_status("t-1"), await client.fresh_media("t-1")):
            assert isinstance(answer, HttpAnswer)
            assert answer.status == 401 and answer.transport_error is None
            assert "control character" in answer.detail
            shown = answer.detail + answer.body.decode()
            assert "secret-part" not in shown and "key_bad" not in shown
            assert RULES.error_code(parsed(answer))[0] == ERROR_CODE
        decision = decide_submit(_intent(), await client.create_video(BODY, "k", ENDPOINT),
                                 _now(), PollPolicy(), _rng(), RULES)
        assert isinstance(decision, AuthPause)  # the intent stays queued: nothing was sent
        assert fake.create_posts == 0 and fake.status_reads == 0
        assert "secret-part" not in repr(client)


async def test_a_wrong_key_is_runways_401() -> None:
    async with serving(key="key_" + "f" * 128) as (fake, client):
        answer = await client.create_video(BODY, "k", ENDPOINT)
        assert answer.status == 401 and fake.billed() == []
        assert isinstance(decide_submit(_intent(), answer, _now(), PollPolicy(), _rng(), RULES),
                          AuthPause)


async def test_a_model_that_cannot_be_an_endpoint_is_refused_unsent() -> None:
    async with serving() as (fake, client):
        for model in (None, "tasks", "../v1/tasks", "gen4_turbo/x/y", "Image_To_Video",
                      "image_to_video?x=1"):
            answer = await client.create_video(BODY, "k", model)
            assert answer.status == 400, model
            assert parsed(answer)["error"].startswith("not sent: "), model
            decision = decide_submit(_intent(), answer, _now(), PollPolicy(), _rng(), RULES)
            assert not isinstance(decision, AuthPause) and decision.state == "rejected"
        assert fake.create_posts == 0


async def test_an_api_version_no_header_can_carry_is_refused_unsent() -> None:
    options = ProviderOptions(extra={"api_version": "2024-11-06\r\nX-Evil: 1"})
    async with serving(options=options) as (fake, client):
        answer = await client.create_video(BODY, "k", ENDPOINT)
        assert answer.status == 400 and "X-Runway-Version" in parsed(answer)["error"]
        assert (await client.read_status("t")).status == 400
        assert fake.create_posts == 0 and fake.status_reads == 0


def _intent() -> ClaimedIntent:
    return ClaimedIntent("k", uuid.uuid4(), BODY, attempts=1, consecutive_errors=0,
                         account="a", model=ENDPOINT)


def _now() -> datetime:
    return datetime.now(UTC)


def _rng() -> random.Random:
    return random.Random(0)


async def test_fresh_links_are_gone_for_good_only_when_runway_itself_says_so():
    """Runway's outputs live a day or two: a proxy's error page or a garbled answer in front
    of it is tried again later; only Runway's own 404 (in its envelope: a deleted task) or a
    task that ended without output fails the download for good (found in review)."""
    from aiohttp import web

    from vidpoll.download import media_refresher
    from vidpoll.errors import DownloadError, DownloadRefused

    pages = {"proxy 404": (404, "<html><body>404 Not Found</body></html>"),
             "maintenance": (200, "<html><body>back soon</body></html>"),
             "not JSON": (200, "{\"id\": ")}
    showing = {"page": "proxy 404"}

    async def proxy(request: web.Request) -> web.Response:
        status, text = pages[showing["page"]]
        return web.Response(status=status, text=text, content_type="text/html")

    app = web.Application()
    app.router.add_get("/v1/tasks/{task}", proxy)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with RunwayClient(f"http://127.0.0.1:{port}", DEFAULT_KEY, timeout_s=3.0,
                                options=registry_options()) as client:
            refresh = media_refresher({"rw": client})
            for page in pages:
                showing["page"] = page
                with pytest.raises(DownloadError) as caught:
                    await refresh("rw", str(uuid.uuid4()))
                assert not isinstance(caught.value, DownloadRefused), page
    finally:
        await runner.cleanup()
    async with serving() as (fake, client):
        refresh = media_refresher({"rw": client})
        with pytest.raises(DownloadRefused, match="no longer holds them"):
            await refresh("rw", str(uuid.uuid4()))  # Runway's own "Could not find Task"
        created = parsed(await client.create_video(dict(BODY), "k-failed", ENDPOINT))
        fake.finish(created["id"], "FAILED")
        with pytest.raises(DownloadRefused, match="no longer holds them"):
            await refresh("rw", created["id"])  # ended without output
