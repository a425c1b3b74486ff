"""What Sume's answers mean: its status words, its two shapes of status answer, its error
envelope, its create answer and its result's "not yet". Pure; no I/O.

The seed reads `{terminal, sume_status, next_poll_after_seconds}`; Sume's CLI reads an
enveloped answer (fields under `data`, `data.job` or `job`, often no `terminal`). Both are
read here (`read_status`), so the core only ever sees a neutral `StatusView`.

What a job cost (`cost`) is Sume's `usage` beside the status word ("Credits are reserved when
a job is accepted, then captured or refunded", SUME_API.md), in one of two forms:
- bare amounts in credits, `{"reserved", "captured", "refunded"}` (SUME_API.md; the fake);
- US dollars, as Sume's CLI (sumelabs/cli 0dc4f33, `src/commands/jobs.ts` `readUsageSummary`
  and its tests) reads them: `captured_amount_usd_micros`, `refunded_amount_usd_micros` (or
  `released_...`), `reserved_amount_usd_micros`, `billable_amount_usd_micros` (or
  `amount_usd_micros`), each also as `..._usd_cents`, with `usage_status` (or `status`,
  `state`: `estimated`, `reserved`, `captured`, `refunded`, `released`) saying which of them
  the billable amount is, and `currency` (or `billable_currency`, USD when absent).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from vidpoll.errors import InvalidJobId
from vidpoll.media import media_urls
from vidpoll.models import PENDING, HttpAnswer
from vidpoll.policy import MAX_ERROR_TEXT, validate_job_id
from vidpoll.providers import render_time as rt
from vidpoll.providers.base import (
    Cost,
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
CREDIT, USD = "credit", "usd"
"""The units `SumeRules.cost` names (described in `PROVIDER.cost_units`)."""
USAGE_FIELDS = ("usage", "usage_summary")
"""Where a status answer keeps its ledger (Sume's CLI reads both names)."""
LEDGER = ("captured", "refunded", "reserved")
"""A bare `usage`'s amounts, in credits (SUME_API.md)."""
MONEY_FIELDS: Mapping[str, tuple[str, ...]] = {
    "captured": ("captured_amount",), "refunded": ("refunded_amount", "released_amount"),
    "reserved": ("reserved_amount",)}
"""The same amounts in the CLI's fields (each `..._usd_micros` or `..._usd_cents`)."""
_USD_SUFFIXES = ("_usd_micros", "_usd_cents")
_BILLABLE_IS = {"captured": "captured", "refunded": "refunded", "released": "refunded",
                "reserved": "reserved"}
"""A `usage_status` and the amount its `billable_amount_usd_micros` then stands for."""
_DECIMAL_TEXT = re.compile(r"\s*\d{1,18}(?:\.\d{1,18})?\s*")


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


def usage_of(body: dict[str, Any]) -> dict[str, Any] | None:
    """The `usage` (or `usage_summary`) object of a status answer in any shape, looked for
    where the status word is, nearest the job first (data.job, job, data, top)."""
    for holder in _holders(body):
        for name in USAGE_FIELDS:
            usage = holder.get(name)
            if isinstance(usage, dict) and usage:
                return usage
    return None


def amount(value: Any) -> Decimal | None:
    """A ledger amount: a JSON number or its decimal text ("0.09"), finite and not negative;
    None for anything else (a bool, NaN, an infinity, a negative, other text)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    if isinstance(value, str) and not _DECIMAL_TEXT.fullmatch(value):
        return None
    figure = Decimal(str(value).strip())
    return figure.copy_abs() if figure.is_finite() and figure >= 0 else None  # -0.0: 0


def _usd(usage: Mapping[str, Any], *names: str) -> Decimal | None:
    """The first of `{name}_usd_micros`, else of `{name}_usd_cents`, in dollars (as the CLI
    reads them: every micros field before any cents field)."""
    for suffix, places in zip(_USD_SUFFIXES, (-6, -2), strict=True):
        for name in names:
            figure = amount(usage.get(name + suffix))
            if figure is not None:
                return figure.scaleb(places)
    return None


def settled(captured: Decimal | None, refunded: Decimal | None,
            reserved: Decimal | None) -> Decimal | None:
    """What a job's ledger says it cost once settled: what was captured; 0 when nothing was
    captured and something was refunded, or when nothing was captured and nothing is still
    reserved; None while an amount is only reserved (not settled yet) or nothing is said."""
    if captured is not None and captured > 0:
        return captured
    if refunded is not None and refunded > 0:
        return Decimal(0)
    if captured is not None and not (reserved is not None and reserved > 0):
        return Decimal(0)
    return None


def usage_cost(usage: Mapping[str, Any]) -> Cost | None:
    """What one `usage` object says a job cost, in credits (bare amounts) or in dollars (the
    CLI's fields); None when nothing in it is settled, when an amount in it is not one
    (garbled, negative, ...), or when it names another currency than the dollar."""
    money = "usage_status" in usage or any(k.endswith(_USD_SUFFIXES) for k in usage)
    figures = [k for k in usage if (k.endswith(_USD_SUFFIXES) if money else k in LEDGER)]
    if any(amount(usage[k]) is None for k in figures):
        return None
    if not money:
        spent = settled(*(amount(usage.get(k)) for k in LEDGER))
        return None if spent is None else Cost(spent, CREDIT)
    currency = usage.get("billable_currency", usage.get("currency", "USD"))
    if not isinstance(currency, str) or currency.strip().upper() != "USD":
        return None
    state = next((w.strip().lower() for w in (usage.get(k) for k in (
        "usage_status", "status", "state")) if isinstance(w, str) and w.strip()), "estimated")
    ledger = {name: _usd(usage, *fields) for name, fields in MONEY_FIELDS.items()}
    said = _BILLABLE_IS.get(state)
    if said is not None and ledger[said] is None:
        ledger[said] = _usd(usage, "billable_amount", "amount")
    spent = settled(*(ledger[k] for k in LEDGER))
    return None if spent is None else Cost(spent, USD)


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

    def cost(self, body: dict[str, Any], outcome: NeutralOutcome) -> Cost | None:
        """What Sume's `usage` says the ended job cost (captured; 0 when refunded); None
        when the answer holds no settled ledger. The outcome is not needed: Sume's own
        ledger says whether a failure was refunded."""
        usage = usage_of(body)
        return None if usage is None else usage_cost(usage)

    def duration_key(self, payload: dict[str, Any], model: str | None) -> str | None:
        """The body's `duration` (`5s`; a number or its text, `"5"`, `"5s"`) and
        `resolution` (`1080p`), as the request bodies vidpoll's docs send them (`--param
        duration=8`); None when the body names neither. Sume's create body is passed through
        as written, and Sume documents no field of it: a body without these gives no key."""
        return rt.key(rt.seconds(rt.dig(payload, "duration")),
                      rt.word(rt.dig(payload, "resolution")))

    def media_urls(self, result: Any) -> list[str]:
        """Sume's result lists its videos under `url` keys (`videos[].url`)."""
        return media_urls(result)

    def result_not_ready(self, answer: HttpAnswer, code: str | None) -> bool:
        # 409 job_not_completed: Sume's "not yet"
        return answer.status == 409


RULES = SumeRules()
created_job_id = RULES.created_job_id
