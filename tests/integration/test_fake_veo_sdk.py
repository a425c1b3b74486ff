"""Google's official SDK (google-genai 2.34, with google-auth) drives the fake Veo (Gemini API)
and the fake Vertex AI, unmodified except for its base URL and credentials.

A fake the SDK cannot drive is not Google. The SDK is synchronous (httpx, and requests for the
token refresh): it runs in a worker thread while the fakes serve in the test's event loop.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiohttp import web
from google import genai
from google.genai import errors, types
from google.oauth2 import service_account
from standardwebhooks.webhooks import Webhook

from vidpoll.providers.veo.fake import (
    DEFAULT_API_KEY,
    DEFAULT_MODELS,
    FakeVeo,
    VeoFakeConfig,
    b64url,
    jwt_decode,
    start_fake_veo,
)
from vidpoll.providers.vertex.fake import (
    DEFAULT_LOCATION,
    DEFAULT_PROJECT,
    FakeVertex,
    VertexFakeConfig,
    start_fake_vertex,
)

MODEL = DEFAULT_MODELS[0]
WAIT_S = 20.0
GOOGLE = "https://generativelanguage.googleapis.com"
T = TypeVar("T")


def run_to_end(client: genai.Client, op: types.GenerateVideosOperation
               ) -> types.GenerateVideosOperation:
    """The documented loop (`while not op.done: op = client.operations.get(op)`), polled
    briskly and bounded by an overall deadline."""
    deadline = time.monotonic() + WAIT_S
    while not op.done:
        assert time.monotonic() < deadline, "operation never ended"
        time.sleep(0.05)
        op = client.operations.get(op)
    return op


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    return await asyncio.wait_for(asyncio.to_thread(fn, *args, **kwargs), WAIT_S * 2)


@pytest.fixture
async def runners() -> AsyncIterator[list[web.AppRunner]]:
    started: list[web.AppRunner] = []
    yield started
    for runner in started:
        await runner.cleanup()


async def gemini(runners: list[web.AppRunner], **overrides: Any) -> tuple[FakeVeo, genai.Client]:
    # google-genai's files.download only understands https:// URIs (t_file_name); it keeps the
    # file id and fetches from its own base URL. So the fake writes Google's origin into them.
    config = VeoFakeConfig(**{"processing_s": 0.2, "seed": 3, "files_base_url": GOOGLE,
                              **overrides})
    fake = FakeVeo(config)
    runner, url = await start_fake_veo(fake)
    runners.append(runner)
    client = genai.Client(api_key=DEFAULT_API_KEY,
                          http_options=types.HttpOptions(base_url=url, api_version="v1beta"))
    return fake, client


def generate(client: genai.Client, prompt: str, **config: Any) -> types.GenerateVideosOperation:
    return client.models.generate_videos(
        model=MODEL, source=types.GenerateVideosSource(prompt=prompt),
        config=types.GenerateVideosConfig(**config))


async def test_gemini_success_operations_get_and_files_download(
        runners: list[web.AppRunner]) -> None:
    fake, client = await gemini(runners)
    op = await in_thread(generate, client, "a lighthouse at dusk", number_of_videos=2,
                         aspect_ratio="16:9", duration_seconds=8)
    assert op.name and op.name.startswith(f"models/{MODEL}/operations/") and not op.done
    [(key, count)] = fake.created_bodies().items()
    assert count == 1 and key[0] == MODEL
    sent = json.loads(key[1])
    assert sent["instances"] == [{"prompt": "a lighthouse at dusk"}]
    assert sent["parameters"] == {"sampleCount": 2, "aspectRatio": "16:9", "durationSeconds": 8}

    done = await in_thread(run_to_end, client, op)
    assert done.done and done.error is None
    assert done.response is not None and done.result is not None
    videos = done.response.generated_videos or []
    assert len(videos) == 2
    for index, generated in enumerate(videos):
        assert generated.video is not None and generated.video.uri
        assert generated.video.uri.startswith(f"{GOOGLE}/v1beta/files/")
        data = await in_thread(client.files.download, file=generated)
        expected = fake.video_bytes(fake.file_id(op.name, index))
        assert data == expected and generated.video.video_bytes == expected
    stats = fake.stats()
    assert stats["creates"] == 1 and stats["file_reads"] == 2 and stats["status_reads"] >= 1


async def test_gemini_error_and_filtered_ends(runners: list[web.AppRunner]) -> None:
    fake, client = await gemini(runners, outcome_mix={"error": 1.0})
    failed = await in_thread(run_to_end, client, await in_thread(generate, client, "fails"))
    assert failed.error == {"code": 13, "message": fake.config.error_message}
    assert failed.response is None

    fake.config.outcome_mix = {"filtered": 1.0}
    filtered = await in_thread(run_to_end, client, await in_thread(generate, client, "blocked"))
    assert filtered.error is None and filtered.response is not None
    assert filtered.response.generated_videos is None
    assert filtered.response.rai_media_filtered_count == 1
    assert filtered.response.rai_media_filtered_reasons == fake.config.filtered_reasons

    fake.config.outcome_mix, fake.config.partial_filter_rate = {"success": 1.0}, 1.0
    partial = await in_thread(run_to_end, client,
                              await in_thread(generate, client, "some", number_of_videos=4))
    assert partial.response is not None
    kept = len(partial.response.generated_videos or [])
    assert 1 <= kept <= 3 and partial.response.rai_media_filtered_count == 4 - kept


async def test_gemini_refusals_surface_as_sdk_errors(runners: list[web.AppRunner]) -> None:
    fake, client = await gemini(runners)
    url = fake.base_url
    wrong = genai.Client(api_key="AIza-wrong",
                         http_options=types.HttpOptions(base_url=url, api_version="v1beta"))
    with pytest.raises(errors.ClientError) as caught:
        await in_thread(generate, wrong, "x")
    assert caught.value.code == 400 and caught.value.status == "INVALID_ARGUMENT"
    assert caught.value.details["error"]["details"][0]["reason"] == "API_KEY_INVALID"

    with pytest.raises(errors.ClientError) as caught:
        await in_thread(client.models.generate_videos, model="veo-nope",
                        source=types.GenerateVideosSource(prompt="x"))
    assert caught.value.code == 404 and caught.value.status == "NOT_FOUND"

    fake.script_creates(["429", "5xx_before"])
    with pytest.raises(errors.ClientError) as caught:
        await in_thread(generate, client, "throttled")
    assert caught.value.code == 429 and caught.value.status == "RESOURCE_EXHAUSTED"
    [retry] = caught.value.details["error"]["details"]
    assert retry == {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "30s"}
    with pytest.raises(errors.ServerError) as server:
        await in_thread(generate, client, "unlucky")
    assert server.value.code in (500, 503)
    assert fake.stats()["creates"] == 0  # the SDK does not retry by default


async def test_gemini_sdk_cannot_download_a_plain_http_uri(runners: list[web.AppRunner]) -> None:
    """With the fake's own http:// origin in the URI, google-genai's t_file_name keeps the whole
    URI as the "file name" and requests a path that does not exist: a limitation of the SDK
    (Google's URIs are https), pinned here so nobody mistakes it for a fake bug."""
    _, client = await gemini(runners, files_base_url=None)
    done = await in_thread(run_to_end, client, await in_thread(generate, client, "plain"))
    assert done.response is not None and done.response.generated_videos
    generated = done.response.generated_videos[0]
    assert generated.video is not None and str(generated.video.uri).startswith("http://")
    with pytest.raises(errors.APIError):
        await in_thread(client.files.download, file=generated)


class Receiver:
    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], bytes]] = []

    async def hook(self, request: web.Request) -> web.Response:
        self.requests.append(({k.lower(): v for k, v in request.headers.items()},
                              await request.read()))
        return web.Response(status=204)


async def receiver(runners: list[web.AppRunner]) -> tuple[Receiver, str]:
    rec = Receiver()
    app = web.Application()
    app.router.add_post("/hook", rec.hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    runners.append(runner)
    return rec, f"http://127.0.0.1:{runner.addresses[0][1]}/hook"


async def until(predicate: Callable[[], bool]) -> None:
    """Wait, with an overall timeout, until state the fake exposes satisfies `predicate`."""
    async def loop() -> None:
        while True:
            if predicate():
                return
            await asyncio.sleep(0.02)
    await asyncio.wait_for(loop(), WAIT_S)


async def test_gemini_webhooks_registered_via_sdk_and_per_request(
        runners: list[web.AppRunner]) -> None:
    fake, client = await gemini(runners)
    rec, hook_url = await receiver(runners)
    created = await in_thread(client.webhooks.create, uri=hook_url,
                              subscribed_events=["video.generated"], name="vidpoll")
    secret = created.new_signing_secret
    assert secret and secret.startswith("whsec_") and created.uri == hook_url
    listed = await in_thread(client.webhooks.list)
    assert [h.uri for h in listed.webhooks or []] == [hook_url]
    assert all(h.new_signing_secret is None for h in listed.webhooks or [])

    op = await in_thread(generate, client, "hooked")
    await until(lambda: fake.stats()["webhooks_sent"] == 1)
    headers, body = rec.requests[0]
    event = Webhook(secret).verify(body, headers)
    assert event["type"] == "video.generated" and event["data"]["id"] == op.name

    # a per-request webhookConfig replaces the registered hooks and is signed with a JWT
    dynamic = await in_thread(generate, client, "dynamic", webhook_config=types.WebhookConfig(
        uris=[hook_url], user_metadata={"job": "j-1"}))
    [(key, _)] = [(k, c) for k, c in fake.created_bodies().items() if "dynamic" in k[1]]
    # google-genai 2.34 sends the config's fields in snake_case here
    assert json.loads(key[1])["webhookConfig"] == {"uris": [hook_url],
                                                   "user_metadata": {"job": "j-1"}}
    await until(lambda: fake.stats()["webhooks_sent"] == 2)
    headers, body = rec.requests[1]
    jwks = fake.jwks()["keys"]
    assert jwks[0]["kid"] == fake.webhook_key_id
    _, claims = jwt_decode(headers["webhook-signature"],
                           {fake.webhook_key_id: fake.webhook_signing_key.public_key()})
    assert claims["aud"] == hook_url and claims["webhook_id"] == headers["webhook-id"]
    assert claims["body_sha256"] == b64url(hashlib.sha256(body).digest())
    event = json.loads(body)
    assert event["data"] == {"id": dynamic.name, "user_metadata": {"job": "j-1"}}
    assert len(rec.requests) == 2  # the registered hook did not also get the dynamic one's end


# ---- Vertex AI ----

async def vertex(runners: list[web.AppRunner], tmp_path: Path, api_version: str | None = None,
                 **overrides: Any) -> tuple[FakeVertex, genai.Client]:
    fake = FakeVertex(VertexFakeConfig(**{"processing_s": 0.2, "seed": 5,
                                          "file_bytes": 4096, **overrides}))
    runner, url = await start_fake_vertex(fake)
    runners.append(runner)
    key_file = fake.write_credentials(tmp_path / "sa.json")
    credentials = service_account.Credentials.from_service_account_file(
        str(key_file), scopes=["https://www.googleapis.com/auth/cloud-platform"])
    options = (types.HttpOptions(base_url=url, api_version=api_version) if api_version
               else types.HttpOptions(base_url=url))
    client = genai.Client(vertexai=True, project=DEFAULT_PROJECT, location=DEFAULT_LOCATION,
                          credentials=credentials, http_options=options)
    return fake, client


async def test_vertex_inline_bytes_via_fetch_predict_operation(
        runners: list[web.AppRunner], tmp_path: Path) -> None:
    fake, client = await vertex(runners, tmp_path)
    op = await in_thread(generate, client, "a red kite", number_of_videos=2,
                         generate_audio=True, labels={"job": "j-7"})
    assert op.name and op.name.startswith(
        f"projects/{DEFAULT_PROJECT}/locations/{DEFAULT_LOCATION}/publishers/google/models/"
        f"{MODEL}/operations/")
    assert fake.stats()["tokens_issued"] == 1  # google-auth's JWT-bearer grant, verified
    sent = json.loads(next(iter(fake.created_bodies()))[1])
    assert sent["parameters"] == {"sampleCount": 2, "generateAudio": True}
    assert sent["labels"] == {"job": "j-7"}

    done = await in_thread(run_to_end, client, op)
    assert done.error is None and done.response is not None
    videos = done.response.generated_videos or []
    assert len(videos) == 2
    for index, generated in enumerate(videos):
        assert generated.video is not None and generated.video.mime_type == "video/mp4"
        assert generated.video.video_bytes == fake.video_bytes(f"{fake.operation(op.name).id}"
                                                              f"/sample_{index}")
    stats = fake.stats()
    assert stats["status_reads"] >= 1 and stats["token_requests"] == 1  # token reused


async def test_vertex_gcs_output_error_and_filtered(runners: list[web.AppRunner],
                                                    tmp_path: Path) -> None:
    fake, client = await vertex(runners, tmp_path, api_version="v1")
    done = await in_thread(run_to_end, client, await in_thread(
        generate, client, "to a bucket", output_gcs_uri="gs://vidpoll-out/renders"))
    assert done.response is not None
    [generated] = done.response.generated_videos or []
    assert generated.video is not None and generated.video.video_bytes is None
    uri = str(generated.video.uri)
    op_id = fake.operation(done.name or "").id
    assert uri == f"gs://vidpoll-out/renders/{op_id}/sample_0.mp4"
    assert fake.gcs_object(uri) == fake.video_bytes(f"{op_id}/sample_0")
    sent = json.loads(next(iter(fake.created_bodies()))[1])
    assert sent["parameters"]["storageUri"] == "gs://vidpoll-out/renders"

    fake.config.outcome_mix = {"error": 1.0}
    failed = await in_thread(run_to_end, client, await in_thread(generate, client, "fails"))
    assert failed.error == {"code": 13, "message": fake.config.error_message}
    fake.config.outcome_mix = {"filtered": 1.0}
    filtered = await in_thread(run_to_end, client, await in_thread(generate, client, "no"))
    assert filtered.response is not None and not filtered.response.generated_videos
    assert filtered.response.rai_media_filtered_count == 1


async def test_vertex_expired_token_and_refusals(runners: list[web.AppRunner],
                                                 tmp_path: Path) -> None:
    fake, client = await vertex(runners, tmp_path)
    op = await in_thread(generate, client, "expiring")
    fake.expire_tokens()  # the server's view; google-auth still holds an unexpired token
    with pytest.raises(errors.ClientError) as caught:
        await in_thread(client.operations.get, op)
    assert caught.value.code == 401 and caught.value.status == "UNAUTHENTICATED"
    assert caught.value.details["error"]["details"][0]["reason"] == "ACCESS_TOKEN_EXPIRED"

    fake2, client2 = await vertex(runners, tmp_path, models=["veo-other"])
    with pytest.raises(errors.ClientError) as caught:
        await in_thread(generate, client2, "unknown model")
    assert caught.value.code == 404
    fake2.config.models.append(MODEL)
    fake2.script_creates(["5xx_after"])
    with pytest.raises(errors.ServerError):
        await in_thread(generate, client2, "billed anyway")
    assert sum(fake2.created_bodies().values()) == 1


def test_credentials_file_is_a_service_account_key(tmp_path: Path) -> None:
    fake = FakeVertex()
    path = fake.write_credentials(tmp_path / "key.json", token_uri="http://127.0.0.1:9/token")
    info = json.loads(path.read_text())
    assert info["type"] == "service_account" and info["project_id"] == DEFAULT_PROJECT
    assert info["private_key"].startswith("-----BEGIN PRIVATE KEY-----")
    assert info["token_uri"] == "http://127.0.0.1:9/token"
    creds = service_account.Credentials.from_service_account_info(info)
    assert creds.service_account_email == info["client_email"]
    assert base64.b64decode(info["private_key"].splitlines()[1])  # PEM body
