"""An experiment's load points and request records as flat tables (parquet or CSV), for
pandas, spreadsheets and notebooks. Nested JSON (per class, percentiles) becomes dotted columns."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

import pandas as pd

from orchestrator.errors import UserError
from orchestrator.records import RECORD_FIELDS
from orchestrator.report.data import ExperimentData

TableFormat = Literal["parquet", "csv"]
RUN_COLUMNS = ("experiment", "run_id", "arm", "block", "attempt")


def points_frame(data: ExperimentData) -> pd.DataFrame:
    """One row per load point; ``per_class``, ``percentiles`` and ``context`` flattened to dotted
    columns (``standard.attainment``, ``ttft_s.p99``, ``context.server_prefix_hit_rate``)."""
    pts = data.points
    if pts.empty:
        return pd.DataFrame(columns=[*RUN_COLUMNS, "point_id"])
    base = pts.drop(columns=["per_class", "percentiles", "context", "run_valid"]).rename(columns={"id": "point_id"})
    per_class = pd.json_normalize([pc or {} for pc in pts.per_class], sep=".")
    pct = pd.json_normalize([p or {} for p in pts.percentiles], sep=".")
    ctx = pd.json_normalize([{"context": c} if isinstance(c, dict) and c else {} for c in pts.context], sep=".")
    frame = pd.concat([base.reset_index(drop=True), per_class, pct, ctx], axis=1)
    frame.insert(0, "experiment", data.experiment.name)
    frame["created_at"] = pd.to_datetime(frame["created_at"], utc=True)
    lead = [*RUN_COLUMNS, "point_id", "seq"]
    return frame[lead + [c for c in frame.columns if c not in lead]]


def requests_frame(data: ExperimentData) -> pd.DataFrame:
    """Every request record of every point (all phases), with its point and run beside it, and
    the derived TTFT and TPOT (NaN where no token arrived: a miss, never a fast request)."""
    parts = []
    for p in data.points.itertuples(index=False):
        recs = data.requests(int(p.id))
        if not recs:
            continue
        frame = pd.DataFrame([r.to_dict() for r in recs], columns=list(RECORD_FIELDS))
        finite = [(r.ttft_s, r.tpot_s) for r in recs]
        frame["ttft_s"] = [t if math.isfinite(t) else math.nan for t, _ in finite]
        frame["tpot_s"] = [t if math.isfinite(t) else math.nan for _, t in finite]
        frame.insert(0, "point_id", int(p.id))
        for i, col in enumerate(("experiment", "run_id", "arm", "block", "attempt")):
            value = data.experiment.name if col == "experiment" else getattr(p, col)
            frame.insert(i, col, value)
        parts.append(frame)
    if not parts:
        return pd.DataFrame(columns=[*RUN_COLUMNS, "point_id", *RECORD_FIELDS, "ttft_s", "tpot_s"])
    return pd.concat(parts, ignore_index=True)


def write_tables(data: ExperimentData, out_dir: str | Path, fmt: TableFormat) -> dict[str, tuple[Path, int]]:
    """Write points.<fmt> and requests.<fmt>; returns {table: (path, rows written)}."""
    if fmt not in ("parquet", "csv"):
        raise UserError(f"--format: {fmt!r} is not parquet, csv or llmd")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, frame in (("points", points_frame(data)), ("requests", requests_frame(data))):
        path = out / f"{name}.{fmt}"
        if fmt == "parquet":
            frame.to_parquet(path, index=False)
        else:
            frame.to_csv(path, index=False)
        paths[name] = (path, len(frame))
    return paths
