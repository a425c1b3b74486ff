"""Inputs the through-the-stack fuzzing (tests/integration/test_fuzz.py) found, pinned."""

from __future__ import annotations

import pytest

from vidpoll.errors import InvalidJobId
from vidpoll.policy import validate_job_id


@pytest.mark.parametrize("job_id", ["\ud800", "a\udfffb", "\udc00\ud800"])
def test_a_lone_surrogate_job_id_is_refused_as_invalid(job_id: str) -> None:
    # found by ids=['\ud800']: store.add_job raised UnicodeEncodeError from psycopg
    with pytest.raises(InvalidJobId, match="surrogate"):
        validate_job_id(job_id)
