"""How the table's figures are put together from the catalog's estimate and the exact counts
(vidpoll.web.figures.combine): which figures are estimates, and how they are split."""

from __future__ import annotations

from datetime import UTC, datetime

from vidpoll.web.figures import FINISHED, combine

ANALYZED = datetime(2026, 1, 1, tzinfo=UTC)


def estimate(rows: float | None, shares: dict[str, float] | None = None) -> dict[str, object]:
    return {"rows": rows, "states": list(shares) if shares else None,
            "shares": list(shares.values()) if shares else None, "analyzed_at": ANALYZED}


def test_a_small_table_is_counted_exactly():
    figures = combine(estimate(None), {"pending": 7, "failed": 3}, 7, 4, 2.5)
    assert figures.states == {"pending": 7, "failed": 3} and figures.total == 10
    assert figures.estimated == frozenset() and figures.analyzed_at is None
    assert (figures.due, figures.due_capped, figures.oldest_late_s) == (4, False, 2.5)


def test_finished_rows_are_the_estimate_less_the_exact_pending_split_by_the_sample():
    shares = {"completed": 0.76, "failed": 0.04, "pending": 0.2}
    figures = combine(estimate(10_000_000, shares), None, 100_000, 12, 0.0, cap=200_000)
    # pending is the index's exact count, not the sample's 20 %
    assert figures.states["pending"] == 100_000 and "pending" not in figures.estimated
    assert figures.states["completed"] == 9_405_000  # 9.9M x 0.76 / 0.80
    assert figures.states["failed"] == 495_000
    assert figures.estimated == {"completed", "failed"}
    assert figures.total == 10_000_000 and figures.analyzed_at == ANALYZED


def test_a_backlog_past_the_cap_is_estimated_and_due_reads_as_a_lower_bound():
    shares = {"completed": 0.5, "pending": 0.5}
    figures = combine(estimate(4_000_000, shares), None, 1001, 1001, 30.0, cap=1000)
    assert figures.states == {"pending": 2_000_000, "completed": 2_000_000}
    assert figures.estimated == {"pending", "completed"}
    assert (figures.due, figures.due_capped) == (1000, True)


def test_a_table_never_analyzed_shows_one_estimated_finished_figure():
    figures = combine(estimate(500_000.0), None, 20_000, 0, 0.0)
    assert figures.states == {"pending": 20_000, FINISHED: 480_000}
    assert figures.estimated == {FINISHED}


def test_an_estimate_below_the_pending_count_never_goes_negative():
    figures = combine(estimate(15_000, {"pending": 1.0}), None, 20_000, 0, 0.0, cap=30_000)
    assert figures.states == {"pending": 20_000} and figures.estimated == frozenset()
