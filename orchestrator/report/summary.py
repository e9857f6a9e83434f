"""The figures of a report as plain data: the tables the HTML shows and `orch report --json`
prints. One place decides what a row says, so the page and the JSON never disagree."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from orchestrator.report.data import ExperimentData


def num(x: Any) -> Any:
    """JSON-safe number: NaN and infinities become None; numpy scalars plain Python."""
    if x is None:
        return None
    if hasattr(x, "item"):
        x = x.item()
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def when(dt: Any) -> str | None:
    if dt is None or (isinstance(dt, float) and math.isnan(dt)):
        return None
    return pd.Timestamp(dt).isoformat()


def _label(v: Any, confidence: float, compare: str = "B/A") -> str:
    """Exactly what the stored interval is (a verdict stored before labels were: what its
    lower..upper then meant, two one-sided bounds at the bar's confidence)."""
    if v.label:
        return str(v.label)
    lo, hi = num(v.lower), num(v.upper)
    return (f"{compare} {'-' if lo is None else f'{lo:.4g}'}..{'-' if hi is None else f'{hi:.4g}'}: each end a one-sided "
            f"{confidence:.0%} bound (together a {2 * confidence - 1:.0%} two-sided interval); stored before labels were")


def verdict_rows(data: ExperimentData) -> list[dict[str, Any]]:
    """One row per registered bar; a bar without a stored verdict says NOT JUDGED. Each says
    exactly what its interval is (``label``), the blocks it used, and which blocks were
    censored or dropped and why."""
    stored = {v.bar_id: v for v in data.verdicts}
    rows = []
    for bar in data.plan.bars:
        v = stored.get(bar.id)
        evidence = (v.evidence or {}) if v else {}
        rows.append({
            "bar": bar.id, "metric": bar.metric, "class": bar.service_class, "compare": bar.compare,
            "direction": bar.direction, "threshold": bar.threshold, "confidence": bar.confidence,
            "rate": bar.rate, "verdict": v.verdict if v else "NOT JUDGED",
            "estimate": num(v.estimate) if v else None, "lower": num(v.lower) if v else None,
            "upper": num(v.upper) if v else None, "blocks": v.blocks if v else 0,
            "judged_at": when(v.judged_at) if v else None,
            "label": _label(v, bar.confidence, bar.compare) if v else "not judged: no interval",
            "note": (v.note or "") if v else "",
            "blocks_used": evidence.get("blocks_used"),
            "censored": list(evidence.get("censored") or []), "dropped": list(evidence.get("dropped") or []),
        })
    return rows


def sweep_doc(data: ExperimentData) -> dict[str, Any] | None:
    """A sweep plan's arms by readable name and its effects with their intervals, as stored with
    its verdicts (None: not a sweep plan, or not judged yet)."""
    for v in data.verdicts:
        if v.evidence and v.evidence.get("sweep"):
            return dict(v.evidence["sweep"])
    return None


def capacity_rows(data: ExperimentData) -> list[dict[str, Any]]:
    """Every stored capacity with its censoring: censored (None, below_min, above_max,
    at_ceiling), converged, and upper (None: unbounded)."""
    rows = []
    for r in data.capacities.itertuples(index=False):
        censored = r.censored if isinstance(r.censored, str) else None
        converged = bool(r.converged) if r.converged is not None else True
        upper = num(r.upper)
        row = {"run_id": int(r.run_id), "arm": r.arm, "block": int(r.block), "attempt": int(r.attempt),
               "valid": bool(r.valid) if r.valid is not None else None, "class": r.class_name,
               "capacity_tok_s": num(r.capacity), "at_rate": num(r.at_rate),
               "attainment": num(r.attainment), "points_used": int(r.points_used),
               "censored": censored, "converged": converged, "upper_tok_s": upper}
        if censored is None and converged and (num(r.capacity) or 0) > 0:
            row["censoring"] = "point estimate"
        else:
            lo = 0.0 if censored == "below_min" else num(r.capacity) or 0.0
            why = ", ".join(w for w in (censored, None if converged else "unconverged") if w)
            row["censoring"] = (f"{why}: a bound, in [{lo:,.0f}, "
                                + ("unbounded)" if upper is None else f"{upper:,.0f}]"))
        rows.append(row)
    return rows


def run_rows(data: ExperimentData) -> list[dict[str, Any]]:
    """Every run with its validity and each guard it failed (value vs threshold)."""
    rates = dict(zip(data.points.id, data.points.offered_rate, strict=False)) if not data.points.empty else {}
    rows = []
    for r in data.runs:
        guards = data.guards.get(r.id, [])
        failed = [
            {"guard": g.name, "value": num(g.value), "threshold": num(g.threshold), "detail": g.detail,
             "point_id": g.point_id, "offered_rate": num(rates.get(g.point_id))}
            for g in guards if not g.passed
        ]
        rows.append({
            "run_id": r.id, "block": r.block, "arm": r.arm, "attempt": r.attempt,
            "status": r.status, "valid": r.valid, "reason": r.invalid_reason,
            "started_at": when(r.started_at), "finished_at": when(r.finished_at),
            "points": int((data.points.run_id == r.id).sum()) if not data.points.empty else 0,
            "guards_checked": len(guards), "guards_failed": failed,
        })
    return rows


def guard_rows(data: ExperimentData) -> list[dict[str, Any]]:
    """Every guard result of every run (run-level ones have no point)."""
    rates = dict(zip(data.points.id, data.points.offered_rate, strict=False)) if not data.points.empty else {}
    return [
        {"run_id": run_id, "run": data.run_label(run_id), "guard": g.name, "passed": g.passed,
         "value": num(g.value), "threshold": num(g.threshold), "detail": g.detail,
         "point_id": g.point_id, "offered_rate": num(rates.get(g.point_id))}
        for run_id, guards in data.guards.items() for g in guards
    ]


def fingerprint_rows(data: ExperimentData) -> list[dict[str, Any]]:
    return [{"run_id": r.id, "run": data.run_label(r.id), "fingerprint": r.fingerprint or {}}
            for r in data.runs]


def experiment_doc(data: ExperimentData) -> dict[str, Any]:
    e, reg = data.experiment, data.registration
    return {
        "id": e.id, "name": e.name, "status": e.status, "created_at": when(e.created_at),
        "started_at": when(e.started_at), "finished_at": when(e.finished_at),
        "plan": {"name": reg.name, "registration_id": reg.id, "sha256": reg.sha256,
                 "registered_at": when(reg.registered_at), "hypothesis": data.plan.hypothesis},
        # what a point's rate counts (a live-sessions plan's rate starts sessions)
        "rate_unit": data.plan.workload.rate_unit,
    }
