"""Veo's clients against the fakes over real HTTP on loopback: the Gemini API's (`VeoClient`:
the key in `x-goog-api-key`, a GET of the operation) and Vertex AI's (`VertexClient`: OAuth2
tokens minted from a service-account key file, a POST of `fetchPredictOperation`, inline
videos never handed back as bytes but read again on demand).

What is checked: each create's path and body (unchanged), each read's shape, a 429's wait
from its RetryInfo, odd or foreign operation names refused unsent, the key and the token only
ever to the API's origin and never in a body, a detail or a repr, a token minted once for many
calls, replaced after it expires (and after a 401), every credential failure a 401 naming the
file but never its contents, and the inline bytes: dropped from a status body of any size,
handed back whole by `inline_media`."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from yarl import URL

from vidpoll.download import inline_fetcher
from vidpoll.errors import DownloadRefused
from vidpoll.fetch_guard import AccountRules
from vidpoll.models import ClaimedIntent, HttpAnswer
from vidpoll.policy import AuthPause, PollPolicy, decide_submit
from vidpoll.providers import registry
from vidpoll.providers.base import Pending, ProviderOptions
from vidpoll.providers.veo.client import VeoClient
from vidpoll.providers.veo.fake import DEFAULT_API_KEY, DEFAULT_MODELS, FakeVeo, VeoFakeConfig
from vidpoll.providers.veo.fake import start_fake_veo as start_veo
from vidpoll.providers.veo.rules import RULES
from vidpoll.providers.vertex import client as vertex_client
from vidpoll.providers.vertex.client import VertexClient
from vidpoll.providers.vertex.fake import (
    DEFAULT_LOCATION,
    DEFAULT_PROJECT,
    FakeVertex,
    VertexFakeConfig,
    start_fake_vertex,
)

from ..conftest import free_port

MODEL = DEFAULT_MODELS[0]
BODY = {"instances": [{"prompt": "a heron at dawn", "image": None}],
        "parameters": {"aspectRatio": "16:9", "durationSeconds": 8, "sampleCount": 1,
                       "seed": 7, "enhancePrompt": False}}
WAIT_S = 20.0
VERTEX_OPTIONS = ProviderOptions(extra={"project": DEFAULT_PROJECT,
                                        "location": DEFAULT_LOCATION})


async def eventually(check: Callable[[], Awaitable[Any]], timeout_s: float = WAIT_S,
                     what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = await check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


@asynccontextmanager
async def gemini(**config: Any) -> AsyncIterator[tuple[FakeVeo, VeoClient]]:
    fake = FakeVeo(VeoFakeConfig(**{"processing_s": 0.2, "file_bytes": 4096, **config}))
    runner, url = await start_veo(fake)
    try:
        async with VeoClient(url, DEFAULT_API_KEY, timeout_s=3.0,
                             options=registry_options("veo")) as client:
            yield fake, client
    finally:
        await runner.cleanup()


def registry_options(provider: str) -> ProviderOptions:
    """The options an account of `provider` gets with every field left to its default."""
    own = registry.load(provider).account_options  # type: ignore[attr-defined]
    return ProviderOptions(extra={k: v.default for k, v in own.items() if v.default})


@asynccontextmanager
async def vertex_fake(**config: Any) -> AsyncIterator[FakeVertex]:
    fake = FakeVertex(VertexFakeConfig(**{"processing_s": 0.2, "file_bytes": 4096, **config}))
    runner, _ = await start_fake_vertex(fake)
    try:
        yield fake
    finally:
        await runner.cleanup()


@asynccontextmanager
async def vertex(tmp_path: Path, **config: Any
                 ) -> AsyncIterator[tuple[FakeVertex, VertexClient]]:
    async with vertex_fake(**config) as fake:
        assert fake.base_url is not None
        key_file = fake.write_credentials(tmp_path / "sa.json")
        async with VertexClient(fake.base_url, str(key_file), timeout_s=3.0,
                                options=VERTEX_OPTIONS) as client:
            yield fake, client


def parsed(answer: HttpAnswer) -> dict[str, Any]:
    assert answer.body is not None
    value = json.loads(answer.body)
    assert isinstance(value, dict)
    return value


async def created(client: VeoClient | VertexClient, body: dict[str, Any] = BODY) -> str:
    answer = await client.create_video(body, "key-1", MODEL)
    assert answer.status == 200, answer
    job_id = RULES.created_job_id(parsed(answer))
    assert job_id is not None
    return job_id


async def finished(client: VeoClient | VertexClient, job_id: str) -> dict[str, Any]:
    async def read() -> dict[str, Any] | None:
        answer = await client.read_status(job_id)
        assert answer.status == 200, answer
        body = parsed(answer)
        return body if body.get("done") else None
    found: dict[str, Any] = await eventually(read, what="the operation to finish")
    return found


# ---- the Gemini API ----------------------------------------------------------------------

async def test_gemini_create_sends_the_body_unchanged_with_the_key_and_reads_by_get() -> None:
    async with gemini() as (fake, client):
        job_id = await created(client)
        assert job_id.startswith(f"models/{MODEL}/operations/")
        assert list(fake.created_bodies().values()) == [1]
        assert fake.operation(job_id).body == BODY  # every field as submit gave it
        pending = await client.read_status(job_id)
        assert pending.status == 200 and isinstance(RULES.read_status(parsed(pending)), Pending)
        body = await finished(client, job_id)
        [uri] = RULES.media_urls(body)
        assert uri.startswith(client.base_url) and uri.endswith(":download?alt=media")
        assert fake.stats()["unauthorized"] == 0
        assert client.shown_status_url(job_id) == f"{client.base_url}/v1beta/{job_id}"
        assert client.shown_create_url().endswith("/v1beta/models/MODEL:predictLongRunning")


async def test_gemini_media_carry_the_key_to_the_api_origin_only() -> None:
    async with gemini() as (_, client):
        assert dict(client.media_headers()) == {"x-goog-api-key": DEFAULT_API_KEY}
        assert client.media_auth_hosts() == frozenset()
        rules = AccountRules(client.base_url, api_headers=client.media_headers(),
                             header_hosts=client.media_auth_hosts())
        assert rules.gets_headers(URL(f"{client.base_url}/v1beta/files/x:download?alt=media"))
        for other in ("https://generativelanguage.googleapis.com/v1beta/files/x:download",
                      f"http://127.0.0.1:{free_port()}/v1beta/files/x",
                      "https://storage.googleapis.com/b/x.mp4"):
            assert not rules.gets_headers(URL(other)), other


async def test_gemini_a_429_waits_as_its_retry_info_says() -> None:
    async with gemini(status_429=1.0, retry_delay_s=42) as (_, client):
        job_id = await created(client)
        answer = await client.read_status(job_id)
        assert answer.status == 429 and answer.retry_after == "42"
        assert RULES.error_code(parsed(answer))[0] == "RESOURCE_EXHAUSTED"


@pytest.mark.parametrize("job_id", [
    "x", "vidpoll-probe-0123", "models/x", "models/x/operations/../y", "models//operations/y",
    "models/x/operations/y?alt=media", "models/x/operations/y#f", "../../v1beta/files/x",
    "models/x/operations/a b", "models/x/operations/é", "files/abc/download"])
async def test_gemini_odd_operation_names_are_read_as_one_segment_google_answers(
        job_id: str) -> None:
    # a real request (the core's probe of a paused account must reach Google to prove the
    # route), under a model that cannot exist, the id one percent-encoded segment: no id
    # turns into another path, and Google's own 404 answers it
    async with gemini() as (fake, client):
        answer = await client.read_status(job_id)
        assert answer.status == 404 and "not sent" not in parsed(answer)["error"]["message"]
        assert RULES.error_code(parsed(answer))[0] == "NOT_FOUND"
        assert fake.stats()["status_reads"] == 1
        assert client.shown_status_url(job_id).startswith(
            f"{client.base_url}/v1beta/models/vidpoll-no-such-model/operations/")


async def test_gemini_a_model_that_cannot_be_one_is_refused_unsent() -> None:
    async with gemini() as (fake, client):
        for model in (None, "../x", "veo/3", "veo 3"):
            answer = await client.create_video(BODY, "k", model)
            assert answer.status == 400 and "not sent" in parsed(answer)["error"]["message"]
        assert fake.stats()["create_requests"] == 0


async def test_gemini_a_key_no_header_can_carry_is_a_refused_key_never_an_unknown_create(
        ) -> None:
    fake = FakeVeo(VeoFakeConfig())
    runner, url = await start_veo(fake)
    try:
        async with VeoClient(url, "AIza-bad\nkey") as client:
            answer = await client.create_video(BODY, "k", MODEL)
            assert answer.status == 401 and answer.transport_error is None
            assert "control character" in (answer.detail or "")
            assert "AIza-bad" not in (answer.detail or "") + answer.body.decode()
            # the submitter gives the intent back untouched (a pause), never "reconciling"
            assert isinstance(decide_submit(_intent(), answer, _now(), _policy(), _rng(), RULES),
                              AuthPause)
            assert fake.stats()["create_requests"] == 0
    finally:
        await runner.cleanup()


# ---- Vertex AI -----------------------------------------------------------------------------

async def test_vertex_create_and_reads_go_to_its_paths_with_a_token_from_the_key_file(
        tmp_path: Path) -> None:
    async with vertex(tmp_path) as (fake, client):
        job_id = await created(client)
        assert job_id.startswith(f"projects/{DEFAULT_PROJECT}/locations/{DEFAULT_LOCATION}/"
                                 f"publishers/google/models/{MODEL}/operations/")
        assert fake.operation(job_id).body == BODY
        stats = fake.stats()
        assert stats["token_requests"] == 1 and stats["tokens_issued"] == 1
        assert client.token_refreshes == 1
        body = await finished(client, job_id)
        # every read a POST of fetchPredictOperation (a GET would answer 404), one token
        stats = fake.stats()
        assert stats["status_reads"] >= 1 and stats["unauthorized"] == 0
        assert stats["token_requests"] == 1
        assert body["name"] == job_id
        assert client.shown_status_url(job_id) == (
            f"{fake.base_url}/v1/projects/{DEFAULT_PROJECT}/locations/{DEFAULT_LOCATION}/"
            f"publishers/google/models/{MODEL}:fetchPredictOperation")
        assert client.shown_create_url().endswith("/models/MODEL:predictLongRunning")
        assert client.media_headers() == {} and client.media_auth_hosts() == frozenset()


async def test_vertex_concurrent_calls_on_a_cold_client_mint_one_token(tmp_path: Path) -> None:
    async with vertex(tmp_path) as (fake, client):
        job_id = fake.operation(await created(client)).name
        fake.expire_tokens()
        client._token = None
        answers = await asyncio.gather(*(client.read_status(job_id) for _ in range(20)))
        assert all(a.status == 200 for a in answers)
        assert fake.stats()["token_requests"] == 2  # the first create's, and one for all 20


async def test_vertex_an_expired_token_is_refused_once_then_replaced(tmp_path: Path) -> None:
    async with vertex(tmp_path) as (fake, client):
        job_id = await created(client)
        fake.expire_tokens()
        refused = await client.read_status(job_id)
        assert refused.status == 401
        assert RULES.error_code(parsed(refused))[0] == "UNAUTHENTICATED (ACCESS_TOKEN_EXPIRED)"
        again = await client.read_status(job_id)  # the next read mints a new token
        assert again.status == 200
        assert client.token_refreshes == 2 and fake.stats()["tokens_issued"] == 2
        assert fake.stats()["unauthorized"] == 1


async def test_vertex_a_token_is_replaced_before_it_expires(tmp_path: Path) -> None:
    # a token of 8 s is replaced from 6 s on (a quarter of its life before it ends), in the
    # background, while it is still sent: 2 s to spare even on a slow machine
    async with vertex(tmp_path, token_lifetime_s=8.0) as (fake, client):
        job_id = await created(client)

        async def replaced() -> bool:
            answer = await client.read_status(job_id)
            assert answer.status == 200, answer
            return client.token_refreshes >= 2

        await eventually(replaced, what="a second token")
        assert fake.stats()["unauthorized"] == 0  # replaced before any refusal


async def test_vertex_a_call_waits_for_a_slow_token_endpoint_only_so_long(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # a create must not outlast its lease waiting for a token: it is answered unsent (a
    # refused key: the intent stays queued) while the mint goes on, and used once it is in
    monkeypatch.setattr(vertex_client, "MINT_WAIT_S", 0.2)
    async with vertex(tmp_path, latency_s=0.6) as (fake, client):
        answer = await client.create_video(BODY, "k", MODEL)
        assert answer.status == 401 and "has not answered within 0.2 s" in (answer.detail or "")
        assert fake.stats()["create_requests"] == 0

        async def minted() -> bool:
            return client.token_refreshes == 1
        await eventually(minted, what="the token minted meanwhile")
        assert (await client.create_video(BODY, "k", MODEL)).status == 200
        assert fake.stats()["token_requests"] == 1


async def test_vertex_inline_bytes_never_come_back_in_a_status_body_even_past_the_cap(
        tmp_path: Path) -> None:
    size = 3 << 20  # base64: 4 MiB, past the 1 MiB every other body is capped at
    async with vertex(tmp_path, file_bytes=size) as (fake, client):
        job_id = await created(client, {**BODY, "parameters": {"sampleCount": 2}})
        body = await finished(client, job_id)
        op = fake.operation(job_id)
        expected = [fake.video_bytes(f"{op.id}/sample_{i}") for i in range(2)]
        assert body["response"]["videos"] == [
            {"inlineBytes": size, "sha256": hashlib.sha256(e).hexdigest(),
             "mimeType": "video/mp4"} for e in expected]
        answer = await client.read_status(job_id)
        assert answer.body is not None and len(answer.body) < 4096
        assert b"bytesBase64Encoded" not in answer.body
        assert RULES.media_urls(body) == ["inline:0", "inline:1"]
        for i, data in enumerate(expected):
            got = await client.inline_media(job_id, None, i)
            assert got == data
        gone = await client.inline_media(job_id, None, 2)
        assert isinstance(gone, HttpAnswer) and gone.status == 200
        assert "no longer holds the bytes of video 2" in (gone.detail or "")
        # through the downloader's adapter: the bytes, or a DownloadError that says why
        fetch = inline_fetcher({"acct": client, "other": object()})
        assert await fetch("acct", job_id, 1) == expected[1]
        with pytest.raises(DownloadRefused, match="bytes are gone"):
            await fetch("acct", job_id, 2)
        with pytest.raises(DownloadRefused, match="serves no inline media"):
            await fetch("other", job_id, 0)


async def test_vertex_gcs_results_are_recorded_not_downloaded(tmp_path: Path) -> None:
    async with vertex(tmp_path) as (_fake, client):
        job_id = await created(client, {**BODY, "parameters": {"storageUri": "gs://b/out"}})
        body = await finished(client, job_id)
        [video] = body["response"]["videos"]
        assert video["gcsUri"].startswith("gs://b/out/") and RULES.media_urls(body) == []


@pytest.mark.parametrize("job_id", [
    "x", "vidpoll-probe-0123",
    f"models/{MODEL}/operations/abc",
    f"projects/{DEFAULT_PROJECT}/locations/{DEFAULT_LOCATION}/publishers/google/models/{MODEL}",
    f"projects/{DEFAULT_PROJECT}/locations/{DEFAULT_LOCATION}/publishers/google/models/"
    f"{MODEL}/operations/../../x",
    f"projects/{DEFAULT_PROJECT}/locations/{DEFAULT_LOCATION}/publishers/google/models/"
    f"{MODEL}/operations/a?b",
    f"projects/{DEFAULT_PROJECT}/locations/{DEFAULT_LOCATION}/publishers/other/models/"
    f"{MODEL}/operations/abc",
    f"projects/{DEFAULT_PROJECT}/locations/{DEFAULT_LOCATION}/publishers/google/models/"
    f"../operations/abc",
])
async def test_vertex_an_id_that_is_no_operation_name_is_read_through_a_model_that_cannot_be(
        tmp_path: Path, job_id: str) -> None:
    # a real request, which Google answers with its own error (the core's probe of a paused
    # account must reach it), the id only in the JSON body, never in the path
    async with vertex(tmp_path) as (fake, client):
        answer = await client.read_status(job_id)
        assert answer.status is not None and 400 <= answer.status < 500
        assert RULES.error_code(parsed(answer))[0] is not None  # Google's envelope
        assert "not sent" not in (answer.detail or "")
        assert fake.stats()["status_reads"] == 1
        assert "vidpoll-no-such-model" in client.shown_status_url(job_id)


@pytest.mark.parametrize("job_id", [
    f"projects/someone-else/locations/{DEFAULT_LOCATION}/publishers/google/models/"
    f"{MODEL}/operations/abc",
    f"projects/{DEFAULT_PROJECT}/locations/europe-west4/publishers/google/models/"
    f"{MODEL}/operations/abc",
])
async def test_vertex_foreign_operation_names_are_refused_unsent(
        tmp_path: Path, job_id: str) -> None:
    async with vertex(tmp_path) as (fake, client):
        answer = await client.read_status(job_id)
        assert answer.status == 404 and "not sent" in (answer.detail or "")
        assert RULES.error_code(parsed(answer))[0] == "NOT_FOUND"
        assert fake.stats()["status_reads"] == 0 and fake.stats()["token_requests"] == 0


def credential_cases(tmp_path: Path, fake: FakeVertex) -> dict[str, tuple[Path, str]]:
    """Key files that cannot give a token, and what the refusal must say."""
    missing = tmp_path / "missing.json"
    garbage = tmp_path / "garbage.json"
    garbage.write_text('{"private_key": "-----BEGIN PRIVATE KEY-----SUPERSECRETKEYBYTES')
    partial = tmp_path / "partial.json"
    partial.write_text(json.dumps({"type": "service_account",
                                   "private_key": "SUPERSECRETKEYBYTES"}))
    bad_key = tmp_path / "bad_key.json"
    info = fake.credentials_info()
    bad_key.write_text(json.dumps({**info, "private_key": "-----BEGIN PRIVATE KEY-----\n"
                                   "SUPERSECRETKEYBYTES\n-----END PRIVATE KEY-----\n"}))
    unknown = tmp_path / "unknown_account.json"
    unknown.write_text(json.dumps({**info, "client_email": "nobody@x.iam.gserviceaccount.com"}))
    unreachable = tmp_path / "unreachable.json"
    unreachable.write_text(json.dumps({**info,
                                       "token_uri": f"http://127.0.0.1:{free_port()}/token"}))
    return {"missing": (missing, "cannot be read (No such file or directory)"),
            "garbage": (garbage, "cannot be used"),
            "partial": (partial, "missing fields"),
            "bad_key": (bad_key, "cannot be used"),
            "refused": (unknown, "the token endpoint refused the key"),
            "unreachable": (unreachable, "could not be reached")}


async def test_vertex_a_key_file_that_gives_no_token_answers_every_call_401_naming_it(
        tmp_path: Path) -> None:
    async with vertex_fake() as fake:
        assert fake.base_url is not None
        for case, (path, said) in credential_cases(tmp_path, fake).items():
            async with VertexClient(fake.base_url, str(path), timeout_s=2.0,
                                    options=VERTEX_OPTIONS) as client:
                assert client.key_problem is None  # a path is no key: nothing refuses it
                name = (f"projects/{DEFAULT_PROJECT}/locations/{DEFAULT_LOCATION}/publishers/"
                        f"google/models/{MODEL}/operations/abc")
                for answer in (await client.create_video(BODY, "k", MODEL),
                               await client.read_status(name)):
                    assert answer.status == 401 and answer.transport_error is None, case
                    detail = answer.detail or ""
                    assert str(path) in detail and said in detail, (case, detail)
                    assert "SUPERSECRETKEYBYTES" not in detail + answer.body.decode(), case
                    assert "BEGIN PRIVATE KEY" not in detail + answer.body.decode(), case
                    # the code is what the core's "rejected the key" line shows: the file
                    code = RULES.error_code(parsed(answer))[0] or ""
                    assert code.startswith("not sent: ") and str(path) in code, code
                    # a create: the intent is given back untouched (never an unknown create)
                    assert isinstance(decide_submit(_intent(), answer, _now(), _policy(),
                                                    _rng(), RULES), AuthPause)
        stats = fake.stats()
        assert stats["create_requests"] == 0 and stats["status_reads"] == 0
        assert stats["tokens_issued"] == 0


async def test_vertex_a_path_with_a_control_character_is_refused_not_sent(
        tmp_path: Path) -> None:
    async with vertex_fake() as fake:
        assert fake.base_url is not None
        async with VertexClient(fake.base_url, "/etc/x\n.json", options=VERTEX_OPTIONS) as c:
            answer = await c.create_video(BODY, "k", MODEL)
            assert answer.status == 401 and "control character" in (answer.detail or "")
        async with VertexClient(fake.base_url, str(fake.write_credentials(tmp_path / "k")),
                                options=ProviderOptions(extra={})) as c:
            answer = await c.create_video(BODY, "k", MODEL)
            assert answer.status == 401 and "project is missing" in (answer.detail or "")
        assert fake.stats()["create_requests"] == 0


class Echo:
    """An API that answers with the Authorization header it got, in every form an error
    page or a JSON body may take it (the fake's /token mints the tokens)."""

    def __init__(self) -> None:
        self.tokens: list[str] = []

    async def handle(self, request: web.Request) -> web.Response:
        token = request.headers.get("Authorization", "").removeprefix("Bearer ")
        self.tokens.append(token)
        if request.match_info["verb"] == "predictLongRunning":
            return web.json_response({"error": {"code": 400, "status": "INVALID_ARGUMENT",
                                                "message": f"bad token {token}"}}, status=400)
        escaped = token.replace("/", "\\/")
        return web.json_response({"name": "x", "done": False, "note": f"seen {token}",
                                  "escaped": escaped, "url": f"https://h/x?access_token={token}"})


async def test_vertex_the_token_never_comes_back_in_a_body_a_detail_or_a_repr(
        tmp_path: Path) -> None:
    echo = Echo()
    app = web.Application()
    app.router.add_post("/v1/projects/{p}/locations/{l}/publishers/google/models/{m}:{verb}",
                        echo.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    api = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with vertex_fake() as fake:
            key_file = fake.write_credentials(tmp_path / "sa.json")  # tokens from the fake
            async with VertexClient(api, str(key_file), options=VERTEX_OPTIONS) as client:
                name = (f"projects/{DEFAULT_PROJECT}/locations/{DEFAULT_LOCATION}/publishers/"
                        f"google/models/{MODEL}/operations/abc")
                answers = [await client.create_video(BODY, "k", MODEL),
                           await client.read_status(name)]
                [token] = set(echo.tokens)
                assert token.startswith("ya29.") and token in fake.tokens
                for answer in answers:
                    text = (answer.body or b"").decode() + (answer.detail or "")
                    assert token not in text and token.replace("/", "\\/") not in text
                    assert "<redacted>" in text
                assert token not in repr(client) and str(key_file) not in repr(client)
                assert RULES.error_code(parsed(answers[0]))[0] == "INVALID_ARGUMENT"
    finally:
        await runner.cleanup()


async def test_vertex_the_default_base_url_names_the_location() -> None:
    provider = registry.load("vertex")
    client = provider.client(provider.default_base_url, "/nonexistent.json", timeout_s=1.0,
                             max_connections=1,
                             options=ProviderOptions(extra={"project": "p",
                                                            "location": "europe-west4"}))
    assert client.base_url == "https://europe-west4-aiplatform.googleapis.com"
    assert client.shown_create_url() == (
        "https://europe-west4-aiplatform.googleapis.com/v1/projects/p/locations/europe-west4/"
        "publishers/google/models/MODEL:predictLongRunning")


# ---- helpers: what the submitter would decide ---------------------------------------------

def _intent() -> ClaimedIntent:
    return ClaimedIntent("k", uuid.uuid4(), BODY, attempts=1, consecutive_errors=0,
                         account="a", model=MODEL)


def _now() -> datetime:
    return datetime.now(UTC)


def _policy() -> PollPolicy:
    return PollPolicy()


def _rng() -> random.Random:
    return random.Random(0)
