"""fal's webhook deliveries: Ed25519 signatures checked against fal's published keys (a JWKS
fetched over HTTP, cached, refreshed at most once a minute), the replay window, the job id.

The scheme (fal's "Verifying Your Webhook", docs.fal.ai/model-apis/model-endpoints/webhooks
and fal.ai/docs/documentation/model-apis/inference/webhooks; public verifiers agree): a
delivery carries `X-Fal-Webhook-Request-Id`, `X-Fal-Webhook-User-Id`,
`X-Fal-Webhook-Timestamp` (Unix seconds) and `X-Fal-Webhook-Signature`, the hex Ed25519
signature of the UTF-8 message

    request_id + "\\n" + user_id + "\\n" + timestamp + "\\n" + hex(sha256(raw body))

made with one of the keys fal publishes as a JWKS (`{"keys": [{"kty": "OKP", "crv": "Ed25519",
"x": <base64url public key>}]}`) at DEFAULT_JWKS_URL; fal's docs say the set may be cached up
to 24 hours, and a timestamp more than 300 s from now (either way) is to be refused (vidpoll
applies the caller's `tolerance_s`). A delivery names no key: each key in the set is tried
(the keys of fal's set may carry a `kid`; nothing in a delivery refers to one). The body is
`{request_id, gateway_request_id, status, payload, error?, payload_error?}`; fal retries a
delivery up to 10 times in 2 hours, with the same request id.

So nothing here is a secret: the "secret" `vidpoll.web.webhooks` passes to `verify` is the
JWKS URL (an account's `jwks_url` option, else DEFAULT_JWKS_URL: `account_secret`), and the
keys are fetched by `refresh_keys`, the optional async member of `Webhooks` the route awaits
before verifying and once more after a `signature` refusal:
- fetched when none are cached or the cached ones are over MAX_KEY_AGE_S old, and again when
  no cached key verifies a delivery (fal rotated its keys);
- never more than once every REFETCH_EVERY_S per URL, whatever arrives: a flood of forged
  deliveries costs fal's JWKS host at most one request a minute in total, and concurrent
  deliveries share the one fetch in flight;
- a fetch that fails (timeout, non-200, redirect, over MAX_JWKS_BYTES, no usable key) keeps the
  keys there were.
The fetch: aiohttp, a fresh session each time (at most one a minute), short timeouts, no
redirects followed, no proxy or cookies from the environment, the body read up to a cap.

The hint: the job is the signed `X-Fal-Webhook-Request-Id` (the body's `request_id`, when it
has one, must be the same, or the delivery is `malformed`), and so is the event id (fal keeps
it on every retry, so a retry is a repeat); a repeat is also recognised by the signature that
verified, in lower-case hex (`WebhookHint.dedupe`). `verify` itself is synchronous and pure:
it uses the keys cached for the URL it is given.

`WEBHOOKS` is what the fal provider's `webhooks` returns; `vidpoll serve` calls it for
`POST /webhooks/fal` (vidpoll.web.webhooks).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from vidpoll.errors import InvalidJobId
from vidpoll.policy import validate_job_id
from vidpoll.providers.base import WebhookHint
from vidpoll.providers.fal import DEFAULT_JWKS_URL as DEFAULT_JWKS_URL
from vidpoll.webhook import WebhookRejected

log = logging.getLogger(__name__)

REQUEST_ID_HEADER = "X-Fal-Webhook-Request-Id"
USER_ID_HEADER = "X-Fal-Webhook-User-Id"
TIMESTAMP_HEADER = "X-Fal-Webhook-Timestamp"
SIGNATURE_HEADER = "X-Fal-Webhook-Signature"

REFETCH_EVERY_S = 60.0
"""The least time between two fetches of one JWKS URL, whatever arrives."""
MAX_KEY_AGE_S = 24 * 3600.0
"""Keys fetched longer ago than this are fetched again before the next verification (fal's
docs: cache the set up to 24 hours); until a fetch succeeds, the old ones are used."""
FETCH_TIMEOUT_S = 5.0
"""The whole JWKS fetch, connecting included."""
MAX_JWKS_BYTES = 64 * 1024
"""A JWKS is a few hundred bytes; anything past this is refused unread."""
MAX_KEYS = 16
"""Usable keys taken from one set (a rotation needs two)."""
MAX_ID_CHARS = 200
"""The longest request id or user id taken (fal's request ids are UUIDs)."""
MAX_TIMESTAMP_DIGITS = 12
SIGNATURE_HEX_CHARS = 128
"""An Ed25519 signature is 64 bytes."""

_ID = re.compile(rf"[\x21-\x7e]{{1,{MAX_ID_CHARS}}}")
"""Visible ASCII, no space: part of the signed message, joined by newlines (a newline in one
would let the message be split another way), and the job id vidpoll stores."""
_USER_ID = re.compile(rf"[\x21-\x7e]{{0,{MAX_ID_CHARS}}}")
_TIMESTAMP = re.compile(rf"[1-9][0-9]{{0,{MAX_TIMESTAMP_DIGITS - 1}}}")
"""ASCII digits without a leading zero: the time checked is the text signed."""
_HEX_SIGNATURE = re.compile(rf"[0-9a-fA-F]{{{SIGNATURE_HEX_CHARS}}}")
_BASE64URL = re.compile(r"[A-Za-z0-9_-]+")

Fetcher = Callable[[str], Awaitable[bytes]]
"""Fetches a JWKS document: its body, or an exception (JwksUnavailable, aiohttp's, a
timeout) when there is none to read."""


class JwksUnavailable(Exception):
    """A JWKS fetch that gave no document (the message is fixed text and the URL's host)."""


def shown_url(url: str) -> str:
    """`url` as logs show it: scheme, host, port and path, never a query or credentials."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def url_problem(url: str) -> str | None:
    """Why `url` cannot be a JWKS URL to fetch fal's keys from; None when it can: https, or
    http to a loopback host (a test's, or a proxy beside vidpoll)."""
    try:
        parts = urlsplit(url.strip())
        _ = parts.port  # a port that is not a number raises here
    except ValueError:
        return "is not a URL"
    if not parts.hostname:
        return "is not a URL"
    if parts.username or parts.password:
        return "holds credentials (a JWKS is public)"
    loopback = parts.hostname in ("127.0.0.1", "::1", "localhost")
    if parts.scheme != "https" and not (parts.scheme == "http" and loopback):
        return "is not an https URL (http only to a loopback host)"
    return None


async def fetch_jwks(url: str, *, timeout_s: float = FETCH_TIMEOUT_S,
                     max_bytes: int = MAX_JWKS_BYTES) -> bytes:
    """The body of a 200 answer to GET `url`, at most `max_bytes`; JwksUnavailable (or
    aiohttp's, or a timeout) otherwise. No redirect is followed (a 3xx is a failure), nothing
    is taken from the environment (proxies, netrc) and no cookie is kept."""
    timeout = aiohttp.ClientTimeout(total=timeout_s, connect=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, trust_env=False,
                                     cookie_jar=aiohttp.DummyCookieJar()) as http, \
            http.get(url, allow_redirects=False,
                     headers={"Accept": "application/json"}) as resp:
        if resp.status != 200:
            raise JwksUnavailable(f"HTTP {resp.status}")
        if resp.content_length is not None and resp.content_length > max_bytes:
            raise JwksUnavailable(f"a body over {max_bytes} bytes")
        body = bytearray()
        async for chunk in resp.content.iter_chunked(8192):
            body += chunk
            if len(body) > max_bytes:
                raise JwksUnavailable(f"a body over {max_bytes} bytes")
        return bytes(body)


def keys_of_jwks(document: bytes) -> tuple[Ed25519PublicKey, ...]:
    """The Ed25519 keys of a JWKS document (`kty` OKP, `crv` Ed25519, `x` the base64url public
    key, 32 bytes), at most MAX_KEYS, in order, without repeats; keys of other kinds, or for
    another use than signing (`use` other than `sig`), are skipped. Empty when the document is
    not a JWKS or has no such key."""
    try:
        value: Any = json.loads(document)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return ()
    entries = value.get("keys") if isinstance(value, dict) else None
    if not isinstance(entries, list):
        return ()
    found: dict[bytes, Ed25519PublicKey] = {}
    for jwk in entries:
        if not isinstance(jwk, dict) or jwk.get("kty") != "OKP" or jwk.get("crv") != "Ed25519":
            continue
        if jwk.get("use", "sig") != "sig":
            continue
        raw = _base64url(jwk.get("x"))
        if raw is None or len(raw) != 32 or raw in found:
            continue
        try:
            found[raw] = Ed25519PublicKey.from_public_bytes(raw)
        except ValueError:
            continue
        if len(found) >= MAX_KEYS:
            break
    return tuple(found.values())


def _base64url(value: object) -> bytes | None:
    """The bytes of unpadded (or padded) base64url text; None for anything else."""
    if not isinstance(value, str):
        return None
    text = value.rstrip("=")
    if not text or len(text) > 1024 or not _BASE64URL.fullmatch(text):
        return None
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None


def _header(headers: Mapping[str, str], name: str) -> str | None:
    """`name`'s value, stripped, its case ignored as HTTP does (a plain dict, as a test passes,
    may not); None when absent."""
    value = headers.get(name)
    if value is None:
        wanted = name.lower()
        value = next((v for k, v in headers.items() if k.lower() == wanted), None)
    return None if value is None else value.strip()


def signed_message(request_id: str, user_id: str, timestamp: str, body: bytes) -> bytes:
    """What fal signs for a delivery."""
    digest = hashlib.sha256(body).hexdigest()
    return f"{request_id}\n{user_id}\n{timestamp}\n{digest}".encode()


def verify_signature(keys: tuple[Ed25519PublicKey, ...], request_id: str | None,
                     user_id: str | None, timestamp: str | None, signature: str | None,
                     body: bytes, now_s: float, tolerance_s: float) -> str:
    """Raise WebhookRejected unless the headers are sane, the timestamp is within
    `tolerance_s` of `now_s` (either way) and one of `keys` signed this delivery.

    Returns the signature in lower-case hex: what a repeat is recognised by. Messages are
    fixed text: never a header's value."""
    if not (request_id and timestamp and signature) or user_id is None:
        raise WebhookRejected("unsigned", f"missing {REQUEST_ID_HEADER}, {USER_ID_HEADER}, "
                                          f"{TIMESTAMP_HEADER} or {SIGNATURE_HEADER}")
    if not _ID.fullmatch(request_id) or not _USER_ID.fullmatch(user_id):
        # both are part of the signed message: without sane ones there is nothing to check
        raise WebhookRejected("unsigned", f"{REQUEST_ID_HEADER} or {USER_ID_HEADER} is not "
                                          f"up to {MAX_ID_CHARS} visible ASCII characters")
    if not _TIMESTAMP.fullmatch(timestamp):
        raise WebhookRejected("timestamp", f"{TIMESTAMP_HEADER} is not Unix seconds")
    # `not <=`: a NaN now or tolerance refuses instead of letting everything through
    if not abs(now_s - int(timestamp)) <= tolerance_s:
        raise WebhookRejected("timestamp",
                              f"timestamp outside the {tolerance_s:g}s replay window")
    if not _HEX_SIGNATURE.fullmatch(signature):
        raise WebhookRejected("signature", f"{SIGNATURE_HEADER} is not "
                                           f"{SIGNATURE_HEX_CHARS} hex digits")
    if not keys:
        raise WebhookRejected("signature", "no fal webhook key could be fetched yet")
    raw = bytes.fromhex(signature)
    message = signed_message(request_id, user_id, timestamp, body)
    for key in keys:
        try:
            key.verify(raw, message)
        except InvalidSignature:
            continue
        return raw.hex()
    raise WebhookRejected("signature", "signature does not match fal's keys")


def check_body(body: bytes, request_id: str) -> str:
    """The job id of a verified delivery: `request_id` (the signed header), when the body is a
    JSON object whose `request_id`, if it has one, is the same; WebhookRejected `malformed`
    otherwise."""
    try:
        value: Any = json.loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        value = None
    if not isinstance(value, dict):
        raise WebhookRejected("malformed", "need a JSON object as fal's delivery body")
    if "request_id" in value and value["request_id"] != request_id:
        raise WebhookRejected("malformed", "the body's request_id is not the signed "
                                           f"{REQUEST_ID_HEADER}")
    try:
        return validate_job_id(request_id)
    except InvalidJobId:  # the header pattern allows no such id; kept as a guard
        raise WebhookRejected("malformed", "the request id cannot be a job id") from None


@dataclass(slots=True)
class _KeySet:
    """What is known of one JWKS URL."""

    keys: tuple[Ed25519PublicKey, ...] = ()
    raw: frozenset[bytes] = frozenset()
    fetched_at: float | None = None
    """The fetcher's clock when `keys` came (None: never)."""
    tried_at: float | None = None
    """The fetcher's clock at the last fetch begun, successful or not."""
    inflight: asyncio.Future[bool] | None = field(default=None, repr=False)


class FalWebhooks:
    """fal's webhooks behind the provider interface (`vidpoll.providers.base.Webhooks`), with
    the keys of each JWKS URL it has been asked about.

    `fetch` (default `fetch_jwks`) and `clock` (monotonic seconds, default time.monotonic)
    are a test's to replace."""

    def __init__(self, fetch: Fetcher | None = None,
                 clock: Callable[[], float] = time.monotonic, *,
                 refetch_every_s: float = REFETCH_EVERY_S,
                 max_key_age_s: float = MAX_KEY_AGE_S) -> None:
        self._fetch: Fetcher = fetch or fetch_jwks
        self._clock = clock
        self._refetch_every_s = refetch_every_s
        self._max_key_age_s = max_key_age_s
        self._sets: dict[str, _KeySet] = {}
        self.fetches = 0
        """Fetches begun (tests count them)."""

    def account_secret(self, webhook_secret: str, options: Mapping[str, Any]) -> str:
        """What the route verifies an account's deliveries with: its `jwks_url` option, else
        DEFAULT_JWKS_URL (fal signs with its own keys: there is no secret to configure)."""
        url = options.get("jwks_url") if isinstance(options, Mapping) else None
        return url.strip() if isinstance(url, str) and url.strip() else DEFAULT_JWKS_URL

    def secret_problem(self, secret: str) -> str | None:
        """Why `secret` cannot be the JWKS URL fal's keys are fetched from (checked when
        `serve` starts); None when it can."""
        why = url_problem(secret)
        return None if why is None else f"(the JWKS URL fal's keys are fetched from) {why}"

    def keys(self, secret: str) -> tuple[Ed25519PublicKey, ...]:
        """The keys cached for the JWKS URL `secret` (empty before a fetch succeeded)."""
        known = self._sets.get(secret.strip())
        return known.keys if known is not None else ()

    async def refresh_keys(self, secret: str, *, refused: bool = False) -> bool:
        """Make the keys of the JWKS URL `secret` ready for `verify`: fetch them when none are
        cached or they are over the age limit, or, with `refused` (verify refused a delivery
        as `signature`), in any case; but never twice within `refetch_every_s`, and a call
        while a fetch is in flight waits for that one. True when the keys changed (a refused
        delivery is worth verifying again). Never raises for a failed fetch: the old keys
        stay, and the failure is logged."""
        url = secret.strip()
        known = self._sets.setdefault(url, _KeySet())
        if known.inflight is not None and not known.inflight.done():
            return await asyncio.shield(known.inflight)
        now = self._clock()
        if known.tried_at is not None and now - known.tried_at < self._refetch_every_s:
            return False
        stale = known.fetched_at is None or now - known.fetched_at >= self._max_key_age_s
        if not (refused or not known.keys or stale):
            return False
        known.tried_at = now
        self.fetches += 1
        known.inflight = asyncio.ensure_future(self._fetch_into(url, known))
        return await asyncio.shield(known.inflight)

    async def _fetch_into(self, url: str, known: _KeySet) -> bool:
        try:
            document = await self._fetch(url)
            keys = keys_of_jwks(document)
            if not keys:
                raise JwksUnavailable("no Ed25519 key in the answer")
        except Exception as exc:  # never the route's failure: the old keys stay
            expected = isinstance(exc, JwksUnavailable | aiohttp.ClientError | TimeoutError)
            log.warning("fetching fal's webhook keys from %s failed (%s); keeping the %d keys "
                        "there were, trying again in %gs at the earliest", shown_url(url),
                        exc if isinstance(exc, JwksUnavailable) else type(exc).__name__,
                        len(known.keys), self._refetch_every_s, exc_info=not expected)
            return False
        raw = frozenset(k.public_bytes_raw() for k in keys)
        known.fetched_at = self._clock()
        changed = raw != known.raw
        known.keys, known.raw = keys, raw
        if changed:
            log.info("fetched %d fal webhook keys from %s", len(keys), shown_url(url))
        return changed

    def verify(self, headers: Mapping[str, str], body: bytes, secret: str, now_s: float,
               tolerance_s: float) -> WebhookHint:
        """The delivery's request id (its job and event id) and the signature that verified
        it with a key cached for the JWKS URL `secret`; WebhookRejected (unsigned, timestamp,
        signature; then malformed: signed, but the body is not fal's JSON for that request)
        unless it is fal's and recent."""
        request_id = _header(headers, REQUEST_ID_HEADER)
        signed = verify_signature(self.keys(secret), request_id,
                                  _header(headers, USER_ID_HEADER),
                                  _header(headers, TIMESTAMP_HEADER),
                                  _header(headers, SIGNATURE_HEADER), body, now_s, tolerance_s)
        assert request_id is not None  # verify_signature refused a delivery without one
        job_id = check_body(body, request_id)
        return WebhookHint(job_id=job_id, event_id=request_id, dedupe=signed)

    def __repr__(self) -> str:
        return "<webhooks fal>"


WEBHOOKS = FalWebhooks()
