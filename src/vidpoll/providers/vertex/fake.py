"""A stand-in for Google Veo on Vertex AI ({location}-aiplatform.googleapis.com) and for the
OAuth2 token endpoint a service account uses, served together by aiohttp on loopback.

Written from Google's documentation and from what the official SDKs (google-genai 2.34,
google-auth 2.x) send and parse, not from vidpoll's client. Tags: [D] documented (docs or the
SDKs' code), [O] observed in public transcripts or third-party material, [A] an assumption.
Operations, outcomes, faults, the error envelope and billing are shared with the Gemini fake
(`vidpoll.providers.veo.fake`), whose docstring describes them.

Sources
- VREF: cloud.google.com/vertex-ai/generative-ai/docs/model-reference/veo-video-generation
  (`predictLongRunning`, `fetchPredictOperation` with `{"operationName"}`, `storageUri`, the
  response's `videos[]` with `gcsUri` or `bytesBase64Encoded` and `mimeType`,
  `raiMediaFilteredCount` / `raiMediaFilteredReasons`, the operation name's form).
- SDK: google-genai 2.34.0 — `models.py` (`_GenerateVideosConfig_to_vertex`: `sampleCount`,
  `storageUri`, `labels`; `_GenerateVideosOperation_from_vertex`, `_Video_from_vertex`),
  `operations.py` (`get` POSTs `{resource}:fetchPredictOperation`, the resource being the
  name before `/operations/`), `_api_client.py` (`Authorization: Bearer` from the
  credentials, refreshed when expired; the default api_version is `v1beta1`).
- AUTH: google-auth `oauth2/service_account.py` and `oauth2/_client.py` (the JWT-bearer
  grant: RS256 assertion with `iss` = client_email, `aud` = https://oauth2.googleapis.com/token
  whatever the key file's token_uri, `scope`, `iat`, `exp` = iat + 3600, header `kid` =
  private_key_id; form-encoded POST to token_uri; the answer's `access_token`, `expires_in`);
  developers.google.com/identity/protocols/oauth2/service-account (the grant and its errors).
- PROV: PROVIDERS.md (project notes) section 2b; vercel/ai#12003 (a GET of the
  operation name answers 404).

Behaviour and its basis
- `POST /{v1|v1beta1}/projects/{p}/locations/{l}/publishers/google/models/{m}:predictLongRunning`
  [D VREF, SDK] answers `{"name": "projects/{p}/locations/{l}/publishers/google/models/{m}/
  operations/{uuid}"}` [D VREF]. Body `{"instances": [...], "parameters": {"sampleCount"?,
  "storageUri"?, ...}, "labels"?}` [D SDK]; a `storageUri` not starting `gs://` answers 400
  [A]. Unknown model: 404 NOT_FOUND "Publisher Model `...` not found." [O]; a project outside
  `projects`: 403 PERMISSION_DENIED (IAM_PERMISSION_DENIED) [O]; a location outside
  `locations`: 400 INVALID_ARGUMENT [A].
- `POST .../models/{m}:fetchPredictOperation` with `{"operationName": name}` [D VREF, SDK]:
  `{"name"}` while running, then `{"name", "done": true, "response": {"@type":
  ".../GenerateVideoResponse", "videos": [...], "raiMediaFilteredCount"?,
  "raiMediaFilteredReasons"?}}` [D VREF; the @type is O] or `{"name", "done": true, "error":
  {"code", "message"}}`. Videos are `{"gcsUri": "{storageUri}/{op id}/sample_{i}.mp4",
  "mimeType": "video/mp4"}` when `storageUri` was set [D VREF; the object path is O], else
  `{"bytesBase64Encoded", "mimeType"}` [D VREF] (`file_bytes` long, default 64 KiB); with no
  video left (filtered) `videos` is omitted [A: omitted rather than empty]. An
  operation of another model's resource path: 400 INVALID_ARGUMENT [A]; unknown: 404
  NOT_FOUND [A: message]. `GET` on an operation name answers 404 NOT_FOUND [D PROV: #12003;
  the JSON body is A]. No GCS server: written objects are readable via `gcs_object(uri)`.
- Auth `Authorization: Bearer <token>` [D VREF]. Missing: 401 UNAUTHENTICATED (reason
  CREDENTIALS_MISSING); unknown: 401 (ACCESS_TOKEN_TYPE_UNSUPPORTED); expired: 401
  (ACCESS_TOKEN_EXPIRED) [O: Google's bodies]. Tokens live `token_lifetime_s` [A: Google's is
  3600 s] and are reported in `expires_in`.
- `POST /token` (form) [D AUTH]: `grant_type=urn:ietf:params:oauth:grant-type:jwt-bearer` and
  `assertion=<JWT>`; the RS256 signature must verify against the service account's public key
  (by `kid`), `iss` must be its email, `aud` Google's token endpoint or this fake's /token,
  `exp` - `iat` <= 3600 and now within [iat, exp] give or take `clock_skew_s`, `scope`
  non-empty. Errors are OAuth2 JSON `{"error", "error_description"}` with 400:
  unsupported_grant_type, invalid_grant ("Invalid JWT Signature.", "Invalid grant: account
  not found", "Invalid JWT: Token must be a short-lived token (60 minutes) and in a reasonable
  timeframe...", "Invalid JWT: Failed audience check."), invalid_scope [O: Google's texts].
  Answer `{"access_token": "ya29.c.<random>", "expires_in", "token_type": "Bearer"}` [D AUTH].
  `token_5xx` makes the endpoint answer 503 [A].
- Faults as in the Gemini fake: create `lose_reply`, `5xx_after`, `5xx_before`, `hang`,
  `hang_then_create`, `429` (RESOURCE_EXHAUSTED with RetryInfo, A for Vertex); reads
  `status_5xx`, `status_429`; `latency_s`.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import secrets
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from aiohttp import web
from cryptography.hazmat.primitives import serialization

from vidpoll.providers.veo.fake import (
    DEFAULT_MODELS,
    FakeOperation,
    GoogleFakeBase,
    GoogleFakeConfig,
    error_info,
    google_error,
    jwt_decode,
    new_rsa_key,
    serve_app,
)

DEFAULT_PROJECT = "vidpoll-fake-project"
DEFAULT_LOCATION = "us-central1"
DEFAULT_SA_EMAIL = f"vidpoll-fake@{DEFAULT_PROJECT}.iam.gserviceaccount.com"
GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"
JWT_BEARER = "urn:ietf:params:oauth:grant-type:jwt-bearer"
SCOPE = "https://www.googleapis.com/auth/cloud-platform"
VERTEX_RESPONSE_TYPE = "type.googleapis.com/cloud.ai.large_models.vision.GenerateVideoResponse"
MODEL_PATH = ("/{ver:v1|v1beta1}/projects/{project:[^/]+}/locations/{location:[^/]+}"
              "/publishers/google/models/{model:[^/:]+}")
_AUTH_HELP = ("Expected OAuth 2 access token, login cookie or other valid authentication "
              "credential. See https://developers.google.com/identity/sign-in/web/"
              "devconsole-project.")

__all__ = ["DEFAULT_MODELS", "FakeVertex", "VertexFakeConfig", "start_fake_vertex"]


@dataclass
class VertexFakeConfig(GoogleFakeConfig):
    """The Vertex fake's configuration; mutable while it runs."""

    projects: list[str] = field(default_factory=lambda: [DEFAULT_PROJECT])
    locations: list[str] = field(default_factory=lambda: [DEFAULT_LOCATION])
    service_account_email: str = DEFAULT_SA_EMAIL
    token_lifetime_s: float = 3600.0
    clock_skew_s: float = 300.0
    token_5xx: float = 0.0


class FakeVertex(GoogleFakeBase):
    """The Vertex AI fake's state and handlers; serve it with start_fake_vertex()."""

    quota_message: ClassVar[str] = (
        "Quota exceeded for aiplatform.googleapis.com/online_prediction_requests_per_base_model "
        "with base model: veo. Please submit a quota increase request.")

    def __init__(self, config: VertexFakeConfig | None = None) -> None:
        self.config = config or VertexFakeConfig()
        super().__init__(self.config)
        self.service_account_key = new_rsa_key()
        self.service_account_key_id = secrets.token_hex(20)
        self.tokens: dict[str, float] = {}
        """Access token -> when it expires (unix seconds)."""

    # ---- credentials (no HTTP) ----

    def credentials_info(self, token_uri: str | None = None) -> dict[str, str]:
        """A service-account key file's content; token_uri defaults to this fake's /token
        (the fake must have been started, or pass it)."""
        if token_uri is None:
            if self.base_url is None:
                raise RuntimeError("start the fake first, or pass token_uri")
            token_uri = f"{self.base_url}/token"
        pem = self.service_account_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption()).decode()
        email = self.config.service_account_email
        return {
            "type": "service_account", "project_id": self.config.projects[0],
            "private_key_id": self.service_account_key_id, "private_key": pem,
            "client_email": email, "client_id": "100000000000000000001",
            "auth_uri": "https://accounts.google.com/o/oauth2/auth", "token_uri": token_uri,
            "auth_provider_x509_cert_url": "https://www.googleapis.com/oauth2/v1/certs",
            "client_x509_cert_url": "https://www.googleapis.com/robot/v1/metadata/x509/"
                                    + email.replace("@", "%40"),
            "universe_domain": "googleapis.com"}

    def write_credentials(self, path: str | Path, token_uri: str | None = None) -> Path:
        """Write a service-account key file (JSON) whose token_uri is this fake's /token."""
        target = Path(path)
        target.write_text(json.dumps(self.credentials_info(token_uri), indent=2))
        target.chmod(0o600)
        return target

    def mint_token(self, lifetime_s: float | None = None) -> str:
        """An access token as /token would issue (for tests that skip the grant)."""
        token = "ya29.c.fake-" + secrets.token_urlsafe(32)
        lifetime = self.config.token_lifetime_s if lifetime_s is None else lifetime_s
        self.tokens[token] = time.time() + lifetime
        return token

    def expire_tokens(self) -> None:
        """Make every issued token expired from now on."""
        now = time.time()
        for token in self.tokens:
            self.tokens[token] = min(self.tokens[token], now)

    def gcs_object(self, uri: str) -> bytes:
        """The bytes of a video the fake wrote to GCS (KeyError if none is there yet)."""
        for op in self.operations.values():
            if op.storage_uri and op.done(time.time()):
                for index in range(op.samples):
                    if self._gcs_uri(op, index) == uri:
                        return self.video_bytes(f"{op.id}/sample_{index}")
        raise KeyError(uri)

    def view(self, operation_name: str) -> dict[str, Any]:
        """What fetchPredictOperation would answer now."""
        return self._body(self.operations[operation_name], time.time())

    def app(self) -> web.Application:
        app = web.Application()
        r = app.router
        r.add_post("/token", self.token)
        r.add_post(MODEL_PATH + ":predictLongRunning", self.create)
        r.add_post(MODEL_PATH + ":fetchPredictOperation", self.fetch_operation)
        r.add_get(MODEL_PATH + "/operations/{opid:[^/:]+}", self.get_operation)
        app.on_cleanup.append(self._cleanup)
        return app

    # ---- the token endpoint ----

    def _oauth_error(self, error: str, description: str, status: int = 400) -> web.Response:
        self._stats["tokens_refused"] += 1
        return web.json_response({"error": error, "error_description": description},
                                 status=status)

    async def token(self, request: web.Request) -> web.StreamResponse:
        """POST /token: the JWT-bearer grant of a service account."""
        self._stats["token_requests"] += 1
        if self.config.latency_s > 0:
            await asyncio.sleep(self.config.latency_s)
        if self._chance(self.config.token_5xx):
            self._stats["fault_token_5xx"] += 1
            return web.json_response({"error": "internal_failure",
                                      "error_description": "Backend Error"}, status=503)
        form = await request.post()
        raw_grant = form.get("grant_type")
        grant_type = raw_grant if isinstance(raw_grant, str) else ""
        if grant_type != JWT_BEARER:
            return self._oauth_error("unsupported_grant_type",
                                     f"Invalid grant_type: {grant_type}")
        assertion = form.get("assertion")
        if not isinstance(assertion, str):
            return self._oauth_error("invalid_request", "Missing required parameter: assertion")
        try:
            _, claims = jwt_decode(assertion, {
                self.service_account_key_id: self.service_account_key.public_key()})
        except ValueError:
            return self._oauth_error("invalid_grant", "Invalid JWT Signature.")
        if claims.get("iss") != self.config.service_account_email:
            return self._oauth_error("invalid_grant", "Invalid grant: account not found")
        if claims.get("aud") not in (GOOGLE_TOKEN_AUDIENCE, f"{self._origin(request)}/token"):
            return self._oauth_error("invalid_grant", "Invalid JWT: Failed audience check.")
        iat, exp = claims.get("iat"), claims.get("exp")
        now, skew = time.time(), self.config.clock_skew_s
        if not (isinstance(iat, int | float) and isinstance(exp, int | float)
                and 0 < exp - iat <= 3600 and iat - skew <= now <= exp + skew):
            return self._oauth_error(
                "invalid_grant",
                "Invalid JWT: Token must be a short-lived token (60 minutes) and in a "
                "reasonable timeframe. Check your iat and exp values in the JWT claim.")
        if not (isinstance(claims.get("scope"), str) and claims["scope"].strip()):
            return self._oauth_error("invalid_scope",
                                     "Invalid OAuth scope or ID token audience provided.")
        token = self.mint_token()
        self._stats["tokens_issued"] += 1
        return web.json_response({"access_token": token,
                                  "expires_in": math.ceil(self.config.token_lifetime_s),
                                  "token_type": "Bearer"})

    # ---- API auth and routing ----

    def _unauthenticated(self, message: str, reason: str) -> web.Response:
        self._stats["unauthorized"] += 1
        return google_error(401, "UNAUTHENTICATED", message, [
            error_info(reason, method="google.cloud.aiplatform.v1.PredictionService",
                       service="aiplatform.googleapis.com")])

    def _authorized(self, request: web.Request) -> web.Response | None:
        scheme, _, token = request.headers.get("Authorization", "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return self._unauthenticated(
                "Request is missing required authentication credential. " + _AUTH_HELP,
                "CREDENTIALS_MISSING")
        expires = self.tokens.get(token.strip())
        if expires is None:
            return self._unauthenticated(
                "Request had invalid authentication credentials. " + _AUTH_HELP,
                "ACCESS_TOKEN_TYPE_UNSUPPORTED")
        if time.time() >= expires:
            return self._unauthenticated(
                "Request had invalid authentication credentials. " + _AUTH_HELP,
                "ACCESS_TOKEN_EXPIRED")
        return None

    async def _enter(self, request: web.Request) -> tuple[web.Response | None, str]:
        """Latency, auth, project, location and model checks; (early answer, resource)."""
        if self.config.latency_s > 0:
            await asyncio.sleep(self.config.latency_s)
        denied = self._authorized(request)
        m = request.match_info
        resource = (f"projects/{m['project']}/locations/{m['location']}"
                    f"/publishers/google/models/{m['model']}")
        if denied is not None:
            return denied, resource
        if m["project"] not in self.config.projects:
            return google_error(
                403, "PERMISSION_DENIED",
                f"Permission 'aiplatform.endpoints.predict' denied on resource "
                f"'//aiplatform.googleapis.com/{resource}' (or it may not exist).",
                [error_info("IAM_PERMISSION_DENIED", domain="aiplatform.googleapis.com",
                            permission="aiplatform.endpoints.predict")]), resource
        if m["location"] not in self.config.locations:
            return google_error(400, "INVALID_ARGUMENT",
                                f"Location {m['location']} is not supported."), resource
        if m["model"] not in self.config.models:
            return google_error(404, "NOT_FOUND",
                                f"Publisher Model `{resource}` not found."), resource
        return None, resource

    # ---- the operation object ----

    @staticmethod
    def _gcs_uri(op: FakeOperation, index: int) -> str:
        return f"{str(op.storage_uri).rstrip('/')}/{op.id}/sample_{index}.mp4"

    def _body(self, op: FakeOperation, now: float) -> dict[str, Any]:
        body: dict[str, Any] = {"name": op.name}
        if not op.done(now):
            return body
        body["done"] = True
        if op.outcome == "error":
            body["error"] = {"code": op.error_code, "message": op.error_message}
            return body
        videos: list[dict[str, Any]] = []
        for index in range(op.samples):
            if op.storage_uri:
                videos.append({"gcsUri": self._gcs_uri(op, index), "mimeType": "video/mp4"})
            else:
                data = self.video_bytes(f"{op.id}/sample_{index}")
                videos.append({"bytesBase64Encoded": _b64(data), "mimeType": "video/mp4"})
        response: dict[str, Any] = {"@type": VERTEX_RESPONSE_TYPE}
        if videos:
            response["videos"] = videos
        if op.filtered:
            response["raiMediaFilteredCount"] = op.filtered
            response["raiMediaFilteredReasons"] = list(op.filtered_reasons)
        body["response"] = response
        return body

    # ---- handlers ----

    async def create(self, request: web.Request) -> web.StreamResponse:
        """POST .../models/{model}:predictLongRunning."""
        self._stats["create_requests"] += 1
        early, resource = await self._enter(request)
        if early is not None:
            return early
        try:
            body = await request.json()
        except ValueError:
            return google_error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
        problem = self._instances_problem(body)
        if problem is not None:
            return google_error(400, "INVALID_ARGUMENT", problem)
        requested = self._requested(body, self.config.max_samples)
        if isinstance(requested, str):
            return google_error(400, "INVALID_ARGUMENT", requested)
        storage = body.get("parameters", {}).get("storageUri")
        if storage is not None and not (isinstance(storage, str)
                                        and storage.startswith("gs://") and len(storage) > 5):
            return google_error(400, "INVALID_ARGUMENT",
                                "storageUri must be a Cloud Storage URI (gs://bucket/path).")
        model = request.match_info["model"]

        def record() -> FakeOperation:
            op_id = str(uuid.UUID(int=self.rng.getrandbits(128), version=4))
            op = self._new_operation(op_id=op_id, name=f"{resource}/operations/{op_id}",
                                     model=model, body=body, requested=requested)
            op.storage_uri = storage
            return self._store(op)

        return await self._create_with_faults(
            request, record, lambda op: web.json_response({"name": op.name}))

    async def fetch_operation(self, request: web.Request) -> web.StreamResponse:
        """POST .../models/{model}:fetchPredictOperation {"operationName": name}."""
        self._stats["status_reads"] += 1
        early, resource = await self._enter(request)
        if early is not None:
            return early
        fault = self._read_fault()
        if fault is not None:
            return fault
        try:
            payload = await request.json()
        except ValueError:
            return google_error(400, "INVALID_ARGUMENT", "Invalid JSON payload received.")
        name = payload.get("operationName") if isinstance(payload, dict) else None
        if not isinstance(name, str) or "/operations/" not in name:
            return google_error(400, "INVALID_ARGUMENT",
                                "operationName must be a long-running operation name.")
        if name.rpartition("/operations/")[0] != resource:
            return google_error(400, "INVALID_ARGUMENT",
                                f"Operation {name} does not belong to {resource}.")
        op = self.operations.get(name)
        if op is None:
            return google_error(404, "NOT_FOUND", f"Operation {name} not found.")
        return web.json_response(self._body(op, time.time()))

    async def get_operation(self, request: web.Request) -> web.StreamResponse:
        """GET of an operation name: 404, as Vertex answers (vercel/ai#12003)."""
        self._stats["status_reads"] += 1
        return google_error(404, "NOT_FOUND", "The requested URL was not found on this server.")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


async def start_fake_vertex(fake: FakeVertex, host: str = "127.0.0.1",
                            port: int = 0) -> tuple[web.AppRunner, str]:
    """Serve `fake` (API and /token) on a loopback port; returns the runner and base URL."""
    runner, url = await serve_app(fake.app(), host, port)
    fake.base_url = url
    return runner, url
