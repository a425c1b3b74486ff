"""The words that mean "a video was made" are one list, Sume's, in Python and in SQL.

The state is the provider's own word lower-cased; the provider's rules give each terminal word
a neutral outcome, and `succeeded` gets a result fetch (record_outcomes, from
Outcome.succeeded), a download and exit 0 from `wait`. Migration 0011's trigger (what a
release before 0014 queues downloads by) lists Sume's success words in SQL: the same list.
"""

from __future__ import annotations

import re
import uuid

from vidpoll.models import Outcome
from vidpoll.providers.sume.rules import RULES, SUCCESS_STATUSES
from vidpoll.sql import migrations


def test_the_download_trigger_of_0011_lists_exactly_sumes_success_words() -> None:
    [(_, _, sql)] = [m for m in migrations() if m[1] == "0011_success_words.sql"]
    listed = re.search(r"NEW\.state IN \(([^)]*)\)", sql)
    assert listed is not None
    assert set(re.findall(r"'([^']+)'", listed.group(1))) == SUCCESS_STATUSES
    assert {w for w, o in RULES.words.items() if o == "succeeded"} == SUCCESS_STATUSES


def test_an_outcome_succeeds_by_its_neutral_outcome_not_by_its_word() -> None:
    for word in (*SUCCESS_STATUSES, "failed", "canceled", "expired", "weird"):
        outcome = Outcome("j", uuid.uuid4(), word, 0.0, read_ok=True,
                          outcome=RULES.words.get(word, "failed"))
        assert outcome.succeeded == (word in SUCCESS_STATUSES)
    # a provider whose success word is Sume's failure word: the outcome decides
    assert Outcome("j", uuid.uuid4(), "failed", 0.0, read_ok=True, outcome="succeeded").succeeded
    assert not Outcome("j", uuid.uuid4(), "completed", 0.0, read_ok=True,
                       outcome="failed").succeeded
