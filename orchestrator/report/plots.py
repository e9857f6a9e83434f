"""The report's figures, drawn with matplotlib's Agg backend into PNG files.

Every function writes one file and returns its path, or None when there is nothing to draw
(a report without a figure says so in words; it never shows an empty frame).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")  # no display: reports are written on servers and in CI

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from orchestrator.analysis.censored import describe_median  # noqa: E402
from orchestrator.report.data import ExperimentData, class_value, server_series  # noqa: E402

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

# A and B as they always were; further arms (a plan may have up to 8) from the tab10 palette.
ARM_COLORS = {"A": "#1f77b4", "B": "#d62728", "C": "#2ca02c", "D": "#9467bd", "E": "#ff7f0e",
              "F": "#8c564b", "G": "#e377c2", "H": "#17becf"}
BLOCK_MARKERS = "osD^vP*X<>"
DPI = 110


def _color(arm: str) -> str:
    return ARM_COLORS.get(arm, "#555555")


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return path


def verdict_intervals(data: ExperimentData, path: Path) -> Path | None:
    """Each bar: the estimate of its ratio (B/A, or the pair it names) with its interval, against
    the registered threshold."""
    if not data.verdicts:
        return None
    fig, ax = plt.subplots(figsize=(8, 0.9 + 0.8 * len(data.verdicts)))
    values = [v for x in data.verdicts for v in (x.estimate, x.lower, x.upper) if v and v > 0]
    thresholds = [b.threshold for b in data.plan.bars]
    span = values + thresholds or [1.0]
    lo_edge, hi_edge = min(span) / 1.25, max(span) * 1.25
    colors = {"ACCEPT": "#2ca02c", "REJECT": "#d62728", "INCONCLUSIVE": "#ff7f0e"}
    for i, v in enumerate(data.verdicts):
        y = len(data.verdicts) - 1 - i
        bar = data.bar(v.bar_id)
        lower = v.lower if v.lower is not None and v.lower > 0 else lo_edge
        upper = v.upper if v.upper is not None and math.isfinite(v.upper) else hi_edge
        c = colors.get(v.verdict, "#555555")
        ax.plot([lower, upper], [y, y], color=c, lw=4, solid_capstyle="butt", alpha=0.7)
        if v.estimate is not None:
            ax.plot([v.estimate], [y], "o", color="black", ms=7, zorder=3)
        if bar is not None:
            ax.plot([bar.threshold] * 2, [y - 0.35, y + 0.35], color="black", ls="--", lw=1.5)
            side = ">=" if bar.direction == "at_least" else "<="
            ax.annotate(f"bar {side} {bar.threshold:g}", (bar.threshold, y + 0.38), ha="center",
                        fontsize=8)
        ax.annotate(v.verdict, (upper, y), xytext=(6, -3), textcoords="offset points", color=c,
                    fontsize=9, fontweight="bold")
    ax.set_yticks(range(len(data.verdicts)))
    ax.set_yticklabels([_bar_name(data, v.bar_id) for v in reversed(data.verdicts)])
    ax.set_xscale("log")
    ax.set_xlim(lo_edge, hi_edge * 1.3)
    ax.set_ylim(-0.7, len(data.verdicts) - 0.3)
    pairs = sorted({b.compare for b in data.plan.bars}) or ["B/A"]
    ax.set_xlabel(f"{' or '.join(p.replace('/', ' / ') for p in pairs)} "
                  "(estimate and one-sided bounds; dashed: registered bar)")
    ax.grid(axis="x", which="both", alpha=0.3)
    return _save(fig, path)


def _bar_name(data: ExperimentData, bar_id: str) -> str:
    """The bar's id, with its pair when the plan compares more than one pair."""
    bar = data.bar(bar_id)
    if bar is None or len({b.compare for b in data.plan.bars}) < 2:
        return bar_id
    return f"{bar_id} ({bar.compare})"


def load_curves(data: ExperimentData, class_name: str, path: Path) -> Path | None:
    """Attainment and goodput vs offered load at one class: every block's points, per arm,
    each run's capacity starred; hollow markers are points that failed a guard."""
    pts = data.points
    if pts.empty:
        return None
    target = data.plan.search.attainment
    fig, (ax_att, ax_good) = plt.subplots(1, 2, figsize=(11, 4.2))
    for (run_id, arm, block), g in pts.groupby(["run_id", "arm", "block"], sort=True):
        g = g.sort_values("offered_rate")
        att = g.per_class.map(lambda pc: class_value(pc, class_name, "attainment"))
        good = g.per_class.map(lambda pc: class_value(pc, class_name, "goodput_tok_s"))
        marker = BLOCK_MARKERS[int(block) % len(BLOCK_MARKERS)]
        label = data.run_label(int(run_id))
        for ax, ys in ((ax_att, att), (ax_good, good)):
            ax.plot(g.offered_rate, ys, "-", color=_color(arm), alpha=0.35, lw=1)
            valid = g.valid.astype(bool).to_numpy()
            ax.scatter(g.offered_rate[valid], ys[valid], marker=marker, color=_color(arm), label=label)
            ax.scatter(g.offered_rate[~valid], ys[~valid], marker=marker, facecolors="none",
                       edgecolors=_color(arm))
    for run, point_id, capacity in data.capacity_points(class_name):
        row = pts[pts.id == point_id].iloc[0]
        att = class_value(row.per_class, class_name, "attainment")
        ax_good.scatter([row.offered_rate], [capacity], marker="*", s=260, color=_color(run.arm),
                        edgecolors="black", zorder=4)
        ax_att.scatter([row.offered_rate], [att], marker="*", s=260, color=_color(run.arm),
                       edgecolors="black", zorder=4)
    ax_att.axhline(target, color="black", ls="--", lw=1)
    ax_att.annotate(f"attainment {target:.0%}", (0.01, target), xycoords=("axes fraction", "data"),
                    xytext=(0, 3), textcoords="offset points", fontsize=8)
    ax_att.set_ylim(-0.03, 1.03)
    ax_att.set_ylabel(f"attainment [{class_name}]")
    ax_good.set_ylabel(f"goodput [{class_name}], output tok/s")
    for ax in (ax_att, ax_good):
        ax.set_xlabel(f"offered load, {data.plan.workload.rate_unit}")
        ax.grid(alpha=0.3)
    handles, labels = ax_att.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=False))
    ax_good.legend(unique.values(), unique.keys(), fontsize=8, title="run (star: capacity)",
                   title_fontsize=8)
    fig.suptitle(f"{class_name}: attainment and goodput vs offered load", fontsize=11)
    return _save(fig, path)


def _ecdf(ax: Axes, values: np.ndarray, n_total: int, color: str, label: str, ls: str = "-") -> bool:
    """Empirical CDF over every scheduled request: misses (+inf) keep the curve below 1.
    False when there is nothing to draw (no requests, or none with a finite value)."""
    finite = np.sort(values[np.isfinite(values)])
    if n_total == 0 or finite.size == 0:
        return False
    y = np.arange(1, finite.size + 1) / n_total
    ax.step(finite * 1e3, y, where="post", color=color, label=label, linestyle=ls)
    return True


def latency_at_capacity(data: ExperimentData, class_name: str, path: Path) -> Path | None:
    """TTFT and TPOT distributions (CDFs, every measured request) at each run's capacity point,
    with the class limits drawn."""
    found = data.capacity_points(class_name)
    if not found:
        return None
    cls = data.plan.service_class(class_name)
    fig, (ax_ttft, ax_tpot) = plt.subplots(1, 2, figsize=(11, 4))
    drawn = {"ttft": False, "tpot": False}  # a capacity point may hold no finished request
    for run, point_id, _cap in found:
        recs = [r for r in data.requests(point_id) if r.phase == "measure"]
        label = data.run_label(run.id)
        ls = "-" if run.block % 2 == 0 else "--"
        ttft = np.array([r.ttft_s if r.status == "ok" else math.inf for r in recs], dtype=float)
        tpot = np.array([r.tpot_s for r in recs], dtype=float)
        drawn["ttft"] |= _ecdf(ax_ttft, ttft, len(recs), _color(run.arm), label, ls)
        drawn["tpot"] |= _ecdf(ax_tpot, tpot, len(recs), _color(run.arm), label, ls)
    for ax, limit, name in ((ax_ttft, cls.ttft_ms, "TTFT"), (ax_tpot, cls.tpot_ms, "TPOT")):
        ax.axvline(limit, color="black", ls=":", lw=1.5)
        ax.annotate(f"{class_name} limit {limit:g} ms", (limit, 0.02), xytext=(-4, 0),
                    textcoords="offset points", fontsize=8, ha="right")
        ax.set_xlim(left=0, right=max(ax.get_xlim()[1], limit * 1.08))
        ax.set_xlabel(f"{name}, ms")
        ax.set_ylabel("share of scheduled requests")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
    if drawn["tpot"] or drawn["ttft"]:
        (ax_tpot if drawn["tpot"] else ax_ttft).legend(fontsize=8, title="run", title_fontsize=8)
    fig.suptitle(f"{class_name}: latency at each run's capacity point", fontsize=11)
    return _save(fig, path)


def server_metrics(data: ExperimentData, path: Path) -> Path | None:
    """Requests running and waiting, KV cache use and prefix hit rate over each run's time."""
    series = server_series(data.metrics)
    if series.empty:
        return None
    panels = (("running", "requests running"), ("waiting", "requests waiting"),
              ("kv_usage", "KV cache use (0-1)"), ("prefix_hit_rate", "prefix-cache hit rate"))
    fig, axes = plt.subplots(2, 2, figsize=(11, 6.5), sharex=True)
    for run_id, g in series.groupby("run_id", sort=True):
        run = data.run(int(run_id))
        start = run.started_at.timestamp() if run.started_at.tzinfo else pd.Timestamp(
            run.started_at, tz="UTC").timestamp()
        x = g.t - start
        for ax, (col, _) in zip(axes.flat, panels, strict=True):
            ax.plot(x, g[col], marker="o", ms=3, color=_color(run.arm),
                    ls="-" if run.block % 2 == 0 else "--", label=data.run_label(run.id))
    for ax, (_, title) in zip(axes.flat, panels, strict=True):
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    for ax in axes[1]:
        ax.set_xlabel("seconds since the run started (one scrape after each point)")
    axes[0][0].legend(fontsize=8)
    return _save(fig, path)


# How capacity_history draws a run of each kind (analysis.censored): the marker and the
# legend's words for it.
RUN_MARKERS = {"point": ("o", "point estimate"), "above": ("^", "lower bound: censored above (capacity >= marker)"),
               "below": ("v", "upper bound: censored below (capacity <= marker)"),
               "unconverged": ("_", "unconverged: within the bar (^ without an upper end)")}


def capacity_history(trends: pd.DataFrame, path: Path) -> Path | None:
    """Capacity over time per comparable group (``trends``: report.history.capacity_trends' rows):
    its point estimates joined by a line, a run censored above as an upward marker at its lower
    bound, one censored below as a downward marker at its upper bound, an unconverged one as a
    bar over its bracket, and the group's median of every run (the NPMLE's) as a dashed line
    labelled with its value (``>= x`` when censored). Runs with no finite bound are not drawn."""
    drawn = trends[trends["bound"].notna()] if "bound" in trends.columns else trends.iloc[:0]
    if drawn.empty:
        return None
    fig, ax = plt.subplots(figsize=(11, 5.5 + 0.15 * min(drawn.groupby(["label", "class"]).ngroups, 24)))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, ((label, cls), g) in enumerate(drawn.groupby(["label", "class"], sort=True)):
        color = colors[i % len(colors)]
        g = g.sort_values("measured_at")
        when = pd.to_datetime(g["measured_at"])
        points = (g["kind"] == "point").to_numpy()
        ax.plot(when[points], g["bound"][points], marker="o", color=color, label=f"{label} [{cls}]")
        open_top = (g["kind"] == "unconverged").to_numpy() & g["bound_high"].isna().to_numpy()
        for kind in ("above", "below"):
            at = (g["kind"] == kind).to_numpy() | (open_top if kind == "above" else False)
            ax.scatter(when[at], g["bound"][at], marker=RUN_MARKERS[kind][0], s=60, color=color, zorder=3)
        bracket = (g["kind"] == "unconverged").to_numpy() & ~open_top
        if bracket.any():
            ax.vlines(when[bracket], g["bound"][bracket], g["bound_high"][bracket], color=color, lw=2)
            for end in ("bound", "bound_high"):
                ax.scatter(when[bracket], g[end][bracket], marker="_", s=80, color=color)
        median = float(g["median"].iloc[0])
        if math.isfinite(median):
            censored = g["median_censored"].iloc[0]
            ax.hlines(median, when.min(), when.max(), colors=color, linestyles="--", lw=1.2)
            ax.annotate(f"median {describe_median(median, censored if isinstance(censored, str) else None)}",
                        (when.max(), median), xytext=(4, 2), textcoords="offset points", fontsize=7, color=color)
    ax.set_ylabel("capacity, goodput tok/s (valid runs)")
    ax.set_xlabel("measured")
    ax.grid(alpha=0.3)
    fig.autofmt_xdate()
    # below the axes, where no run is hidden: the groups (a color each), and what a marker means
    groups = ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.22), title_fontsize=7,
                       title="group (dashed: median of every run)")
    ax.add_artist(groups)
    kinds = [k for k in RUN_MARKERS if (drawn["kind"] == k).any()]
    ax.legend([Line2D([], [], color="black", marker="$I$" if k == "unconverged" else RUN_MARKERS[k][0],
                      ls="-" if k == "point" else "") for k in kinds],
              [RUN_MARKERS[k][1] for k in kinds], fontsize=7, loc="upper right", bbox_to_anchor=(1.0, -0.22),
              title="run", title_fontsize=7)
    return _save(fig, path)
