"""The chaos run's short variant (make test), and its detectors against planted violations."""

from __future__ import annotations

import pytest

from .harness import AuditRow, ChaosConfig, early_reads, run, short_hints, stale_writes


def row(kind: str, at: float, next_poll_at: float, *, job: str = "j", by: str | None = "w:1",
        app: str | None = "vidpoll w:1", hint: float | None = None,
        due_after_s: float = 1.0) -> AuditRow:
    return AuditRow(job, at, kind, by, app, next_poll_at, kind == "record", hint, due_after_s,
                    "pending")


def test_a_read_before_the_recorded_due_time_is_caught():
    audit = [row("insert", 100.0, 100.2), row("claim", 100.3, 103.3),
             row("record", 100.5, 101.1)]
    on_time = [(100.25, 11, "j"), (101.2, 12, "j")]
    assert early_reads(on_time, audit, [], 4.0) == (0, [])
    excused, early = early_reads([(100.8, 12, "j")], audit, [], 4.0)
    assert excused == 0 and early == ["j by pid 12: 0.300s early"]
    # the same read from a worker that was just frozen past its lease is counted apart
    assert early_reads([(100.8, 12, "j")], audit, [(12, 95.0, 100.6)], 4.0) == (1, [])
    # and a freeze long before does not excuse it
    assert early_reads([(100.8, 12, "j")], audit, [(12, 80.0, 85.0)], 4.0)[0] == 0


def test_a_write_by_a_process_not_holding_the_claim_is_caught():
    assert stale_writes([row("record", 1.0, 2.0)]) == []
    assert stale_writes([row("release", 1.0, 2.0, app="vidpoll w:2")]) == [
        "j by 'vidpoll w:2', claim of 'w:1'"]
    # an outcome written to a row that nobody had claimed (a write with no fence at all)
    assert stale_writes([row("unfenced", 1.0, 2.0, by=None)]) == [
        "j by 'vidpoll w:1', claim of None"]
    long_id = "h" * 80
    assert stale_writes([row("record", 1.0, 2.0, by=long_id,
                             app=("vidpoll " + long_id)[:63])]) == []


def test_a_due_time_sooner_than_the_hint_is_caught():
    # the fake sent the answer at 1.0; the record (at 1.05) made the row due at 1.6 or 1.4
    answers = [(0.2, "j"), (1.0, "j"), (3.0, "j")]
    assert short_hints([row("record", 1.05, 1.6, hint=0.6)], answers) == []
    assert short_hints([row("record", 1.05, 1.4, hint=0.6)], answers) == [
        "j: due 0.400s after the answer < hint 0.6"]
    # counted from the fake's own log, not from what vidpoll recorded as the answer's time
    assert short_hints([row("record", 1.05, 1.4, hint=0.6, due_after_s=0.6)], answers) != []


@pytest.mark.slow
async def test_a_short_chaos_run_loses_nothing(tmp_path):
    cfg = ChaosConfig(seed=7, duration_s=40.0)
    figures = await run(cfg, tmp_path)
    assert figures.violations and not any(figures.violations.values()), figures.examples
    # the storm really happened, and the detectors had something to look at
    assert figures.kills >= 3 and figures.pauses >= 1 and figures.pg_restarts == 2
    assert sum(figures.net_cuts.values()) >= 1
    assert sum(figures.faults_injected.values()) >= 50 and len(figures.faults_injected) >= 6
    assert figures.intents >= 40 and figures.clips_billed == figures.intents
    assert figures.reads_seen_by_proxy >= figures.status_reads * 0.9
    assert figures.reads_attributed_to_a_worker >= figures.reads_seen_by_proxy * 0.9
    assert figures.hook_calls >= figures.jobs
