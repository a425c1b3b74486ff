"""The Kling client: its paths, its envelope and its JWT over the shared plumbing
(`vidpoll.providers.http.JsonApiClient`: every failure an answer, never raised; the access key
scrubbed from every body however it is encoded).

A create is `POST {base}/v1/videos/{endpoint}` (the endpoint is `submit --model`:
`text2video`, `image2video`, ...) with the request body as `submit` gave it plus
`external_task_id`, derived from the intent's idempotency key (`rules.external_task_id`); its
answer's `data.task_id` is the job, and the endpoint is kept as its handle. A read is `GET
{base}/v1/videos/{endpoint}/{task_id}`; the finished task lists its videos (inline result), on
Kling's public CDN: no download carries the token. An unknown create is looked up by its
external id in the same place (`find_created`): found, adopted; Kling's "no such task", sent
again with the same external id; anything else, looked up again later.

Kling's envelope is on every answer, `{code, message, request_id, data}`, and a code other than
0 is an error even under HTTP 200: such an answer comes back with the HTTP status Kling's docs
pair the code with (`rules.status_for_code`; 502 for a code they do not list), its body kept,
so the core's rules for that status apply. A create refused because its external id is already
used comes back as 409 (an unknown outcome, looked up: never a second task).

Auth: every request carries `Authorization: Bearer <JWT>` (HS256, `iss` the access key, life
30 min) signed with the secret key (`options.secrets["secret_key_env"]`); the token is kept
and minted again when less than TOKEN_MARGIN_S of it is left, and after a 401 saying it expired
or is not yet valid (1004, 1003), when the call is sent once more with a fresh one (a 401 is
no create: nothing was billed). Neither key is ever logged; the recent tokens and the secret
key are scrubbed from every body and detail as the access key is. A key missing, or one no
header can carry, answers every call a 401 in Kling's envelope, unsent.
"""

from __future__ import annotations

import asyncio
import collections
import json
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from yarl import URL

from vidpoll.media import job_path_segment, redact_urls, shown_url
from vidpoll.models import ErrorClass, HttpAnswer
from vidpoll.policy import parsed_json_object
from vidpoll.providers.base import Created, CreatedPage, ProviderOptions
from vidpoll.providers.http import REDACTED, SCRUB_INLINE_BYTES, JsonApiClient, scrub_body
from vidpoll.providers.kling.rules import (
    DEFAULT_ENDPOINT,
    JWT_LIFE_S,
    RULES,
    TOKEN_CODES,
    KlingRules,
    envelope_code,
    external_task_id,
    mint_token,
    model_problem,
    payload_problem,
    status_for_code,
)

if TYPE_CHECKING:
    from vidpoll.providers.base import Client

SECRET_KEY_OPTION = "secret_key_env"
API_VERSION = "v1"
TOKEN_MARGIN_S = 300.0
"""A token with less than this left is not sent: another is minted (Kling checks `exp` on its
own clock; five minutes cover a skewed one and a slow request)."""
RECENT_TOKENS = 4
"""Tokens scrubbed from every answer: the current one and those before it (a call in flight
when the token was replaced was sent with the old one)."""
REFUSED_CODE = 1000
"""Kling's "Authentication failed": the code of the 401 a call not sent for its keys answers."""
INVALID_CODE = 1201
"""Kling's "Invalid parameters": the code of the 400 a create not sent for its body answers."""
REPEATED_ID = ("external_task_id", "external task id", "externaltaskid")
"""Words of a refusal of a repeated external id (Kling does not document its code: a reseller
says the id "must be unique per user"); such an answer comes back as 409."""
NOT_FOUND_CODES = frozenset({1203})
""""The requested resource does not exist": a query of an external id no task carries."""
_NO_OPTIONS = ProviderOptions()


def refused_unsent(why: str) -> HttpAnswer:
    """A call not sent because the account's keys cannot be used: a 401 in Kling's envelope
    (code 1000), so the core pauses the account as for a refused key (reads stay due, a create
    stays queued: never an unknown outcome). `why` never holds a secret."""
    text = f"not sent: {why}"
    return HttpAnswer(401, json.dumps({"code": REFUSED_CODE, "message": text,
                                       "request_id": "", "data": None}).encode(), detail=text)


def invalid_unsent(why: str) -> HttpAnswer:
    """A create not sent because of its endpoint or body: a 400 in Kling's envelope (code
    1201), which the core takes for a final refusal (`rejected`)."""
    text = f"not sent: {why}"
    return HttpAnswer(400, json.dumps({"code": INVALID_CODE, "message": text,
                                       "request_id": "", "data": None}).encode(), detail=text)


def is_repeated_id(code: int, message: Any) -> bool:
    """Whether Kling's refusal (`code`, `message`) says the external id is already used."""
    if not isinstance(message, str) or code in (0, *TOKEN_CODES):
        return False
    said = message.lower()
    return any(w in said for w in REPEATED_ID) and any(
        w in said for w in ("exist", "used", "duplicat", "repeat", "unique", "already"))


def _replace(answer: HttpAnswer, status: int | None, body: bytes, detail: str) -> HttpAnswer:
    return HttpAnswer(status, body, retry_after=answer.retry_after,
                      request_id=answer.request_id, transport_error=answer.transport_error,
                      detail=detail, ratelimit_remaining=answer.ratelimit_remaining,
                      ratelimit_reset=answer.ratelimit_reset)


def with_envelope_status(answer: HttpAnswer, *, create: bool = False) -> HttpAnswer:
    """`answer` with the HTTP status its envelope's code pairs with when Kling answered a code
    other than 0 under a 2xx; a create refused for a repeated external id as 409, whatever
    status it came with. The body is kept; anything else comes back as it came."""
    if answer.status is None or not answer.body:
        return answer
    body = parsed_json_object(answer.body)
    code = envelope_code(body)
    if code is None or code == 0 or body is None:
        return answer
    status = status_for_code(code)
    if create and is_repeated_id(code, body.get("message")):
        status = 409
    if not 200 <= answer.status < 300 and status != 409:
        return answer  # Kling's own status stands beside its code
    return _replace(answer, status, answer.body, f"Kling code {code} under HTTP {answer.status}")


class KlingClient(JsonApiClient):
    """One account's client for Kling's API (`vidpoll.providers.base.Client`), with the
    look-up of a create by its external id (`find_created`)."""

    rules: KlingRules = RULES

    def __init__(self, base_url: str, api_key: str, *, timeout_s: float = 15.0,
                 max_connections: int = 100, options: ProviderOptions = _NO_OPTIONS,
                 clock: Callable[[], float] = time.time) -> None:
        super().__init__(base_url, api_key, timeout_s=timeout_s,
                         max_connections=max_connections)
        self._secret = options.secrets.get(SECRET_KEY_OPTION, "")
        self._secret_var = options.extra.get(SECRET_KEY_OPTION, "")
        self._secret_bytes = self._secret.encode("utf-8", "surrogateescape")
        self._clock = clock
        """Epoch seconds, as the token's claims are (tests move it)."""
        self._token: str | None = None
        self._token_exp = 0.0
        self._recent: collections.deque[bytes] = collections.deque(maxlen=RECENT_TOKENS)
        self._refused = False
        """The last token was refused: the next is minted `later` (never the same token)."""
        self.tokens_minted = 0
        """Tokens minted (a figure for tests and logs; never a token)."""
        self.token_retries = 0
        """Calls sent again with a fresh token after Kling said theirs expired."""

    @staticmethod
    def _normal_base(base_url: str) -> str:
        """The API root (a trailing `/v1` is dropped: the paths carry it)."""
        base = JsonApiClient._normal_base(base_url)
        return base[: -len("/" + API_VERSION)] if base.endswith("/" + API_VERSION) else base

    def _auth_headers(self) -> dict[str, str]:
        """None on the session: the token goes on each call (it is replaced every 25 min)."""
        return {}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(base_url={self.base_url!r}, access_key=<redacted>, "
                f"secret_key=<redacted>)")

    # -- the token ------------------------------------------------------------------------

    def _keys_problem(self) -> str | None:
        """Why no token can be minted (never quoting a key); None."""
        if not self._api_key:
            return "the account's access key is empty (api_key_env)"
        if self.key_problem is not None:
            return f"the access key cannot be used: {self.key_problem}"
        if not self._secret:
            if self._secret_var:
                return (f"the account's secret key is empty: set the variable "
                        f"{self._secret_var} (its secret_key_env)")
            return ("the account names no secret key: set secret_key_env = \"NAME\" in its "
                    "[accounts.NAME] table and export NAME")
        return None

    def _current_token(self) -> str:
        """The token to send now: the kept one while more than TOKEN_MARGIN_S of it is left,
        else a fresh one (minted here: HS256 is a hash, no I/O)."""
        now = self._clock()
        if self._token is None or now >= self._token_exp - TOKEN_MARGIN_S:
            self._token = mint_token(self._api_key, self._secret, now, later=self._refused)
            self._refused = False
            self._token_exp = int(now) + JWT_LIFE_S
            self._recent.append(self._token.encode())
            self.tokens_minted += 1
        return self._token

    def _token_refused(self, token: str) -> None:
        """Kling refused `token` (a 401): the next call mints another, never the same one."""
        if self._token == token:
            self._token = None
            self._token_exp = 0.0
            self._refused = True

    def _without_secrets(self, answer: HttpAnswer, keep_links: bool) -> HttpAnswer:
        """`answer` with the secret key and every recent token scrubbed from its body and
        detail (the access key already is: JsonApiClient's own scrub)."""
        body, detail = answer.body, answer.detail
        for secret in (self._secret_bytes, *self._recent):
            if not secret:
                continue
            if body:
                body = scrub_body(body, secret, answer.status or 0, keep_links=keep_links)
            shown = secret.decode("utf-8", "surrogateescape")
            if detail and shown in detail:
                detail = detail.replace(shown, REDACTED)
        if body is answer.body and detail is answer.detail:
            return answer
        return _replace(answer, answer.status, body, detail)

    async def _call(self, method: str, url: URL, *, keep_links: bool = False,
                    create: bool = False, **kwargs: Any) -> HttpAnswer:
        """JsonApiClient's, with the current token (a 401 in Kling's envelope, unsent, when
        the keys cannot make one), sent once more with a fresh token after a 401 saying it
        expired; the answer's envelope code turned into its HTTP status
        (`with_envelope_status`) and the secrets scrubbed from it."""
        problem = self._keys_problem()
        if problem is not None:
            return refused_unsent(problem)
        headers = kwargs.pop("headers", {})
        answer = HttpAnswer(None)
        for attempt in range(2):
            token = self._current_token()
            answer = await super()._call(method, url, keep_links=keep_links,
                                         headers={**headers, "Authorization": f"Bearer {token}"},
                                         **kwargs)
            if answer.body and len(answer.body) > SCRUB_INLINE_BYTES:
                answer = await asyncio.to_thread(self._without_secrets, answer, keep_links)
            else:
                answer = self._without_secrets(answer, keep_links)
            answer = with_envelope_status(answer, create=create)
            if answer.status != 401:
                break
            code = envelope_code(parsed_json_object(answer.body))
            self._token_refused(token)
            if code not in TOKEN_CODES or attempt:
                break
            self.token_retries += 1
        return answer

    # -- paths ----------------------------------------------------------------------------

    def _endpoint(self, handle: Mapping[str, Any] | None) -> str | HttpAnswer:
        if handle is None:
            return DEFAULT_ENDPOINT
        value = handle.get("endpoint") if isinstance(handle, Mapping) else None
        if not isinstance(value, str) or model_problem(value) is not None:
            return HttpAnswer(None, transport_error=ErrorClass.CLIENT_ERROR,
                              detail="not sent: the job's handle names no Kling endpoint")
        return value

    def _task_url(self, endpoint: str, task_id: str) -> URL:
        return URL(f"{self._base}/{API_VERSION}/videos/{endpoint}/{job_path_segment(task_id)}",
                   encoded=True)

    def _create_url(self, endpoint: str) -> URL:
        return URL(f"{self._base}/{API_VERSION}/videos/{endpoint}", encoded=True)

    def shown_status_url(self, job_id: str) -> str:
        return shown_url(str(self._task_url(DEFAULT_ENDPOINT, job_id)))

    def shown_create_url(self) -> str:
        return shown_url(f"{self._base}/{API_VERSION}/videos") + "/{endpoint}"

    def media_headers(self) -> Mapping[str, str]:
        """None: Kling's videos are on its public CDN; the token goes only to the API."""
        return {}

    def media_auth_hosts(self) -> frozenset[str]:
        return frozenset()

    # -- calls ----------------------------------------------------------------------------

    async def read_status(self, job_id: str,
                          handle: Mapping[str, Any] | None = None) -> HttpAnswer:
        """GET the task under its handle's endpoint (`text2video` without one). Its links are
        kept whole: the finished task's video URLs are the result the download needs."""
        endpoint = self._endpoint(handle)
        if isinstance(endpoint, HttpAnswer):
            return endpoint
        return await self._call("GET", self._task_url(endpoint, job_id), keep_links=True)

    async def read_result(self, job_id: str,
                          handle: Mapping[str, Any] | None = None) -> HttpAnswer:
        """The same GET (the result is inline; the worker never calls this for Kling)."""
        return await self.read_status(job_id, handle)

    async def create_video(self, payload: dict[str, Any], idempotency_key: str,
                           model: str | None = None) -> HttpAnswer:
        """POST the task to the endpoint `model` with `payload` unchanged plus
        `external_task_id` (from `idempotency_key`): the paid call. An endpoint or a body
        Kling cannot take is answered unsent, 400 in its envelope (`rejected`)."""
        problem = ("no --model (a Kling create names its endpoint, like text2video)"
                   if model is None else model_problem(model)) or payload_problem(payload, model)
        if problem is not None or model is None:
            return invalid_unsent(problem or "no endpoint")
        body = {**payload, "external_task_id": external_task_id(idempotency_key)}
        # a 2xx is kept whole but for the keys: its id is read as sent
        return await self._call("POST", self._create_url(model), data=json.dumps(body).encode(),
                                headers={"Content-Type": "application/json"}, keep_links=True,
                                create=True)

    async def find_created(self, model: str | None, key: str) -> CreatedPage:
        """The create made with `key`, looked up by its external id (`GET
        {base}/v1/videos/{model}/{external_task_id}`): the task, found; no entry when Kling
        says no task carries it (404, code 1203); a failed page otherwise (5xx, 429, a
        transport error, an answer that is neither), which the core looks up again later."""
        endpoint = model or DEFAULT_ENDPOINT
        if model_problem(endpoint) is not None:
            return CreatedPage(detail="looking up the create: no Kling endpoint to look in",
                               final=True, calls=0)
        if self._keys_problem() is not None:
            return CreatedPage(failure=refused_unsent(self._keys_problem() or ""),
                               detail="looking up the create: not sent (the account's keys)",
                               final=True, calls=0)
        wanted = external_task_id(key)
        answer = await self._call("GET", self._task_url(endpoint, wanted), keep_links=True)
        what = f"looking up external_task_id {wanted}"
        if answer.transport_error is not None or answer.status is None:
            return CreatedPage(failure=answer,
                               detail=f"{what}: {redact_urls(answer.detail) or 'no answer'}")
        body = parsed_json_object(answer.body)
        code = envelope_code(body)
        if answer.status == 404 and code in NOT_FOUND_CODES:
            return CreatedPage()
        if not 200 <= answer.status < 300:
            shown = f" (Kling code {code})" if code else ""
            return CreatedPage(failure=answer, detail=f"{what}: HTTP {answer.status}{shown}")
        data = body.get("data") if isinstance(body, dict) and code == 0 else None
        job_id = RULES.created_job_id(body)
        if not isinstance(data, dict) or job_id is None:
            return CreatedPage(failure=answer, detail=f"{what}: the answer is not a task")
        info = data.get("task_info")
        echoed = info.get("external_task_id") if isinstance(info, dict) else None
        if echoed is not None and echoed != wanted:
            # a query takes a task id or an external id in one place: never another's task
            return CreatedPage(failure=answer,
                               detail=f"{what}: the task found carries another external id")
        return CreatedPage((Created(job_id, data, _created_at(data.get("created_at")),
                                    {"endpoint": endpoint}),))


def _created_at(value: Any) -> datetime | None:
    """A task's `created_at` (Unix milliseconds), or None."""
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        try:
            return datetime.fromtimestamp(value / 1000.0, UTC)
        except (OverflowError, OSError, ValueError):
            return None
    return None


if TYPE_CHECKING:
    def _is_a_client(client: KlingClient) -> Client:
        return client  # mypy checks KlingClient against the protocol
