"""What Sume's answers mean: its status words, its two shapes of status answer, its error
envelope, its create answer and its result's "not yet". Pure; no I/O.

The seed reads `{terminal, sume_status, next_poll_after_seconds}`; Sume's CLI reads an
enveloped answer (fields under `data`, `data.job` or `job`, often no `terminal`). Both are
read here (`read_status`), so the core only ever sees a neutral `StatusView`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vidpoll.errors import InvalidJobId
from vidpoll.media import media_urls
from vidpoll.models import PENDING, HttpAnswer
from vidpoll.policy import MAX_ERROR_TEXT, validate_job_id
from vidpoll.providers.base import (
    NeutralOutcome,
    Pending,
    ResultSource,
    StatusView,
    Terminal,
    Unreadable,
)

COMPLETED = "completed"
"""Sume's terminal word of a render that produced a video."""
IN_PROGRESS_STATUSES = frozenset({"queued", "running", "processing", "pending", "submitted"})
"""Status words that mean "not done yet": read without a `terminal` flag, they keep the row
polled like any unknown word, but the worker logs only the words outside this set."""
SUCCESS_STATUSES = frozenset({"complete", COMPLETED, "success", "succeeded"})
"""Words that end a job with a video (Sume's CLI reads `succeeded`, `success`, `complete` as
well as `completed`). The state is the word itself, lower-cased, as for every terminal word;
the neutral outcome is `succeeded`."""
ENDED_STATUSES = frozenset({"canceled", "cancelled", "error", "errored", "failed", "expired"})
"""Words that end a job without a video (the CLI's, plus `expired`, which the CLI forgets)."""
TERMINAL_STATUSES = SUCCESS_STATUSES | ENDED_STATUSES
"""The words that end a job when the answer carries no `terminal` flag."""
WORDS: Mapping[str, NeutralOutcome] = {
    **dict.fromkeys(SUCCESS_STATUSES, "succeeded"),
    **dict.fromkeys(("failed", "error", "errored"), "failed"),
    **dict.fromkeys(("canceled", "cancelled"), "canceled"),
    "expired": "expired",
}
"""Every terminal word and its neutral outcome; a word not here that arrives with
`terminal: true` ended the job without a video (`failed`)."""


@dataclass(frozen=True, slots=True)
class StatusRead:
    """What a 200 status answer says, whichever of Sume's two shapes it came in."""

    terminal: bool | None
    """The `terminal` flag, None when no holder carries a boolean one."""
    word: str | None
    """The status word, stripped and lower-cased; None when there is none."""
    next_poll_after: Any
    """The raw `next_poll_after_seconds` hint (None when absent)."""


def _holders(body: dict[str, Any]) -> tuple[dict[str, Any], ...]:
    """The objects a status answer keeps its fields in, nearest the job first: `data.job`,
    `job`, `data`, then the top."""
    data = body.get("data")
    data = data if isinstance(data, dict) else {}
    found = (data.get("job"), body.get("job"), data)
    return (*(h for h in found if isinstance(h, dict) and h), body)


def _word(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    word = value.strip().lower()
    return word or None


def read_fields(body: dict[str, Any]) -> StatusRead:
    """Read the flag, the word and the hint of a status answer in either shape.

    The flag, the hint and the seed's `sume_status` are looked for at the top first, then
    under data.job, job and data; then `status`, nearest the job first (data.job, job, data,
    top): a top-level `status` may describe the envelope ("ok", "success") rather than the
    job, so it counts only when nothing nearer the job carries a word. A flag that is not a
    boolean is no flag (the word decides).
    """
    nearest = _holders(body)
    seed_first = (body, *nearest[:-1])  # the seed's own fields live at the top
    terminal = next((h["terminal"] for h in seed_first if isinstance(h.get("terminal"), bool)),
                    None)
    word = next((w for w in (_word(h.get("sume_status")) for h in seed_first) if w), None)
    if word is None:
        word = next((w for w in (_word(h.get("status")) for h in nearest) if w), None)
    hint = next((h["next_poll_after_seconds"] for h in seed_first
                 if h.get("next_poll_after_seconds") is not None), None)
    return StatusRead(terminal, word, hint)


def outcome_of(word: str) -> NeutralOutcome:
    """The neutral outcome of a terminal word (an unknown one: ended without a video)."""
    return WORDS.get(word, "failed")


def envelope(body: dict[str, Any] | None) -> tuple[str | None, str | None]:
    """Sume's error code and message, if the body is its error envelope
    (`{"error": {"code": ..., "message": ...}}`)."""
    err = (body or {}).get("error")
    if not isinstance(err, dict):
        return None, None
    code, message = err.get("code"), err.get("message")
    return (str(code)[:200] if isinstance(code, str) and code else None,
            str(message)[:MAX_ERROR_TEXT] if isinstance(message, str) and message else None)


class SumeRules:
    """Sume's answers (`vidpoll.providers.base.Rules`)."""

    result_source = ResultSource.SEPARATE
    """GET /v1/jobs/{id}/result after `completed` (409 job_not_completed until it is ready)."""
    idempotency_header = "Idempotency-Key"
    takes_model = False
    """The request body (`submit --json`) says everything, a model included."""
    min_poll_s = 0.0
    """Sume's hint says when to read next; the worker's own floor (VIDPOLL_MIN_POLL_S) applies."""
    rate_limit_headers = ("RateLimit-Remaining", "RateLimit-Reset")
    words = WORDS

    def read_status(self, body: dict[str, Any]) -> StatusView:
        read = read_fields(body)
        word, terminal = read.word, read.terminal
        if terminal is None:
            if word is None:
                return Unreadable("no boolean 'terminal' and no status word ('sume_status' or "
                                  "'status', at the top or under 'data', 'data.job' or 'job')")
            # no flag: the word decides, as Sume's CLI does; an unknown word keeps polling
            terminal = word in TERMINAL_STATUSES
        if terminal:
            if not word or word == PENDING:
                return Unreadable("terminal answer without a usable 'sume_status'")
            return Terminal(word, outcome_of(word))
        return Pending(word, read.next_poll_after,
                       known=word is None or word in IN_PROGRESS_STATUSES)

    def error_code(self, body: dict[str, Any] | None) -> tuple[str | None, str | None]:
        return envelope(body)

    def created_job_id(self, body: dict[str, Any] | None) -> str | None:
        """The job id in a create answer or a webhook (`job_id`, `id`, or either under
        `data`)."""
        for holder in (body, (body or {}).get("data")):
            if not isinstance(holder, dict):
                continue
            for name in ("job_id", "id"):
                value = holder.get(name)
                if isinstance(value, str):
                    try:
                        return validate_job_id(value)
                    except InvalidJobId:
                        return None
        return None

    def media_urls(self, result: Any) -> list[str]:
        """Sume's result lists its videos under `url` keys (`videos[].url`)."""
        return media_urls(result)

    def result_not_ready(self, answer: HttpAnswer, code: str | None) -> bool:
        # 409 job_not_completed: Sume's "not yet"
        return answer.status == 409


RULES = SumeRules()
created_job_id = RULES.created_job_id
