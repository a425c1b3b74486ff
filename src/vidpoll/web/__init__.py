"""`vidpoll serve`: one small aiohttp server with the providers' webhooks (a hint that makes a
job due now: vidpoll.web.webhooks), the dashboard (vidpoll.web.dashboard), Prometheus metrics,
/healthz and /readyz.
`vidpoll worker --metrics-port` serves only the metrics and health routes (`metrics_app`)."""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from vidpoll import metrics
from vidpoll.config import ProxyNetwork
from vidpoll.errors import DatabaseUnavailable, SchemaError
from vidpoll.providers import registry
from vidpoll.providers.registry import DEFAULT_PROVIDER
from vidpoll.spend import AccountSpend
from vidpoll.store import PgStore
from vidpoll.web.dashboard import FailureLimiter, Guard, client_of, setup_dashboard
from vidpoll.web.durations import export_durations
from vidpoll.web.figures import TableFigures, read_figures
from vidpoll.web.webhooks import PRUNE_EVERY_S, WebhookSecrets, secrets_of, setup_webhooks
from vidpoll.webhook import DEFAULT_TOLERANCE_S, MAX_BODY_BYTES, REJECT_LOG_EVERY_S

log = logging.getLogger(__name__)

STORE = web.AppKey("store", PgStore)
GUARD = web.AppKey("guard", Guard)
"""The token checks (and their failure budget) of `make_app`'s app: a `--metrics-port`
listener of the same `serve` shares them (`metrics_app(..., guard=app[GUARD])`)."""


GAUGES_MAX_AGE_S = 5.0
"""A scrape reads the table's figures at most this often (a few index and catalog reads:
vidpoll.web.figures), however many scrapers there are."""


def export_figures(figures: TableFigures, now_s: float) -> None:
    """Set the table's gauges from `figures` (`now_s`: time.time(), for the sample's age)."""
    metrics.JOBS.clear()  # a state whose rows are all gone reads 0, not stale
    metrics.JOBS_ESTIMATED.clear()
    # a provider's own terminal words are counted under `other` (bounded labels)
    estimated = {metrics.state_label(s) for s in figures.estimated}
    for label, n in metrics.counts_by_state_label(figures.states).items():
        metrics.JOBS.labels(label).set(n)
        metrics.JOBS_ESTIMATED.labels(label).set(1 if label in estimated else 0)
    analyzed = figures.analyzed_at
    metrics.STATISTICS_AGE.set(max(0.0, now_s - analyzed.timestamp())
                               if analyzed is not None and figures.estimated else math.nan)
    metrics.DUE.set(figures.due)
    metrics.OLDEST_DUE.set(figures.oldest_late_s)


def make_app(store: PgStore, webhook_secrets: WebhookSecrets | str | None,
             tolerance_s: float = DEFAULT_TOLERANCE_S,
             clock: Callable[[], float] = time.time, *, dashboard: bool = True,
             dashboard_token: str | None = None,
             loopback_only: bool = True,
             metrics_token: str | None = None, metrics_apart: bool = False,
             limiter: FailureLimiter | None = None,
             metrics_limiter: FailureLimiter | None = None,
             trusted_proxies: Sequence[ProxyNetwork] = (),
             webhook_events_retention_s: float | None = None,
             webhook_prune_every_s: float = PRUNE_EVERY_S,
             webhook_log_every_s: float = REJECT_LOG_EVERY_S,
             spends: Mapping[str, AccountSpend] | None = None) -> web.Application:
    """The application. `webhook_secrets`: provider name -> its webhook secret(s), the
    providers whose POST /webhooks/<name> this app serves (503 for one without a secret, 404
    for any other name; ConfigError for a name the registry does not know); a bare secret, or
    None, is the default provider's (`{DEFAULT_PROVIDER: webhook_secrets}`), as before providers.

    `loopback_only`: the server is bound to loopback and has no token, so the dashboard
    answers only to a loopback Host header. `metrics_token`: /metrics and /readyz need it (or
    the dashboard token) as Bearer; without it, /metrics needs the dashboard token if there
    is one. `metrics_apart`: /metrics and /readyz are served by a `metrics_app` of their own
    (serve --metrics-port), not here. `limiter`, `metrics_limiter`: the budgets of wrong
    dashboard and metrics tokens (default ones). `trusted_proxies`: the peers whose
    X-Forwarded-For names the client a budget is kept for (VIDPOLL_TRUSTED_PROXIES).
    `webhook_events_retention_s`: as Settings.webhook_events_retention_s (None: the replay
    window plus an hour; inf: never); with any secret, webhook events older than that are
    deleted at start and every `webhook_prune_every_s` (vidpoll.web.webhooks). `spends`: the
    accounts' prices and caps (vidpoll.spend), drawn on the dashboard's spend page."""
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[STORE] = store

    if webhook_secrets is None or isinstance(webhook_secrets, str):
        webhook_secrets = {DEFAULT_PROVIDER: webhook_secrets}
    setup_webhooks(app, store, webhook_secrets, tolerance_s=tolerance_s, clock=clock,
                   retention_s=webhook_events_retention_s,
                   prune_every_s=webhook_prune_every_s, log_every_s=webhook_log_every_s,
                   source_of=lambda request: client_of(request, trusted_proxies))
    guard = Guard(dashboard_token, loopback_only, sessions=store, metrics_token=metrics_token,
                  limiter=limiter, metrics_limiter=metrics_limiter,
                  trusted_proxies=trusted_proxies)
    app[GUARD] = guard
    add_health_and_metrics(app, store, guard=guard, scrapes=not metrics_apart)
    if dashboard:
        setup_dashboard(app, store, guard, secrets=[
            *(s for given in webhook_secrets.values() for s in secrets_of(given)),
            *((metrics_token,) if metrics_token else ())], spends=spends)
    return app


def metrics_app(store: PgStore, *, table_gauges: bool = False,
                guard: Guard | None = None) -> web.Application:
    """What `worker --metrics-port` serves: /metrics (this process's counters only: the
    table's figures come from `vidpoll serve`), /healthz, /readyz. `serve --metrics-port`
    serves the same with the table's figures, behind its metrics token if it has one
    (`guard`: the dashboard app's, app[GUARD])."""
    app = web.Application()
    add_health_and_metrics(app, store, table_gauges=table_gauges, guard=guard, public=False)
    return app


def add_health_and_metrics(app: web.Application, store: PgStore,
                           table_gauges: bool = True, *, guard: Guard | None = None,
                           public: bool = True, scrapes: bool = True) -> None:
    """/healthz (the process answers), /readyz (database reachable, schema current) and
    /metrics (this process's counters and, with `table_gauges`, the table's figures read at
    scrape time: exact pending and due counts, estimated finished ones on a big table). Every
    provider's terminal words are state labels (any other word is `other`).

    `guard`: who may read /metrics and /readyz (Guard.scrape_refusal; None: anyone);
    `public`: this is the dashboard's port (not a `--metrics-port` listener); `scrapes`:
    False leaves /metrics and /readyz out (they are on a listener of their own). /healthz is
    always open: a liveness probe carries no token."""
    for name in registry.names():
        metrics.know_states(registry.load(name).rules.words)
    refreshed = [0.0]

    async def refusal(request: web.Request) -> web.StreamResponse | None:
        return None if guard is None else await guard.scrape_refusal(request, public)

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(request: web.Request) -> web.StreamResponse:
        if (refused := await refusal(request)) is not None:
            return refused
        try:
            await store.check_schema()
        except (DatabaseUnavailable, SchemaError) as exc:
            # the kind of failure only: the message may name the database's host
            return web.json_response({"status": "unavailable",
                                      "reason": type(exc).__name__}, status=503)
        return web.json_response({"status": "ready"})

    async def scrape(request: web.Request) -> web.StreamResponse:
        if (refused := await refusal(request)) is not None:
            return refused
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
                    with contextlib.suppress(DatabaseUnavailable):  # the ledger (0017)
                        metrics.export_spend(await store.spend_totals(),
                                             await store.held_by_cap())
                    with contextlib.suppress(DatabaseUnavailable):  # render times (0018)
                        export_durations(await store.render_stats(),
                                         await store.count_overdue())
            body += generate_latest(metrics.TABLE_REGISTRY)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    app.router.add_get("/healthz", healthz)
    if scrapes:
        app.router.add_get("/readyz", readyz)
        app.router.add_get("/metrics", scrape)


async def start_server(app: web.Application, host: str, port: int
                       ) -> tuple[web.AppRunner, str]:
    """Serve `app`; returns the runner and the base URL it listens on."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:  # a port in use: what startup began (a pruner) ends here
        await runner.cleanup()
        raise
    bound = runner.addresses[0][1]
    return runner, f"http://{host}:{bound}"
