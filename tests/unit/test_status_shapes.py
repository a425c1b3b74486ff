"""decide() on both shapes of Sume's status answer (issue 15, item 0).

The seed's bare `{terminal, sume_status, next_poll_after_seconds}`, and the one Sume's CLI reads
and mocks: fields under `data`, `data.job` or `job` (or a top-level `status`), the word in any
case, often no `terminal` flag. Pure: a fixed `now`, a seeded random source, no I/O.
"""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from vidpoll.models import GAVE_UP, PENDING, ClaimedJob, ErrorClass, HttpAnswer, Outcome
from vidpoll.policy import (
    PollPolicy,
    decide,
)
from vidpoll.providers.sume.rules import (
    COMPLETED,
    ENDED_STATUSES,
    IN_PROGRESS_STATUSES,
    SUCCESS_STATUSES,
    TERMINAL_STATUSES,
)
from vidpoll.providers.sume.rules import RULES as SUME
from vidpoll.providers.sume.rules import (
    read_fields as read_status,
)

NOW = datetime(2025, 6, 1, 12, 0, 0, tzinfo=UTC)
POLICY = PollPolicy()
TOKEN = uuid.UUID("00000000-0000-4000-8000-000000000002")


def job(age_s: float = 60.0) -> ClaimedJob:
    return ClaimedJob(job_id="vid_1", claim_token=TOKEN, due_at=NOW,
                      polling_since=NOW - timedelta(seconds=age_s), polls=1,
                      consecutive_errors=0, not_found_count=0)


def read(body: Any, age_s: float = 60.0) -> Outcome:
    result = decide(job(age_s), HttpAnswer(200, json.dumps(body).encode()), NOW, POLICY,
                    random.Random(0), SUME)
    assert isinstance(result, Outcome), result
    return result


def enveloped(word: str, **fields: Any) -> dict[str, Any]:
    """The shape Sume's CLI mocks: a `data` envelope, no `terminal` flag, and the extras."""
    return {"data": {"id": "vid_1", "status": word, "result_ready": False, "progress": 0.5,
                     "next_action": "poll", "usage": {"reserved": 10}, **fields},
            "request_id": "req_abc"}


# --- the words, without a flag ---------------------------------------------------------------

@pytest.mark.parametrize(("word", "stored"), [
    ("COMPLETED", "completed"), ("completed", "completed"), ("Complete", "complete"),
    ("success", "success"), ("SUCCEEDED", "succeeded"), (" succeeded\n", "succeeded"),
])
def test_a_success_word_without_a_flag_completes_the_job(word: str, stored: str) -> None:
    out = read(enveloped(word))
    # the state is Sume's own word lower-cased (the contract); each success word is one
    assert out.state == stored and out.succeeded
    assert out.provider_status == stored
    assert out.read_ok and out.is_final and out.error_class is None
    assert out.request_id == "req_abc"
    assert out.body == enveloped(word)


@pytest.mark.parametrize(("word", "state"), [
    ("failed", "failed"), ("FAILED", "failed"), ("error", "error"), ("Errored", "errored"),
    ("canceled", "canceled"), ("CANCELLED", "cancelled"), ("expired", "expired"),
    ("EXPIRED", "expired"),
])
def test_an_ending_word_without_a_flag_ends_the_job_under_its_own_word(word: str,
                                                                     state: str) -> None:
    out = read(enveloped(word))
    assert out.state == state
    assert out.provider_status == state
    assert out.read_ok and out.is_final and out.delay_s == 0.0


@pytest.mark.parametrize("word", ["running", "RUNNING", "queued", "Processing", "pending",
                                  "submitted"])
def test_an_in_progress_word_without_a_flag_keeps_polling_with_the_hint(word: str) -> None:
    out = read(enveloped(word, next_poll_after_seconds=30))
    assert out.state == PENDING
    assert out.delay_s == 30.0
    assert out.provider_status == word.lower()
    assert out.read_ok and out.error_class is None


@pytest.mark.parametrize("word", ["ready", "rendering", "WAITING_FOR_GPU"])
def test_an_unknown_word_without_a_flag_keeps_polling_not_an_error(word: str) -> None:
    out = read(enveloped(word))
    assert out.state == PENDING
    assert out.read_ok and out.error_class is None  # the worker logs the word once
    assert out.provider_status == word.lower()
    assert out.provider_status not in IN_PROGRESS_STATUSES
    assert out.delay_s == POLICY.default_poll_s


def test_an_unknown_word_past_the_deadline_gives_up() -> None:
    out = read(enveloped("ready"), age_s=POLICY.max_age_s + 1)
    assert out.state == GAVE_UP


# --- where the fields are --------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    {"status": "succeeded"},
    {"data": {"status": "succeeded"}},
    {"data": {"sume_status": "succeeded"}},
    {"data": {"job": {"id": "vid_1", "status": "succeeded"}}},
    {"job": {"id": "vid_1", "status": "succeeded"}},
    {"sume_status": "succeeded"},
], ids=["status", "data.status", "data.sume_status", "data.job.status", "job.status",
        "sume_status"])
def test_the_word_is_found_in_every_holder_the_cli_reads(body: dict[str, Any]) -> None:
    out = read(body)
    assert (out.state, out.provider_status) == ("succeeded", "succeeded")


def test_a_top_level_status_does_not_override_the_jobs_own_word() -> None:
    # {"status": "success"} may describe the envelope; the job itself is still running
    out = read({"status": "success", "data": {"job": {"status": "running"}}})
    assert out.state == PENDING and out.provider_status == "running"


@pytest.mark.parametrize("body", [
    {"data": {"status": "running", "next_poll_after_seconds": 42}},
    {"data": {"job": {"status": "running", "next_poll_after_seconds": "42"}}},
    {"job": {"status": "running", "next_poll_after_seconds": 42}},
    {"status": "running", "next_poll_after_seconds": 42},
])
def test_the_hint_is_read_under_the_envelope_too(body: dict[str, Any]) -> None:
    assert read(body).delay_s == 42.0


def test_the_flag_may_live_under_the_envelope() -> None:
    out = read({"data": {"terminal": True, "status": "Failed"}})
    assert out.state == "failed" and out.is_final


# --- the flag wins ---------------------------------------------------------------------------

def test_a_false_flag_wins_over_a_terminal_word() -> None:
    out = read({"terminal": False, "data": {"status": "completed"},
                "next_poll_after_seconds": 5})
    assert out.state == PENDING and out.delay_s == 5.0


def test_a_true_flag_wins_over_an_unknown_word() -> None:
    out = read({"terminal": True, "sume_status": "Ready"})
    assert out.state == "ready" and out.is_final  # as the seed's shape always did


@pytest.mark.parametrize("word", sorted(SUCCESS_STATUSES))
def test_the_seed_shape_with_a_success_word_succeeds_too(word: str) -> None:
    out = read({"terminal": True, "sume_status": word.upper()})
    assert (out.state, out.provider_status, out.succeeded) == (word, word, True)


@pytest.mark.parametrize("flag", ["true", "false", 1, 0, [], {}])
def test_a_flag_that_is_not_a_boolean_leaves_the_word_to_decide(flag: Any) -> None:
    assert read({"terminal": flag, "sume_status": "completed"}).state == COMPLETED
    assert read({"terminal": flag, "sume_status": "running"}).state == PENDING


def test_the_seed_shape_reads_as_before() -> None:
    done = read({"terminal": True, "sume_status": "COMPLETED"})
    assert (done.state, done.provider_status) == ("completed", "completed")
    waiting = read({"terminal": False, "sume_status": "running",
                    "next_poll_after_seconds": 7})
    assert (waiting.state, waiting.delay_s) == (PENDING, 7.0)


# --- neither flag nor word -------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    {}, {"data": {}}, {"data": {"status": 5}}, {"status": "   "}, {"job": {"state": "done"}},
    {"data": {"job": {"status": None}}, "request_id": "r"}, {"result_ready": True},
    {"terminal": None},
])
def test_an_answer_with_neither_flag_nor_word_stays_malformed(body: dict[str, Any]) -> None:
    out = read(body)
    assert out.state == PENDING and not out.read_ok
    assert out.error_class is ErrorClass.MALFORMED
    assert out.error is not None and "status word" in out.error


@pytest.mark.parametrize("body", [{"data": {"terminal": True}},
                                  {"terminal": True, "data": {"status": "pending"}}])
def test_a_terminal_flag_without_a_usable_word_stays_malformed(body: dict[str, Any]) -> None:
    out = read(body)
    assert out.state == PENDING and out.error_class is ErrorClass.MALFORMED


# --- the vocabularies ------------------------------------------------------------------------

def test_the_word_sets_are_consistent() -> None:
    assert not TERMINAL_STATUSES & IN_PROGRESS_STATUSES
    assert not SUCCESS_STATUSES & ENDED_STATUSES
    assert {"complete", "completed", "success", "succeeded", "canceled", "cancelled", "error",
            "errored", "failed", "expired"} == TERMINAL_STATUSES
    assert PENDING in IN_PROGRESS_STATUSES and PENDING not in TERMINAL_STATUSES
    assert all(w == w.lower() for w in TERMINAL_STATUSES | IN_PROGRESS_STATUSES)


def test_read_status_reports_flag_word_and_hint() -> None:
    got = read_status({"data": {"job": {"status": " Running "}},
                       "next_poll_after_seconds": 3})
    assert (got.terminal, got.word, got.next_poll_after) == (None, "running", 3)
