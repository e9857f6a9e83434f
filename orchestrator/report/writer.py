"""Write an experiment's report: figures first, then the page that shows them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.errors import UserError
from orchestrator.report import html, pareto, plots, summary
from orchestrator.report.data import ExperimentData, load_experiment

if TYPE_CHECKING:
    from orchestrator.store import Store

INDEX = "index.html"
FIGURES = "figures"


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-") or "x"


def report_document(data: ExperimentData) -> dict[str, Any]:
    """The report's content as plain data (what `orch report --json` prints, less paths)."""
    return {
        "experiment": summary.experiment_doc(data),
        "verdicts": summary.verdict_rows(data),
        "sweep": summary.sweep_doc(data),
        "capacities": summary.capacity_rows(data),
        "runs": summary.run_rows(data),
        "guards": summary.guard_rows(data),
        "fingerprints": summary.fingerprint_rows(data),
    }


def _figures(data: ExperimentData, out: Path) -> dict[str, Any]:
    """Draw every figure into out/figures; paths relative to out (None: nothing to draw)."""
    fig_dir = out / FIGURES
    fig_dir.mkdir(parents=True, exist_ok=True)

    def rel(p: Path | None) -> str | None:
        return None if p is None else p.relative_to(out).as_posix()

    images: dict[str, Any] = {
        "verdicts": rel(plots.verdict_intervals(data, fig_dir / "verdicts.png")),
        "server": rel(plots.server_metrics(data, fig_dir / "server-metrics.png")),
        "curves": {}, "latency": {},
    }
    for cls in data.plan.classes:
        slug = _slug(cls.name)
        images["curves"][cls.name] = rel(plots.load_curves(data, cls.name, fig_dir / f"load-{slug}.png"))
        images["latency"][cls.name] = rel(
            plots.latency_at_capacity(data, cls.name, fig_dir / f"latency-{slug}.png"))
    return images


@dataclass(frozen=True)
class WrittenReport:
    """Where the page is, what it says (report_document) and its figures (relative paths)."""

    index: Path
    document: dict[str, Any]
    images: dict[str, Any]


def render_report(store: Store, experiment: int | str, out_dir: str | Path) -> WrittenReport:
    """Write the report of ``experiment`` (id or name) into ``out_dir``.

    The page needs no network: CSS is inline, figures are PNG files in ``out_dir/figures``."""
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out: {out} exists and is not a directory")
    data = load_experiment(store, experiment)  # before anything is created: no such experiment, no folder
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UserError(f"--out: cannot create {out}: {e.strerror or e}") from None
    doc = report_document(data)
    images = _figures(data, out)
    # The Pareto front over comparable history (not only this experiment: the store is asked).
    front = pareto.experiment_section(store, data, out / FIGURES, out)
    images["pareto"], doc["pareto"] = front.image, front.to_dict()
    plan_doc = data.plan.model_dump(mode="json", by_alias=True)
    page = html.render(doc, images, plan_doc, list(data.plan.classes))
    page = pareto.insert_section(page, pareto.pareto_section_html(front))
    index = out / INDEX
    index.write_text(page, encoding="utf-8")
    return WrittenReport(index, doc, images)


def write_report(store: Store, experiment: int | str, out_dir: str | Path) -> Path:
    """Write the report of ``experiment`` (id or name) into ``out_dir``; returns index.html."""
    return render_report(store, experiment, out_dir).index


def figure_paths(images: dict[str, Any]) -> list[str]:
    """Every figure path in an images mapping, flattened."""
    out: list[str] = []
    for v in images.values():
        if isinstance(v, dict):
            out.extend(p for p in v.values() if p)
        elif v:
            out.append(v)
    return out
