"""Inputs the through-the-stack fuzzing (tests/integration/test_fuzz.py) found, pinned."""

from __future__ import annotations

import pytest

from vidpoll.errors import InvalidJobId
from vidpoll.media import job_path_segment
from vidpoll.policy import validate_job_id


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
