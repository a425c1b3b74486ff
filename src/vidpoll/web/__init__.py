"""`vidpoll serve`: one small aiohttp server with Sume's webhooks (a hint that makes a job due
now), the dashboard (vidpoll.web.dashboard), Prometheus metrics, /healthz and /readyz.
`vidpoll worker --metrics-port` serves only the metrics and health routes (`metrics_app`)."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from vidpoll import metrics
from vidpoll.errors import DatabaseUnavailable, SchemaError
from vidpoll.store import PgStore
from vidpoll.web.dashboard import Guard, setup_dashboard
from vidpoll.web.figures import TableFigures, read_figures
from vidpoll.webhook import (
    DEFAULT_TOLERANCE_S,
    MAX_BODY_BYTES,
    WebhookRejected,
    job_id_of,
    verify,
)

log = logging.getLogger(__name__)

STORE = web.AppKey("store", PgStore)


GAUGES_MAX_AGE_S = 5.0
"""A scrape reads the table's figures at most this often (a few index and catalog reads:
vidpoll.web.figures), however many scrapers there are."""


def export_figures(figures: TableFigures, now_s: float) -> None:
    """Set the table's gauges from `figures` (`now_s`: time.time(), for the sample's age)."""
    metrics.JOBS.clear()  # a state whose rows are all gone reads 0, not stale
    metrics.JOBS_ESTIMATED.clear()
    for state, n in figures.states.items():
        metrics.JOBS.labels(state).set(n)
        metrics.JOBS_ESTIMATED.labels(state).set(1 if state in figures.estimated else 0)
    analyzed = figures.analyzed_at
    metrics.STATISTICS_AGE.set(max(0.0, now_s - analyzed.timestamp())
                               if analyzed is not None and figures.estimated else math.nan)
    metrics.DUE.set(figures.due)
    metrics.OLDEST_DUE.set(figures.oldest_late_s)


def make_app(store: PgStore, webhook_secret: str | None,
             tolerance_s: float = DEFAULT_TOLERANCE_S,
             clock: Callable[[], float] = time.time, *, dashboard: bool = True,
             dashboard_token: str | None = None,
             loopback_only: bool = True) -> web.Application:
    """The application; without a webhook secret the webhook route answers 503.

    `loopback_only`: the server is bound to loopback and has no token, so the dashboard
    answers only to a loopback Host header."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[STORE] = store

    async def webhook(request: web.Request) -> web.Response:
        if not webhook_secret:
            return web.json_response({"error": "SUME_WEBHOOK_SECRET is not set"}, status=503)
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            # refused on its header, never read into memory (aiohttp discards what follows
            # for at most its lingering time, 10 s); a body without a length (chunked) is cut
            # off by client_max_size as soon as it passes the limit
            return web.json_response({"error": f"body larger than {MAX_BODY_BYTES} bytes"},
                                     status=413)
        body = await request.read()
        try:
            # the value that matched, not the raw header: a repeat re-spaced, re-ordered or
            # padded with other values is still the same signed delivery
            signed = verify(webhook_secret, request.headers.get("X-Sume-Timestamp"),
                            request.headers.get("X-Sume-Signature"), body, clock(),
                            tolerance_s)
        except WebhookRejected as exc:
            log.warning("webhook refused: %s", exc)
            return web.json_response({"error": "invalid signature or timestamp"}, status=401)
        event_id = request.headers.get("X-Sume-Event-Id", "").strip()
        job_id = job_id_of(body)
        if not event_id or job_id is None:
            return web.json_response({"error": "need X-Sume-Event-Id and a job id in the body"},
                                     status=400)
        try:
            effect, made_due = await store.receive_webhook(event_id[:200], job_id, signed)
        except DatabaseUnavailable:
            # Sume retries a delivery that failed; polling finds the state meanwhile anyway
            return web.json_response({"error": "database unavailable"}, status=503)
        if effect is None:
            return web.json_response({"status": "duplicate"})
        if effect == "unknown":
            log.info("webhook for a job vidpoll does not track: %s (event %s)", job_id, event_id)
        return web.json_response({"status": effect, "made_due": made_due})

    app.router.add_post("/webhooks/sume", webhook)
    add_health_and_metrics(app, store)
    if dashboard:
        setup_dashboard(app, store, Guard(dashboard_token, loopback_only),
                        secrets=[webhook_secret] if webhook_secret else [])
    return app


def metrics_app(store: PgStore) -> web.Application:
    """What `worker --metrics-port` serves: /metrics (this process's counters only: the
    table's figures come from `vidpoll serve`), /healthz, /readyz."""
    app = web.Application()
    add_health_and_metrics(app, store, table_gauges=False)
    return app


def add_health_and_metrics(app: web.Application, store: PgStore,
                           table_gauges: bool = True) -> None:
    """/healthz (the process answers), /readyz (database reachable, schema current) and
    /metrics (this process's counters and, with `table_gauges`, the table's figures read at
    scrape time: exact pending and due counts, estimated finished ones on a big table)."""
    refreshed = [0.0]

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        try:
            await store.check_schema()
        except (DatabaseUnavailable, SchemaError) as exc:
            # the kind of failure only: the message may name the database's host
            return web.json_response({"status": "unavailable",
                                      "reason": type(exc).__name__}, status=503)
        return web.json_response({"status": "ready"})

    async def scrape(request: web.Request) -> web.Response:
        body = generate_latest(metrics.REGISTRY)
        if table_gauges:
            if time.monotonic() - refreshed[0] > GAUGES_MAX_AGE_S:
                try:
                    figures = await read_figures(store)
                except DatabaseUnavailable:
                    pass  # the process's own counters are still worth a scrape
                else:
                    export_figures(figures, time.time())
                    refreshed[0] = time.monotonic()
            body += generate_latest(metrics.TABLE_REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", scrape)


async def start_server(app: web.Application, host: str, port: int
                       ) -> tuple[web.AppRunner, str]:
    """Serve `app`; returns the runner and the base URL it listens on."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = runner.addresses[0][1]
    return runner, f"http://{host}:{bound}"
