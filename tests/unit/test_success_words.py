"""The words that mean "a video was made" are one list, in Python and in SQL.

The state is the provider's own word lower-cased; models.SUCCESS_STATES says which of them get a
result fetch (record_outcomes, from Outcome.succeeded), a download (the 0011 trigger, which
lists them in SQL) and exit 0 from `wait`.
"""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime

from vidpoll.models import SUCCESS_STATES, Job, Outcome
from vidpoll.sql import migrations


def test_the_download_trigger_lists_exactly_the_success_states() -> None:
    [(_, _, sql)] = [m for m in migrations() if m[1] == "0011_success_words.sql"]
    listed = re.search(r"NEW\.state IN \(([^)]*)\)", sql)
    assert listed is not None
    assert set(re.findall(r"'([^']+)'", listed.group(1))) == SUCCESS_STATES


def test_an_outcome_and_a_job_succeed_by_the_same_words() -> None:
    now = datetime.now(UTC)
    for state in (*SUCCESS_STATES, "failed", "canceled", "expired", "gave_up", "pending"):
        outcome = Outcome("j", uuid.uuid4(), state, 0.0, read_ok=True)
        job = Job(job_id="j", state=state, provider_status=state, polls=1, created_at=now,
                  finished_at=now, idempotency_key=None)
        assert outcome.succeeded == job.succeeded == (state in SUCCESS_STATES)
