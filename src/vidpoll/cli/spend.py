"""`vidpoll spend`: where the money went (vidpoll.spend, the ledger of migration 0017)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

import click

from vidpoll.cli._common import _cell, _on_store, _settings

if TYPE_CHECKING:
    from vidpoll.spend import AccountSpend
    from vidpoll.store import PgStore

_DAY = click.DateTime(["%Y-%m-%d"])


@click.command("spend")
@click.option("--since", type=_DAY, metavar="YYYY-MM-DD",
              help="First day counted [default: today in each account's cap_timezone].")
@click.option("--until", type=_DAY, metavar="YYYY-MM-DD",
              help="Last day counted, included [default: today].")
@click.option("--account", "only", multiple=True, help="Only this account (repeatable).")
@click.option("--json", "as_json", is_flag=True,
              help="Print a JSON object: per-account totals (spent, reserved, held), by day "
                   "and model, by tag.")
def spend_cmd(since: datetime | None, until: datetime | None, only: tuple[str, ...],
              as_json: bool) -> None:
    """Spend and reservations by account, day, model and tag, for a window of days.

    A day is a calendar day in the account's cap_timezone (the one its caps count by).
    `spent`: jobs that ended, at the provider's figure where the account prices its unit,
    else at the estimate; `reserved`: creates sent whose jobs have not ended (or whose
    outcome is unknown); `held`: intents a cap holds now (`intents list --state held`).
    """
    from vidpoll.spend import NO_SPEND

    settings = _settings()
    spends = settings.spends()
    if since is not None and until is not None and since > until:
        raise click.BadParameter("--since is after --until", param_hint="--since")

    async def collect(store: PgStore) -> dict[str, Any]:
        held = await store.held_by_cap()
        totals = await store.spend_totals()
        names = sorted(set(spends) | {r["account"] for r in held}
                       | {r["account"] for r in totals})
        if only:
            names = [n for n in names if n in only] + [n for n in only if n not in names]
        now = datetime.now(UTC)
        windows = {n: _window(spends.get(n, NO_SPEND), now, since, until) for n in names}
        by_day, by_tag = await store.spend_rows(windows)
        return _report(names, windows, spends, by_day, by_tag, held)

    report = _on_store(collect)
    if as_json:
        click.echo(json.dumps(report, indent=2, sort_keys=True))
        return
    _print(report)


def _window(spend: AccountSpend, now: datetime, since: datetime | None,
            until: datetime | None) -> tuple[date, date]:
    today = spend.today(now)
    last = until.date() if until is not None else today
    first = since.date() if since is not None else min(today, last)
    return first, last


def _num(amount: Decimal | None) -> float | None:
    """An amount for JSON: a number (the ledger keeps it exact; this is for reading)."""
    return None if amount is None else float(amount)


def _report(names: list[str], windows: dict[str, tuple[date, date]],
            spends: dict[str, AccountSpend], by_day: list[dict[str, Any]],
            by_tag: list[dict[str, Any]], held: list[dict[str, Any]]) -> dict[str, Any]:
    from vidpoll.spend import NO_SPEND

    accounts: dict[str, Any] = {}
    for name in names:
        spend = spends.get(name, NO_SPEND)
        rows = [r for r in by_day if r["account"] == name]
        caps = {"cap_per_day": spend.cap_per_day, "cap_per_month": spend.cap_per_month,
                "max_creates_per_hour": spend.max_creates_per_hour,
                **{f"cap_per_key_prefix:{p}": c for p, c in spend.cap_per_key_prefix.items()}}
        accounts[name] = {
            "currency": spend.currency, "timezone": spend.cap_timezone,
            "since": windows[name][0].isoformat(), "until": windows[name][1].isoformat(),
            "priced": spend.priced,
            "spent": _num(sum((r["spent"] for r in rows), Decimal(0))),
            "reserved": _num(sum((r["reserved"] for r in rows), Decimal(0))),
            "creates": sum(int(r["creates"]) for r in rows),
            "released": sum(int(r["released"]) for r in rows),
            "held": sum(int(h["n"]) for h in held if h["account"] == name),
            "held_by_cap": {h["cap"] or "unknown": int(h["n"]) for h in held
                            if h["account"] == name},
            "caps": {k: (v if isinstance(v, int) else _num(v)) for k, v in caps.items()
                     if v is not None}}
    return {
        "accounts": accounts,
        "by_day": [{"day": r["day"].isoformat(), "account": r["account"], "model": r["model"],
                    "currency": r["currency"], "spent": _num(r["spent"]),
                    "reserved": _num(r["reserved"]), "creates": int(r["creates"]),
                    "released": int(r["released"])} for r in by_day],
        "by_tag": [{"account": r["account"], "tag": r["tag"], "value": r["value"],
                    "currency": r["currency"], "spent": _num(r["spent"]),
                    "reserved": _num(r["reserved"]), "creates": int(r["creates"])}
                   for r in by_tag]}


def _print(report: dict[str, Any]) -> None:
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    def money(value: float | None) -> str:
        return "" if value is None else f"{value:.2f}"

    console = Console(highlight=False)
    table = Table(title="spend by account", title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("account", "window", "spent", "reserved", "creates", "held", "caps"):
        table.add_column(column, justify="right" if column in ("spent", "reserved", "creates",
                                                              "held") else "left")
    for name, a in report["accounts"].items():
        window = a["since"] if a["since"] == a["until"] else f"{a['since']}..{a['until']}"
        caps = ", ".join(f"{k}={v}" for k, v in a["caps"].items()) or (
            "no caps" if a["priced"] else "no prices set")
        table.add_row(escape(_cell(name)), f"{window} {a['timezone']}",
                      f"{money(a['spent'])} {a['currency']}",
                      f"{money(a['reserved'])} {a['currency']}", str(a["creates"]),
                      str(a["held"]), escape(_cell(caps)))
    console.print(table)
    if report["by_day"]:
        days = Table(title="by day and model", title_justify="left", box=box.SIMPLE_HEAD)
        for column in ("day", "account", "model", "spent", "reserved", "creates"):
            days.add_column(column)
        for r in report["by_day"]:
            days.add_row(r["day"], escape(_cell(r["account"])), escape(_cell(r["model"] or "")),
                         money(r["spent"]), money(r["reserved"]), str(r["creates"]))
        console.print(days)
    if report["by_tag"]:
        tags = Table(title="by tag", title_justify="left", box=box.SIMPLE_HEAD)
        for column in ("account", "tag", "spent", "reserved", "creates"):
            tags.add_column(column)
        for r in report["by_tag"]:
            tags.add_row(escape(_cell(r["account"])), escape(_cell(f"{r['tag']}={r['value']}")),
                         money(r["spent"]), money(r["reserved"]), str(r["creates"]))
        console.print(tags)
