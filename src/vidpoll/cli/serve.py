"""`vidpoll serve`: the dashboard, /metrics, the webhook route, /healthz and /readyz."""

from __future__ import annotations

import sys

import click

from vidpoll.cli._common import _listening, _open_store, _run, _settings, _stderr, _until_signalled

MIN_TOKEN_CHARS = 16


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Beyond loopback it needs VIDPOLL_DASHBOARD_TOKEN.")
@click.option("--port", default=8800, show_default=True, type=click.IntRange(0, 65535))
@click.option("--metrics-port", type=click.IntRange(0, 65535),
              help="Serve /metrics and /readyz (and /healthz) on this port, not on --port: "
                   "open there unless VIDPOLL_METRICS_TOKEN is set.")
@click.option("--metrics-host", default="127.0.0.1", show_default=True,
              help="The address of --metrics-port.")
def serve_cmd(host: str, port: int, metrics_port: int | None, metrics_host: str) -> None:
    """Serve the dashboard (/), Prometheus /metrics, POST /webhooks/<provider> for each
    provider with an account (Sume's needs SUME_WEBHOOK_SECRET; fal's fetches fal's keys),
    /healthz and /readyz. With VIDPOLL_METRICS_TOKEN, /metrics and
    /readyz need it as `Authorization: Bearer`; without it, /metrics on --port needs the
    dashboard token if there is one."""
    from vidpoll.web import GUARD, make_app, metrics_app, start_server

    settings = _settings()
    loopback = host in ("127.0.0.1", "localhost", "::1")
    if not loopback and not settings.dashboard_token:
        _stderr(f"error: --host {host} exposes the dashboard beyond this machine; set "
                   "VIDPOLL_DASHBOARD_TOKEN first")
        sys.exit(2)
    if settings.dashboard_token and len(settings.dashboard_token) < MIN_TOKEN_CHARS:
        _stderr(f"error: VIDPOLL_DASHBOARD_TOKEN is shorter than {MIN_TOKEN_CHARS} "
                   "characters; use a long random one (python -c 'import secrets; "
                   "print(secrets.token_urlsafe(24))')")
        sys.exit(2)
    if settings.metrics_token and len(settings.metrics_token) < MIN_TOKEN_CHARS:
        _stderr(f"error: VIDPOLL_METRICS_TOKEN is shorter than {MIN_TOKEN_CHARS} characters; "
                "use a long random one")
        sys.exit(2)
    apart = metrics_port is not None

    from vidpoll.providers import registry

    # each provider with an account is served at /webhooks/<provider>, with every secret its
    # accounts have (503 while none has one); a provider whose deliveries are checked with
    # keys it fetches (fal: a JWKS) says what each account contributes instead of a secret
    # (`Webhooks.account_secret`, optional: providers/base.py)
    secrets: dict[str, list[str] | None] = {}
    for acc in settings.accounts.values():
        hooks = registry.load(acc.provider).webhooks
        if hooks is not None and not getattr(hooks, "signed", True) and not acc.webhook_url:
            continue  # unsigned deliveries (Luma's) are taken only where creates ask for them
        if hooks is not None:
            got = secrets.setdefault(acc.provider, None) or []
            of_account = getattr(hooks, "account_secret", None)
            secret = acc.webhook_secret if of_account is None else of_account(
                acc.webhook_secret, acc.options)
            if secret and secret not in got:
                got.append(secret)
            secrets[acc.provider] = got or None
    if not secrets:
        secrets[registry.DEFAULT_PROVIDER] = [settings.webhook_secret] if (
            settings.webhook_secret) else None

    async def go() -> None:
        store = await _open_store(settings)
        try:
            runner, url = await _listening(start_server(
                make_app(store, secrets, settings.webhook_tolerance_s,
                         dashboard_token=settings.dashboard_token or None,
                         loopback_only=loopback and not settings.dashboard_token,
                         metrics_token=settings.metrics_token or None, metrics_apart=apart,
                         trusted_proxies=settings.trusted_proxies,
                         webhook_events_retention_s=settings.webhook_events_retention_s,
                         spends=settings.spends()),
                host, port), host, port, "--port")
            scrapes = "/metrics"
            if metrics_port is not None:
                metrics_runner, metrics_url = await _listening(start_server(
                    metrics_app(store, table_gauges=True, guard=runner.app[GUARD]),
                    metrics_host, metrics_port), metrics_host, metrics_port,
                    "--metrics-port", "--metrics-host")
                scrapes = f"{metrics_url}/metrics"
            if settings.metrics_token or (settings.dashboard_token and not apart):
                # (not "Bearer <word>": the log redactor would hide the word)
                scrapes += ", which asks for a token"
            # said once the settings, the database and the port are known good: a command
            # that cannot start says one line, its error
            for name, got in sorted(secrets.items()):
                found = registry.load(name)
                if not got and getattr(found.webhooks, "signed", True):
                    _stderr(f"warning: no {found.title} webhook secret is set (webhook_secret_env "
                            f"in the accounts file, or {found.env_prefix}_WEBHOOK_SECRET); "
                            f"/webhooks/{name} answers 503")
            _stderr(f"vidpoll serving on {url} (dashboard at /, metrics at {scrapes})")
            await _until_signalled()
            if metrics_port is not None:
                await metrics_runner.cleanup()
            await runner.cleanup()
        finally:
            await store.close()

    _run(go())
