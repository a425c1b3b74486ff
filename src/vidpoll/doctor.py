"""`vidpoll doctor`: what the database's own statistics say about vidpoll's tables, as findings
with a fix each. Pure: `diagnose` reads the report `PgStore.doctor()` collects, no I/O.
The last finding says which database it is: DATABASE_URL's, or the embedded one (a warning).
`check_providers` adds one finding per account with an API key: one status read of a job id
that cannot exist, which only the provider's own "not found" answers right (I/O, apart).

The checks are the classic failures of Postgres queues: a claim query that stopped using its
partial index, dead rows piling up (autovacuum off or held back), a bloated hot index, an old
transaction or replication slot holding the xmin horizon back (so vacuum removes nothing),
connections running out, listeners missing or the NOTIFY queue filling up, claims stuck.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vidpoll.config import key_variable
from vidpoll.media import redact_urls
from vidpoll.models import HttpAnswer
from vidpoll.policy import (
    KEY_REFUSED,
    MISROUTED,
    NO_ANSWER,
    NOT_API,
    PROVIDER,
    body_kind,
    parsed_json_object,
    probe_verdict,
    provider_error_code,
)
from vidpoll.providers import registry
from vidpoll.providers.base import Rules
from vidpoll.spend import AccountSpend

OK, WARN, FAIL = "ok", "warn", "fail"

DEAD_RATIO_WARN = 0.2
"""Dead rows per live row above which a table is behind on vacuum."""
INDEX_BYTES_PER_PENDING_ROW_WARN = 400
"""The due index holds ~40 bytes per pending row when healthy; ten times that is bloat."""
XMIN_AGE_WARN_S = 300.0
XMIN_AGE_FAIL_S = 3600.0
CONNECTIONS_WARN = 0.8
NOTIFY_QUEUE_WARN = 0.5
MIN_INDEX_CHECK_BYTES = 1 << 20
SMALL_TABLE_ROWS = 1000
"""Below this many rows a sequential scan is the right plan, so the claim's is not judged."""
XID_AGE_WARN = 10_000_000
"""An xmin this many transactions old holds vacuum back, whatever its age in seconds."""
"""Smaller indexes are not judged by bytes per row (a few pages are always there)."""
SHIPPED_OPTIONS = {"fillfactor=80", "autovacuum_vacuum_scale_factor=0.02"}
"""What migration 0002 sets on video_jobs; without it the hot table bloats sooner."""


@dataclass(frozen=True, slots=True)
class Finding:
    """One check's verdict, what it saw, and what to do."""

    check: str
    status: str
    detail: str
    fix: str = ""


def diagnose(report: dict[str, Any], latest_schema: int,
             embedded_pgdata: Path | None = None) -> list[Finding]:
    """Every check, in the order an operator would look. `embedded_pgdata`: the data
    directory of the embedded PostgreSQL when that is the database (DATABASE_URL unset)."""
    return [*_checks(report, latest_schema), database_finding(embedded_pgdata)]


def database_finding(embedded_pgdata: Path | None) -> Finding:
    """Which database this is: DATABASE_URL's, or the private embedded one (a warning: jobs
    recorded there are seen by no worker on another machine)."""
    if embedded_pgdata is None:
        return Finding("database", OK, "DATABASE_URL")
    return Finding("database", WARN, f"DATABASE_URL is unset: the embedded PostgreSQL in "
                   f"{embedded_pgdata}, private to this machine (no worker elsewhere sees "
                   "its jobs)", "set DATABASE_URL to the server your workers use; "
                   "VIDPOLL_EMBEDDED=off (or --no-embedded) makes every command refuse the "
                   "fallback")


def _checks(report: dict[str, Any], latest: int) -> Iterator[Finding]:
    version = report.get("schema_version")
    if version == latest:
        yield Finding("schema", OK, f"version {version}, current")
    elif version is not None and version > latest and not report.get("schema_refusal"):
        yield Finding("schema", WARN, f"version {version}, newer than this vidpoll ({latest}) "
                      "and marked compatible with it (a rolling upgrade in progress?)",
                      "upgrade this vidpoll when the rollout is done (docs/UPGRADING.md)")
    elif version is not None and version > latest:
        yield Finding("schema", FAIL, f"version {version}, newer than this vidpoll "
                      f"({latest}) and not compatible with it", "upgrade vidpoll")
    else:
        yield Finding("schema", FAIL, f"version {version}, this vidpoll needs {latest}",
                      "run `vidpoll migrate`")
    yield _claim_plan(report.get("claim_plan"), int(report.get("hot_rows_estimate") or 0))
    yield from _tables(report.get("tables", []))
    yield from _indexes(report.get("indexes", []))
    yield from _xmin(report.get("xmin", []))
    yield from _connections(report.get("connections") or {})
    stuck = report.get("stuck_claims", [])
    if stuck:
        who = ", ".join(f"{s['claimed_by']} ({s['rows']} rows since {s['since']:%H:%M:%S})"
                        for s in stuck[:5])
        yield Finding("stuck claims", WARN, f"leases ended over a minute ago without a "
                      f"record: {who}", "the rows are due again and another worker reads "
                      "them; look at that worker (hung, or its database connection cut)")
    else:
        yield Finding("stuck claims", OK, "no lease overdue by more than a minute")
    unknown = int(report.get("unknown_intents") or 0)
    if unknown:
        yield Finding("unknown intents", WARN, f"{unknown} intent(s) refused after an earlier "
                      "attempt's outcome was unknown: a render may be billed and is not yet "
                      "tracked; they are re-sent with the same key every 2 minutes at most",
                      "`vidpoll intents list --state unknown`; once you know from the provider's "
                      "records, `vidpoll intents resolve KEY --job-id ID` or `--not-billed`")
    else:
        yield Finding("unknown intents", OK, "none")


def _plan_nodes(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, list):
        for item in node:
            yield from _plan_nodes(item)
    elif isinstance(node, dict):
        if "Node Type" in node:
            yield node
        for key in ("Plan", "Plans"):
            if key in node:
                yield from _plan_nodes(node[key])


def _claim_plan(plan: Any, rows: int) -> Finding:
    nodes = list(_plan_nodes(plan))
    # a Bitmap Index Scan names the index but not the table; its Bitmap Heap Scan the table
    used = sorted({n["Index Name"] for n in nodes if n.get("Index Name", "").startswith(
        "video_jobs")})
    seq = [n for n in nodes if n.get("Relation Name") == "video_jobs"
           and n.get("Node Type") == "Seq Scan"]
    if rows < SMALL_TABLE_ROWS:
        return Finding("claim query", OK, f"not judged: video_jobs has about {rows:,} rows, "
                       "too few for an index to be the planner's best plan"
                       + (f" (uses {', '.join(used)})" if used else ""))
    if seq or not used:
        return Finding("claim query", FAIL, "the claim reads video_jobs without its partial "
                       "index (a sequential scan)", "run ANALYZE video_jobs; check that "
                       "video_jobs_account_due_idx and video_jobs_next_poll_at_idx exist "
                       "(`vidpoll migrate` recreates them)")
    return Finding("claim query", OK, f"uses {', '.join(used)}")


def _tables(tables: list[dict[str, Any]]) -> Iterator[Finding]:
    for t in tables:
        name, live, dead = t["table_name"], int(t["live"] or 0), int(t["dead"] or 0)
        ratio = dead / max(live, 1)
        if dead > 1000 and ratio > DEAD_RATIO_WARN:
            yield Finding(f"dead rows: {name}", WARN,
                          f"{dead:,} dead for {live:,} live rows ({ratio:.0%}); last vacuum "
                          f"{t['last_vacuum'] or 'never'}",
                          f"VACUUM (ANALYZE) {name}; if it keeps coming back, look for a held "
                          "xmin horizon below, or autovacuum workers too few/slow")
        else:
            yield Finding(f"dead rows: {name}", OK, f"{dead:,} dead, {live:,} live")
        if name == "video_jobs":
            options = set(t.get("options") or [])
            missing = SHIPPED_OPTIONS - options
            if missing:
                yield Finding("autovacuum settings", WARN,
                              f"video_jobs lacks {', '.join(sorted(missing))}",
                              "run `vidpoll migrate` (0002 sets them), or set them again "
                              "with ALTER TABLE video_jobs SET (...)")
            else:
                yield Finding("autovacuum settings", OK, "video_jobs: " + ", ".join(
                    sorted(options)))


def _indexes(indexes: list[dict[str, Any]]) -> Iterator[Finding]:
    for i in indexes:
        if i["index_name"] not in ("video_jobs_next_poll_at_idx", "video_jobs_account_due_idx"):
            continue
        pending, size = int(i["pending_rows"] or 0), int(i["bytes"] or 0)
        per_row = size / max(pending, 1)
        if size > MIN_INDEX_CHECK_BYTES and per_row > INDEX_BYTES_PER_PENDING_ROW_WARN:
            yield Finding(f"index bloat: {i['index_name']}", WARN,
                          f"{size / 1e6:.1f} MB for {pending:,} pending rows "
                          f"({per_row:,.0f} bytes each)",
                          f"REINDEX INDEX CONCURRENTLY {i['index_name']}")
        else:
            yield Finding(f"index bloat: {i['index_name']}", OK,
                          f"{size / 1e6:.2f} MB for {pending:,} pending rows")


def _xmin(holders: list[dict[str, Any]]) -> Iterator[Finding]:
    if not holders:
        yield Finding("xmin horizon", OK, "nothing in this database holds it back")
        return
    top = holders[0]
    age_s = top.get("age_s")
    xid_age = int(top.get("xmin_age") or 0)
    what = f"{top['holder']} {top['who']} ({top['detail'] or '-'})"
    fix = ("vacuum cannot remove dead rows newer than it: end that transaction "
           "(pg_terminate_backend), drop the unused slot, or COMMIT/ROLLBACK PREPARED")
    if top["holder"] != "session":
        if xid_age > XID_AGE_WARN or (age_s is not None and age_s > XMIN_AGE_FAIL_S):
            yield Finding("xmin horizon", WARN, f"{what} holds it back ({_age(age_s)}, "
                          f"{xid_age:,} xids)", fix)
        else:
            yield Finding("xmin horizon", OK, f"{what}, {xid_age:,} xids behind")
    elif (age_s is not None and age_s > XMIN_AGE_FAIL_S) or xid_age > 10 * XID_AGE_WARN:
        yield Finding("xmin horizon", FAIL, f"{what} holds it back ({_age(age_s)}, "
                      f"{xid_age:,} xids)", fix)
    elif (age_s is not None and age_s > XMIN_AGE_WARN_S) or xid_age > XID_AGE_WARN:
        yield Finding("xmin horizon", WARN, f"{what} open for {_age(age_s)} ({xid_age:,} "
                      "xids)", "a long transaction keeps vacuum from cleaning the hot table; "
                      "find it in pg_stat_activity")
    else:
        yield Finding("xmin horizon", OK, f"oldest snapshot {_age(age_s)} old, "
                      f"{xid_age:,} xids behind")


def _connections(c: dict[str, Any]) -> Iterator[Finding]:
    if not c:
        return
    if not c.get("sees_all_sessions", True):
        yield Finding("visibility", WARN, "this role cannot see other roles' sessions (their "
                      "transaction ages and LISTENs look empty)",
                      "run doctor as the owner, or GRANT pg_read_all_stats TO this role")
    used, limit = int(c["used"]), int(c["max_connections"])
    status = WARN if used > CONNECTIONS_WARN * limit else OK
    yield Finding("connections", status, f"{used} of {limit} in use",
                  "" if status == OK else "fewer --db-connections per worker, or PgBouncer "
                  "in transaction mode with `worker --claim lease --no-listen`")
    if c["autovacuum"] != "on" or c["track_counts"] != "on":
        yield Finding("autovacuum", FAIL, f"autovacuum={c['autovacuum']}, "
                      f"track_counts={c['track_counts']}", "turn both on: the hot table "
                      "bloats without them")
    else:
        yield Finding("autovacuum", OK, "on")
    usage = float(c["notify_queue_usage"] or 0)
    listeners = int(c["listeners"])
    if usage > NOTIFY_QUEUE_WARN:
        yield Finding("listeners", WARN, f"NOTIFY queue {usage:.0%} full",
                      "a listener stopped reading (a session LISTENing inside a long "
                      "transaction?); workers still poll on their timers")
    else:
        yield Finding("listeners", OK, f"{listeners} listening session(s), NOTIFY queue "
                      f"{usage:.0%} full" + ("" if listeners else "; workers with --no-listen "
                                            "or none running: wake-ups come from timers"))


PROBE_PREFIX = "vidpoll-doctor-probe-"
"""The job id doctor reads (with a random suffix): one that cannot exist."""
BASE_URL_FIX = ("check {setting}: scheme, host and any path prefix the provider's API lives "
                "under (the status path is appended to it), and any "
                "proxy in between")


async def check_providers(base_url: str | Mapping[str, str], keys: Mapping[str, str],
                          timeout_s: float = 15.0, *,
                          providers: Mapping[str, str] | None = None,
                          settings_of: Mapping[str, str] | None = None) -> list[Finding]:
    """One finding per account with a key (`keys`: account -> API key), by account name: one
    status read each of a job id that cannot exist, all at once. The keys are never shown.
    `base_url`: every account's, or one per account; `providers`: account -> provider name
    (the default provider's for an account not named); `settings_of`: account -> where its
    base URL is set, as messages name it."""
    default = registry.load(registry.DEFAULT_PROVIDER)
    if not keys:
        return [Finding("provider", OK, "not checked: no API key in this environment "
                        f"({default.env_prefix}_API_KEY, {default.env_prefix}_API_KEY_<ACCOUNT>, "
                        "or api_key_env of an account in vidpoll.toml)")]

    async def one(account: str, key: str) -> Finding:
        provider = registry.load((providers or {}).get(account, registry.DEFAULT_PROVIDER))
        url = base_url if isinstance(base_url, str) else base_url[account]
        setting = (settings_of or {}).get(account, f"{provider.env_prefix}_BASE_URL")
        try:
            job_id = f"{PROBE_PREFIX}{uuid.uuid4().hex}"
            async with provider.client(url, key, timeout_s=timeout_s,
                                       max_connections=1) as client:
                if client.key_problem is not None:
                    return Finding(f"provider: {account}", FAIL, "the API key of account "
                                   f"{account!r} cannot be sent: {client.key_problem}",
                                   f"check {key_variable(account)}")
                answer = await client.read_status(job_id)
                return provider_finding(account, client.shown_status_url(job_id), answer,
                                        client.rules, setting)
        except Exception as exc:  # one account's failure is its finding, never a traceback
            return Finding(f"provider: {account}", FAIL, f"could not check account "
                           f"{account!r}: {type(exc).__name__}: {_safe_text(exc, key)}",
                           f"check {key_variable(account)} and {setting}")

    return list(await asyncio.gather(*(one(a, keys[a]) for a in sorted(keys))))


def _safe_text(exc: BaseException, key: str) -> str:
    """An exception's first line for a finding: never the key, no URL's query string, short
    (a header's error may quote the header)."""
    text = str(exc).splitlines()[0] if str(exc) else ""
    if key:
        text = text.replace(key, "<redacted>")
    if "Bearer" in text or "Authorization" in text:
        return "(message not shown: it may quote the key)"
    return redact_urls(text)[:200]


def provider_finding(account: str, url: str, answer: HttpAnswer, rules: Rules,
                     setting: str = "the base URL") -> Finding:
    """What one probe read of `url` (scheme, host and path only) says about an account's base
    URL and key."""
    check = f"provider: {account}"
    verdict = probe_verdict(answer, rules)
    status = answer.status
    code = provider_error_code(answer.body, rules)
    said = f"HTTP {status}" + (f" {code}" if code else "")
    if verdict == PROVIDER:
        return Finding(check, OK, f"{url} answered in the provider's own words ({said}) for a "
                       "job id that cannot exist: base URL and key are right")
    if verdict == KEY_REFUSED:
        return Finding(check, FAIL, f"the provider refused the API key of account {account!r} "
                       f"({said}) at {url}", f"check {key_variable(account)} (if the key is "
                       "right and no error code is shown, a proxy may refuse instead: "
                       f"check {setting})")
    if verdict == MISROUTED:
        kind = body_kind(answer.body, parsed_json_object(answer.body))
        return Finding(check, FAIL, f"base URL looks wrong: {url} answered HTTP {status} "
                       f"({kind}), not the provider's error envelope",
                       BASE_URL_FIX.format(setting=setting))
    if verdict == NOT_API:
        # a warning, as for the worker: a provider's own broken body may come now and then
        what = ("a redirect" if status is not None and 300 <= status < 400
                else "an HTML page" if body_kind(answer.body, None) == "an HTML page"
                else "not a JSON object")
        return Finding(check, WARN, f"base URL is probably wrong: {url} answered HTTP "
                       f"{status} ({what}), not the provider's JSON",
                       BASE_URL_FIX.format(setting=setting) + "; run "
                       "`vidpoll doctor` again if the URL is right (a passing glitch)")
    if verdict == NO_ANSWER:
        return Finding(check, FAIL, f"base URL looks wrong: {url} gave no answer "
                       f"({answer.transport_error}: {redact_urls(answer.detail)})",
                       BASE_URL_FIX.format(setting=setting)
                       + "; or the network, a firewall, or the provider is down")
    return Finding(check, WARN, f"{url} answered {said}, which does not tell whether base URL "
                   "and key are right (a gateway error, or a pause asked for)",
                   "run `vidpoll doctor` again in a minute")


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "age unknown"
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"


def spend_findings(accounts: Mapping[str, tuple[AccountSpend, Mapping[str, str]]]
                   ) -> list[Finding]:
    """One finding per account on what vidpoll knows of its costs (vidpoll.spend): `accounts`
    maps a name to (its prices and caps, its provider's cost units)."""
    found = []
    for name, (spend, units) in sorted(accounts.items()):
        check = f"spend: {name}"
        if not spend.priced:
            guard = (f"; max_creates_per_hour {spend.max_creates_per_hour} caps its creates"
                     if spend.max_creates_per_hour is not None else "")
            found.append(Finding(check, OK, f"no prices: its jobs have no estimate and no "
                                 f"spend cap{guard}",
                                 f"set price_per_job (or [accounts.{name}.prices]) and "
                                 f"cap_per_day / cap_per_month in the accounts file to cap "
                                 f"what it spends"))
            continue
        caps = [f"{k} {v} {spend.currency}" for k, v in (("cap_per_day", spend.cap_per_day),
                                                          ("cap_per_month", spend.cap_per_month))
                if v is not None]
        caps += [f"cap_per_key_prefix {p!r} {c} {spend.currency}"
                 for p, c in spend.cap_per_key_prefix.items()]
        if spend.max_creates_per_hour is not None:
            caps.append(f"max_creates_per_hour {spend.max_creates_per_hour}")
        unpriced = sorted(set(units) - set(spend.unit_prices) - {spend.currency.lower()})
        fix = (f"add [accounts.{name}.unit_prices] {unpriced[0]} = ... to count the "
               f"provider's own figure instead of the estimate" if unpriced else "")
        found.append(Finding(check, OK, f"priced in {spend.currency}; "
                             + ("caps: " + ", ".join(caps) if caps else "no caps")
                             + (f"; the provider's {', '.join(unpriced)} figures are recorded "
                                f"but not converted (no unit price)" if unpriced else ""), fix))
    return found
