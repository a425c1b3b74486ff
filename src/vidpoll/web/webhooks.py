"""POST /webhooks/{provider} (a hint that makes a job due now) and the pruning of the events
that recognise a repeat delivery, both part of `vidpoll serve` (vidpoll.web.make_app).

One route serves every provider: the path names it (`/webhooks/<name>`), the registry finds
it, and its `webhooks` (vidpoll.providers.base.Webhooks) verify the delivery and name its
job; this module knows no provider's headers. A provider is served when the caller gives its
secret(s) (`setup_webhooks`' `secrets`, provider name -> secret(s)); a path naming any other
is a 404, refused like a forged delivery. A provider whose deliveries are checked with keys
fetched over HTTP (fal: its "secret" is the URL of its JWKS) has the optional async
`Webhooks.refresh_keys`: awaited before verifying, and once more after a `signature`
refusal (then the delivery is verified again if the keys changed); it bounds its own fetches.

Anyone who can reach the server can send deliveries, so a refused one costs no database work,
no row and at most one log line per reason a minute (vidpoll.webhook.LogSampler); each is
counted in vidpoll_webhooks_rejected_total{reason}. A signed delivery is recorded once
however it is replayed (the value the provider says it is known by is unique, migration 0005);
serve deletes the records once they are older than the replay window plus a margin, so the
table holds about an hour of deliveries, not all of them for ever.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from aiohttp import web

from vidpoll import metrics
from vidpoll.config import WEBHOOK_RETENTION_MARGIN_S, check_webhook_retention, webhook_replay_s
from vidpoll.errors import ConfigError, DatabaseUnavailable
from vidpoll.providers import registry
from vidpoll.providers.base import WebhookHint, Webhooks
from vidpoll.runner import Signals
from vidpoll.store import PgStore
from vidpoll.webhook import (
    DEFAULT_TOLERANCE_S,
    MAX_BODY_BYTES,
    REJECT_LOG_EVERY_S,
    REJECT_REASONS,
    UNSIGNED_POKE_GAP_S,
    LogSampler,
    RejectReason,
    SourceLimiter,
    WebhookRejected,
    source_key,
)

log = logging.getLogger(__name__)

PRUNE_EVERY_S = 600.0
"""How often serve deletes old webhook events (and once at start)."""


def retention_in_force(retention_s: float | None, tolerance_s: float) -> float | None:
    """The age past which serve deletes webhook events: `retention_s` as
    Settings.webhook_events_retention_s holds it (None: the replay window plus an hour; inf:
    never, None returned), refused (ConfigError) if shorter than the replay window."""
    if retention_s is None:
        return webhook_replay_s(tolerance_s) + WEBHOOK_RETENTION_MARGIN_S
    if math.isinf(retention_s):
        return None
    return check_webhook_retention(retention_s, tolerance_s, "webhook_events_retention_s")


class WebhookEventPruner:
    """Deletes webhook events received more than `retention_s` ago (the database's clock), at
    start and then every `every_s`. A role without DELETE on vidpoll_webhook_events (the
    least-privilege worker role of docs/SECURITY.md) leaves them to `jobs prune`, said once."""

    def __init__(self, store: PgStore, retention_s: float,
                 every_s: float = PRUNE_EVERY_S) -> None:
        self.signals = Signals()
        self.passes = 0
        """Prune passes completed (tests wait on it)."""
        self.deleted = 0
        self.allowed: bool | None = None
        """Whether this role may delete events; None until asked."""
        self._store = store
        self._retention_s = retention_s
        self._every_s = every_s

    async def run(self) -> None:
        """Prune until cancelled; a failed pass is logged once per streak and tried again."""
        failing = False
        while True:
            try:
                if self.allowed is None:
                    self.allowed = await self._store.may_delete_webhook_events()
                    if not self.allowed:
                        log.info("this role may not delete webhook events; `vidpoll jobs "
                                 "prune` (as the owner) deletes the old ones")
                        await self.signals.pulse()
                        return
                gone = await self._store.prune_webhook_events(self._retention_s)
            except Exception as exc:  # never ends serve: tried again next time
                if not failing:
                    outage = isinstance(exc, DatabaseUnavailable)
                    log.warning("deleting old webhook events failed (%s); trying again every "
                                "%gs", exc if outage else type(exc).__name__, self._every_s,
                                exc_info=not outage)
                failing = True
            else:
                if failing:
                    log.info("deleting old webhook events works again")
                failing = False
                self.passes += 1
                self.deleted += gone
                if gone:
                    log.info("deleted %d webhook events received over %gs ago", gone,
                             self._retention_s)
                await self.signals.pulse()
            await asyncio.sleep(self._every_s)


WEBHOOK_PRUNER = web.AppKey("webhook_pruner", WebhookEventPruner)
"""The app's pruner, when it has one (tests wait on its signals)."""


WebhookSecrets = Mapping[str, str | Sequence[str] | None]
"""Provider name -> its webhook secret(s), what `setup_webhooks` serves: several when several
accounts of the provider (or a rotation on vidpoll's side) sign with different ones; None or
empty: the provider's route answers 503. For a provider with `refresh_keys` (fal) each
"secret" names where its keys are fetched from (a JWKS URL), not a secret."""

KeyRefresher = Callable[..., Awaitable[bool]]
"""`Webhooks.refresh_keys(secret, *, refused=False) -> bool` (optional, providers/base.py)."""


def secrets_of(given: str | Sequence[str] | None) -> tuple[str, ...]:
    """The non-empty secrets in one entry of WebhookSecrets."""
    if given is None or isinstance(given, str):
        return (given,) if given else ()
    return tuple(s for s in given if s)


@dataclass(frozen=True, slots=True)
class _Served:
    """A provider whose deliveries this server takes."""

    webhooks: Webhooks
    secrets: tuple[str, ...]
    unset: str
    """The 503's error while it has no secret (the setting that would give one)."""
    signed: bool = True
    """False: the provider signs no delivery (Luma): served without a secret, each source
    rate-limited, every delivery only ever a hint."""


def served_providers(secrets: WebhookSecrets) -> dict[str, _Served]:
    """The providers `secrets` names, found in the registry: ConfigError for a name it does
    not know, for a secret given to a provider that has no webhooks, or for one its provider
    says cannot be its secret (`Webhooks.secret_problem`, optional)."""
    served: dict[str, _Served] = {}
    for name, given in secrets.items():
        provider = registry.load(name)
        hooks, own = provider.webhooks, secrets_of(given)
        if hooks is None:
            if own:
                raise ConfigError(f"provider {name!r} has no webhooks, but a webhook secret "
                                  "was given for it")
            continue
        problem: Callable[[str], str | None] | None = getattr(hooks, "secret_problem", None)
        for secret in own:  # secret_problem is optional (providers/base.py)
            why = problem(secret) if problem is not None else None
            if why:
                raise ConfigError(f"the webhook secret given for {provider.title} {why}")
        # the 503's words name both places a secret is set: an account in the file names
        # its variable with webhook_secret_env (the prefix's variable serves the others)
        signed = bool(getattr(hooks, "signed", True))  # optional (providers/base.py)
        if own and not signed:
            raise ConfigError(f"{provider.title} signs no webhook delivery, but a webhook "
                              "secret was given for it (leave webhook_secret_env out)")
        served[name] = _Served(hooks, own, f"no {provider.title} webhook secret is set "
                                           f"(webhook_secret_env in the accounts file, or "
                                           f"{provider.env_prefix}_WEBHOOK_SECRET)", signed)
    return served


def verify_any(hooks: Webhooks, secrets: Sequence[str], headers: Mapping[str, str],
               body: bytes, now_s: float, tolerance_s: float) -> WebhookHint:
    """What `hooks` reads from a delivery signed with any of `secrets`; the refusal otherwise.
    Only a wrong signature depends on the secret: any other refusal (unsigned, stale, or
    signed but malformed) is the same for every one, so it ends the search."""
    refused: WebhookRejected | None = None
    for secret in secrets:
        try:
            return hooks.verify(headers, body, secret, now_s, tolerance_s)
        except WebhookRejected as exc:
            if exc.reason != "signature":
                raise
            refused = exc
    assert refused is not None  # a served provider without a secret answered 503 before
    raise refused


async def verify_fresh(hooks: Webhooks, secrets: Sequence[str], headers: Mapping[str, str],
                       body: bytes, clock: Callable[[], float],
                       tolerance_s: float) -> WebhookHint:
    """verify_any, for a provider whose keys are fetched (`Webhooks.refresh_keys`, optional):
    its keys made ready first; after a `signature` refusal, fetched anew (the provider allows
    one fetch a minute, whatever arrives) and, if they changed, the delivery verified once
    more. A provider without `refresh_keys` is verify_any."""
    refresh: KeyRefresher | None = getattr(hooks, "refresh_keys", None)
    if refresh is None:
        return verify_any(hooks, secrets, headers, body, clock(), tolerance_s)
    for secret in secrets:
        await refresh(secret)
    try:
        return verify_any(hooks, secrets, headers, body, clock(), tolerance_s)
    except WebhookRejected as exc:
        if exc.reason != "signature":
            raise
        changed = [await refresh(secret, refused=True) for secret in secrets]
        if not any(changed):
            raise
    return verify_any(hooks, secrets, headers, body, clock(), tolerance_s)


def setup_webhooks(app: web.Application, store: PgStore, secrets: WebhookSecrets, *,
                   tolerance_s: float = DEFAULT_TOLERANCE_S,
                   clock: Callable[[], float] = time.time,
                   retention_s: float | None = None,
                   prune_every_s: float = PRUNE_EVERY_S,
                   log_every_s: float = REJECT_LOG_EVERY_S,
                   source_of: Callable[[web.Request], str] | None = None,
                   sources: SourceLimiter | None = None) -> WebhookEventPruner | None:
    """Add POST /webhooks/{provider} to `app` for each provider `secrets` names (503 for one
    without a secret; 404 for any other name) and, with a secret and a retention
    (`retention_s` as retention_in_force reads it), the pruner (app[WEBHOOK_PRUNER]), started
    and stopped with the app; returns the pruner. ConfigError as served_providers says.
    `source_of`: the address a delivery came from (behind trusted proxies, the client they
    name; default the peer), for `sources`, the per-source budget of unsigned providers."""
    providers = served_providers(secrets)
    sampler = LogSampler(log_every_s)
    limiter = sources if sources is not None else SourceLimiter()
    source = source_of if source_of is not None else (lambda r: r.remote or "-")
    for reason in REJECT_REASONS:  # every reason exported from the start, at 0
        metrics.WEBHOOKS_REJECTED.labels(reason)

    def refuse(reason: RejectReason, why: str, status: int, answer: str) -> web.Response:
        metrics.WEBHOOKS_REJECTED.labels(reason).inc()
        held = sampler.admit(reason)
        if held is not None:  # `why` is fixed text: nothing the caller sent is logged
            log.warning("webhook refused (%s): %s%s", reason, why,
                        f"; {held} more refused for this reason since the last such line"
                        if held else "")
        return web.json_response({"error": answer}, status=status)

    async def webhook(request: web.Request) -> web.Response:
        name = request.match_info["provider"]
        served = providers.get(name)
        if served is None:  # the name is the caller's: never logged
            return refuse("unknown_provider", "no provider of that name takes webhooks here",
                          404, "no such webhook")
        if not served.secrets and served.signed:
            return web.json_response({"error": served.unset}, status=503)
        if not served.signed and not limiter.admit(source_key(source(request))):
            return refuse("rate_limited", "too many unsigned deliveries from one source",
                          429, "too many deliveries")
        too_large = f"body larger than {MAX_BODY_BYTES} bytes"
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            # refused on its header, never read into memory (aiohttp discards what follows
            # for at most its lingering time, 10 s); a body without a length (chunked) is cut
            # off by client_max_size as soon as it passes the limit
            return refuse("too_large", "declared body over the limit", 413, too_large)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return refuse("too_large", "chunked body cut off at the limit", 413, too_large)
        try:
            hint = (await verify_fresh(served.webhooks, served.secrets, request.headers, body,
                                       clock, tolerance_s) if served.signed
                    # nothing to check it with: only the job id is read, to read that job now
                    else served.webhooks.verify(request.headers, body, "", clock(),
                                                tolerance_s))
        except WebhookRejected as exc:
            if exc.reason == "malformed":  # signed: the sender may hear what is missing
                return refuse(exc.reason, str(exc), 400, str(exc))
            return refuse(exc.reason, str(exc), 401, "invalid signature or timestamp")
        if not served.signed:
            # nothing to prove it is the provider's: no row is stored for it, and only a
            # pending job of this provider is poked, at most once a second
            try:
                said, poked = await store.receive_hint(hint.job_id, name, UNSIGNED_POKE_GAP_S)
            except DatabaseUnavailable:
                return web.json_response({"error": "database unavailable"}, status=503)
            return web.json_response({"status": said, "made_due": poked} if said == "poked"
                                     else {"status": said})
        try:
            # hint.dedupe, not a raw header: a repeat re-spaced, re-ordered or padded with
            # other values is still the same signed delivery
            effect, made_due = await store.receive_webhook(hint.event_id[:200], hint.job_id,
                                                           hint.dedupe)
        except DatabaseUnavailable:
            # providers retry a delivery that failed; polling finds the state meanwhile anyway
            return web.json_response({"error": "database unavailable"}, status=503)
        if effect is None:
            return web.json_response({"status": "duplicate"})  # 2xx: the sender stops resending
        if effect == "unknown":
            log.info("webhook from %s for a job vidpoll does not track: %s (event %s)", name,
                     hint.job_id, hint.event_id)
        return web.json_response({"status": effect, "made_due": made_due})

    app.router.add_post("/webhooks/{provider}", webhook)
    older_than_s = retention_in_force(retention_s, tolerance_s)
    if not any(p.secrets for p in providers.values()) or older_than_s is None:
        return None
    pruner = app[WEBHOOK_PRUNER] = WebhookEventPruner(store, older_than_s, prune_every_s)

    async def pruning(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(pruner.run(), name="webhook-event-pruner")
        yield
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    app.cleanup_ctx.append(pruning)
    return pruner
