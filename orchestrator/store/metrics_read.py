"""Read the scraped ``vllm:`` metric samples of an experiment's runs of one arm, per load point
(``orch device fit --experiment``): the rows as stored, for the pure fit in sim/metrics_fit.py."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from orchestrator.store.models import LoadPoint, MetricSample, Run
from orchestrator.store.repository import Store


@dataclass(frozen=True)
class PointSamples:
    """One valid load point of a run, with its samples (t, name, labels, value) in time order."""

    run_id: int
    point_id: int
    seq: int
    offered_rate: float | None
    achieved_rate: float | None  # requests/s over the point's window
    samples: tuple[tuple[float, str, dict[str, str], float], ...]


@dataclass(frozen=True)
class RunPoints:
    """A valid run of the arm: its observed fingerprint and its valid points."""

    run_id: int
    block: int
    attempt: int
    fingerprint: dict[str, Any] | None
    points: tuple[PointSamples, ...]


def arm_point_samples(store: Store, experiment_id: int, arm: str, names: Sequence[str]) -> list[RunPoints]:
    """The valid runs of ``arm`` in an experiment, each with its valid points and those points'
    samples of ``names`` (the other series, histogram buckets among them, are not read)."""
    with store.engine.connect() as c:
        runs = c.execute(
            sa.select(Run.id, Run.block, Run.attempt, Run.fingerprint)
            .where(Run.experiment_id == experiment_id, Run.arm == arm, Run.valid.is_(True))
            .order_by(Run.block, Run.position, Run.attempt)
        ).all()
        run_ids = [r.id for r in runs]
        points = c.execute(
            sa.select(LoadPoint.id, LoadPoint.run_id, LoadPoint.seq, LoadPoint.offered_rate, LoadPoint.achieved_rate)
            .where(LoadPoint.run_id.in_(run_ids), LoadPoint.valid.is_(True))
            .order_by(LoadPoint.run_id, LoadPoint.seq, LoadPoint.id)
        ).all() if run_ids else []
        by_point: dict[int, list[tuple[float, str, dict[str, str], float]]] = {p.id: [] for p in points}
        if by_point:
            rows = c.execute(
                sa.select(MetricSample.point_id, MetricSample.t, MetricSample.name, MetricSample.labels,
                          MetricSample.value)
                .where(MetricSample.run_id.in_(run_ids), MetricSample.name.in_(list(names)),
                       MetricSample.point_id.in_(list(by_point)))
                .order_by(MetricSample.t, MetricSample.id)
            )
            for point_id, t, name, labels, value in rows:  # (a Row's .t is the row itself)
                by_point[point_id].append((float(t), name, dict(labels or {}), float(value)))
    out = []
    for r in runs:
        mine = tuple(PointSamples(r.id, p.id, p.seq, p.offered_rate, p.achieved_rate,
                                  tuple(by_point[p.id]))
                     for p in points if p.run_id == r.id)
        out.append(RunPoints(r.id, r.block, r.attempt, r.fingerprint, mine))
    return out
