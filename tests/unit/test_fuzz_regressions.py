"""Inputs the through-the-stack fuzzing (tests/integration/test_fuzz.py) found, pinned."""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime

import pytest

from vidpoll.errors import InvalidIntent, InvalidJobId
from vidpoll.media import job_path_segment
from vidpoll.models import ClaimedJob, ClaimedResult, ErrorClass, HttpAnswer, Outcome
from vidpoll.policy import (
    PollPolicy,
    decide,
    decide_result,
    validate_job_id,
    validate_payload,
)
from vidpoll.providers.sume.rules import RULES as SUME


@pytest.mark.parametrize("job_id", ["\ud800", "a\udfffb", "\udc00\ud800"])
def test_a_lone_surrogate_job_id_is_refused_as_invalid(job_id: str) -> None:
    # found by ids=['\ud800']: store.add_job raised UnicodeEncodeError from psycopg
    with pytest.raises(InvalidJobId, match="surrogate"):
        validate_job_id(job_id)


def test_the_job_id_limit_counts_utf8_bytes_so_its_url_fits_a_request_line() -> None:
    # found by ids=['日' * 1024]: accepted, then every read was a 400 "Got more than 8190
    # bytes" from the server (a 9 KB percent-encoded path), until the row gave up
    assert validate_job_id("a" * 1024) == "a" * 1024
    assert validate_job_id("日" * 341) == "日" * 341  # 1023 bytes
    with pytest.raises(InvalidJobId, match="1026 bytes"):
        validate_job_id("日" * 342)
    with pytest.raises(InvalidJobId, match="1025 bytes"):
        validate_job_id("a" * 1025)
    assert len(job_path_segment("日" * 341)) <= 3 * 1024


JOB = ClaimedJob("j", uuid.UUID(int=1), datetime(2026, 1, 1, tzinfo=UTC),
                 datetime(2026, 1, 1, tzinfo=UTC), 0, 0, 0)
AT = datetime(2026, 1, 1, 0, 1, tzinfo=UTC)


@pytest.mark.parametrize("number", ["1e400", "-1e400", "1.5e308"])
def test_a_number_past_a_doubles_range_makes_the_body_malformed_not_unwritable(
        number: str) -> None:
    # found by raw='{"": 1e400}': json.loads made it inf, the outcome kept the body, and
    # store.record's json.dumps(allow_nan=False) raised: the batch was dropped on every read
    body = f'{{"terminal": true, "sume_status": "completed", "x": {number}}}'.encode()
    if number == "1.5e308":  # still a finite double: a normal answer
        outcome = decide(JOB, HttpAnswer(200, body), AT, PollPolicy(), random.Random(1), SUME)
        assert isinstance(outcome, Outcome) and outcome.state == "completed"
        return
    outcome = decide(JOB, HttpAnswer(200, body), AT, PollPolicy(), random.Random(1), SUME)
    assert isinstance(outcome, Outcome)
    assert outcome.error_class is ErrorClass.MALFORMED and outcome.body is None
    json.dumps(outcome.body, allow_nan=False)  # what store.record does with it
    result = decide_result(ClaimedResult("j", uuid.UUID(int=2), 1), HttpAnswer(200, body), AT,
                           PollPolicy(), random.Random(1), SUME)
    assert result.state == "pending" and result.result is None


@pytest.mark.parametrize("text", ["\\u0000", "a\\\\u0000", "\\\\\\u0000"])
def test_the_literal_text_backslash_u0000_is_not_a_nul(text: str) -> None:
    # found by raw='{"": "\\\\u0000"}' (the six characters \u0000, no NUL): the body counted as
    # malformed, and a payload holding that text was refused as "contains a NUL character"
    assert "\x00" not in text
    body = json.dumps({"terminal": False, "note": text, text: 1}).encode()
    outcome = decide(JOB, HttpAnswer(200, body), AT, PollPolicy(), random.Random(1), SUME)
    assert isinstance(outcome, Outcome) and outcome.error_class is None
    assert outcome.body == {"terminal": False, "note": text, text: 1}
    assert validate_payload({"prompt": text, text: [text]}) == {"prompt": text, text: [text]}


@pytest.mark.parametrize("value", ["\x00", "a\\\x00", "\\\\\x00"])
def test_a_real_nul_is_still_refused_after_any_backslashes(value: str) -> None:
    body = json.dumps({"terminal": False, "note": value}).encode()
    outcome = decide(JOB, HttpAnswer(200, body), AT, PollPolicy(), random.Random(1), SUME)
    assert isinstance(outcome, Outcome) and outcome.error_class is ErrorClass.MALFORMED
    with pytest.raises(InvalidIntent, match="NUL"):
        validate_payload({"prompt": value})


@pytest.mark.parametrize(("value", "stored"), [(1e300, 10**300), (1.5e16, 15 * 10**15),
                                               (-2e22, -2 * 10**22), (1e-300, 1e-300),
                                               (123.0, 123.0), (0.1, 0.1)])
def test_a_payload_float_is_normalised_the_way_jsonb_gives_it_back(value: float,
                                                                   stored: float) -> None:
    # found by payload={'prompt': 'x', 'f': 1e300}: jsonb returns it as 1000...0 (an int),
    # so re-adding the very same request raised KeyConflict
    normal = validate_payload({"prompt": "x", "f": value})
    assert normal["f"] == stored and type(normal["f"]) is type(stored)
