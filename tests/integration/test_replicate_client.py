"""Replicate's client against a small server on loopback (real HTTP): what each create sends,
where a 429's wait comes from, how a look-up pages through the list (and never takes the
token to another origin), and that no answer hands back the token."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from aiohttp import web

from vidpoll import reconcile
from vidpoll.models import ErrorClass, HttpAnswer
from vidpoll.providers import registry
from vidpoll.providers.base import CreateLookup, ProviderOptions
from vidpoll.providers.replicate.client import ReplicateClient
from vidpoll.providers.replicate.rules import RULES
from vidpoll.reconcile import Lookups, Wanted

from ..conftest import free_port

TOKEN = "r8_Tok3n/with+odd=chars0123456789"
VERSION = "5c7d5dc6dd8bf75c1acaa8565735e7986bc5b66206b55cca93cb72c9bf15ccaa"
PAYLOAD = {"prompt": "a heron at dawn", "duration": 5, "loop": False, "seed": None,
           "tags": ["a", "b"], "nested": {"x": 1.5, "url": "https://cdn.example/i.png?sig=1"}}
SINCE = datetime(2025, 3, 1, 12, 0, 0, 250_000, tzinfo=UTC)
UNTIL = datetime(2025, 3, 1, 12, 30, 0, 1, tzinfo=UTC)


async def _no_wait(_: float) -> None:
    return None


async def find_created(client: ReplicateClient, payload: dict[str, Any], model: str,
                       since: datetime, until: datetime) -> CreateLookup:
    """One look-up through the core's walk of the pages (vidpoll.reconcile), its waits
    between tries of a failed page skipped."""
    import random
    lookups = Lookups(random.Random(0), sleep=_no_wait)
    return await lookups.find("acct", client, RULES,
                              Wanted("k", payload, model, since, until, until))


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


@dataclass
class Api:
    """Replicate's prediction endpoints, as far as these tests go."""

    base: str = ""
    seen: list[Seen] = field(default_factory=list)
    pages: dict[str, dict[str, Any]] = field(default_factory=dict)
    """List pages by `cursor` ("" for the first)."""
    list_status: int = 200
    list_raw: bytes | None = None
    failing: dict[str, list[int]] = field(default_factory=dict)
    """By cursor: the statuses its next reads answer before the page (a busy list)."""
    down: set[str] = field(default_factory=set)
    """Cursors whose page answers 500 until the test mends it."""

    async def record(self, request: web.Request) -> Seen:
        seen = Seen(request.method, request.path, dict(request.query),
                    dict(request.headers), await request.read())
        self.seen.append(seen)
        return seen

    def prediction(self, pid: str, **extra: Any) -> dict[str, Any]:
        return {"id": pid, "status": "starting", "input": PAYLOAD,
                "urls": {"get": f"{self.base}/v1/predictions/{pid}",
                         "cancel": f"{self.base}/v1/predictions/{pid}/cancel"}} | extra

    async def create(self, request: web.Request) -> web.Response:
        sent = json.loads((await self.record(request)).body)
        return web.json_response(self.prediction("p-versioned", input=sent["input"]),
                                 status=201)

    async def create_official(self, request: web.Request) -> web.Response:
        sent = json.loads((await self.record(request)).body)
        return web.json_response(self.prediction("p-official", version="hidden",
                                                 input=sent["input"]), status=201)

    async def listing(self, request: web.Request) -> web.Response:
        await self.record(request)
        if self.list_raw is not None:
            return web.Response(body=self.list_raw, status=self.list_status,
                                content_type="application/json")
        cursor = request.query.get("cursor", "")
        status = (self.failing[cursor].pop(0) if self.failing.get(cursor)
                  else 500 if cursor in self.down else self.list_status)
        if status != 200:
            return web.json_response({"detail": f"boom for token {TOKEN}"}, status=status)
        return web.json_response(self.pages[cursor])

    async def read(self, request: web.Request) -> web.Response:
        await self.record(request)
        pid = request.match_info["id"]
        if pid == "throttled-header":
            return web.json_response({"detail": "Request was throttled."}, status=429,
                                     headers={"Retry-After": "7"})
        if pid == "throttled-body":
            return web.json_response(
                {"detail": "Request was throttled. Your rate limit resets in ~30s."},
                status=429)
        if pid == "throttled-old":
            return web.json_response(
                {"detail": "Request was throttled. Expected available in 1 second."},
                status=429)
        if pid == "echo":
            # as written, and with JSON's escaped slashes inside the JSON text
            escaped = TOKEN.replace("/", "\\/")
            raw = '{"detail": "token ' + TOKEN + " / " + escaped + '"}'
            return web.Response(body=raw.encode(), status=401, content_type="application/json")
        if pid == "missing":
            return web.json_response({"detail": "Not found."}, status=404)
        return web.json_response(self.prediction(
            pid, status="succeeded", logs=f"used {TOKEN}",
            output=["https://replicate.delivery/a/out.mp4",
                    "https://other.example/signed.mp4?X-Amz-Signature=abc"]))


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    state = Api()
    app = web.Application()
    app.router.add_post("/v1/predictions", state.create)
    app.router.add_get("/v1/predictions", state.listing)
    app.router.add_post("/v1/models/{owner}/{name}/predictions", state.create_official)
    app.router.add_get("/v1/predictions/{id}", state.read)
    runner, state.base = await serve(app)
    try:
        yield state
    finally:
        await runner.cleanup()


@pytest.fixture
async def elsewhere() -> AsyncIterator[Api]:
    """Another origin (another port), which must never hear from the client."""
    state = Api()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", state.listing)
    runner, state.base = await serve(app)
    try:
        yield state
    finally:
        await runner.cleanup()


def no_token(answer: HttpAnswer) -> None:
    for form in (TOKEN.encode(), json.dumps(TOKEN).encode(), TOKEN.replace("/", "\\/").encode(),
                 TOKEN.encode("utf-16-le")):
        assert form not in answer.body, answer.body


# --- creates ------------------------------------------------------------------------------

async def test_a_versioned_create_sends_the_version_and_the_input_unchanged(api: Api) -> None:
    async with ReplicateClient(api.base, TOKEN) as client:
        answer = await client.create_video(PAYLOAD, "intent-key-1", f"acme/video:{VERSION}")
    assert answer.status == 201 and RULES.created_job_id(json.loads(answer.body)) == "p-versioned"
    [seen] = api.seen
    assert (seen.method, seen.path) == ("POST", "/v1/predictions")
    assert json.loads(seen.body) == {"version": VERSION, "input": PAYLOAD}
    assert seen.headers["Authorization"] == f"Bearer {TOKEN}"
    assert seen.headers["Content-Type"] == "application/json"
    assert not any(h.lower() == "idempotency-key" for h in seen.headers)
    assert "intent-key-1" not in seen.body.decode() + json.dumps(seen.headers)
    # the create answer keeps its links (its id and URLs are read as sent)
    assert f"{api.base}/v1/predictions/p-versioned" in answer.body.decode()


async def test_an_official_models_create_goes_to_its_models_path(api: Api) -> None:
    async with ReplicateClient(api.base, TOKEN) as client:
        answer = await client.create_video(PAYLOAD, "intent-key-2", "acme/video-1.5")
    assert answer.status == 201 and RULES.created_job_id(json.loads(answer.body)) == "p-official"
    [seen] = api.seen
    assert (seen.method, seen.path) == ("POST", "/v1/models/acme/video-1.5/predictions")
    assert json.loads(seen.body) == {"input": PAYLOAD}
    assert not any(h.lower() == "idempotency-key" for h in seen.headers)


async def test_the_webhook_goes_with_a_create_only_when_the_account_names_one(api: Api) -> None:
    hook = "https://hooks.example/webhooks/replicate"
    provider = registry.load("replicate")
    client = provider.client(api.base, TOKEN, timeout_s=5.0, max_connections=4,
                             options=ProviderOptions(webhook_url=hook))
    async with client:
        await client.create_video(PAYLOAD, "k", f"acme/video:{VERSION}")
        await client.create_video(PAYLOAD, "k", "acme/video")
    async with provider.client(api.base, TOKEN, timeout_s=5.0, max_connections=4) as plain:
        await plain.create_video(PAYLOAD, "k", "acme/video")
    hooked = [json.loads(s.body) for s in api.seen]
    for body in hooked[:2]:
        assert body["webhook"] == hook and body["webhook_events_filter"] == ["completed"]
        assert body["input"] == PAYLOAD
    assert hooked[2] == {"input": PAYLOAD}


@pytest.mark.parametrize("model", [None, "not-a-model", "Acme/Video", "acme/video:v-1"])
async def test_a_model_replicate_cannot_take_is_refused_without_sending(
        api: Api, model: str | None) -> None:
    async with ReplicateClient(api.base, TOKEN) as client:
        answer = await client.create_video(PAYLOAD, "k", model)
    assert api.seen == []
    assert answer.status == 422 and answer.transport_error is None
    code, message = RULES.error_code(json.loads(answer.body))
    assert code == "Invalid model" and message is not None and message.startswith("not sent: ")


# --- reads --------------------------------------------------------------------------------

async def test_a_429s_wait_comes_from_its_header_else_from_its_detail(api: Api) -> None:
    async with ReplicateClient(api.base, TOKEN) as client:
        header = await client.read_status("throttled-header")
        body = await client.read_status("throttled-body")
        old = await client.read_status("throttled-old")
        found = await client.read_status("missing")
    assert (header.status, header.retry_after) == (429, "7")
    assert (body.status, body.retry_after) == (429, "30")
    assert (old.status, old.retry_after) == (429, "1")
    assert found.status == 404 and found.retry_after is None
    assert RULES.error_code(json.loads(found.body)) == ("detail", "Not found.")


async def test_a_status_read_drops_links_query_strings_and_a_result_read_keeps_them(
        api: Api) -> None:
    async with ReplicateClient(api.base, TOKEN) as client:
        status = await client.read_status("p-1")
        result = await client.read_result("p-1")
    assert [s.path for s in api.seen] == ["/v1/predictions/p-1"] * 2
    assert RULES.read_status(json.loads(status.body)).outcome == "succeeded"  # type: ignore[union-attr]
    assert RULES.media_urls(json.loads(status.body)) == [
        "https://replicate.delivery/a/out.mp4", "https://other.example/signed.mp4"]
    assert "https://other.example/signed.mp4?X-Amz-Signature=abc" in RULES.media_urls(
        json.loads(result.body))
    for answer in (status, result):
        no_token(answer)
        assert "used <redacted>" in answer.body.decode()


@pytest.mark.parametrize("suffix", ["", "/", "/v1", "/v1/"])
async def test_the_base_url_may_name_v1_or_not(api: Api, suffix: str) -> None:
    async with ReplicateClient(api.base + suffix, TOKEN) as client:
        answer = await client.read_status("p-2")
        assert client.shown_status_url("p-2") == f"{api.base}/v1/predictions/p-2"
        assert client.shown_create_url() == f"{api.base}/v1/predictions"
    assert answer.status == 200 and [s.path for s in api.seen] == ["/v1/predictions/p-2"]


async def test_the_token_never_comes_back_in_a_body_nor_a_repr(api: Api) -> None:
    api.pages[""] = {"next": None, "results": [api.prediction("p-3", logs=TOKEN)]}
    async with ReplicateClient(api.base, TOKEN) as client:
        assert TOKEN not in repr(client) and "<redacted>" in repr(client)
        answers = [await client.read_status("echo"), await client.read_status("p-4"),
                   await client.read_result("p-4"),
                   await client.create_video({"prompt": TOKEN}, "k", "acme/video")]
        lookup = await find_created(client, PAYLOAD, "acme/video", SINCE, UNTIL)
        api.list_status = 500
        failed = await find_created(client, PAYLOAD, "acme/video", SINCE, UNTIL)
    assert answers[0].status == 401 and b"<redacted>" in answers[0].body
    for answer in answers:
        no_token(answer)
    assert lookup.complete and failed.failure is not None
    no_token(failed.failure)
    assert TOKEN not in failed.detail


def test_file_downloads_carry_the_token_to_replicates_file_host_only() -> None:
    client = ReplicateClient("https://api.replicate.com/v1", TOKEN)
    assert client.media_headers() == {"Authorization": f"Bearer {TOKEN}"}
    assert client.media_auth_hosts() == frozenset({"replicate.delivery"})
    assert ReplicateClient("https://api.replicate.com", "bad\ntoken").media_headers() == {}


# --- looking up an unanswered create ------------------------------------------------------

def listed(api: Api, pid: str, **over: Any) -> dict[str, Any]:
    entry = {"id": pid, "model": "acme/video", "version": VERSION, "source": "api",
             "status": "succeeded", "data_removed": False, "input": dict(PAYLOAD),
             "created_at": "2025-03-01T12:10:00.000000Z",
             "urls": {"get": f"{api.base}/v1/predictions/{pid}"}}
    entry.update(over)
    return entry


async def test_a_look_up_follows_next_pages_on_the_same_origin(api: Api) -> None:
    api.pages[""] = {"previous": None, "next": f"{api.base}/v1/predictions?cursor=c2",
                     "results": [listed(api, "p-same-1"),
                                 listed(api, "p-web", source="web"),
                                 listed(api, "p-other", input={**PAYLOAD, "seed": 7})]}
    api.pages["c2"] = {"previous": f"{api.base}/v1/predictions?cursor=c1",
                       "next": "/v1/predictions?cursor=c3",  # a relative one: same origin
                       "results": [listed(api, "p-removed", data_removed=True, input={}),
                                   listed(api, "p-same-1")]}  # listed again as pages shift
    api.pages["c3"] = {"next": None, "results": [listed(api, "p-same-2"),
                                                 listed(api, "p-v2", version="0" * 64)]}
    async with ReplicateClient(api.base, TOKEN) as client:
        lookup = await find_created(client, PAYLOAD, f"acme/video:{VERSION}", SINCE, UNTIL)
    assert lookup.complete and lookup.failure is None and lookup.calls == 3
    assert lookup.matches == ("p-same-1", "p-same-2")
    assert lookup.unsure == ("p-removed",)
    first, second, third = api.seen
    assert first.path == "/v1/predictions" and first.query == {
        "created_after": "2025-03-01T12:00:00Z", "created_before": "2025-03-01T12:30:01Z"}
    assert second.query == {"cursor": "c2"} and third.query == {"cursor": "c3"}
    assert all(s.headers["Authorization"] == f"Bearer {TOKEN}" for s in api.seen)


def three_pages(api: Api) -> None:
    api.pages[""] = {"next": f"{api.base}/v1/predictions?cursor=c2",
                     "results": [listed(api, "p-1", input={"prompt": "other"})]}
    api.pages["c2"] = {"next": f"{api.base}/v1/predictions?cursor=c3",
                       "results": [listed(api, "p-2")]}
    api.pages["c3"] = {"next": None,
                       "results": [listed(api, "p-3", input={**PAYLOAD, "seed": 99})]}


async def test_a_page_that_fails_now_and_then_is_tried_again_in_place(api: Api) -> None:
    three_pages(api)
    api.failing = {"c2": [500, 429, 503], "c3": [502]}
    async with ReplicateClient(api.base, TOKEN) as client:
        lookup = await find_created(client, PAYLOAD, "acme/video", SINCE, UNTIL)
    assert lookup.complete and lookup.matches == ("p-2",) and lookup.calls == 3 + 4
    # never page one again: each failed page was read again where it failed
    assert [s.query.get("cursor", "") for s in api.seen] == ["", *["c2"] * 4, "c3", "c3"]


async def test_a_walk_that_stopped_resumes_from_the_page_that_failed(api: Api) -> None:
    three_pages(api)
    api.down = {"c3"}
    lookups = Lookups(__import__("random").Random(0), sleep=_no_wait)
    wanted = Wanted("k", PAYLOAD, "acme/video", SINCE, UNTIL, UNTIL)
    async with ReplicateClient(api.base, TOKEN) as client:
        first = await lookups.find("acct", client, RULES, wanted)
        assert not first.complete and first.matches == ("p-2",)
        api.down = set()
        api.seen.clear()
        second = await lookups.find("acct", client, RULES, wanted)
    assert second.complete and second.matches == ("p-2",) and lookups.resumed == 1
    assert [s.query.get("cursor", "") for s in api.seen] == ["c3"]


async def test_lookups_that_arrive_together_share_one_walk(api: Api) -> None:
    three_pages(api)
    lookups = Lookups(__import__("random").Random(0), sleep=_no_wait)
    others = [{**PAYLOAD, "seed": n} for n in range(20)]
    async with ReplicateClient(api.base, TOKEN) as client:
        found = await asyncio.gather(*(
            lookups.find("acct", client, RULES,
                         Wanted(f"k{n}", payload, "acme/video", SINCE, UNTIL, UNTIL))
            for n, payload in enumerate([PAYLOAD, *others])))
    assert len(api.seen) == 3 and lookups.walks == 1  # one walk of three pages for 21
    assert found[0].matches == ("p-2",) and all(not f.matches for f in found[1:])
    assert all(f.complete for f in found)


async def test_a_next_page_on_another_origin_is_not_followed(api: Api, elsewhere: Api) -> None:
    api.pages[""] = {"next": f"{elsewhere.base}/v1/predictions?cursor=c2",
                     "results": [listed(api, "p-same")]}
    async with ReplicateClient(api.base, TOKEN) as client:
        lookup = await find_created(client, PAYLOAD, "acme/video", SINCE, UNTIL)
    assert not lookup.complete and lookup.calls == 1
    assert "another origin" in lookup.detail and "cursor" not in lookup.detail
    assert elsewhere.seen == []  # the token went nowhere else
    assert lookup.matches == ("p-same",)  # what was read, though nothing is proven


@pytest.mark.parametrize("following", ["https://127.0.0.1:{port}/v1/predictions?cursor=x",
                                       "http://localhost:{port}/v1/predictions?cursor=x",
                                       "http://user:pw@127.0.0.1:{port}/v1/predictions",
                                       "//127.0.0.1:{free}/v1/predictions"])
async def test_a_next_page_on_another_scheme_host_or_port_or_with_credentials_is_refused(
        api: Api, following: str) -> None:
    port = api.base.rsplit(":", 1)[1]
    api.pages[""] = {"next": following.format(port=port, free=free_port()), "results": []}
    async with ReplicateClient(api.base, TOKEN) as client:
        lookup = await find_created(client, PAYLOAD, "acme/video", SINCE, UNTIL)
    assert not lookup.complete and lookup.calls == 1 and len(api.seen) == 1
    assert "another origin" in lookup.detail


async def test_a_look_up_reads_at_most_max_list_pages(api: Api, monkeypatch: Any) -> None:
    monkeypatch.setattr(reconcile, "MAX_PAGES", 3)
    for n in range(5):
        api.pages["" if n == 0 else f"c{n}"] = {
            "next": f"{api.base}/v1/predictions?cursor=c{n + 1}", "results": []}
    async with ReplicateClient(api.base, TOKEN) as client:
        lookup = await find_created(client, PAYLOAD, "acme/video", SINCE, UNTIL)
    assert not lookup.complete and lookup.calls == 3 and len(api.seen) == 3
    assert "more than 3 pages" in lookup.detail


async def test_a_next_page_that_repeats_one_already_read_stops(api: Api) -> None:
    api.pages[""] = {"next": f"{api.base}/v1/predictions?cursor=c1", "results": []}
    api.pages["c1"] = {"next": f"{api.base}/v1/predictions?cursor=c1", "results": []}
    async with ReplicateClient(api.base, TOKEN) as client:
        lookup = await find_created(client, PAYLOAD, "acme/video", SINCE, UNTIL)
    assert not lookup.complete and lookup.calls == 2 and "already read" in lookup.detail


@pytest.mark.parametrize(("status", "raw", "said"), [
    (500, None, "HTTP 500"),
    (429, None, "HTTP 429"),
    (200, b"[]", "not {\"results\": [...]}"),
    (200, b'{"results": {"id": "x"}}', "not {\"results\": [...]}"),
    (200, b"<html>proxy</html>", "not {\"results\": [...]}"),
])
async def test_a_failed_list_call_leaves_the_look_up_incomplete_with_its_answer(
        api: Api, status: int, raw: bytes | None, said: str) -> None:
    api.list_status, api.list_raw = status, raw
    async with ReplicateClient(api.base, TOKEN) as client:
        lookup = await find_created(client, PAYLOAD, "acme/video", SINCE, UNTIL)
    # the core tried the page again in place: a 429 after its wait, any other a few times
    tries = reconcile.MAX_THROTTLED_TRIES + 1 if status == 429 else reconcile.PAGE_TRIES
    assert not lookup.complete and lookup.calls == tries and said in lookup.detail
    assert lookup.failure is not None and lookup.failure.status == status


async def test_an_unreachable_list_is_an_incomplete_look_up_not_an_exception() -> None:
    async with ReplicateClient(f"http://127.0.0.1:{free_port()}", TOKEN,
                               timeout_s=2.0) as client:
        lookup = await find_created(client, PAYLOAD, "acme/video", SINCE, UNTIL)
    assert not lookup.complete and lookup.failure is not None
    assert lookup.failure.transport_error is ErrorClass.CONNECTION
    assert lookup.calls == reconcile.PAGE_TRIES  # tried again in place, quickly


async def test_a_token_no_header_can_carry_is_never_sent(api: Api) -> None:
    async with ReplicateClient(api.base, "r8_bad\ntoken") as client:
        lookup = await find_created(client, PAYLOAD, "acme/video", SINCE, UNTIL)
        create = await client.create_video(PAYLOAD, "k", "acme/video")
    assert api.seen == [] and lookup.calls == 0 and not lookup.complete
    # a 401 in Replicate's shape: the account pauses, the intent stays queued (never an
    # unknown create: nothing was sent)
    assert create.status == 401 and b"not sent: the API token" in create.body
