"""The Pareto front of stored load points as a figure and as a report section (issue 20, item 3).

Per model and workload signature, every valid open-loop load point in history is a dot at
(per-user output speed = 1 / median TPOT, output tok/s per GPU): the trade-off `vllm bench sweep`
plots. The front (``report.history.pareto_front``: no other point is faster per user AND higher
per GPU) is drawn over them and numbered; the key names each front point's configuration and
rate. Simulated and measured points are never one front: simulated ones are hollow, their front
dashed. `orch capacity --pareto --plot FILE.png` draws it over the filtered history; an
experiment's report draws it for the experiment's model and workload, its own runs marked.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from orchestrator.plan.signature import rate_unit_of_summary
from orchestrator.report import plots
from orchestrator.report.history import PARETO_COLUMNS, pareto_axes, pareto_front, points_runs
from orchestrator.report.plots import plt

MAX_PANELS = 12  # one panel per model and workload; more than this is unreadable: filter instead
FRONT_COLOR = "#222222"
CONFIG_COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf",
                 "#bcbd22", "#7f7f7f")
MARK_SHAPES = "Ds^vPX<>"  # this experiment's arms, in the order of their names
KEY_LABEL_CHARS = 70


@dataclass(frozen=True)
class ParetoDrawn:
    """What a Pareto figure shows: its file, the panels (model, workload summary, signature),
    the points drawn and the front rows drawn (pareto_front's columns, plus ``key``: the number
    beside the point, and ``mark``: its run's label when the caller marked it)."""

    path: Path
    panels: list[tuple[str, str, str]]
    points: int
    simulated_points: int
    front: pd.DataFrame
    left_out: int  # (model, workload) groups beyond MAX_PANELS, not drawn


def _short(label: str, limit: int = KEY_LABEL_CHARS) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"


def _groups(points: pd.DataFrame) -> list[tuple[tuple[str, str], pd.DataFrame]]:
    """(model, workload) groups, the most points first (the ones a reader has most evidence
    on), then by name for a stable order."""
    groups = [(key, g) for key, g in points.groupby(["model", "workload_sha256"], sort=True)]
    groups.sort(key=lambda kg: -len(kg[1]))
    return [((str(k[0]), str(k[1])), g) for k, g in groups]


def pareto_figure(points: pd.DataFrame, path: str | Path, *, mark: Mapping[int, str] | None = None,
                  title: str | None = None) -> ParetoDrawn | None:
    """Draw the Pareto front of ``points`` (store.load_points rows) into ``path`` (PNG); None
    when there is no point. ``mark``: run id -> label (e.g. "this experiment, arm A"): those
    runs' points are drawn in their arm's color and named in the legend."""
    if points.empty:
        return None
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    mark = dict(mark or {})
    p = pareto_axes(points)
    p = p[p["per_user_tok_s"].map(math.isfinite) & p["tok_s_per_gpu"].map(math.isfinite)]
    if p.empty:
        return None
    groups = _groups(p)
    drawn_groups, left_out = groups[:MAX_PANELS], max(0, len(groups) - MAX_PANELS)
    n = len(drawn_groups)
    fig, axes = plt.subplots(n, 1, figsize=(13, 4.6 * n), squeeze=False)
    fronts, panels, n_points, n_sim = [], [], 0, 0
    for ax, ((model, sha), g) in zip(axes[:, 0], drawn_groups, strict=True):
        summary = str(g["workload"].iloc[0]) if isinstance(g["workload"].iloc[0], str) else "workload ?"
        panels.append((model, summary, sha))
        unit = rate_unit_of_summary(summary)
        front = pareto_front(g.drop(columns=["per_user_tok_s", "tok_s_per_gpu", "tpot_p50_ms"]))
        front = front.assign(key=range(1, len(front) + 1),
                             mark=[mark.get(int(r)) for r in front["run_id"]])
        fronts.append(front)
        _draw_points(ax, g, mark)
        n_points += len(g)
        n_sim += int(g["simulated"].astype(bool).sum())
        for simulated, f in front.groupby("simulated", sort=True):
            f = f.sort_values("per_user_tok_s")
            ax.plot(f["per_user_tok_s"], f["tok_s_per_gpu"], ls="--" if simulated else "-", color=FRONT_COLOR,
                    lw=1.3, zorder=4, label="front (simulated)" if simulated else "front (measured)")
            ax.scatter(f["per_user_tok_s"], f["tok_s_per_gpu"], s=150, zorder=3, linewidths=1.4,
                       facecolors="none", edgecolors=FRONT_COLOR)
            for r in f.itertuples(index=False):
                ax.annotate(str(r.key), (r.per_user_tok_s, r.tok_s_per_gpu), xytext=(7, 6),
                            textcoords="offset points", fontsize=9, fontweight="bold", color=FRONT_COLOR, zorder=6)
        # The key: each front point's configuration and rate (the legend, beside the panel).
        for r in front.itertuples(index=False):
            ax.plot([], [], ls="none", label=f"{r.key}: {_short(str(r.label))} @ {r.offered_rate:.3g} {unit}"
                    + (" [sim]" if r.simulated else "") + (f" ({r.mark})" if isinstance(r.mark, str) else ""))
        ax.set_title(f"{model} | {summary} [{sha[:8]}]", fontsize=10, loc="left")
        ax.set_xlabel("per-user output speed, tok/s (1 / median TPOT)")
        ax.set_ylabel("output tok/s per GPU")
        ax.grid(alpha=0.3)
        # From zero (the trade-off's scale), with room for the numbers beside the outer points.
        ax.set_xlim(0, float(g["per_user_tok_s"].max()) * 1.1)
        ax.set_ylim(0, float(g["tok_s_per_gpu"].max()) * 1.12)
        handles, labels = ax.get_legend_handles_labels()
        unique = dict(zip(labels, handles, strict=False))
        ax.legend(unique.values(), unique.keys(), fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  borderaxespad=0, title="numbered: the front", title_fontsize=7)
    fig.suptitle(title or "Pareto front per model and workload: throughput per GPU vs per-user speed "
                 "(valid stored load points)", fontsize=11)
    # The legend sits right of the panels: a tight bounding box keeps it in the file.
    fig.tight_layout()
    fig.savefig(out, dpi=plots.DPI, bbox_inches="tight")
    plt.close(fig)
    front_all = (pd.concat(fronts, ignore_index=True) if fronts
                 else pd.DataFrame(columns=[*PARETO_COLUMNS, "key", "mark"]))
    return ParetoDrawn(out, panels, n_points, n_sim, front_all, left_out)


def _draw_points(ax: Any, g: pd.DataFrame, mark: Mapping[int, str]) -> None:
    """Every point of a panel: a color per configuration, filled when measured, hollow when
    simulated; a marked run's points (this experiment's arms) in their own marker shape."""
    labels = sorted(str(x) for x in g["label"].unique())
    colors = {lab: CONFIG_COLORS[i % len(CONFIG_COLORS)] for i, lab in enumerate(labels)}
    marks = sorted({m for r in g["run_id"] if (m := mark.get(int(r))) is not None})
    shapes = {m: MARK_SHAPES[i % len(MARK_SHAPES)] for i, m in enumerate(marks)}
    for (label, simulated, run_id), pts in g.groupby(["label", "simulated", "run_id"], sort=True):
        color, m = colors[str(label)], mark.get(int(run_id))
        style: dict[str, Any] = {"facecolors": "none", "edgecolors": color} if simulated else {"color": color}
        ax.scatter(pts["per_user_tok_s"], pts["tok_s_per_gpu"], s=46 if m else 30, zorder=5,
                   marker=shapes.get(m, "o") if m else "o", linewidths=1.3, **style)
    # The legend's entries, one per meaning (not one per run drawn).
    for label in labels:
        ax.scatter([], [], color=colors[label], s=30, label=_short(label, 60))
    if g["simulated"].astype(bool).any():
        ax.scatter([], [], facecolors="none", edgecolors="#555555", s=30, label="hollow: simulated")
    for m in marks:
        ax.scatter([], [], color="#555555", marker=shapes[m], s=46, label=m)


# -- the report's section ------------------------------------------------------------------------


@dataclass(frozen=True)
class ParetoSection:
    """The report's Pareto section for one experiment: what was asked, what history holds."""

    model: str
    workload: str  # summary
    workload_sha256: str
    simulated: bool
    points: int  # comparable stored points
    own_points: int  # of them, this experiment's
    rows: list[dict[str, Any]]  # the front, fastest per user first
    image: str | None  # relative to the report's folder
    rate_unit: str = "req/s"  # what a point's rate counts (sessions/s for live sessions)
    runs: int = 0  # the valid runs the points come from
    censored_runs: int = 0  # of them, with a censored or unconverged capacity (their points count too)

    def to_dict(self) -> dict[str, Any]:
        return {"model": self.model, "workload": self.workload, "workload_sha256": self.workload_sha256,
                "simulated": self.simulated, "points": self.points, "own_points": self.own_points,
                "runs": self.runs, "censored_runs": self.censored_runs, "front": self.rows,
                "rate_unit": self.rate_unit}


def experiment_points(store: Any, data: Any) -> tuple[pd.DataFrame, dict[int, str], str, str, bool]:
    """The stored load points comparable with ``data``'s experiment (report.data.ExperimentData):
    its model and workload signature, its source (simulated or measured: never mixed). Returns
    (points, run id -> "this experiment, arm X", model, workload sha256, simulated)."""
    from orchestrator.plan.signature import workload_signature

    model = data.plan.model.name
    sha = workload_signature(data.plan.workload).sha256
    points = store.load_points(model=model, workload=sha)
    mark = {int(r.id): f"this experiment, arm {r.arm}" for r in data.runs}
    own = points[points["run_id"].map(lambda r: int(r) in mark)]
    # The experiment's own stored kind (a Kubernetes backend may run simulated engines), else
    # its plan's backend.
    simulated = bool(own["simulated"].iloc[0]) if not own.empty else data.plan.backend == "sim"
    points = points[points["simulated"].astype(bool) == simulated].reset_index(drop=True)
    return points, mark, model, sha, simulated


def experiment_section(store: Any, data: Any, fig_dir: Path, out: Path) -> ParetoSection:
    """Draw the experiment's Pareto figure into ``fig_dir`` and gather its section's rows
    (image path relative to ``out``, the report's folder)."""
    points, mark, model, sha, simulated = experiment_points(store, data)
    own_points = int(points["run_id"].map(lambda r: int(r) in mark).sum()) if not points.empty else 0
    drawn = pareto_figure(points, fig_dir / "pareto.png", mark=mark,
                          title=f"Pareto front of {model} on this workload: every comparable stored point, "
                                "this experiment's arms marked")
    rows: list[dict[str, Any]] = []
    summary = ""
    if drawn is not None:
        summary = drawn.panels[0][1] if drawn.panels else ""
        for r in drawn.front.to_dict("records"):
            rows.append({
                "key": int(r["key"]), "label": r["label"], "gpu": r["gpu"], "gpus": int(r["gpus"]),
                "offered_rate": float(r["offered_rate"]), "per_user_tok_s": float(r["per_user_tok_s"]),
                "tpot_p50_ms": float(r["tpot_p50_ms"]), "tok_s_per_gpu": float(r["tok_s_per_gpu"]),
                "run_id": int(r["run_id"]), "simulated": bool(r["simulated"]),
                "mark": r["mark"] if isinstance(r["mark"], str) else None,  # pandas' NaN: not marked
            })
    image = None if drawn is None else drawn.path.relative_to(out).as_posix()
    censored = store.censored_runs([int(r) for r in points["run_id"]]) if not points.empty else set()
    counts = points_runs(points, censored)
    for row in rows:
        row["run_censored"] = row["run_id"] in censored
    return ParetoSection(model, summary, sha, simulated, len(points), own_points, rows, image,
                         data.plan.workload.rate_unit, **counts)


SECTION = """<h2 id="pareto-section">Pareto front <span class="muted">({{ s.model }}, {{ s.workload or "this workload" }}
[{{ s.workload_sha256[:8] }}], {{ "simulated" if s.simulated else "measured" }})</span></h2>
{% if s.rows %}
<p>Every valid open-loop load point stored for this model and workload signature
({{ s.points }} point(s), {{ s.own_points }} of them this experiment's, from {{ s.runs }} valid run(s),
{{ s.censored_runs }} of them with a censored or unconverged capacity: their points count too), as per-user output speed
(1 / median TPOT) against output tokens per second per GPU. The front: the points that no other
point beats on both, faster per user <em>and</em> higher per GPU. {{ "Simulated" if s.simulated else "Measured" }}
points only: simulated and measured points are never one front.</p>
<table id="pareto">
<thead><tr><th>#</th><th>configuration</th><th>rate, {{ s.rate_unit }}</th><th>tok/s per user</th><th>TPOT p50, ms</th>
<th>tok/s per GPU</th><th>run</th><th>this experiment</th></tr></thead>
<tbody>
{% for r in s.rows %}
<tr{% if r.mark %} class="own" style="background: #eef5ff"{% endif %}><td>{{ r.key }}</td><td>{{ r.label }}</td><td class="num">{{ "%.3g"|format(r.offered_rate) }}</td>
<td class="num">{{ "{:,.1f}".format(r.per_user_tok_s) }}</td><td class="num">{{ "%.2f"|format(r.tpot_p50_ms) }}</td>
<td class="num">{{ "{:,.0f}".format(r.tok_s_per_gpu) }}</td><td>{{ r.run_id }}</td><td>{{ r.mark.replace("this experiment, ", "") if r.mark else "-" }}</td></tr>
{% endfor %}
</tbody>
</table>
{% if s.image %}<img src="{{ s.image }}" alt="Pareto front: throughput per GPU against per-user speed">{% endif %}
{% else %}
<p id="pareto-none">No valid open-loop load point of {{ s.model }} on this workload is stored
({{ "simulated" if s.simulated else "measured" }}): no front to show.</p>
{% endif %}
"""


def pareto_section_html(section: ParetoSection) -> str:
    """The report's "Pareto front" section (an HTML fragment, escaped)."""
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    return env.from_string(SECTION).render(s=section)


# Where the section goes in the page: before the validity table (after the classes' curves),
# else at the end of the body. The page is html.render's; this keeps that template untouched.
ANCHORS = ("<h2>Validity of every run</h2>", "</body>")


def insert_section(page: str, fragment: str) -> str:
    for anchor in ANCHORS:
        at = page.find(anchor)
        if at >= 0:
            return page[:at] + fragment + "\n" + page[at:]
    return page + fragment
