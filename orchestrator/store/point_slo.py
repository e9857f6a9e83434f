"""Whether stored load points met each class's SLO: the input of a Pareto front per class
(`orch capacity --pareto --slo-met`).

A point meets a class's SLO when the share of its requests within the class's TTFT and TPOT
limits (its stored attainment at that class) is at least the attainment its plan's capacity
search required (``search.attainment`` of the registered plan): the rule by which the search
counts a point toward capacity."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pandas as pd
import sqlalchemy as sa

from orchestrator.store.models import Experiment, LoadPoint, PlanRegistration, Run

CHUNK = 5000  # point ids per query (bound parameters)
COLUMNS = ["point_id", "class_name", "attainment", "required"]


def point_attainment(engine: sa.Engine, point_ids: Sequence[int]) -> pd.DataFrame:
    """One row per (point, class it stored): its attainment and the attainment its plan
    required (COLUMNS)."""
    rows: list[tuple[int, str, float, float]] = []
    required: dict[int, float] = {}
    ids = sorted({int(i) for i in point_ids})
    with engine.connect() as conn:
        for start in range(0, len(ids), CHUNK):
            chunk = ids[start:start + CHUNK]
            found = conn.execute(
                sa.select(LoadPoint.id, LoadPoint.per_class, Experiment.registration_id)
                .join(Run, Run.id == LoadPoint.run_id).join(Experiment, Experiment.id == Run.experiment_id)
                .where(LoadPoint.id.in_(chunk))).all()
            new = {r.registration_id for r in found} - set(required)
            if new:
                for reg_id, text in conn.execute(sa.select(PlanRegistration.id, PlanRegistration.canonical_json)
                                                 .where(PlanRegistration.id.in_(sorted(new)))):
                    required[reg_id] = float(json.loads(text)["plan"]["search"]["attainment"])
            for r in found:
                for cls, m in (r.per_class or {}).items():
                    att = (m or {}).get("attainment")
                    if isinstance(att, int | float):
                        rows.append((int(r.id), str(cls), float(att), required[r.registration_id]))
    return pd.DataFrame(rows, columns=COLUMNS)
