"""`Rules.cost` of every provider (issue 30): what an ended job cost by the provider's own
figure in its final status answer, in the units its `cost_units` name; 0 for an end the
provider documents as not charged; None when the answer says nothing usable (missing,
garbled, negative, a bool, NaN): then vidpoll keeps its own estimate. Pure: no I/O.
"""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from vidpoll.providers import registry
from vidpoll.providers.base import CURRENCY, Cost, NeutralOutcome

SUME, REPLICATE, RUNWAY = (registry.load(n) for n in ("sume", "replicate", "runway"))
KLING, FAL, LUMA = (registry.load(n) for n in ("kling", "fal", "luma"))
GARBLED: list[Any] = [None, True, False, -1, -0.5, float("nan"), float("inf"), "abc", "-3",
                      "1e3", [], {}]
"""Amounts no provider's figure can be: each makes `cost` say nothing (None)."""


def cost_of(provider: Any, body: dict[str, Any], outcome: NeutralOutcome) -> Cost | None:
    result: Cost | None = provider.rules.cost(body, outcome)
    return result


# --- Sume: `usage`, wherever the status word is ---------------------------------------------

def sume_shapes(usage: dict[str, Any], word: str = "completed") -> list[dict[str, Any]]:
    """One answer in each of the shapes Sume's status answers come in, holding `usage`."""
    return [
        {"job_id": "vid_1", "sume_status": word, "terminal": True, "usage": usage},
        {"data": {"status": word, "usage": usage}, "request_id": "req_1"},
        {"data": {"sume_status": word, "usage": usage}, "request_id": "req_1"},
        {"data": {"job": {"status": word, "usage": usage}}, "request_id": "req_1"},
        {"job": {"status": word, "usage": usage}, "request_id": "req_1"},
        {"job_id": "vid_1", "status": word, "usage": usage, "request_id": "req_1"},
        {"data": {"status": word, "usage_summary": usage}},  # the CLI reads this name too
    ]


@pytest.mark.parametrize(("usage", "outcome", "want"), [
    ({"reserved": 0, "captured": 50, "refunded": 0}, "succeeded", Cost(Decimal(50), "credit")),
    ({"captured": 3}, "succeeded", Cost(Decimal(3), "credit")),
    ({"captured": "12.5"}, "succeeded", Cost(Decimal("12.5"), "credit")),
    ({"captured": 0.25}, "succeeded", Cost(Decimal("0.25"), "credit")),
    ({"reserved": 0, "captured": 0, "refunded": 50}, "failed", Cost(Decimal(0), "credit")),
    ({"refunded": 50}, "expired", Cost(Decimal(0), "credit")),
    ({"captured": 30, "refunded": 20}, "failed", Cost(Decimal(30), "credit")),  # partly kept
    ({"captured": 0, "reserved": 0}, "canceled", Cost(Decimal(0), "credit")),
    ({"reserved": 50}, "succeeded", None),  # still only reserved: not settled
    ({"reserved": 50, "captured": 0, "refunded": 0}, "failed", None),
    ({"progress": 1.0}, "succeeded", None),
    # the fields Sume's CLI reads (sumelabs/cli src/commands/jobs.ts and its tests): dollars
    ({"status": "captured", "currency": "USD", "provider_estimated_cost_usd_micros": 90_000,
      "billable_amount_usd_micros": 90_000, "captured_amount_usd_micros": 90_000},
     "succeeded", Cost(Decimal("0.09"), "usd")),
    ({"captured_amount_usd_micros": 900_000, "usage_status": "captured"}, "succeeded",
     Cost(Decimal("0.9"), "usd")),
    ({"usage_status": "captured", "billable_amount_usd_micros": 125_000}, "succeeded",
     Cost(Decimal("0.125"), "usd")),
    ({"usage_status": "captured", "amount_usd_cents": 40}, "succeeded",
     Cost(Decimal("0.40"), "usd")),
    ({"usage_status": "refunded", "billable_amount_usd_micros": 125_000}, "failed",
     Cost(Decimal(0), "usd")),
    ({"released_amount_usd_micros": 5_000, "captured_amount_usd_micros": 0}, "canceled",
     Cost(Decimal(0), "usd")),
    ({"usage_status": "reserved", "billable_amount_usd_micros": 125_000}, "failed", None),
    ({"billable_amount_usd_micros": 125_000}, "succeeded", None),  # only an estimate
    ({"usage_status": "captured", "currency": "EUR", "captured_amount_usd_micros": 1},
     "succeeded", None),
])
def test_sume_reads_usage_in_every_shape(usage: dict[str, Any], outcome: NeutralOutcome,
                                         want: Cost | None) -> None:
    for body in sume_shapes(usage):
        assert cost_of(SUME, body, outcome) == want, body
    if want is not None:
        assert want.unit in SUME.cost_units


def test_sume_takes_the_usage_nearest_the_job() -> None:
    body = {"data": {"job": {"status": "completed", "usage": {"captured": 7}},
                     "usage": {"captured": 9}}, "usage": {"captured": 11}}
    assert cost_of(SUME, body, "succeeded") == Cost(Decimal(7), "credit")


@pytest.mark.parametrize("bad", GARBLED)
@pytest.mark.parametrize("field", ["captured", "refunded", "reserved",
                                   "captured_amount_usd_micros", "refunded_amount_usd_cents"])
def test_sume_says_nothing_for_a_garbled_amount(bad: Any, field: str) -> None:
    usage = {"captured": 50, field: bad}
    if field.endswith(("_micros", "_cents")):
        usage = {"usage_status": "captured", "captured_amount_usd_micros": 1000, field: bad}
    for body in sume_shapes(usage):
        assert cost_of(SUME, body, "succeeded") is None, body


@pytest.mark.parametrize("body", [
    {"sume_status": "completed", "terminal": True},
    {"data": {"status": "failed", "usage": None}},
    {"data": {"status": "failed", "usage": "refunded"}},
    {"data": {"status": "failed", "usage": {}}},
    {"data": "nope", "usage": [1, 2]},
])
def test_sume_says_nothing_without_a_usage(body: dict[str, Any]) -> None:
    assert cost_of(SUME, body, "failed") is None


# --- Replicate: `metrics.predict_time`; `aborted` is not charged ------------------------------

def prediction(status: str, **metrics: Any) -> dict[str, Any]:
    return {"id": "p1", "status": status, "metrics": {"total_time": 9.5, **metrics}}


@pytest.mark.parametrize(("body", "outcome", "want"), [
    (prediction("succeeded", predict_time=4.25), "succeeded",
     Cost(Decimal("4.25"), "predict_second")),
    (prediction("failed", predict_time=1.5), "failed", Cost(Decimal("1.5"), "predict_second")),
    # canceled once running: "you pay for the time the prediction ran before it was canceled"
    (prediction("canceled", predict_time=2), "canceled", Cost(Decimal(2), "predict_second")),
    (prediction("succeeded", predict_time=0.1 + 0.2), "succeeded",
     Cost(Decimal("0.30000000000000004"), "predict_second")),  # the figure as written
    (prediction("aborted"), "canceled", Cost(Decimal(0), CURRENCY)),
    (prediction("ABORTED", predict_time=3), "canceled", Cost(Decimal(0), CURRENCY)),
    (prediction("canceled"), "canceled", None),  # canceled before it started: nothing said
    (prediction("succeeded"), "succeeded", None),
    ({"id": "p1", "status": "succeeded"}, "succeeded", None),
    ({"id": "p1", "status": "succeeded", "metrics": "fast"}, "succeeded", None),
])
def test_replicate_bills_the_predict_time(body: dict[str, Any], outcome: NeutralOutcome,
                                          want: Cost | None) -> None:
    assert cost_of(REPLICATE, body, outcome) == want
    if want is not None and want.unit != CURRENCY:
        assert want.unit in REPLICATE.cost_units


@pytest.mark.parametrize("bad", [*GARBLED, "4.2"])
def test_replicate_says_nothing_for_a_garbled_predict_time(bad: Any) -> None:
    assert cost_of(REPLICATE, prediction("succeeded", predict_time=bad), "succeeded") is None


# --- Runway: an ended task's `cost.credits` --------------------------------------------------

@pytest.mark.parametrize(("body", "outcome", "want"), [
    ({"status": "SUCCEEDED", "output": ["https://x/1.mp4"], "cost": {"credits": 50}},
     "succeeded", Cost(Decimal(50), "credit")),
    ({"status": "FAILED", "failure": "bad", "cost": {"credits": 0}}, "failed",
     Cost(Decimal(0), "credit")),  # "A refunded task reports 0"
    ({"status": "CANCELLED", "cost": {"credits": 25}}, "canceled", Cost(Decimal(25), "credit")),
    ({"status": "FAILED", "failure": "bad"}, "failed", None),
    ({"status": "RUNNING", "estimatedCost": {"credits": 50}}, "succeeded", None),
    ({"status": "SUCCEEDED", "cost": 50}, "succeeded", None),
    ({"status": "SUCCEEDED", "cost": {"credits": 12.5}}, "succeeded", None),  # documented int
])
def test_runway_reads_the_tasks_cost(body: dict[str, Any], outcome: NeutralOutcome,
                                     want: Cost | None) -> None:
    assert cost_of(RUNWAY, body, outcome) == want
    if want is not None:
        assert want.unit in RUNWAY.cost_units


@pytest.mark.parametrize("bad", [*GARBLED, "50"])
def test_runway_says_nothing_for_garbled_credits(bad: Any) -> None:
    body = {"status": "SUCCEEDED", "cost": {"credits": bad}}
    assert cost_of(RUNWAY, body, "succeeded") is None


# --- Kling: `final_unit_deduction`, unless the balance paid (part of) it ---------------------

def task(word: str, **fields: Any) -> dict[str, Any]:
    return {"code": 0, "message": "SUCCEED", "request_id": "r1",
            "data": {"task_id": "t1", "task_status": word, **fields}}


@pytest.mark.parametrize(("body", "want"), [
    (task("succeed", final_unit_deduction="5"), Cost(Decimal(5), "unit")),
    (task("succeed", final_unit_deduction="0.6"), Cost(Decimal("0.6"), "unit")),
    (task("succeed", final_unit_deduction=3), Cost(Decimal(3), "unit")),
    (task("succeed", final_unit_deduction="5",
          final_balance_deduction={"quota": "0", "list_price": "0"}), Cost(Decimal(5), "unit")),
    (task("failed", final_unit_deduction="0",
          final_balance_deduction={"quota": "0", "list_price": "0"}), Cost(Decimal(0), "unit")),
    # units 0 without the balance's part: it may have been paid from the balance
    (task("failed", final_unit_deduction="0"), None),
    (task("succeed", final_unit_deduction="5",
          final_balance_deduction={"quota": "1.20", "list_price": "1.50"}), None),
    (task("succeed", final_unit_deduction="5", final_balance_deduction={"quota": "x"}), None),
    (task("succeed", final_unit_deduction="5", final_balance_deduction="0"), None),
    (task("succeed"), None),
    ({"code": 1201, "message": "bad", "data": {"final_unit_deduction": "5"}}, None),
    ({"code": 0, "message": "ok", "data": None}, None),
])
def test_kling_reads_the_units_a_task_took(body: dict[str, Any], want: Cost | None) -> None:
    assert cost_of(KLING, body, "succeeded") == want
    if want is not None:
        assert want.unit in KLING.cost_units


@pytest.mark.parametrize("bad", [*GARBLED, "1.5.2", " "])
def test_kling_says_nothing_for_a_garbled_deduction(bad: Any) -> None:
    assert cost_of(KLING, task("succeed", final_unit_deduction=bad), "succeeded") is None


# --- fal and Luma: no figure; the ends they document as not charged --------------------------

@pytest.mark.parametrize(("body", "outcome", "want"), [
    ({"status": "COMPLETED", "error": "Request timed out", "error_type": "request_timeout"},
     "failed", Cost(Decimal(0), CURRENCY)),
    ({"status": "COMPLETED", "error": "crashed", "error_type": "RUNNER_SERVER_ERROR"},
     "failed", Cost(Decimal(0), CURRENCY)),
    ({"status": "COMPLETED", "error": "x", "error_type": "internal_error"}, "failed",
     Cost(Decimal(0), CURRENCY)),
    # an input the model refused (422) "may still be charged"; a cancel is not a server error
    ({"status": "COMPLETED", "error": [{"msg": "bad prompt"}]}, "failed", None),
    ({"status": "COMPLETED", "error": "x", "error_type": "client_cancelled"}, "canceled", None),
    ({"status": "COMPLETED", "error": "x", "error_type": "bad_request"}, "failed", None),
    ({"status": "COMPLETED", "metrics": {"inference_time": 12.5}}, "succeeded", None),
    ({"status": "COMPLETED", "error_type": 504}, "failed", None),
])
def test_fal_charges_nothing_for_a_server_error(body: dict[str, Any], outcome: NeutralOutcome,
                                                want: Cost | None) -> None:
    assert cost_of(FAL, body, outcome) == want


@pytest.mark.parametrize(("body", "outcome", "want"), [
    ({"id": "g1", "state": "failed", "failure_reason": "moderation"}, "failed",
     Cost(Decimal(0), CURRENCY)),
    ({"id": "g1", "state": "FAILED"}, "failed", Cost(Decimal(0), CURRENCY)),
    ({"id": "g1", "state": "completed", "assets": {"video": "https://x/v.mp4"}}, "succeeded",
     None),
    ({"id": "g1"}, "failed", None),
])
def test_luma_refunds_a_failed_generation(body: dict[str, Any], outcome: NeutralOutcome,
                                          want: Cost | None) -> None:
    assert cost_of(LUMA, body, outcome) == want


# --- the units --------------------------------------------------------------------------------

def test_every_provider_names_its_units_and_none_without_a_figure() -> None:
    units = {name: dict(getattr(registry.load(name), "cost_units", {}) or {})
             for name in registry.names()}
    assert units["sume"].keys() == {"credit", "usd"}
    assert units["replicate"].keys() == {"predict_second"}
    assert units["runway"].keys() == {"credit"}
    assert units["kling"].keys() == {"unit"}
    for name in ("fal", "luma", "veo", "vertex"):
        assert units[name] == {}, name  # their answers carry no cost figure
    for name in ("veo", "vertex"):  # no figure, no documented uncharged end
        assert getattr(registry.load(name).rules, "cost", None) is None
    for described in units.values():
        for unit, text in described.items():
            assert unit != CURRENCY and unit.isidentifier() and text.strip()
