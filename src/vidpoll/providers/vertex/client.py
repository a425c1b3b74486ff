"""The Veo client on Vertex AI: Veo's operations over Vertex's paths, with OAuth2 access tokens
minted from a service-account key file (google-auth).

A create is `POST {base}/{version}/projects/{project}/locations/{location}/publishers/google/
models/{model}:predictLongRunning` with the request body as `submit` gave it; its answer is
an operation whose `name` (`projects/{p}/locations/{l}/publishers/google/models/{model}/
operations/{id}`) is the job. A read is `POST …/models/{model}:fetchPredictOperation` with
`{"operationName": name}` (a GET of the name answers 404), the model taken from the name, each
of its segments checked; a name of another project or location than the account's is refused
unsent.

Auth: the account's `api_key` is the PATH of the key file (`Provider.key_setting =
"credentials_file"`). A token is minted with google-auth in a thread (one blocking requests
call an hour), one mint at a time; it is replaced in the background a few minutes before it
expires, while still sent; a 401 drops it, so the next call mints another (a call waits at
most MINT_WAIT_S for one). It goes as `Authorization: Bearer` on each call (never a session
header), only to the base URL's origin, is never logged, and is scrubbed from every body and
detail as the key is. A key file that cannot be read or parsed, or a token endpoint that
refuses or cannot be reached, answers every call a 401 naming the file (never its contents),
unsent: the core pauses the account as for a refused key (a create stays queued).

Videos that come back as bytes (no `storageUri`) are never stored: a status answer is read up
to MAX_INLINE_BODY and each `bytesBase64Encoded` replaced with `{"inlineBytes": size,
"sha256": hex}` before the body is returned; the rules list such a video as `inline:{n}`,
and `inline_media` reads the operation again for its bytes when the download runs.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import collections
import datetime as dt
import hashlib
import json
import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from yarl import URL

from vidpoll.media import shown_url
from vidpoll.models import HttpAnswer
from vidpoll.providers.base import ProviderOptions
from vidpoll.providers.http import MAX_BODY_BYTES, SCRUB_INLINE_BYTES, JsonApiClient, scrub_body
from vidpoll.providers.veo.client import refused_unsent, retry_delay
from vidpoll.providers.veo.rules import RULES, VeoRules, samples

if TYPE_CHECKING:
    from google.oauth2.service_account import Credentials

    from vidpoll.providers.base import Client

DEFAULT_API_VERSION = "v1"
DEFAULT_LOCATION = "us-central1"
SCOPES = ("https://www.googleapis.com/auth/cloud-platform",)
MAX_INLINE_BODY = 256 << 20
"""The longest status answer read (its videos inline, base64): the bytes are dropped from it
before it is returned, so what is stored stays small."""
TOKEN_MARGIN_S = 300.0
"""A token is replaced this long before it expires (at most a quarter of its life), in the
background while it is still sent."""
TOKEN_SAFETY_S = 30.0
"""A token is no longer sent this long before it expires (at most a tenth of its life)."""
MINT_WAIT_S = 5.0
"""The longest a call waits for a token (the submitter leaves a create's lease room for one
HTTP timeout plus its margin, 10 s by default)."""
DEFAULT_TOKEN_LIFE_S = 3600.0
MIN_TOKEN_LIFE_S = 1.0
"""A token is kept at least this long (a clock that makes it look expired at once would
otherwise mint one per call; a refused one is replaced after the 401 anyway)."""
RECENT_TOKENS = 4
"""Tokens scrubbed from every answer: the current one and those before it (a call in flight
during a refresh was sent with the old one)."""
_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._~-]{0,255}")
_NAME_FORM = "projects/P/locations/L/publishers/google/models/MODEL/operations/ID"
_FIXED = {0: "projects", 2: "locations", 4: "publishers", 5: "google", 6: "models",
          8: "operations"}
_MISSING_FIELDS = "Service account info was not in the expected format"
_NO_OPTIONS = ProviderOptions()


class _CredentialsProblem(Exception):
    """Why no token could be minted, in words that never quote the key file's contents."""


def parse_operation(name: str) -> tuple[str, str, str, str] | None:
    """(project, location, model, id) of a Vertex operation name, each segment checked
    (letters, digits, `.`, `_`, `~`, `-`; the model as `submit --model` takes one); None when
    the name is not one."""
    parts = name.split("/")
    if len(parts) != 10 or any(parts[i] != word for i, word in _FIXED.items()):
        return None
    if not all(_SEGMENT.fullmatch(p) for p in parts) or RULES.model_problem(parts[7]):
        return None
    return parts[1], parts[3], parts[7], parts[9]


def strip_inline(value: Any, keep: int | None = None) -> tuple[Any, bytes | None]:
    """`value` (a parsed operation) with every video's `bytesBase64Encoded` replaced with its
    decoded size and sha256 (`inlineProblem` when it is not base64), and the decoded bytes of
    video `keep` (as `samples` counts them), if asked for and there."""
    kept: bytes | None = None
    wanted = None
    if keep is not None and isinstance(value, dict):
        listed = samples(value.get("response"))
        wanted = listed[keep] if 0 <= keep < len(listed) else None
    stack: list[Any] = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, list):
            stack.extend(n for n in node if isinstance(n, dict | list))
            continue
        if not isinstance(node, dict):
            continue
        encoded = node.get("bytesBase64Encoded")
        if isinstance(encoded, str) and encoded:
            try:
                data = base64.b64decode(encoded, validate=False)
            except (binascii.Error, ValueError):
                del node["bytesBase64Encoded"]
                node["inlineProblem"] = "bytesBase64Encoded was not valid base64"
            else:
                if node is wanted:
                    kept = data
                del node["bytesBase64Encoded"]
                node["inlineBytes"] = len(data)
                node["sha256"] = hashlib.sha256(data).hexdigest()
                del data
        stack.extend(v for v in node.values() if isinstance(v, dict | list))
    return value, kept


def _inline_shaper(keep: int | None, holder: list[bytes]) -> Any:
    """A `prepare` for JsonApiClient._call: a 2xx JSON body with its inline videos dropped
    (the one at `keep` put in `holder`); any other body as it came."""
    def prepare(body: bytes, status: int) -> bytes:
        if not 200 <= status < 300 or b"bytesBase64Encoded" not in body:
            return body
        try:
            value = json.loads(body)
        except (ValueError, RecursionError):
            return body
        value, kept = strip_inline(value, keep)
        if kept is not None:
            holder.append(kept)
        return json.dumps(value).encode()
    return prepare


def _load_credentials(path: str) -> Credentials:
    from google.oauth2 import service_account

    try:
        credentials: Credentials = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
            path, scopes=list(SCOPES))
        return credentials
    except OSError as exc:
        raise _CredentialsProblem(f"the service-account key file {path} cannot be read "
                                  f"({exc.strerror or type(exc).__name__})") from None
    except ValueError as exc:
        # google-auth's "missing fields client_email, token_uri" names fields, never values;
        # any other message (a key that does not parse) is not shown
        said = str(exc)
        why = (said[:200] if said.startswith(_MISSING_FIELDS)
               else f"{type(exc).__name__}: not a service-account key file (JSON with "
                    "type, client_email, private_key and token_uri)")
        raise _CredentialsProblem(f"the service-account key file {path} cannot be used: "
                                  f"{why}") from None
    except Exception as exc:  # google-auth's own errors (a malformed key): never its text
        raise _CredentialsProblem(f"the service-account key file {path} cannot be used "
                                  f"({type(exc).__name__})") from None


def _mint(path: str, timeout_s: float) -> tuple[str, float]:
    """A fresh access token from the key file at `path`, and its life in seconds. Blocking
    (run in a thread); raises _CredentialsProblem."""
    import google.auth.exceptions
    import requests
    from google.auth.transport.requests import Request

    class Bounded(Request):
        """google-auth's transport with this client's timeout (its own default is 120 s)."""

        def __call__(self, url: str, method: str = "GET", body: Any = None,
                     headers: Mapping[str, str] | None = None, timeout: Any = None,
                     **kwargs: Any) -> Any:
            return super().__call__(  # type: ignore[no-untyped-call]
                url, method=method, body=body, headers=headers, timeout=timeout_s, **kwargs)

    credentials = _load_credentials(path)
    session = requests.Session()
    try:
        credentials.refresh(Bounded(session=session))  # type: ignore[no-untyped-call]
    except google.auth.exceptions.RefreshError as exc:
        # ("invalid_grant: Invalid JWT Signature.", {...}): the endpoint's own words
        said = str(exc.args[0]) if exc.args else ""
        raise _CredentialsProblem(f"the token endpoint refused the key of {path}"
                                  + (f" ({said[:200]})" if said else "")) from None
    except (google.auth.exceptions.GoogleAuthError, requests.RequestException, OSError,
            ValueError) as exc:
        raise _CredentialsProblem(f"no token for the key of {path}: the token endpoint could "
                                  f"not be reached ({type(exc).__name__})") from None
    except Exception as exc:  # anything else google-auth raises: never its text (a key?)
        raise _CredentialsProblem(f"no token for the key of {path} ({type(exc).__name__})"
                                  ) from None
    finally:
        session.close()
    token = credentials.token
    if not isinstance(token, str) or not token:
        raise _CredentialsProblem(f"the token endpoint gave no access token for {path}")
    expiry = credentials.expiry
    life = DEFAULT_TOKEN_LIFE_S
    if isinstance(expiry, dt.datetime):
        now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        life = (expiry.replace(tzinfo=None) - now).total_seconds()
    return token, max(life, MIN_TOKEN_LIFE_S)


NO_SUCH_MODEL = "vidpoll-no-such-model"
"""The model an id that is no operation name is read through (Google answers its own error)."""


class VertexClient(JsonApiClient):
    """One account's client for Veo on Vertex AI (`vidpoll.providers.base.Client`)."""

    rules: VeoRules = RULES

    def __init__(self, base_url: str, api_key: str, *, timeout_s: float = 15.0,
                 max_connections: int = 100, options: ProviderOptions = _NO_OPTIONS) -> None:
        extra = options.extra
        self._project = extra.get("project") or ""
        self._location = extra.get("location") or DEFAULT_LOCATION
        self._version = extra.get("api_version") or DEFAULT_API_VERSION
        # the provider's default URL names the location (`https://{location}-aiplatform...`)
        super().__init__(base_url.replace("{location}", self._location), api_key,
                         timeout_s=timeout_s, max_connections=max_connections)
        self._credentials_file = api_key
        self._token: str | None = None
        self._fresh_until = 0.0
        """Until then the token is sent as it is; after it, a new one is minted meanwhile."""
        self._valid_until = 0.0
        """After it the token is not sent: a call waits for a new one."""
        self._recent: collections.deque[bytes] = collections.deque(maxlen=RECENT_TOKENS)
        self._lock = asyncio.Lock()
        self._minting: asyncio.Task[str | HttpAnswer] | None = None
        self.token_refreshes = 0
        """Tokens minted (a figure for tests and logs; never the token)."""
        self._setup_problem = self._options_problem()

    def _options_problem(self) -> str | None:
        for field, value in (("project", self._project), ("location", self._location),
                             ("api_version", self._version)):
            if not _SEGMENT.fullmatch(value):
                return (f"the account's {field} is missing or not a name" if not value
                        else f"the account's {field} is not a name (letters, digits, '.', "
                             f"'_', '~', '-')")
        if not self._credentials_file:
            return "the account names no service-account key file (credentials_file)"
        return None

    def _auth_headers(self) -> dict[str, str]:
        """None on the session: the token goes on each call (it changes every hour)."""
        return {}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(base_url={self.base_url!r}, project={self._project!r}, "
                f"location={self._location!r}, credentials_file=<path>)")

    def _retry_after(self, status: int, headers: Mapping[str, str], body: bytes) -> str | None:
        """A `Retry-After` header if one came, else (a 429) the body's `retryDelay`."""
        header = super()._retry_after(status, headers, body)
        if header is not None or status != 429:
            return header
        return retry_delay(body)

    # -- the token ------------------------------------------------------------------------

    async def _access_token(self) -> str | HttpAnswer:
        """The token to send now; else the 401 (unsent) every call answers while none can
        be had. A token near its end is still sent while its successor is minted in the
        background; a call waits for a mint only when there is no valid token at all (the
        first call, after a 401, after an idle hour), and then at most MINT_WAIT_S: a create
        must not outlast its lease waiting for a token."""
        now = time.monotonic()
        token = self._token
        if token is not None and now < self._valid_until:
            if now >= self._fresh_until:
                self._mint_soon()  # refreshed ahead, in the background
            return token
        minting = self._mint_soon()
        done, _ = await asyncio.wait({minting}, timeout=MINT_WAIT_S)
        if not done:
            return refused_unsent(f"no token yet for the key of {self._credentials_file}: the "
                                  f"token endpoint has not answered within {MINT_WAIT_S:g} s")
        return minting.result()

    def _mint_soon(self) -> asyncio.Task[str | HttpAnswer]:
        """The mint in progress, or a new one: one at a time, however many calls want it."""
        if self._minting is None or self._minting.done():
            self._minting = asyncio.get_running_loop().create_task(self._mint())
        return self._minting

    async def _mint(self) -> str | HttpAnswer:
        """Mint a token in a thread (google-auth's refresh is one blocking requests call) and
        keep it; the 401 every waiting call answers when none can be had."""
        async with self._lock:
            started = time.monotonic()
            try:
                minted, life = await asyncio.to_thread(_mint, self._credentials_file,
                                                       self._timeout.total or 15.0)
            except _CredentialsProblem as exc:
                if self._token is not None and time.monotonic() >= self._valid_until:
                    self._token = None
                return refused_unsent(str(exc))
            self._token = minted
            self._recent.append(minted.encode())
            self.token_refreshes += 1
            self._fresh_until = started + life - min(TOKEN_MARGIN_S, life / 4)
            self._valid_until = started + life - min(TOKEN_SAFETY_S, life / 10)
            return minted

    async def close(self) -> None:
        """Close the connection pool; a mint in progress is no longer waited for."""
        if self._minting is not None and not self._minting.done():
            self._minting.cancel()  # (its thread ends on its own; its token is not kept)
            await asyncio.gather(self._minting, return_exceptions=True)
        await super().close()

    def _token_refused(self, token: str) -> None:
        """A 401 to a call sent with `token`: the next call mints another (once, however
        many calls it refused)."""
        if self._token == token:
            self._token = None
            self._fresh_until = self._valid_until = 0.0

    def _without_tokens(self, answer: HttpAnswer, keep_links: bool) -> HttpAnswer:
        """`answer` with every recent token scrubbed from its body and detail."""
        body, detail = answer.body, answer.detail
        for token in self._recent:
            if body:
                body = scrub_body(body, token, answer.status or 0, keep_links=keep_links)
            if detail and token.decode() in detail:
                detail = detail.replace(token.decode(), "<redacted>")
        if body is answer.body and detail is answer.detail:
            return answer
        return HttpAnswer(answer.status, body, transport_error=answer.transport_error,
                          detail=detail, retry_after=answer.retry_after,
                          request_id=answer.request_id,
                          ratelimit_remaining=answer.ratelimit_remaining,
                          ratelimit_reset=answer.ratelimit_reset)

    async def _call(self, method: str, url: URL, *, keep_links: bool = False,
                    **kwargs: Any) -> HttpAnswer:
        """JsonApiClient's, with the account's current token (refused unsent, 401, when
        none can be had), the token dropped after a 401 and scrubbed from the answer."""
        if self._setup_problem is not None:
            return refused_unsent(self._setup_problem)
        if self.key_problem is not None:
            return refused_unsent(f"the credentials_file setting cannot be used: "
                                  f"{self.key_problem}")
        token = await self._access_token()
        if isinstance(token, HttpAnswer):
            return token
        headers = {**kwargs.pop("headers", {}), "Authorization": f"Bearer {token}"}
        answer = await super()._call(method, url, keep_links=keep_links, headers=headers,
                                     **kwargs)
        if answer.status == 401:
            self._token_refused(token)
        if answer.body and len(answer.body) > SCRUB_INLINE_BYTES:
            return await asyncio.to_thread(self._without_tokens, answer, keep_links)
        return self._without_tokens(answer, keep_links)

    # -- paths ----------------------------------------------------------------------------

    def _model_url(self, model: str, verb: str) -> URL:
        return URL(f"{self._base}/{self._version}/projects/{self._project}/locations/"
                   f"{self._location}/publishers/google/models/{model}:{verb}", encoded=True)

    def _operation_model(self, job_id: str) -> str | HttpAnswer:
        """The model whose `fetchPredictOperation` reads `job_id`, or the answer (404 in
        Google's envelope, unsent) for an operation of another project or location. An id that
        is no operation name at all (a job added by hand, the core's probe of a paused
        account) is read through NO_SUCH_MODEL: a real request that Google answers with its
        own error, which proves the route (never a made-up answer)."""
        parsed = parse_operation(job_id)
        if parsed is None:
            return NO_SUCH_MODEL
        if (parsed[0], parsed[1]) != (self._project, self._location):
            why = (f"the operation belongs to project {parsed[0]!r}, location {parsed[1]!r}, "
                   f"not this account's ({self._project!r}, {self._location!r})")
        else:
            return parsed[2]
        return HttpAnswer(404, json.dumps({"error": {
            "code": 404, "status": "NOT_FOUND", "message": f"not sent: {why}"}}).encode(),
            detail=f"not sent: {why}: {job_id[:120]!r}")

    def shown_status_url(self, job_id: str) -> str:
        model = self._operation_model(job_id)
        return shown_url(str(self._model_url(model if isinstance(model, str) else "?",
                                             "fetchPredictOperation")))

    def shown_create_url(self) -> str:
        return shown_url(str(self._model_url("MODEL", "predictLongRunning")))

    def media_headers(self) -> Mapping[str, str]:
        """None: inline videos are read through `inline_media`, Cloud Storage objects are not
        downloaded, and the token never goes with a download."""
        return {}

    def media_auth_hosts(self) -> frozenset[str]:
        return frozenset()

    # -- calls ----------------------------------------------------------------------------

    async def _fetch_operation(self, job_id: str, keep: int | None,
                               holder: list[bytes]) -> HttpAnswer:
        model = self._operation_model(job_id)
        if isinstance(model, HttpAnswer):
            return model
        return await self._call(
            "POST", self._model_url(model, "fetchPredictOperation"),
            data=json.dumps({"operationName": job_id}).encode(),
            headers={"Content-Type": "application/json"},
            max_body=MAX_INLINE_BODY, prepare=_inline_shaper(keep, holder))

    async def read_status(self, job_id: str,
                          handle: Mapping[str, Any] | None = None) -> HttpAnswer:
        """POST `fetchPredictOperation` for the operation; its inline videos come back as
        their size and sha256, never as bytes."""
        return await self._fetch_operation(job_id, None, [])

    async def read_result(self, job_id: str,
                          handle: Mapping[str, Any] | None = None) -> HttpAnswer:
        """The same read (the result is inline; the worker never calls this for Vertex)."""
        return await self.read_status(job_id, handle)

    async def inline_media(self, job_id: str, handle: Mapping[str, Any] | None,
                           index: int) -> bytes | HttpAnswer:
        """The bytes of video `index` (as `inline:{index}` names it), read from the
        operation again; the answer when they cannot be had (a 2xx answer whose detail says
        the operation no longer holds them)."""
        holder: list[bytes] = []
        answer = await self._fetch_operation(job_id, index, holder)
        if holder and answer.status is not None and 200 <= answer.status < 300:
            return holder[0]
        if answer.status is not None and 200 <= answer.status < 300 and not answer.detail:
            return HttpAnswer(answer.status, answer.body, detail=(
                f"the operation no longer holds the bytes of video {index} (it lists "
                f"{_videos_in(answer.body)})"), request_id=answer.request_id)
        return answer

    async def create_video(self, payload: dict[str, Any], idempotency_key: str,
                           model: str | None = None) -> HttpAnswer:
        """POST `predictLongRunning` for `model` with `payload` as the request body, fields
        unchanged (the paid call). `idempotency_key` is not sent: Google has none. A model
        that cannot be one is answered unsent, 400 INVALID_ARGUMENT in Google's envelope."""
        problem = ("no --model (a Veo create names the model id)" if model is None
                   else self.rules.model_problem(model))
        if problem is not None or model is None:
            return HttpAnswer(400, json.dumps({"error": {
                "code": 400, "status": "INVALID_ARGUMENT",
                "message": f"not sent: {problem}"}}).encode())
        return await self._call("POST", self._model_url(model, "predictLongRunning"),
                                data=json.dumps(payload).encode(),
                                headers={"Content-Type": "application/json"}, keep_links=True)


def _videos_in(body: bytes) -> str:
    try:
        value = json.loads(body) if len(body) <= MAX_BODY_BYTES else None
    except (ValueError, RecursionError):
        value = None
    found = len(samples(value.get("response"))) if isinstance(value, dict) else 0
    return "no video" if not found else f"{found} video(s)"


if TYPE_CHECKING:
    def _is_a_client(client: VertexClient) -> Client:
        return client  # mypy checks VertexClient against the protocol
