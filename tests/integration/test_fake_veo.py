"""The fake Veo (Gemini API) and the fake Vertex AI against Google's documented behaviour, over
real HTTP on loopback.

These pin the fakes themselves (vidpoll's adapters are tested against them elsewhere): the
operation's life and its three ends, Google's error envelope for every refusal, the
authenticated and expiring files with Range, the operations list, every create fault and what
it bills, 429 with RetryInfo, static (HMAC) and dynamic (JWT) webhooks checked independently,
and on Vertex the OAuth2 JWT-bearer token endpoint, token expiry, fetchPredictOperation and
inline or GCS outputs. Tests wait on observed state with a generous overall timeout.
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
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from google.auth import crypt
from google.auth import jwt as google_jwt
from standardwebhooks.webhooks import Webhook

from vidpoll.providers.veo.fake import (
    DEFAULT_API_KEY,
    DEFAULT_MODELS,
    FakeVeo,
    VeoFakeConfig,
    canonical,
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
KEY = {"x-goog-api-key": DEFAULT_API_KEY}
WAIT_S = 15.0
BODY = {"instances": [{"prompt": "a cat"}], "parameters": {"aspectRatio": "16:9"}}
RESOURCE = (f"projects/{DEFAULT_PROJECT}/locations/{DEFAULT_LOCATION}/publishers/google/"
            f"models/{MODEL}")
SCOPE = "https://www.googleapis.com/auth/cloud-platform"


async def eventually(check: Callable[[], Awaitable[Any]], timeout_s: float = WAIT_S) -> Any:
    """Poll `check` until it returns something truthy; fail after `timeout_s`."""
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


class Http:
    """A thin aiohttp client: (status, parsed JSON or text, headers)."""

    def __init__(self, session: aiohttp.ClientSession, base: str,
                 headers: dict[str, str]) -> None:
        self.session, self.base, self.headers = session, base, headers

    async def call(self, method: str, path: str, *, json_body: Any = None,
                   headers: dict[str, str] | None = None, auth: bool = True,
                   timeout_s: float | None = None, **kwargs: Any
                   ) -> tuple[int, Any, dict[str, str]]:
        url = path if path.startswith("http") else self.base + path
        sent = {**(self.headers if auth else {}), **(headers or {})}
        timeout = aiohttp.ClientTimeout(total=timeout_s) if timeout_s else None
        async with self.session.request(method, url, json=json_body, headers=sent,
                                        timeout=timeout, **kwargs) as resp:
            raw = await resp.read()
            try:
                body: Any = json.loads(raw)
            except ValueError:
                body = raw
            return resp.status, body, dict(resp.headers)


@pytest.fixture
async def served() -> AsyncIterator[Callable[[Any], Awaitable[Http]]]:
    """Start fakes on loopback, each with its own client session; stop them all after."""
    runners: list[web.AppRunner] = []
    sessions: list[aiohttp.ClientSession] = []

    async def serve(fake: Any) -> Http:
        if isinstance(fake, FakeVertex):
            runner, url = await start_fake_vertex(fake)
            headers = {"Authorization": f"Bearer {fake.mint_token()}"}
        else:
            runner, url = await start_fake_veo(fake)
            headers = dict(KEY)
        runners.append(runner)
        session = aiohttp.ClientSession()
        sessions.append(session)
        return Http(session, url, headers)

    yield serve
    for session in sessions:
        await session.close()
    for runner in runners:
        await runner.cleanup()


def veo(**overrides: Any) -> FakeVeo:
    return FakeVeo(VeoFakeConfig(**{"processing_s": 0.15, "seed": 11, **overrides}))


def vertex(**overrides: Any) -> FakeVertex:
    return FakeVertex(VertexFakeConfig(**{"processing_s": 0.15, "seed": 13,
                                          "file_bytes": 2048, **overrides}))


async def create(api: Http, body: Any = None, model: str = MODEL,
                 **kwargs: Any) -> tuple[int, Any, dict[str, str]]:
    return await api.call("POST", f"/v1beta/models/{model}:predictLongRunning",
                          json_body=BODY if body is None else body, **kwargs)


async def until_done(api: Http, name: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        status, body, _ = await api.call("GET", f"/v1beta/{name}")
        assert status == 200, body
        return body if body.get("done") else None
    result: dict[str, Any] = await eventually(check)
    return result


# ---- Gemini API ----

async def test_gemini_operation_runs_to_success_with_downloadable_samples(served: Any) -> None:
    fake = veo(file_bytes=1000)
    api: Http = await served(fake)
    body = {"instances": [{"prompt": "two cats"}], "parameters": {"sampleCount": 2}}
    status, created, _ = await create(api, body)
    assert status == 200 and set(created) == {"name"}
    name = created["name"]
    assert re.fullmatch(rf"models/{MODEL}/operations/[a-z0-9]{{12}}", name)

    status, running, _ = await api.call("GET", f"/v1beta/{name}")
    assert status == 200 and running == {"name": name}  # `done` absent while running

    done = await until_done(api, name)
    assert set(done) == {"name", "done", "response"} and done["done"] is True
    response = done["response"]
    assert response["@type"] == ("type.googleapis.com/google.ai.generativelanguage.v1beta."
                                 "PredictLongRunningResponse")
    samples = response["generateVideoResponse"]["generatedSamples"]
    assert set(response["generateVideoResponse"]) == {"generatedSamples"}
    assert len(samples) == 2
    for index, sample in enumerate(samples):
        uri = sample["video"]["uri"]
        fid = fake.file_id(name, index)
        assert uri == f"{api.base}/v1beta/files/{fid}:download?alt=media"
        status, data, headers = await api.call("GET", uri)
        assert status == 200 and data == fake.video_bytes(fid) and len(data) == 1000
        assert headers["Content-Type"] == "video/mp4"
    assert fake.created_bodies() == {(MODEL, canonical(body)): 1}
    assert fake.stats()["creates"] == 1 and fake.stats()["file_reads"] == 2


async def test_gemini_refusals_use_googles_error_envelope(served: Any) -> None:
    fake = veo()
    api: Http = await served(fake)
    status, body, _ = await create(api, auth=False)
    assert status == 403 and body["error"]["status"] == "PERMISSION_DENIED"
    assert body["error"]["code"] == 403 and "unregistered callers" in body["error"]["message"]

    status, body, _ = await create(api, auth=False, headers={"x-goog-api-key": "AIza-wrong"})
    assert status == 400
    error = body["error"]
    assert error["status"] == "INVALID_ARGUMENT"
    assert error["message"] == "API key not valid. Please pass a valid API key."
    assert error["details"][0] == {
        "@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "API_KEY_INVALID",
        "domain": "googleapis.com", "metadata": {"service": "generativelanguage.googleapis.com"}}
    # the key may also come as ?key=
    status, _, _ = await api.call("POST", f"/v1beta/models/{MODEL}:predictLongRunning"
                                  f"?key={DEFAULT_API_KEY}", json_body=BODY, auth=False)
    assert status == 200

    status, body, _ = await create(api, model="veo-unknown")
    assert status == 404 and body["error"]["status"] == "NOT_FOUND"
    assert body["error"]["message"].startswith("models/veo-unknown is not found")
    bad: Any
    for bad in ({"instances": []}, {"parameters": {}}, [1, 2],
                {"instances": [{"prompt": "x"}], "parameters": {"sampleCount": 9}},
                {"instances": [{"prompt": "x"}], "parameters": {"sampleCount": "2"}}):
        status, body, _ = await create(api, bad)
        assert status == 400 and body["error"]["status"] == "INVALID_ARGUMENT", bad
    status, body, _ = await api.call("POST", f"/v1beta/models/{MODEL}:predictLongRunning",
                                     data=b"{not json", headers={"Content-Type": "text/plain"})
    assert status == 400 and body["error"]["code"] == 400
    status, body, _ = await api.call("GET", f"/v1beta/models/{MODEL}/operations/nosuchop1234")
    assert status == 404 and body["error"]["status"] == "NOT_FOUND"
    assert fake.stats()["creates"] == 1 and fake.stats()["unauthorized"] == 2


async def test_gemini_error_and_filtered_ends(served: Any) -> None:
    fake = veo(outcome_mix={"error": 1.0}, error_code=3, error_message="bad prompt")
    api: Http = await served(fake)
    _, created, _ = await create(api)
    failed = await until_done(api, created["name"])
    assert failed == {"name": created["name"], "done": True,
                      "error": {"code": 3, "message": "bad prompt"}}  # no status string

    fake.config.outcome_mix = {"filtered": 1.0}
    _, created, _ = await create(api, {"instances": [{"prompt": "x"}],
                                       "parameters": {"numberOfVideos": 2}})
    filtered = await until_done(api, created["name"])
    result = filtered["response"]["generateVideoResponse"]
    assert result == {"raiMediaFilteredCount": 2,
                      "raiMediaFilteredReasons": fake.config.filtered_reasons}

    fake.config.outcome_mix = {"success": 1.0, "error": 1.0, "filtered": 1.0}
    names = [(await create(api, {"instances": [{"prompt": f"mix {n}"}]}))[1]["name"]
             for n in range(30)]
    ends = {fake.operation(n).outcome for n in names}
    assert ends == {"success", "error", "filtered"}  # a seeded mix


async def test_gemini_files_need_the_key_honour_range_and_expire(served: Any) -> None:
    fake = veo(file_bytes=1000, file_retention_s=600.0)  # made to expire below, not waited for
    api: Http = await served(fake)
    _, created, _ = await create(api)
    done = await until_done(api, created["name"])
    uri = done["response"]["generateVideoResponse"]["generatedSamples"][0]["video"]["uri"]
    expected = fake.video_bytes(fake.file_id(created["name"]))

    status, body, _ = await api.call("GET", uri, auth=False)
    assert status == 403 and body["error"]["status"] == "PERMISSION_DENIED"
    status, data, _ = await api.call("GET", uri + f"&key={DEFAULT_API_KEY}", auth=False)
    assert status == 200 and data == expected
    status, data, headers = await api.call("GET", uri, headers={"Range": "bytes=10-19"})
    assert status == 206 and data == expected[10:20]
    assert headers["Content-Range"] == "bytes 10-19/1000"
    status, data, _ = await api.call("GET", uri, headers={"Range": "bytes=-5"})
    assert status == 206 and data == expected[-5:]
    status, _, headers = await api.call("GET", uri, headers={"Range": "bytes=5000-"})
    assert status == 416 and headers["Content-Range"] == "bytes */1000"
    status, _, headers = await api.call("HEAD", uri)
    assert status == 200 and headers["Content-Length"] == "1000"
    status, body, _ = await api.call("GET", f"{api.base}/v1beta/files/zzzz9999:download")
    assert status == 404 and body["error"]["status"] == "NOT_FOUND"

    fake.config.file_retention_s = 0.0  # the two days are over
    status, _, _ = await api.call("GET", uri)
    assert status == 404
    status, still, _ = await api.call("GET", f"/v1beta/{created['name']}")
    assert status == 200 and still["done"]  # the operation stays readable


async def test_gemini_download_redirect_and_files_origin(served: Any) -> None:
    fake = veo(download_redirect=True, files_base_url="https://generativelanguage.googleapis.com")
    api: Http = await served(fake)
    _, created, _ = await create(api)
    done = await until_done(api, created["name"])
    uri = done["response"]["generateVideoResponse"]["generatedSamples"][0]["video"]["uri"]
    fid = fake.file_id(created["name"])
    assert uri == f"https://generativelanguage.googleapis.com/v1beta/files/{fid}:download?alt=media"
    local = f"{api.base}/v1beta/files/{fid}:download?alt=media"
    status, _, headers = await api.call("GET", local, allow_redirects=False)
    assert status == 302 and headers["Location"].startswith(f"{api.base}/storage/{fid}?sig=")
    status, data, _ = await api.call("GET", headers["Location"], auth=False)
    assert status == 200 and data == fake.video_bytes(fid)
    status, data, _ = await api.call("GET", local)  # followed, as `curl -L` does
    assert status == 200 and data == fake.video_bytes(fid)
    status, _, _ = await api.call("GET", f"{api.base}/storage/{fid}?sig=forged", auth=False)
    assert status == 403


async def test_gemini_list_operations_names_and_done_only(served: Any) -> None:
    fake = veo(list_page_size=3, processing_s=0.0)
    api: Http = await served(fake)
    names = [(await create(api, {"instances": [{"prompt": f"n{n}"}]}))[1]["name"]
             for n in range(5)]
    fake.config.processing_s = 60.0
    _, running, _ = await create(api, {"instances": [{"prompt": "running"}]})
    seen: list[dict[str, Any]] = []
    url = f"/v1beta/models/{MODEL}/operations"
    while True:
        status, page, _ = await api.call("GET", url)
        assert status == 200
        seen += page["operations"]
        if "nextPageToken" not in page:
            break
        url = f"/v1beta/models/{MODEL}/operations?pageToken={page['nextPageToken']}"
    assert [o["name"] for o in seen] == [running["name"], *names[::-1]]
    assert seen[0] == {"name": running["name"]}
    assert all(o == {"name": o["name"], "done": True} for o in seen[1:])  # no request, no time
    status, page, _ = await api.call("GET", f"/v1beta/models/{DEFAULT_MODELS[1]}/operations")
    assert status == 200 and page == {"operations": []}
    assert fake.stats()["list_reads"] == 3


@pytest.mark.parametrize(("fault", "bills"), [
    ("ok", 1), ("lose_reply", 1), ("5xx_after", 1), ("5xx_before", 0), ("429", 0),
    ("hang", 1), ("hang_then_create", 1),
])
@pytest.mark.parametrize("which", ["gemini", "vertex"])
async def test_each_create_fault_bills_what_it_says(served: Any, which: str, fault: str,
                                                     bills: int) -> None:
    fake: FakeVeo | FakeVertex = veo(hang_s=2.0) if which == "gemini" else vertex(hang_s=2.0)
    api: Http = await served(fake)
    fake.script_creates([fault])
    body = {"instances": [{"prompt": f"{which} {fault}"}]}
    path = (f"/v1beta/models/{MODEL}:predictLongRunning" if which == "gemini"
            else f"/v1/{RESOURCE}:predictLongRunning")
    answer: tuple[int, Any, dict[str, str]] | None
    try:
        answer = await api.call("POST", path, json_body=body, timeout_s=0.4)
    except (TimeoutError, aiohttp.ClientError):
        answer = None
    gave_up = time.time()

    if fault == "ok":
        assert answer is not None and answer[0] == 200
    elif fault in ("lose_reply", "hang", "hang_then_create"):
        assert answer is None
    elif fault == "5xx_after":
        assert answer is not None and answer[0] in (500, 502, 503, 504)
    elif fault == "5xx_before":
        assert answer is not None and answer[0] in (500, 503)
    else:
        assert answer is not None and answer[0] == 429
        assert "Retry-After" not in answer[2]
        assert answer[1]["error"]["status"] == "RESOURCE_EXHAUSTED"
        assert answer[1]["error"]["details"] == [
            {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "30s"}]
    if answer is not None and answer[0] in (500, 503):
        expected = {500: "INTERNAL", 503: "UNAVAILABLE"}[answer[0]]
        assert answer[1]["error"]["status"] == expected
    if answer is not None and answer[0] == 502:
        assert b"502" in answer[1] and answer[2]["Content-Type"].startswith("text/html")

    model_body = (MODEL, canonical(body))
    await until(lambda: fake.created_bodies()[model_body] == bills)
    if fault == "hang_then_create":  # created by a server that went on after the client left
        [op] = fake.operations.values()
        assert op.created >= gave_up
    stats = fake.stats()
    assert stats["creates"] == bills and stats["create_requests"] == 1
    if fault != "ok":
        assert stats[f"fault_{fault}"] == 1


async def test_fault_rates_status_faults_and_latency(served: Any) -> None:
    fake = veo(create_fault_rates={"5xx_before": 1.0}, status_5xx=1.0)
    api: Http = await served(fake)
    status, _, _ = await create(api)
    assert status in (500, 503) and not fake.created_bodies()
    fake.config.create_fault_rates = {}
    _, created, _ = await create(api)
    status, body, _ = await api.call("GET", f"/v1beta/{created['name']}")
    assert status in (500, 503) and body["error"]["code"] == status
    fake.config.status_5xx, fake.config.status_429 = 0.0, 1.0
    status, body, headers = await api.call("GET", f"/v1beta/{created['name']}")
    assert status == 429 and "Retry-After" not in headers
    fake.config.status_429, fake.config.retry_delay_s = 0.0, 7
    fake.script_creates(["429"])
    _, body, _ = await create(api)
    assert body["error"]["details"][0]["retryDelay"] == "7s"

    fake.config.latency_s = 5.0  # a client that gives up during latency bills nothing
    with pytest.raises(TimeoutError):
        await create(api, {"instances": [{"prompt": "slow"}]}, timeout_s=0.2)
    fake.config.latency_s = 0.0
    assert sum(fake.created_bodies().values()) == 1
    with pytest.raises(ValueError, match="unknown"):
        fake.script_creates(["explode"])


async def test_a_patient_client_gets_the_held_answer(served: Any) -> None:
    fake = veo(hang_s=0.2)
    api: Http = await served(fake)
    fake.script_creates(["hang", "hang_then_create"])
    for n in range(2):
        status, body, _ = await create(api, {"instances": [{"prompt": f"patient {n}"}]},
                                       timeout_s=WAIT_S)
        assert status == 200 and body["name"] in fake.operations
    assert fake.stats()["creates"] == 2


class Receiver:
    """A webhook endpoint on loopback: answers from a script, records every request."""

    def __init__(self) -> None:
        self.answers: list[int] = []
        self.requests: list[tuple[dict[str, str], bytes]] = []

    async def hook(self, request: web.Request) -> web.Response:
        self.requests.append(({k.lower(): v for k, v in request.headers.items()},
                              await request.read()))
        return web.Response(status=self.answers.pop(0) if self.answers else 204)


@pytest.fixture
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    rec = Receiver()
    app = web.Application()
    app.router.add_post("/hook", rec.hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield rec, f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    await runner.cleanup()


def hmac_ok(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """Our own Standard Webhooks check."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    want = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    return any(sig.partition(",")[2] == want for sig in headers["webhook-signature"].split())


def verify_jwt_with_jwks(token: str, jwks: dict[str, Any]) -> dict[str, Any]:
    """An independent RS256 check against a JWKS document."""
    head, payload, signature = token.split(".")

    def unb64(text: str) -> bytes:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))

    header = json.loads(unb64(head))
    assert header["alg"] == "RS256"
    [key] = [k for k in jwks["keys"] if k["kid"] == header["kid"]]
    public = rsa.RSAPublicNumbers(int.from_bytes(unb64(key["e"]), "big"),
                                  int.from_bytes(unb64(key["n"]), "big")).public_key()
    public.verify(unb64(signature), f"{head}.{payload}".encode(), padding.PKCS1v15(),
                  hashes.SHA256())
    claims: dict[str, Any] = json.loads(unb64(payload))
    return claims


async def test_registered_webhooks_are_hmac_signed_and_retried(
        served: Any, receiver: tuple[Receiver, str]) -> None:
    rec, hook_url = receiver
    rec.answers = [500]
    fake = veo(webhook_retry_delays_s=(0.05, 0.05), outcome_mix={"error": 1.0})
    api: Http = await served(fake)
    status, hook, _ = await api.call("POST", "/v1beta/webhooks", json_body={
        "uri": hook_url, "subscribed_events": ["video.generated"], "name": "main"})
    assert status == 200 and hook["new_signing_secret"].startswith("whsec_")
    assert hook["state"] == "enabled" and hook["subscribed_events"] == ["video.generated"]
    status, listed, _ = await api.call("GET", "/v1beta/webhooks")
    assert "new_signing_secret" not in listed["webhooks"][0]
    status, _, _ = await api.call("POST", "/v1beta/webhooks",
                                  json_body={"uri": hook_url, "subscribed_events": ["nope"]})
    assert status == 400
    fake.register_webhook(hook_url, ["batch.succeeded"])  # not subscribed to videos

    _, created, _ = await create(api)
    await until(lambda: fake.stats()["webhooks_sent"] == 1)
    assert [d.status for d in fake.webhook_deliveries] == [500, 204]
    assert len({d.webhook_id for d in fake.webhook_deliveries}) == 1
    for headers, body in rec.requests:
        assert hmac_ok(hook["new_signing_secret"], headers, body)
        event = Webhook(hook["new_signing_secret"]).verify(body, headers)
        assert event["type"] == "video.generated" and event["version"] == "v1"
        assert event["data"] == {"id": created["name"], "error_code": 13,
                                 "error_message": fake.config.error_message}

    status, _, _ = await api.call("DELETE", f"/v1beta/webhooks/{hook['id']}")
    assert status == 200
    status, _, _ = await api.call("GET", f"/v1beta/webhooks/{hook['id']}")
    assert status == 404
    await create(api, {"instances": [{"prompt": "after delete"}]})
    await until(lambda: all(op.done(time.time()) for op in fake.operations.values()))
    assert fake.stats()["webhook_attempts"] == 2  # nobody subscribed any more


async def test_dynamic_webhooks_are_jwt_signed_against_the_jwks(
        served: Any, receiver: tuple[Receiver, str]) -> None:
    rec, hook_url = receiver
    fake = veo()
    api: Http = await served(fake)
    fake.register_webhook(hook_url)  # replaced by the per-request config
    body = {**BODY, "webhookConfig": {"uris": [hook_url], "userMetadata": {"job": 7}}}
    _, created, _ = await create(api, body)
    await until(lambda: fake.stats()["webhooks_sent"] == 1)
    [(headers, raw)] = rec.requests
    status, jwks, _ = await api.call("GET", "/.well-known/jwks.json", auth=False)
    assert status == 200
    claims = verify_jwt_with_jwks(headers["webhook-signature"], jwks)
    assert claims["aud"] == hook_url and claims["iss"] == fake.config.webhook_jwt_issuer
    assert claims["exp"] > claims["iat"] and claims["webhook_id"] == headers["webhook-id"]
    digest = base64.urlsafe_b64encode(hashlib.sha256(raw).digest()).rstrip(b"=").decode()
    assert claims["body_sha256"] == digest
    assert json.loads(raw)["data"] == {"id": created["name"], "user_metadata": {"job": 7}}
    assert fake.webhook_deliveries[0].scheme == "jwt"
    status, _, _ = await create(api, {**BODY, "webhookConfig": {"uris": ["ftp://x"]}})
    assert status == 400


async def test_an_unreachable_webhook_is_retried_then_given_up(served: Any) -> None:
    fake = veo(webhook_retry_delays_s=(0.01, 0.01))
    api: Http = await served(fake)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}/hook"
    fake.register_webhook(dead)
    await create(api)
    await until(lambda: fake.stats()["webhooks_failed"] == 1)
    assert [d.attempt for d in fake.webhook_deliveries] == [1, 2, 3]
    assert all(d.status is None and d.error for d in fake.webhook_deliveries)


# ---- Vertex AI ----

def assertion(fake: FakeVertex, **claims: Any) -> str:
    """A JWT-bearer assertion signed by google-auth's own signer with the key file's key."""
    info = fake.credentials_info(token_uri="http://unused/token")
    now = int(time.time())
    payload = {"iss": info["client_email"], "aud": "https://oauth2.googleapis.com/token",
               "iat": now, "exp": now + 3600, "scope": SCOPE, **claims}
    payload = {k: v for k, v in payload.items() if v is not None}
    signer = crypt.RSASigner.from_service_account_info(info)
    return google_jwt.encode(signer, payload).decode()


async def grant(api: Http, jwt_text: str, grant_type: str = "urn:ietf:params:oauth:grant-type:"
                "jwt-bearer") -> tuple[int, Any, dict[str, str]]:
    return await api.call("POST", "/token", auth=False,
                          data={"grant_type": grant_type, "assertion": jwt_text})


async def test_vertex_token_endpoint_verifies_the_jwt_bearer_grant(served: Any) -> None:
    # a lifetime no slow machine reaches during the test; the expiry is made, not waited for
    fake = vertex(token_lifetime_s=600.5)
    api: Http = await served(fake)
    status, token, _ = await grant(api, assertion(fake))
    assert status == 200 and set(token) == {"access_token", "expires_in", "token_type"}
    assert token["token_type"] == "Bearer" and token["expires_in"] == 601  # whole seconds
    assert token["access_token"].startswith("ya29.")
    status, _, _ = await grant(api, assertion(fake, aud=f"{api.base}/token"))
    assert status == 200

    other = vertex()  # same email, another key: the signature does not verify
    refusals = [
        (await grant(api, assertion(other)), "invalid_grant", "Invalid JWT Signature."),
        (await grant(api, assertion(fake, iss="someone@else.iam.gserviceaccount.com")),
         "invalid_grant", "Invalid grant: account not found"),
        (await grant(api, assertion(fake, aud="https://example.com/token")),
         "invalid_grant", "Invalid JWT: Failed audience check."),
        (await grant(api, assertion(fake, iat=int(time.time()) - 7200,
                                    exp=int(time.time()) - 3600)), "invalid_grant", None),
        (await grant(api, assertion(fake, exp=int(time.time()) + 7200)), "invalid_grant", None),
        (await grant(api, assertion(fake, scope=None)), "invalid_scope", None),
        (await grant(api, assertion(fake), grant_type="client_credentials"),
         "unsupported_grant_type", None),
        (await grant(api, "not.a.jwt"), "invalid_grant", "Invalid JWT Signature."),
    ]
    for (status, body, _), error, description in refusals:
        assert status == 400 and body["error"] == error, body
        if description:
            assert body["error_description"] == description
    stats = fake.stats()
    assert stats["token_requests"] == 10 and stats["tokens_issued"] == 2
    assert stats["tokens_refused"] == 8

    # an issued token works until it expires, then answers ACCESS_TOKEN_EXPIRED
    bearer = {"Authorization": f"Bearer {token['access_token']}"}
    path = f"/v1/{RESOURCE}:fetchPredictOperation"
    status, body, _ = await api.call("POST", path, json_body={"operationName": "x"},
                                     headers=bearer)
    assert status == 400  # authenticated; the name is just wrong

    async def expired() -> bool:
        status, body, _ = await api.call("POST", path, json_body={"operationName": "x"},
                                         headers=bearer)
        return status == 401 and body["error"]["details"][0]["reason"] == "ACCESS_TOKEN_EXPIRED"
    fake.expire_tokens()
    assert await expired()

    fake.config.token_5xx = 1.0
    status, _, _ = await grant(api, assertion(fake))
    assert status == 503


async def test_vertex_api_auth_and_resource_refusals(served: Any) -> None:
    fake = vertex()
    api: Http = await served(fake)
    create_path = f"/v1/{RESOURCE}:predictLongRunning"
    cases = [
        ({}, 401, "UNAUTHENTICATED", "CREDENTIALS_MISSING"),
        ({"Authorization": "Bearer ya29.forged"}, 401, "UNAUTHENTICATED",
         "ACCESS_TOKEN_TYPE_UNSUPPORTED"),
        ({"Authorization": "Basic abc"}, 401, "UNAUTHENTICATED", "CREDENTIALS_MISSING"),
    ]
    for headers, code, status_text, reason in cases:
        status, body, _ = await api.call("POST", create_path, json_body=BODY, auth=False,
                                         headers=headers)
        assert status == code and body["error"]["status"] == status_text
        assert body["error"]["details"][0]["reason"] == reason
    status, body, _ = await api.call(
        "POST", create_path.replace(DEFAULT_PROJECT, "someone-else"), json_body=BODY)
    assert status == 403 and body["error"]["status"] == "PERMISSION_DENIED"
    status, body, _ = await api.call(
        "POST", create_path.replace(DEFAULT_LOCATION, "mars-north1"), json_body=BODY)
    assert status == 400 and body["error"]["status"] == "INVALID_ARGUMENT"
    status, body, _ = await api.call("POST", create_path.replace(MODEL, "veo-unknown"),
                                     json_body=BODY)
    assert status == 404 and "Publisher Model" in body["error"]["message"]
    status, body, _ = await api.call("POST", create_path, json_body={
        **BODY, "parameters": {"storageUri": "s3://bucket/x"}})
    assert status == 400
    assert fake.stats()["creates"] == 0 and fake.stats()["unauthorized"] == 3


async def test_vertex_fetch_predict_operation_inline_and_gcs(served: Any) -> None:
    fake = vertex(file_bytes=3000)
    api: Http = await served(fake)
    body = {"instances": [{"prompt": "inline"}], "parameters": {"sampleCount": 2},
            "labels": {"job": "j"}}
    status, created, _ = await api.call("POST", f"/v1/{RESOURCE}:predictLongRunning",
                                        json_body=body)
    assert status == 200 and set(created) == {"name"}
    name = created["name"]
    assert re.fullmatch(rf"{RESOURCE}/operations/[0-9a-f-]{{36}}", name)
    fetch = f"/v1/{RESOURCE}:fetchPredictOperation"

    status, running, _ = await api.call("POST", fetch, json_body={"operationName": name})
    assert status == 200 and running == {"name": name}
    status, body_404, _ = await api.call("GET", f"/v1/{name}")  # vercel/ai#12003
    assert status == 404 and body_404["error"]["status"] == "NOT_FOUND"

    async def done_view() -> dict[str, Any] | None:
        _, view, _ = await api.call("POST", fetch, json_body={"operationName": name})
        return view if view.get("done") else None
    done: dict[str, Any] = await eventually(done_view)
    response = done["response"]
    assert response["@type"] == ("type.googleapis.com/cloud.ai.large_models.vision."
                                 "GenerateVideoResponse")
    op_id = fake.operation(name).id
    assert [v["mimeType"] for v in response["videos"]] == ["video/mp4", "video/mp4"]
    for index, video in enumerate(response["videos"]):
        assert set(video) == {"bytesBase64Encoded", "mimeType"}
        assert base64.b64decode(video["bytesBase64Encoded"]) == fake.video_bytes(
            f"{op_id}/sample_{index}")
    assert fake.created_bodies() == {(MODEL, canonical(body)): 1}

    gcs_body = {"instances": [{"prompt": "gcs"}], "parameters": {"storageUri": "gs://b/out/"}}
    _, created, _ = await api.call("POST", f"/v1beta1/{RESOURCE}:predictLongRunning",
                                   json_body=gcs_body)
    name = created["name"]

    async def gcs_done() -> dict[str, Any] | None:
        _, view, _ = await api.call("POST", f"/v1beta1/{RESOURCE}:fetchPredictOperation",
                                    json_body={"operationName": name})
        return view if view.get("done") else None
    done = await eventually(gcs_done)
    op_id = fake.operation(name).id
    [video] = done["response"]["videos"]
    assert video == {"gcsUri": f"gs://b/out/{op_id}/sample_0.mp4", "mimeType": "video/mp4"}
    assert fake.gcs_object(video["gcsUri"]) == fake.video_bytes(f"{op_id}/sample_0")
    with pytest.raises(KeyError):
        fake.gcs_object("gs://b/out/other.mp4")

    other_model = fetch.replace(MODEL, DEFAULT_MODELS[1])
    status, body, _ = await api.call("POST", other_model, json_body={"operationName": name})
    assert status == 400
    status, body, _ = await api.call("POST", fetch, json_body={
        "operationName": f"{RESOURCE}/operations/00000000-0000-4000-8000-000000000000"})
    assert status == 404 and body["error"]["status"] == "NOT_FOUND"


async def test_vertex_error_filtered_and_status_faults(served: Any) -> None:
    fake = vertex(outcome_mix={"error": 1.0})
    api: Http = await served(fake)
    fetch = f"/v1/{RESOURCE}:fetchPredictOperation"
    _, created, _ = await api.call("POST", f"/v1/{RESOURCE}:predictLongRunning", json_body=BODY)

    async def done(name: str) -> dict[str, Any]:
        async def check() -> dict[str, Any] | None:
            _, view, _ = await api.call("POST", fetch, json_body={"operationName": name})
            return view if view.get("done") else None
        result: dict[str, Any] = await eventually(check)
        return result

    assert (await done(created["name"]))["error"] == {"code": 13,
                                                      "message": fake.config.error_message}
    fake.config.outcome_mix = {"filtered": 1.0}
    _, created, _ = await api.call("POST", f"/v1/{RESOURCE}:predictLongRunning", json_body=BODY)
    response = (await done(created["name"]))["response"]
    assert "videos" not in response and response["raiMediaFilteredCount"] == 1
    assert response["raiMediaFilteredReasons"] == fake.config.filtered_reasons

    fake.config.status_5xx = 1.0
    status, body, _ = await api.call("POST", fetch, json_body={"operationName": created["name"]})
    assert status in (500, 503) and body["error"]["code"] == status
