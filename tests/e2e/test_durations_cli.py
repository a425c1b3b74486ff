"""Render times and overdue jobs from the command line: `jobs stats --durations [--json]`,
`jobs list --overdue [--json]`, `jobs show`'s next read. The real commands (click, in this
process), a real PostgreSQL; the rows are ended by UPDATEs (the trigger records their render
times) and planned by a real store write."""

from __future__ import annotations

import asyncio
import json
from statistics import median

import pytest
from click.testing import CliRunner, Result

from tests.integration.test_render_times import _end_jobs
from vidpoll.cli import main
from vidpoll.models import Outcome
from vidpoll.store import PgStore


def _run(*args: str) -> Result:
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


async def _planned_overdue(db_url: str, job_id: str, reason: str) -> None:
    """A pending job whose reads a worker planned, overdue 30 s ago (a real store write)."""
    store = await PgStore.open(db_url, max_size=2)
    try:
        await store.add_job(job_id, delay_s=0.0)
        (job,) = await store.claim(5, 30.0, "w1")
        await store.record([Outcome(job.job_id, job.claim_token, "pending", 5.0, read_ok=True,
                                    poll_reason=reason, overdue_after_s=-30.0)])
    finally:
        await store.close()


def test_durations_overdue_and_the_next_read(db_url: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.delenv("VIDPOLL_CONFIG", raising=False)
    _end_jobs(db_url, "k", [60.0 + i * 0.5 for i in range(120)], model="kling-v2", key="5s")
    _end_jobs(db_url, "w", [10.0] * 7, model="wan<b>", key=None)

    shown = _run("jobs", "stats", "--durations", "--json")
    assert shown.exit_code == 0, shown.output
    rows = {(r["model"], r["duration_key"]): r for r in json.loads(shown.output)["durations"]}
    kling = rows[("kling-v2", "5s")]
    assert kling["jobs"] == 120 and kling["learned"] is True
    assert kling["p50"] == pytest.approx(median(60.0 + i * 0.5 - 0.5 for i in range(120)),
                                         abs=0.6)
    assert kling["p10"] < kling["p50"] < kling["p90"] <= kling["p99"]
    assert rows[("kling-v2", None)]["jobs"] == 120  # the model over every key
    assert rows[("wan<b>", "")]["learned"] is False

    table = _run("jobs", "stats", "--durations")
    assert table.exit_code == 0
    assert "kling-v2" in table.output and "120" in table.output

    asyncio.run(_planned_overdue(db_url, "slow-1", "learned: read 3 of 12 at age 64s (dense)"))
    overdue = _run("jobs", "list", "--overdue", "--json")
    assert overdue.exit_code == 0, overdue.output
    assert [r["job_id"] for r in json.loads(overdue.output)["jobs"]] == ["slow-1"]
    assert "slow-1" in _run("jobs", "list", "--overdue").output
    refused = _run("jobs", "list", "--overdue", "--state", "succeeded")
    assert refused.exit_code == 2 and "--overdue lists pending jobs" in refused.output

    show = _run("jobs", "show", "slow-1")
    assert show.exit_code == 0
    assert "next read" in show.output and "learned: read 3 of 12" in show.output
    assert "overdue_at" in show.output


def test_no_render_times_yet_says_so(db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.delenv("VIDPOLL_CONFIG", raising=False)
    out = _run("jobs", "stats", "--durations")
    assert out.exit_code == 0
    assert "no render times yet" in out.output
    assert json.loads(_run("jobs", "stats", "--durations", "--json").output) == {
        "durations": [], "learn_after_jobs": 100}
