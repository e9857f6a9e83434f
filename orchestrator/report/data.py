"""Everything a report shows about one experiment, read from the store once.

The store hands back plain values and DataFrames; this gathers them into one frozen bundle so
the plots, the HTML and the exports read the same numbers (and the store is queried once).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from orchestrator.engines import engine_for
from orchestrator.plan import Bar, Plan
from orchestrator.records import RequestRecord
from orchestrator.store import (
    ExperimentInfo,
    GuardRecord,
    Registration,
    RunInfo,
    Store,
    VerdictInfo,
)

# The server metrics drawn over time (the engine adapter's names; the sim server exports them).
_METRICS = engine_for().metrics
RUNNING = _METRICS.running
WAITING = _METRICS.waiting
KV_USAGE = _METRICS.kv_usage
PREFIX_QUERIES = _METRICS.prefix_queries
PREFIX_HITS = _METRICS.prefix_hits
SCRAPE_GAP_S = 0.5


@dataclass(frozen=True)
class ExperimentData:
    """One experiment as stored: plan, runs, points, capacities, verdicts, guards, metrics."""

    experiment: ExperimentInfo
    registration: Registration
    plan: Plan
    runs: list[RunInfo]
    points: pd.DataFrame  # every point of every run, with the run's arm/block/attempt beside it
    capacities: pd.DataFrame  # store.capacities(): per run and class
    verdicts: list[VerdictInfo]
    guards: dict[int, list[GuardRecord]]  # run id -> its guard results
    metrics: pd.DataFrame  # every scraped sample, with run_id
    _store: Any = field(repr=False, compare=False)

    def run(self, run_id: int) -> RunInfo:
        return next(r for r in self.runs if r.id == run_id)

    def run_label(self, run_id: int) -> str:
        r = self.run(run_id)
        return f"{r.arm} b{r.block}" + (f" a{r.attempt}" if r.attempt else "")

    def requests(self, point_id: int) -> list[RequestRecord]:
        """A point's request records (read on demand: the bulk of the data)."""
        return self._store.requests(int(point_id))

    def capacity_points(self, class_name: str) -> list[tuple[RunInfo, int, float]]:
        """Per valid run: (run, id of the point its capacity at the class was found at, capacity).
        Runs whose capacity is 0 (no point met the attainment) are left out."""
        out = []
        caps = self.capacities
        rows = caps[(caps.class_name == class_name) & caps.valid.fillna(False).astype(bool)]
        for row in rows.itertuples(index=False):
            if row.at_rate is None or not math.isfinite(row.at_rate) or row.capacity <= 0:
                continue
            pts = self.points[(self.points.run_id == row.run_id)]
            near = pts[(pts.offered_rate - row.at_rate).abs() <= 1e-6 * max(1.0, row.at_rate)]
            if near.empty:
                continue
            out.append((self.run(int(row.run_id)), int(near.id.iloc[-1]), float(row.capacity)))
        return out

    def bar(self, bar_id: str) -> Bar | None:
        return next((b for b in self.plan.bars if b.id == bar_id), None)


def load_experiment(store: Store, key: int | str) -> ExperimentData:
    """Read one experiment (by id or name) with everything a report needs."""
    exp = store.get_experiment(key)
    reg = store.get_registration(exp.registration_id)
    plan = store.plan_of(reg)
    runs = store.runs(exp.id)
    frames, metric_frames, guards = [], [], {}
    for r in runs:
        pts = store.points(r.id)
        if not pts.empty:
            frames.append(pts.assign(arm=r.arm, block=r.block, attempt=r.attempt, run_valid=r.valid))
        samples = store.metric_samples(r.id)
        if not samples.empty:
            metric_frames.append(samples.assign(run_id=r.id))
        guards[r.id] = store.guard_results(r.id)
    point_columns = ["id", "run_id", "seq", "search_class", "offered_rate", "users", "window_start_s",
                     "window_end_s", "achieved_rate", "throughput_tok_s", "n_scheduled", "per_class",
                     "percentiles", "context", "valid", "created_at", "arm", "block", "attempt", "run_valid"]
    points = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=point_columns)
    metrics = (pd.concat(metric_frames, ignore_index=True) if metric_frames
               else pd.DataFrame(columns=["t", "name", "labels", "value", "point_id", "run_id"]))
    return ExperimentData(
        experiment=exp, registration=reg, plan=plan, runs=runs, points=points,
        capacities=store.capacities(exp.id), verdicts=store.verdicts(exp.id), guards=guards,
        metrics=metrics, _store=store,
    )


def class_value(per_class: Any, class_name: str, key: str) -> float:
    """A figure of a class from a point's per_class JSON (NaN when absent)."""
    if not isinstance(per_class, dict):
        return math.nan
    v = (per_class.get(class_name) or {}).get(key)
    return float(v) if v is not None else math.nan


def server_series(metrics: pd.DataFrame) -> pd.DataFrame:
    """Per run and scrape: requests running and waiting (summed over every server), KV cache
    use (mean over servers, 0-1), and the prefix-cache hit rate since the previous scrape
    (hits / queries of the counters' increase; NaN when nothing was queried)."""
    columns = ["run_id", "t", "running", "waiting", "kv_usage", "prefix_hit_rate"]
    if metrics.empty:
        return pd.DataFrame(columns=columns)
    # One scrape's samples carry times a few microseconds apart (each stamped as stored):
    # a new scrape starts where the clock jumps by more than SCRAPE_GAP_S.
    m = metrics.sort_values(["run_id", "t"], kind="stable")
    jump = (m.t.diff() > SCRAPE_GAP_S) | (m.run_id != m.run_id.shift())
    m = m.assign(scrape=jump.cumsum())
    rows = []
    for (run_id, _), group in m.groupby(["run_id", "scrape"], sort=True):
        t = group.t.min()
        def total(name: str, g: pd.DataFrame = group) -> float:
            v = g.value[g.name.isin([name, f"{name}_total"])]
            return float(v.sum()) if len(v) else math.nan

        kv = group.value[group.name == KV_USAGE]
        rows.append({
            "run_id": run_id, "t": float(t), "running": total(RUNNING), "waiting": total(WAITING),
            "kv_usage": float(kv.mean()) if len(kv) else math.nan,
            "queries": total(PREFIX_QUERIES), "hits": total(PREFIX_HITS),
        })
    frame = pd.DataFrame(rows)
    out = []
    for _, g in frame.groupby("run_id", sort=True):
        g = g.sort_values("t")
        dq, dh = g.queries.diff(), g.hits.diff()
        # The first scrape of a run: its counters started at zero with the run's servers.
        dq.iloc[0], dh.iloc[0] = g.queries.iloc[0], g.hits.iloc[0]
        out.append(g.assign(prefix_hit_rate=(dh / dq.where(dq > 0))))
    return pd.concat(out, ignore_index=True)[columns]
