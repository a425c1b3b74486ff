"""fal's client against the fake fal (vidpoll.providers.fal.fake) and a few small servers on
loopback (real HTTP): what a create sends and what its answer keeps, reads that go to the
create answer's own URLs and never take the key to another origin, the request history paged
through for reconciliation (`list_created`, and the core's walk over it), and that no answer,
detail or repr hands back the key."""

from __future__ import annotations

import asyncio
import base64
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp import web

from vidpoll.models import ErrorClass, HttpAnswer
from vidpoll.providers import registry
from vidpoll.providers.base import CreateLookup, ProviderOptions
from vidpoll.providers.fal import client as fal_client
from vidpoll.providers.fal.client import NO_HANDLE_APP, FalClient
from vidpoll.providers.fal.fake import DEFAULT_ENDPOINT, DEFAULT_KEY, FakeFal, FalFakeConfig
from vidpoll.providers.fal.rules import RULES
from vidpoll.reconcile import Lookups, Wanted

ENDPOINT = DEFAULT_ENDPOINT
APP = "fal-ai/kling-video"
PAYLOAD = {"prompt": "a heron at dawn", "duration": "5", "seed": 7, "loop": False,
           "nested": {"x": 1.5, "url": "https://cdn.example/i.png?sig=1"}}
WAIT_S = 15.0


@dataclass
class Seen:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]


@dataclass
class Served:
    fake: FakeFal
    url: str
    seen: list[Seen] = field(default_factory=list)

    def options(self, **extra: str) -> ProviderOptions:
        return ProviderOptions(extra={"platform_url": self.url, **extra})

    def client(self, key: str = DEFAULT_KEY, **kwargs: Any) -> FalClient:
        options = kwargs.pop("options", None) or self.options()
        return FalClient(self.url, key, timeout_s=kwargs.pop("timeout_s", 3.0),
                         options=options, **kwargs)


def quick(**overrides: Any) -> FalFakeConfig:
    base: dict[str, Any] = {"processing_s": 0.15, "seed": 5, "concurrency": 4}
    return FalFakeConfig(**{**base, **overrides})


async def serve(fake: FakeFal) -> tuple[web.AppRunner, Served]:
    """The fake's app with a middleware that notes each request (path, query, headers)."""
    served = Served(fake, "")

    @web.middleware
    async def note(request: web.Request,
                   handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                   ) -> web.StreamResponse:
        served.seen.append(Seen(request.method, request.path, dict(request.query),
                                dict(request.headers)))
        return await handler(request)

    app = fake.app()
    app.middlewares.append(note)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=True,
                           shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    served.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    return runner, served


@pytest.fixture
async def fal() -> AsyncIterator[Served]:
    runner, served = await serve(FakeFal(quick()))
    try:
        yield served
    finally:
        await runner.cleanup()


async def eventually(check: Callable[[], Awaitable[Any]], timeout_s: float = WAIT_S) -> Any:
    async def loop() -> Any:
        while True:
            value = await check()
            if value:
                return value
            await asyncio.sleep(0.02)
    return await asyncio.wait_for(loop(), timeout_s)


def no_key(text: bytes | str, key: str = DEFAULT_KEY) -> None:
    raw = text.encode() if isinstance(text, str) else text
    for form in (key.encode(), json.dumps(key).encode(), key.replace("/", "\\/").encode(),
                 key.encode("utf-16-le"), base64.b64encode(key.encode())):
        assert form not in raw, raw[:300]


async def _no_wait(_: float) -> None:
    return None


async def find(client: FalClient, payload: dict[str, Any], since: datetime, until: datetime,
               sent_by: datetime | None = None, model: str = ENDPOINT) -> CreateLookup:
    """One look-up through the core's walk of the pages, its waits skipped."""
    lookups = Lookups(random.Random(0), sleep=_no_wait)
    return await lookups.find("acct", client, RULES,
                              Wanted("k", payload, model, since, until, sent_by or since))


# --- creates and reads ------------------------------------------------------------------------

async def test_a_create_keeps_its_urls_and_every_read_goes_to_them(fal: Served) -> None:
    async with fal.client() as client:
        created = await client.create_video(PAYLOAD, "intent-key-1", ENDPOINT)
        assert created.status == 200 and created.transport_error is None
        body = json.loads(created.body)
        job_id = RULES.created_job_id(body)
        handle = RULES.created_handle(body)
        assert job_id is not None and handle is not None
        # the URLs name owner/app only, never the endpoint's subpath
        assert handle == {"status_url": f"{fal.url}/{APP}/requests/{job_id}/status",
                          "response_url": f"{fal.url}/{APP}/requests/{job_id}",
                          "cancel_url": f"{fal.url}/{APP}/requests/{job_id}/cancel"}
        early = await client.read_result(job_id, handle)

        async def done() -> HttpAnswer | None:
            answer = await client.read_status(job_id, handle)
            return answer if answer.status == 200 else None

        status = await eventually(done)
        result = await client.read_result(job_id, handle)
    create = fal.seen[0]
    assert (create.method, create.path, create.query) == ("POST", f"/{ENDPOINT}", {})
    assert create.headers["Authorization"] == f"Key {DEFAULT_KEY}"
    assert create.headers["Content-Type"] == "application/json"
    assert not any(h.lower() in ("idempotency-key", "x-fal-store-io") for h in create.headers)
    assert "intent-key-1" not in json.dumps(create.headers)
    assert fal.fake.requests[job_id].input == PAYLOAD and fal.fake.requests[job_id].store_io
    assert {(s.method, s.path) for s in fal.seen[1:]} == {
        ("GET", f"/{APP}/requests/{job_id}/status"), ("GET", f"/{APP}/requests/{job_id}")}
    assert all(s.headers["Authorization"] == f"Key {DEFAULT_KEY}" for s in fal.seen)
    assert early.status == 400 and RULES.result_not_ready(early, "detail")
    assert RULES.read_status(json.loads(status.body)).outcome == "succeeded"  # type: ignore[union-attr]
    assert result.status == 200
    assert RULES.media_urls(json.loads(result.body)) == [
        f"{fal.url}/files/{job_id}/output.mp4"]
    assert fal.fake.stats()["unauthorized"] == 0


async def test_a_queued_request_says_its_place_and_202_is_a_read(fal: Served) -> None:
    fal.fake.config.concurrency = 1
    fal.fake.config.processing_s = 30.0
    async with fal.client() as client:
        handles = []
        for i in range(3):
            body = json.loads((await client.create_video({"prompt": f"p{i}"}, "k",
                                                         ENDPOINT)).body)
            handles.append((body["request_id"], RULES.created_handle(body)))
        running = await client.read_status(*handles[0])
        last = await client.read_status(*handles[2])
    assert running.status == 202 and json.loads(running.body)["status"] == "IN_PROGRESS"
    assert last.status == 202
    queued = json.loads(last.body)
    assert queued["status"] == "IN_QUEUE" and queued["queue_position"] == 1
    assert RULES.read_status(queued).word == "in_queue"  # type: ignore[union-attr]


async def test_the_webhook_goes_with_a_create_only_when_the_account_names_one(
        fal: Served) -> None:
    hook = "https://hooks.example/webhooks/fal?account=a&x=1"
    provider = registry.load("fal")
    hooked = provider.client(fal.url, DEFAULT_KEY, timeout_s=3.0, max_connections=2,
                             options=ProviderOptions(webhook_url=hook,
                                                     extra={"platform_url": fal.url}))
    async with hooked, fal.client() as plain:
        one = json.loads((await hooked.create_video(PAYLOAD, "k", ENDPOINT)).body)
        two = json.loads((await plain.create_video(PAYLOAD, "k", ENDPOINT)).body)
    assert fal.fake.requests[one["request_id"]].webhook == hook
    assert fal.fake.requests[two["request_id"]].webhook is None
    assert fal.seen[0].query == {"fal_webhook": hook} and fal.seen[1].query == {}


@pytest.mark.parametrize("model", [None, "fal-ai", "fal-ai/../x", "fal-ai/x?y", "/fal-ai/x"])
async def test_a_model_fal_cannot_take_is_refused_without_sending(fal: Served,
                                                                   model: str | None) -> None:
    async with fal.client() as client:
        answer = await client.create_video(PAYLOAD, "k", model)
    assert fal.seen == []
    assert answer.status == 422 and answer.transport_error is None
    code, message = RULES.error_code(json.loads(answer.body))
    assert code == "invalid_model" and message is not None and message.startswith("not sent: ")


async def test_fals_own_refusals_are_its_envelope(fal: Served) -> None:
    async with fal.client(key="wrong-id:wrong-secret") as wrong, fal.client() as client:
        refused = await wrong.create_video(PAYLOAD, "k", ENDPOINT)
        missing = await client.read_status("no-such-request")  # no handle: a probe's read
    assert refused.status == 401
    assert RULES.error_code(json.loads(refused.body)) == (
        "detail", "No user found for Key ID and Secret")
    assert missing.status == 404
    assert RULES.error_code(json.loads(missing.body)) == ("detail", "Request not found")
    assert fal.seen[-1].path == f"/{NO_HANDLE_APP}/requests/no-such-request/status"


async def test_a_throttled_create_carries_its_retry_after(fal: Served) -> None:
    fal.fake.script_creates(["429"])
    async with fal.client() as client:
        answer = await client.create_video(PAYLOAD, "k", ENDPOINT)
    assert (answer.status, answer.retry_after) == (429, "1")
    assert RULES.error_code(json.loads(answer.body)) == ("rate_limited", "Rate limit exceeded")
    assert fal.fake.stats()["creates"] == 0


# --- the key goes to fal's origins only -------------------------------------------------------

class Elsewhere:
    """Another loopback origin that notes every request (it should see none)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, str]] = []

    async def any(self, request: web.Request) -> web.Response:
        self.seen.append(dict(request.headers))
        return web.json_response({"status": "COMPLETED"})


@pytest.fixture
async def elsewhere() -> AsyncIterator[tuple[Elsewhere, str]]:
    other = Elsewhere()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", other.any)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield other, f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def test_a_handle_url_on_another_origin_is_never_sent_the_key(
        fal: Served, elsewhere: tuple[Elsewhere, str]) -> None:
    other, other_url = elsewhere
    port = int(fal.url.rsplit(":", 1)[1])
    rid = "r-1"
    bad = {
        "another port": f"{other_url}/{APP}/requests/{rid}/status",
        "another host": f"http://localhost:{port}/{APP}/requests/{rid}/status",
        "another scheme": f"https://127.0.0.1:{port}/{APP}/requests/{rid}/status",
        "credentials": f"http://user:pw@127.0.0.1:{port}/{APP}/requests/{rid}/status",
        "relative": f"/{APP}/requests/{rid}/status",
        "not http": f"ftp://127.0.0.1:{port}/{APP}/requests/{rid}/status",
    }
    async with fal.client() as client:
        for what, url in bad.items():
            for read in (client.read_status, client.read_result):
                name = "status_url" if read == client.read_status else "response_url"
                answer = await read(rid, {name: url})
                assert answer.status is None, what
                assert answer.transport_error is ErrorClass.CLIENT_ERROR, what
                assert answer.detail.startswith("not sent: "), (what, answer.detail)
                no_key(answer.detail)
                assert "pw" not in answer.detail
        for handle in ({}, {"status_url": None}, {"status_url": 3}, {"status_url": ""}):
            answer = await client.read_status(rid, handle)
            assert answer.status is None and "no status_url" in answer.detail
    assert other.seen == [] and fal.seen == []


async def test_an_adopted_jobs_urls_are_fals_documented_ones(fal: Served) -> None:
    async with fal.client() as client:
        body = json.loads((await client.create_video(PAYLOAD, "k", ENDPOINT)).body)
        built = client.handle_for(ENDPOINT, body["request_id"])
        assert built == RULES.created_handle(body)
        assert client.handle_for("fal-ai", "x") is None and client.handle_for(None, "x") is None
        answer = await client.read_status(body["request_id"], built)
    assert answer.status in (200, 202)


def test_file_downloads_carry_no_key_and_repr_shows_none() -> None:
    client = FalClient("https://queue.fal.run", DEFAULT_KEY)
    assert client.media_headers() == {} and client.media_auth_hosts() == frozenset()
    assert DEFAULT_KEY not in repr(client) and "<redacted>" in repr(client)
    assert client.shown_create_url() == "https://queue.fal.run/{endpoint_id}"
    assert client.shown_status_url("r 1") == (
        f"https://queue.fal.run/{NO_HANDLE_APP}/requests/r%201/status")


class Echo:
    """fal's shapes, each echoing the Authorization header it got (a misbehaving proxy)."""

    def __init__(self) -> None:
        self.base = ""

    def _key(self, request: web.Request) -> str:
        return request.headers.get("Authorization", "").removeprefix("Key ")

    async def create(self, request: web.Request) -> web.Response:
        key = self._key(request)
        return web.json_response({"request_id": "r-echo", "note": key,
                                  "status_url": f"{self.base}/o/a/requests/r-echo/status"
                                                f"?k={key}"})

    async def status(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "IN_QUEUE", "queue_position": 0,
                                  "logs": [{"message": f"auth {self._key(request)}"}],
                                  "response_url": f"{self.base}/o/a/requests/r?sig=1"})

    async def result(self, request: web.Request) -> web.Response:
        return web.json_response({"detail": f"bad key {self._key(request)}",
                                  "error_type": "bad"}, status=400)

    async def history(self, request: web.Request) -> web.Response:
        key = self._key(request)
        return web.json_response({"items": [{"request_id": "r-echo", "endpoint_id": ENDPOINT,
                                             "sent_at": "2026-01-01T00:00:00Z",
                                             "started_at": "2026-01-01T00:00:01Z",
                                             "json_input": {"prompt": key}}],
                                  "next_cursor": None, "has_more": False})


async def test_the_key_never_comes_back_in_a_body_a_detail_or_a_page() -> None:
    echo = Echo()
    app = web.Application()
    app.router.add_get("/v1/models/requests/by-endpoint", echo.history)
    app.router.add_get("/o/a/requests/{rid}/status", echo.status)
    app.router.add_get("/o/a/requests/{rid}", echo.result)
    app.router.add_post("/{endpoint:.+}", echo.create)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    echo.base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    key = "kid-0042:s3cr/et+key=="
    handle = {"status_url": f"{echo.base}/o/a/requests/r/status",
              "response_url": f"{echo.base}/o/a/requests/r"}
    try:
        async with FalClient(echo.base, key, options=ProviderOptions(
                extra={"platform_url": echo.base})) as client:
            answers = [await client.create_video({"prompt": "x"}, "k", "o/a/b"),
                       await client.read_status("r", handle),
                       await client.read_result("r", handle)]
            now = datetime.now(UTC)
            page = await client.list_created(ENDPOINT, now - timedelta(hours=1), now, None)
    finally:
        await runner.cleanup()
    for answer in answers:
        assert b"<redacted>" in answer.body
        no_key(answer.body, key)
    assert b"?sig=1" not in answers[1].body  # a status body's links lose their query
    [entry] = page.entries
    no_key(json.dumps(entry.entry), key)
    assert key not in repr(page)


# --- the request history ----------------------------------------------------------------------

async def created(client: FalClient, payloads: list[dict[str, Any]],
                  model: str = ENDPOINT) -> list[str]:
    ids = []
    for payload in payloads:
        answer = await client.create_video(payload, "k", model)
        assert answer.status == 200
        ids.append(json.loads(answer.body)["request_id"])
    return ids


async def test_list_created_pages_with_the_cursor_and_expands_payloads(
        fal: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fal_client, "PAGE_LIMIT", 2)
    fal.fake.config.concurrency = 10
    async with fal.client() as client:
        since = datetime.now(UTC) - timedelta(seconds=5)
        ids = await created(client, [{"prompt": f"p{i}"} for i in range(5)])
        await created(client, [{"prompt": "elsewhere"}], "fal-ai/flux/dev")
        until = datetime.now(UTC) + timedelta(seconds=5)
        pages, cursor = [], None
        while True:
            page = await client.list_created(ENDPOINT, since, until, cursor)
            assert page.failure is None and not page.detail and page.calls == 1
            pages.append(page)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
    lists = [s for s in fal.seen if s.path == "/v1/models/requests/by-endpoint"]
    assert len(pages) == len(lists) == 3
    first = lists[0].query
    assert first == {"endpoint_id": ENDPOINT, "start": fal_client.iso_utc(since),
                     "end": fal_client.iso_utc(until, round_up=True), "limit": "2",
                     "expand": "payloads"}
    assert [s.query.get("cursor") for s in lists] == [None, "Mg==", "Mw=="]
    assert all(s.headers["Authorization"] == f"Key {DEFAULT_KEY}" for s in lists)
    entries = [e for p in pages for e in p.entries]
    assert sorted(e.job_id for e in entries if e.job_id) == sorted(ids)
    for e in entries:
        assert e.entry["json_input"] == fal.fake.requests[str(e.job_id)].input
        assert e.created_at is not None and since <= e.created_at <= until
        assert e.handle == client.handle_for(ENDPOINT, str(e.job_id))
    # every request started: each page proves the records through its newest sent_at
    newest = max(e.created_at for e in entries if e.created_at is not None)
    assert max(p.listed_through for p in pages if p.listed_through) == newest


async def test_listed_through_is_the_newest_started_request(fal: Served) -> None:
    fal.fake.config.concurrency = 1
    fal.fake.config.processing_s = 30.0
    async with fal.client() as client:
        since = datetime.now(UTC) - timedelta(seconds=5)
        until = since + timedelta(minutes=1)
        empty = await client.list_created(ENDPOINT, since, until, None)
        ids = await created(client, [{"prompt": f"p{i}"} for i in range(3)])
        page = await client.list_created(ENDPOINT, since, until, None)
    assert empty.entries == () and empty.next_cursor is None
    # no started request listed: nothing is proven (never None: that would say "every create
    # is listed at once")
    assert empty.listed_through == datetime.min.replace(tzinfo=UTC)
    # only the running one is listed (the fake, like fal as far as it is known, lists a
    # request once it has started), and it proves the records through its sent_at only
    [only] = page.entries
    assert only.job_id == ids[0]
    assert page.listed_through == only.created_at
    queued_sent = datetime.fromtimestamp(fal.fake.requests[ids[1]].created, UTC)
    assert page.listed_through is not None and page.listed_through < queued_sent


async def test_a_look_up_adopts_with_handles_and_proves_absence_only_through_started(
        fal: Served) -> None:
    fal.fake.config.concurrency = 1
    fal.fake.config.processing_s = 30.0
    async with fal.client() as client:
        since = datetime.now(UTC) - timedelta(seconds=5)
        ids = await created(client, [PAYLOAD, {"prompt": "queued behind"}])
        until = datetime.now(UTC) + timedelta(seconds=5)
        found = await find(client, PAYLOAD, since, until)
        # nothing of this input was sent; the only started request was sent before the
        # attempt's end (sent_by): not proven absent while a later create could be queued
        absent = await find(client, {"prompt": "never sent"}, since, until,
                            sent_by=datetime.now(UTC))
        earlier = await find(client, {"prompt": "never sent"}, since, until,
                             sent_by=since)
    assert found.complete and found.matches == (ids[0],) and found.unsure == ()
    assert found.handles[ids[0]] == client.handle_for(ENDPOINT, ids[0])
    assert absent.complete and absent.matches == () and not absent.proves_absence
    assert earlier.complete and earlier.matches == () and earlier.proves_absence


async def test_the_history_must_be_on_the_platform_url(fal: Served,
                                                       elsewhere: tuple[Elsewhere, str]) -> None:
    other, other_url = elsewhere
    async with FalClient(fal.url, DEFAULT_KEY,
                         options=ProviderOptions(extra={"platform_url": other_url})) as client:
        now = datetime.now(UTC)
        await client.list_created(ENDPOINT, now - timedelta(minutes=1), now, None)
    assert [s for s in fal.seen if s.path.startswith("/v1/")] == []
    assert len(other.seen) == 1 and other.seen[0]["Authorization"] == f"Key {DEFAULT_KEY}"
    # and without the option: fal's own platform API
    assert FalClient("https://queue.fal.run", DEFAULT_KEY)._platform == "https://api.fal.ai"


@pytest.mark.parametrize(("fault", "status"), [("5xx", None), ("429", 429),
                                               ("garbled", 200)])
async def test_a_failed_page_is_a_failure_the_core_tries_again(fal: Served, fault: str,
                                                               status: int | None) -> None:
    fal.fake.script_lists([fault])
    async with fal.client() as client:
        now = datetime.now(UTC)
        page = await client.list_created(ENDPOINT, now - timedelta(minutes=1), now, None)
        assert page.failure is not None and page.detail and not page.final
        if status is not None:
            assert page.failure.status == status
        else:
            assert page.failure.status in (500, 502, 503, 504)
        if fault == "429":
            assert page.failure.retry_after == "1"
        if fault == "garbled":
            assert "not {\"items\"" in page.detail
        no_key(page.detail)
        # the core's walk tries the page again in place and completes
        fal.fake.script_lists([fault, fault])
        lookup = await find(client, PAYLOAD, now - timedelta(minutes=1), now)
    assert lookup.complete and lookup.failure is None and lookup.calls == 3


class Pages:
    """A history that answers whatever page body a test gives it."""

    def __init__(self) -> None:
        self.bodies: list[Any] = []
        self.seen: list[dict[str, str]] = []

    async def history(self, request: web.Request) -> web.Response:
        self.seen.append(dict(request.query))
        return web.json_response(self.bodies.pop(0))


@pytest.fixture
async def pages() -> AsyncIterator[tuple[Pages, str]]:
    server = Pages()
    app = web.Application()
    app.router.add_get("/v1/models/requests/by-endpoint", server.history)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield server, f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def history_item(rid: Any, sent: str, started: str | None) -> dict[str, Any]:
    return {"request_id": rid, "endpoint_id": ENDPOINT, "sent_at": sent, "started_at": started,
            "json_input": {"prompt": "x"}}


@pytest.mark.parametrize(("body", "detail", "final"), [
    ({"items": [], "has_more": True, "next_cursor": None}, "no next_cursor", True),
    ({"items": [], "has_more": True, "next_cursor": "https://evil.example/page2"},
     "not a cursor", True),
    ({"items": [], "has_more": True, "next_cursor": "x" * 2000}, "not a cursor", True),
    ({"items": {}}, "not {\"items\"", False),
    ([], "not {\"items\"", False),
])
async def test_pages_that_cannot_be_followed(pages: tuple[Pages, str], body: Any, detail: str,
                                             final: bool) -> None:
    server, url = pages
    server.bodies.append(body)
    async with FalClient(url, DEFAULT_KEY,
                         options=ProviderOptions(extra={"platform_url": url})) as client:
        now = datetime.now(UTC)
        page = await client.list_created(ENDPOINT, now - timedelta(minutes=1), now, None)
    assert detail in page.detail and page.final is final and page.next_cursor is None


async def test_a_page_naming_itself_next_ends_the_walk_and_odd_items_are_kept(
        pages: tuple[Pages, str]) -> None:
    server, url = pages
    server.bodies.append({"items": [history_item("r-1", "2026-01-01T00:00:05Z",
                                                 "2026-01-01T00:00:06Z"),
                                    history_item("r-2", "2026-01-01T00:00:09Z", None),
                                    history_item(None, "garbage", "2026-01-01T00:00:10Z"),
                                    "not an item"],
                          "has_more": True, "next_cursor": "Mg=="})
    server.bodies.append({"items": [], "has_more": True, "next_cursor": "Mg=="})
    async with FalClient(url, DEFAULT_KEY,
                         options=ProviderOptions(extra={"platform_url": url})) as client:
        now = datetime.now(UTC)
        first = await client.list_created(ENDPOINT, now - timedelta(minutes=1), now, None)
        again = await client.list_created(ENDPOINT, now - timedelta(minutes=1), now, "Mg==")
    assert first.next_cursor == "Mg==" and not first.final
    assert [e.job_id for e in first.entries] == ["r-1", "r-2", None, None]
    assert first.entries[2].created_at is None and first.entries[3].handle is None
    # the started one with a time: r-1 (r-2 has not started; the third has no sent_at)
    assert first.listed_through == datetime(2026, 1, 1, 0, 0, 5, tzinfo=UTC)
    assert again.final and "just read" in again.detail
    assert server.seen[1]["cursor"] == "Mg=="


async def test_an_unreachable_history_is_a_failed_page_not_an_exception() -> None:
    async with FalClient("http://127.0.0.1:9", DEFAULT_KEY, timeout_s=1.0) as client:
        now = datetime.now(UTC)
        page = await client.list_created(ENDPOINT, now - timedelta(minutes=1), now, None)
        nothing = await client.list_created(None, now - timedelta(minutes=1), now, None)
    assert page.failure is not None and page.failure.status is None and page.detail
    assert nothing.final and nothing.calls == 0
    assert client.list_scope(ENDPOINT) == ENDPOINT and client.list_scope(None) == ""


async def test_a_key_no_header_can_carry_is_never_sent(fal: Served) -> None:
    async with fal.client(key="bad\nkey") as client:
        now = datetime.now(UTC)
        page = await client.list_created(ENDPOINT, now - timedelta(minutes=1), now, None)
        answer = await client.create_video(PAYLOAD, "k", ENDPOINT)
    assert page.final and page.calls == 0 and "not sent" in page.detail
    # a 401 in fal's shape: the account pauses and the intent stays queued (a transport error
    # would be an unknown create, looked up for nothing: nothing was sent)
    assert answer.status == 401 and b"not sent: the API key" in answer.body
    assert b"bad\nkey" not in answer.body and b"bad" not in answer.body
    assert fal.seen == []
