"""Render times on `serve`: the dashboard's /durations page (each group's distribution as a
box-and-whisker row on a shared seconds axis, server-rendered SVG) and the gauges /metrics
exports from the same summary (vidpoll.store.durations), with the overdue jobs' count.

The gauges live in metrics.TABLE_REGISTRY beside the table's and the ledger's figures: read
at scrape time by `serve` only. Their labels are bounded: an account, a provider, and a model
among the MODELS_PER_ACCOUNT with the most jobs of that account and provider (the rest are
counted under OTHER_MODELS in vidpoll_render_jobs and have no quantiles); only the models'
summaries over every duration key (`*`), never a key's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from markupsafe import Markup, escape
from prometheus_client import Gauge

from vidpoll import metrics
from vidpoll.schedule import ANY_KEY, LEARN_AFTER_JOBS, Durations

MODELS_PER_ACCOUNT = 50
"""Models of one account and provider exported with their quantiles (the most jobs first):
a model name is the caller's text, so the series per scrape must stay bounded."""
OTHER_MODELS = "(other)"
"""The model label of the jobs of every model beyond MODELS_PER_ACCOUNT."""
QUANTILES = (0.1, 0.5, 0.9, 0.99)
"""The quantile labels of vidpoll_render_seconds."""

RENDER_SECONDS = Gauge(
    "vidpoll_render_seconds", "Render time (seconds from create to end) of a model's finished "
    "jobs at a quantile (0.1, 0.5, 0.9, 0.99), over the newest 1,000 that ended within 30 "
    "days, all duration keys together; refreshed at most once a minute. At most 50 models "
    "per account and provider (the most jobs).", ["account", "provider", "model", "quantile"],
    registry=metrics.TABLE_REGISTRY)
RENDER_JOBS = Gauge(
    "vidpoll_render_jobs", "Finished jobs the render times of vidpoll_render_seconds are drawn "
    "from (a learned poll schedule needs 100); models beyond the 50 with the most jobs are "
    "summed under model=\"(other)\".", ["account", "provider", "model"],
    registry=metrics.TABLE_REGISTRY)
JOBS_OVERDUE = Gauge(
    "vidpoll_jobs_overdue", "Pending jobs running past their model's p99 render time times "
    "the account's overdue_factor (0 for an account with render times and none overdue).",
    ["account"], registry=metrics.TABLE_REGISTRY)


def export_durations(stats: Iterable[Durations], overdue: Mapping[str, int]) -> None:
    """The render-time summary (PgStore.render_stats) and the overdue counts
    (PgStore.count_overdue) into the three gauges."""
    models: dict[tuple[str, str], list[Durations]] = {}
    accounts = set(overdue)
    for d in stats:
        accounts.add(d.account)
        if d.duration_key == ANY_KEY:
            models.setdefault((d.account, d.provider), []).append(d)
    RENDER_SECONDS.clear()  # a group pruned from the window reads nothing, not stale
    RENDER_JOBS.clear()
    for (account, provider), groups in models.items():
        groups.sort(key=lambda d: (-d.jobs, d.model))
        for d in groups[:MODELS_PER_ACCOUNT]:
            RENDER_JOBS.labels(account, provider, d.model).set(d.jobs)
            for q in QUANTILES:
                RENDER_SECONDS.labels(account, provider, d.model, f"{q:g}").set(d.quantile(q))
        rest = groups[MODELS_PER_ACCOUNT:]
        if rest:
            RENDER_JOBS.labels(account, provider, OTHER_MODELS).set(sum(d.jobs for d in rest))
    JOBS_OVERDUE.clear()
    for account in accounts:
        JOBS_OVERDUE.labels(account).set(overdue.get(account, 0))


def metric_names() -> tuple[str, ...]:
    """The families this module exports (for docs and tests)."""
    return tuple(m.name for c in (RENDER_SECONDS, RENDER_JOBS, JOBS_OVERDUE)
                 for m in c.describe())


# The dashboard's page ------------------------------------------------------------------------


@dataclass(frozen=True)
class GroupRow:
    """One row of a provider's table and plot: a model over every key, or one of its keys."""

    durations: Durations
    learned: str
    """`learned`, `model-wide` (a key too rare: its model's schedule is used) or `not yet`."""
    is_key: bool

    @property
    def label(self) -> str:
        """What the row is called on the page."""
        d = self.durations
        if self.is_key:
            return f"key {d.duration_key}" if d.duration_key else "(no key)"
        return d.model or "(no model)"


@dataclass(frozen=True)
class ProviderDurations:
    """An account's groups of one provider: the page's section, with its plot."""

    account: str
    provider: str
    rows: list[GroupRow]

    @property
    def chart(self) -> Markup:
        return box_plot(self)


def learned_word(d: Durations, model_wide: Durations | None) -> str:
    """Whether a worker plans this group's reads from its history (as learned.Schedules
    does): its own with LEARN_AFTER_JOBS jobs, else its model's over every key."""
    if d.jobs >= LEARN_AFTER_JOBS:
        return "learned"
    if model_wide is not None and model_wide is not d and model_wide.jobs >= LEARN_AFTER_JOBS:
        return "model-wide"
    return "not yet"


def duration_views(stats: Iterable[Durations]) -> list[ProviderDurations]:
    """The page's sections: per account and provider, each model's row (over every key)
    followed by its keys' rows (left out when the model has only one, unnamed, key: the same
    figures)."""
    by_model: dict[tuple[str, str, str], dict[str, Durations]] = {}
    for d in stats:
        by_model.setdefault((d.account, d.provider, d.model), {})[d.duration_key] = d
    sections: dict[tuple[str, str], list[GroupRow]] = {}
    for (account, provider, _), keys in sorted(by_model.items()):
        whole = keys.get(ANY_KEY)
        own = {k: d for k, d in sorted(keys.items()) if k != ANY_KEY}
        rows = sections.setdefault((account, provider), [])
        if whole is not None:
            rows.append(GroupRow(whole, learned_word(whole, None), is_key=False))
        if whole is None or set(own) != {""}:
            rows.extend(GroupRow(d, learned_word(d, whole), is_key=whole is not None)
                        for d in own.values())
    return [ProviderDurations(a, p, rows) for (a, p), rows in sections.items()]


def seconds_text(value: float) -> str:
    """A render time as the page writes it: 4.2 s, 45 s, 3.5 min, 1.2 h."""
    if value < 10:
        return f"{value:.1f} s"
    if value < 120:
        return f"{value:.0f} s"
    if value < 7200:
        return f"{value / 60:.1f} min"
    return f"{value / 3600:.1f} h"


TICK_STEPS_S = (0.1, 0.2, 0.5, 1, 2, 5, 10, 15, 20, 30, 60, 120, 300, 600, 900, 1800, 3600,
                2 * 3600, 3 * 3600, 6 * 3600, 12 * 3600, 24 * 3600)
"""The axis's steps: round seconds, then whole minutes, then whole hours."""


def nice_ticks(top: float, most: int = 6) -> tuple[list[float], float]:
    """Round tick values from 0 to at least `top` (at most `most` + 1 of them), and their
    step."""
    if not (top > 0 and math.isfinite(top)):
        return [0.0, 1.0], 1.0
    step = next((s for s in TICK_STEPS_S if math.ceil(top / s - 1e-9) <= most),
                math.ceil(top / most / 86400) * 86400.0)
    n = max(1, math.ceil(top / step - 1e-9))
    return [i * step for i in range(n + 1)], float(step)


def tick_text(value: float, step: float) -> str:
    """A tick's label in the unit of its axis's step: 0, 30 s, 2 min, 3 h."""
    if value == 0:
        return "0"
    if step >= 3600:
        return f"{value / 3600:g} h"
    if step >= 60:
        return f"{value / 60:g} min"
    return f"{value:g} s"


def _attr(value: object) -> str:
    return str(escape(str(value)))


def _num(value: float) -> str:
    return f"{value:.2f}"


def box_plot(section: ProviderDurations) -> Markup:
    """The groups of one account and provider as box-and-whisker rows on one seconds axis:
    the box from p10 to p90, the median a bar across it, whiskers out to the shortest render
    and to p99, a dot at the longest. role=img with a one-line summary, a <title> per row,
    each row's figures in data attributes (what the browser test reads); every label
    escaped."""
    rows = section.rows
    label_w, plot_w, row_h, top_pad, axis_h = 190, 520, 26, 8, 30
    width = label_w + plot_w + 30  # room for the last tick's label
    height = top_pad + row_h * len(rows) + axis_h
    top_s = max((r.durations.longest for r in rows), default=0.0)
    ticks, step = nice_ticks(top_s)
    end = ticks[-1]

    def x(seconds: float) -> float:
        return label_w + plot_w * min(seconds, end) / end

    parts = []
    for t in ticks:  # the shared axis: grid lines and their labels
        parts.append(f'<line class="grid" x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{top_pad}" '
                     f'y2="{height - axis_h + 4}"/>'
                     f'<text class="tick" x="{x(t):.1f}" y="{height - axis_h + 18}" '
                     f'text-anchor="middle">{tick_text(t, step)}</text>')
    for i, row in enumerate(rows):
        d = row.durations
        mid = top_pad + row_h * i + row_h / 2
        box_h = row_h * 0.5 if row.is_key else row_h * 0.62
        lo, p10, p50, p90, p99, hi = (d.quantiles[0], d.p10, d.p50, d.p90, d.p99, d.longest)
        label = row.label
        shown_label = label if len(label) <= 26 else label[:25] + "…"
        summary = (f"{d.shown()}: {d.jobs} jobs, p10 {seconds_text(p10)}, p50 "
                   f"{seconds_text(p50)}, p90 {seconds_text(p90)}, p99 {seconds_text(p99)}, "
                   f"longest {seconds_text(hi)}; schedule {row.learned}")
        parts.append(
            f'<g class="group {"by-key" if row.is_key else "by-model"} '
            f'{"learned" if row.learned != "not yet" else "unlearned"}" '
            f'data-account="{_attr(d.account)}" data-provider="{_attr(d.provider)}" '
            f'data-model="{_attr(d.model)}" data-key="{_attr(d.duration_key)}" '
            f'data-jobs="{d.jobs}" data-p10="{_num(p10)}" data-p50="{_num(p50)}" '
            f'data-p90="{_num(p90)}" data-p99="{_num(p99)}" data-longest="{_num(hi)}" '
            f'data-learned="{_attr(row.learned)}">'
            f"<title>{escape(summary)}</title>"
            f'<text class="label" x="{label_w - 8}" '
            f'y="{mid + 4:.1f}" text-anchor="end">{escape(shown_label)}</text>'
            f'<line class="whisker" x1="{x(lo):.1f}" x2="{x(p99):.1f}" y1="{mid:.1f}" '
            f'y2="{mid:.1f}"/>'
            f'<line class="whisker" x1="{x(p99):.1f}" x2="{x(p99):.1f}" '
            f'y1="{mid - box_h / 3:.1f}" y2="{mid + box_h / 3:.1f}"/>'
            f'<rect class="box" x="{x(p10):.1f}" y="{mid - box_h / 2:.1f}" '
            f'width="{max(x(p90) - x(p10), 1.0):.1f}" height="{box_h:.1f}"/>'
            f'<line class="median" x1="{x(p50):.1f}" x2="{x(p50):.1f}" '
            f'y1="{mid - box_h / 2:.1f}" y2="{mid + box_h / 2:.1f}"/>'
            f'<circle class="longest" cx="{x(hi):.1f}" cy="{mid:.1f}" r="2.5"/></g>')
    models = sum(1 for r in rows if not r.is_key)
    summary = (f"Render times of {section.account} / {section.provider}: {len(rows)} "
               f"group{'s' if len(rows) != 1 else ''} ({models} model"
               f"{'s' if models != 1 else ''}), axis 0 to {tick_text(end, step)}")
    svg = (f'<figure class="chart durations-chart"><div class="scroll">'
           f'<svg viewBox="0 0 {width} {height}" width="{width}" height="{height}" '
           f'role="img" aria-label="{escape(summary)}"><title>{escape(summary)}</title>'
           f'{"".join(parts)}</svg></div>'
           f'<p class="legend"><span class="key box"></span> p10 to p90, '
           f'<span class="key median"></span> median, whiskers from the shortest to p99, '
           f'<span class="key longest"></span> the longest; '
           f'<span class="key box unlearned"></span> fewer than {LEARN_AFTER_JOBS} jobs '
           f'(not learned yet)</p>'
           f'<p class="summary">{escape(summary)}</p></figure>')
    return Markup(svg)
