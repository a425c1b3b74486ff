"""Operating commands: migrate, doctor, demo and fake-sume (the stand-in provider)."""

from __future__ import annotations

import dataclasses
import json
import sys
from typing import Any

import click
from click.core import ParameterSource

from vidpoll import logs
from vidpoll.cli._common import (
    LaterChoice,
    _listening,
    _on_store,
    _run,
    _settings,
    _shown,
    _stderr,
    _until_signalled,
)


@click.command("migrate")
def migrate_cmd() -> None:
    """Create or upgrade the schema (idempotent; safe to run concurrently)."""
    from vidpoll.embedded import resolve_database_url
    from vidpoll.store import migrate

    settings = _settings()

    async def go() -> list[str]:
        url = resolve_database_url(settings.database_url, settings.home,
                                   embedded=settings.embedded)
        return await migrate(url)

    applied = _run(go())
    click.echo("applied: " + ", ".join(applied) if applied else "schema is up to date")


@click.command("fake-sume")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8900, show_default=True, type=click.IntRange(0, 65535))
@click.option("--api-key", default="sk-fake", show_default=True,
              help="Key the fake accepts ('' accepts any).")
@click.option("--latency-ms", default=0.0, type=float, show_default=True)
@click.option("--latency-jitter", default=0.0, type=float, show_default=True,
              help="Fraction: 0.3 means latency ± 30%.")
@click.option("--render-seconds", default=2.0, type=float, show_default=True)
@click.option("--next-poll-after", default=1.0, type=float, show_default=True)
@click.option("--fail-5xx", default=0.0, type=float, help="Share of reads answered 500.")
@click.option("--rate-429", default=0.0, type=float, help="Share answered 429 + Retry-After.")
@click.option("--unavailable-503", default=0.0, type=float)
@click.option("--hang", default=0.0, type=float, help="Share of reads that hang --hang-seconds.")
@click.option("--hang-seconds", default=30.0, type=float)
@click.option("--malformed", default=0.0, type=float, help="Share of 200s with a bad body.")
@click.option("--html", default=0.0, type=float, help="Share of 200s with an HTML body.")
@click.option("--not-found-for", default=0.0, type=float,
              help="Seconds a new job answers 404.")
@click.option("--uppercase", is_flag=True, help="Send statuses in upper case.")
@click.option("--status-shape", type=LaterChoice("vidpoll.providers.sume.fake:STATUS_SHAPES"),
              default="seed", show_default=True,
              help="seed: the seed document's flat answer (a terminal flag, the word, the "
                   "hint); the others: the CLI's envelope, the word under that field, no "
                   "terminal flag.")
@click.option("--status-case", type=LaterChoice("vidpoll.providers.sume.fake:STATUS_CASES"),
              default="as_is", show_default=True,
              help="Letter case of status words (random: per read).")
@click.option("--auto-create", is_flag=True, help="Treat unknown job ids as new jobs.")
@click.option("--terminal-mix", default="completed=1",
              help="e.g. completed=0.8,failed=0.1,canceled=0.05,expired=0.05")
@click.option("--create-lose-reply", default=0.0, type=float,
              help="Share of creates billed, then never answered (lost reply).")
@click.option("--create-5xx-billed", default=0.0, type=float,
              help="Share of creates billed, then answered 500.")
@click.option("--create-fail-5xx", default=0.0, type=float,
              help="Share of creates answered 500 before billing.")
@click.option("--create-rate-429", default=0.0, type=float, help="Share of creates answered 429.")
@click.option("--credits", type=int, help="Renders the account can pay for; then 402.")
@click.option("--limits-before-key", is_flag=True,
              help="Check credits, limits and the request before the Idempotency-Key lookup "
                   "(a re-send of a billed key then gets 402 while credits are out).")
@click.option("--key-ttl", "key_ttl_s", type=float,
              help="Seconds an Idempotency-Key is remembered (then a re-send bills again).")
@click.option("--create-keeps-running", is_flag=True,
              help="A create goes on (and bills) after its client disconnected.")
@click.option("--create-bill-seconds", "create_bill_s", default=0.0, type=float,
              help="Seconds a create works before it bills.")
@click.option("--max-concurrent", type=int,
              help="Renders that may run at once; then 429 concurrency_limit_exceeded.")
@click.option("--read-rate-per-s", type=float,
              help="Status/result reads per second per key; beyond it 429 + RateLimit-*.")
@click.option("--read-burst", default=1.0, show_default=True, type=float)
@click.option("--create-rate-per-s", type=float, help="Creates per second per key.")
@click.option("--create-burst", default=1.0, show_default=True, type=float)
@click.option("--seed", type=int)
def fake_sume_cmd(host: str, port: int, api_key: str, latency_ms: float, **opts: Any) -> None:
    """Run the bundled fake Sume (tests, demo, benchmarks)."""
    from vidpoll.providers.sume.fake import FakeConfig, FakeSume, start_fake

    mix: dict[str, float] = {}
    for part in str(opts.pop("terminal_mix")).split(","):
        name, _, weight = part.partition("=")
        try:
            mix[name.strip().lower()] = float(weight)
        except ValueError:
            raise click.BadParameter(f"bad weight in {part!r}",
                                     param_hint="--terminal-mix") from None
    known = {f.name for f in dataclasses.fields(FakeConfig)}
    cfg = FakeConfig(api_key=api_key or None, latency_s=latency_ms / 1000, terminal_mix=mix,
                     **{k: v for k, v in _fake_opts(opts).items() if k in known})

    async def go() -> None:
        runner, url = await _listening(start_fake(FakeSume(cfg), host, port), host, port,
                                       "--port")
        _stderr(f"fake Sume listening on {url}")
        await _until_signalled()
        await runner.cleanup()

    _run(go())


def _fake_opts(opts: dict[str, Any]) -> dict[str, Any]:
    renames = {"render_seconds": "render_s", "next_poll_after": "next_poll_after_s",
               "hang_seconds": "hang_s", "not_found_for": "not_found_for_s"}
    return {renames.get(k, k): v for k, v in opts.items()}


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True)
def doctor_cmd(as_json: bool) -> None:
    """Check the schema, the claim query's plan, dead rows and bloat, autovacuum, the xmin
    horizon, connections, listeners and stuck claims, whether the database is the embedded
    one, and each account's base URL and key (one status read of a job id that cannot exist,
    which only the provider's own "not found" answers right); print what is wrong and the fix.
    Exit 0 if nothing failed (warnings included), 1 otherwise."""
    from rich.console import Console
    from rich.table import Table

    from vidpoll.doctor import FAIL, OK, WARN, check_providers, diagnose, spend_findings
    from vidpoll.providers import registry
    from vidpoll.sql import migrations

    settings = _settings()
    report = _on_store(lambda store: store.doctor())
    findings = diagnose(report, len(migrations()),
                        None if settings.database_url else settings.home / "pgdata")
    from vidpoll.accounts import base_url_setting

    keyed = {a: acc for a, acc in settings.accounts.items() if acc.api_key}
    findings += _run(check_providers(
        {a: acc.base_url for a, acc in keyed.items()},
        {a: acc.api_key for a, acc in keyed.items()}, settings.http_timeout_s,
        providers={a: acc.provider for a, acc in keyed.items()},
        settings_of={a: base_url_setting(settings, a) for a in keyed}))
    findings += spend_findings({
        a: (acc.spend, getattr(registry.load(acc.provider), "cost_units", None) or {})
        for a, acc in settings.accounts.items()})
    if as_json:
        click.echo(json.dumps([dataclasses.asdict(f) for f in findings]))
    else:
        console = Console(highlight=False)
        table = Table(title="vidpoll doctor", title_justify="left")
        for col in ("check", "status", "detail", "fix"):
            table.add_column(col, overflow="fold")
        style = {OK: "green", WARN: "yellow", FAIL: "bold red"}
        for f in findings:
            table.add_row(_shown(f.check), f"[{style[f.status]}]{f.status}[/]",
                          _shown(f.detail), _shown(f.fix))
        console.print(table)
    if any(f.status == FAIL for f in findings):
        sys.exit(1)


@click.command("demo")
@click.option("--jobs", "n_jobs", default=40, show_default=True, type=click.IntRange(1, 10_000))
@click.option("--workers", default=3, show_default=True, type=click.IntRange(1, 16))
def demo_cmd(n_jobs: int, workers: int) -> None:
    """Embedded Postgres + fake Sume: submit jobs, poll them to the end, show it live.

    Logs warnings and errors only, unless --log-level is given (`vidpoll --log-level info
    demo`): the live view is the output."""
    from vidpoll.demo import run_demo

    root = click.get_current_context().find_root()
    if root.get_parameter_source("log_level") in (None, ParameterSource.DEFAULT):
        logs.setup("WARNING", root.params.get("log_format") or "text")

    _run(run_demo(_settings(), n_jobs, workers))
