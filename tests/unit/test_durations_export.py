"""The render-time gauges `serve` exports (vidpoll.web.durations): bounded labels, no key's
series, overdue accounts at 0; and the plot's axis."""

from __future__ import annotations

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from vidpoll import metrics
from vidpoll.schedule import durations_from_samples
from vidpoll.web.durations import (
    MODELS_PER_ACCOUNT,
    OTHER_MODELS,
    box_plot,
    duration_views,
    export_durations,
    nice_ticks,
    tick_text,
)


def scraped() -> dict[str, list[tuple[dict[str, str], float]]]:
    text = generate_latest(metrics.TABLE_REGISTRY).decode()
    return {f.name: [(s.labels, s.value) for s in f.samples]
            for f in text_string_to_metric_families(text)}


def test_only_the_models_with_the_most_jobs_get_series() -> None:
    groups = [durations_from_samples([10.0 + i] * (i + 1), account="a", provider="fal",
                                     model=f"m{i}") for i in range(MODELS_PER_ACCOUNT + 5)]
    groups.append(durations_from_samples([5.0], account="a", provider="fal", model="m0",
                                         duration_key="5s"))  # a key: never a series
    export_durations(groups, {"b": 3})
    got = scraped()
    jobs = {s["model"]: v for s, v in got["vidpoll_render_jobs"]}
    assert len(jobs) == MODELS_PER_ACCOUNT + 1
    assert "m0" not in jobs and jobs[f"m{MODELS_PER_ACCOUNT + 4}"] == MODELS_PER_ACCOUNT + 5
    assert jobs[OTHER_MODELS] == sum(range(1, 6))  # the five with the fewest jobs
    seconds = got["vidpoll_render_seconds"]
    assert len(seconds) == MODELS_PER_ACCOUNT * 4
    assert {s["quantile"] for s, _ in seconds} == {"0.1", "0.5", "0.9", "0.99"}
    assert {s["account"]: v for s, v in got["vidpoll_jobs_overdue"]} == {"a": 0, "b": 3}
    # a later scrape without them: nothing stale is left
    export_durations([], {})
    got = scraped()
    assert got.get("vidpoll_render_jobs", []) == got.get("vidpoll_render_seconds", []) == []
    assert got.get("vidpoll_jobs_overdue", []) == []


def test_the_axis_is_round_and_covers_the_longest() -> None:
    ticks, step = nice_ticks(250.0)
    assert ticks == [0, 60, 120, 180, 240, 300]
    assert [tick_text(t, step) for t in ticks] == ["0", "1 min", "2 min", "3 min", "4 min",
                                                   "5 min"]
    ticks, step = nice_ticks(0.7)
    assert ticks[-1] >= 0.7 and tick_text(ticks[1], step) == "0.2 s"
    ticks, step = nice_ticks(40 * 3600.0)
    assert ticks[-1] >= 40 * 3600 and tick_text(ticks[1], step).endswith(" h")
    assert nice_ticks(0.0)[0] == [0.0, 1.0]


def test_the_plot_escapes_every_label() -> None:
    hostile = '<img src=x onerror="alert(1)">&'
    d = durations_from_samples([1.0, 2.0, 3.0], account='a"b', provider="p", model=hostile)
    svg = str(box_plot(duration_views([d])[0]))
    assert "<img" not in svg and 'onerror="' not in svg
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;&amp;" in svg
    assert 'data-account="a&#34;b"' in svg
