"""`vidpoll serve`: one small aiohttp server. For now: Sume's webhooks (a hint that makes a job
due now) and /healthz, /readyz. The dashboard and metrics of the ops issue join it here."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from aiohttp import web

from vidpoll.errors import DatabaseUnavailable, SchemaError
from vidpoll.store import PgStore
from vidpoll.webhook import (
    DEFAULT_TOLERANCE_S,
    MAX_BODY_BYTES,
    WebhookRejected,
    job_id_of,
    verify,
)

log = logging.getLogger(__name__)

STORE = web.AppKey("store", PgStore)


def make_app(store: PgStore, webhook_secret: str | None,
             tolerance_s: float = DEFAULT_TOLERANCE_S,
             clock: Callable[[], float] = time.time) -> web.Application:
    """The application; without a webhook secret the webhook route answers 503."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[STORE] = store

    async def webhook(request: web.Request) -> web.Response:
        if not webhook_secret:
            return web.json_response({"error": "SUME_WEBHOOK_SECRET is not set"}, status=503)
        body = await request.read()
        try:
            verify(webhook_secret, request.headers.get("X-Sume-Timestamp"),
                   request.headers.get("X-Sume-Signature"), body, clock(), tolerance_s)
        except WebhookRejected as exc:
            log.warning("webhook refused: %s", exc)
            return web.json_response({"error": "invalid signature or timestamp"}, status=401)
        event_id = request.headers.get("X-Sume-Event-Id", "").strip()
        job_id = job_id_of(body)
        if not event_id or job_id is None:
            return web.json_response({"error": "need X-Sume-Event-Id and a job id in the body"},
                                     status=400)
        try:
            effect, made_due = await store.receive_webhook(
                event_id[:200], job_id, request.headers.get("X-Sume-Signature", "")[:1000])
        except DatabaseUnavailable:
            # Sume retries a delivery that failed; polling finds the state meanwhile anyway
            return web.json_response({"error": "database unavailable"}, status=503)
        if effect is None:
            return web.json_response({"status": "duplicate"})
        if effect == "unknown":
            log.info("webhook for a job vidpoll does not track: %s (event %s)", job_id, event_id)
        return web.json_response({"status": effect, "made_due": made_due})

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        try:
            await store.check_schema()
        except (DatabaseUnavailable, SchemaError) as exc:
            return web.json_response({"status": "unavailable", "reason": str(exc)}, status=503)
        return web.json_response({"status": "ready"})

    app.router.add_post("/webhooks/sume", webhook)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def start_server(app: web.Application, host: str, port: int
                       ) -> tuple[web.AppRunner, str]:
    """Serve `app`; returns the runner and the base URL it listens on."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, f"http://{host}:{bound}"
