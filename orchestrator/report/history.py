"""History views over every experiment: capacity over time per comparable group."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from orchestrator.analysis.censored_groups import run_kinds
from orchestrator.report import plots

if TYPE_CHECKING:
    from orchestrator.store import Store

# The key columns of store.history.capacity_by_config a trend is drawn per (never pooled).
TREND_KEYS = ("workload_sha256", "ttft_ms", "tpot_ms", "backend", "simulated")


TREND_COLUMNS = ("measured_at", "run_id", "experiment", "class", "capacity", "at_rate", "attainment",
                 "engine_version", "censored", "converged", "upper", "config_id", "label", "kind", "bound", "bound_high",
                 "median", "median_censored")
KINDS = ("point", "above", "below", "unconverged")


def capacity_trends(store: Store, by_config: pd.DataFrame, since_days: float | None = None) -> pd.DataFrame:
    """Run-by-run capacity of every comparable group in ``by_config`` (rows of
    report.capacity_history or store.capacity_by_config: configuration, class, workload, limits,
    backend, simulated), every valid run, oldest first (TREND_COLUMNS): the configuration's label
    (marked when simulated), each run's ``kind`` (analysis.censored: point, above, below,
    unconverged) and ``bound``, where its marker goes (a point's value, the lower end of a run
    censored above or unconverged, the upper end of one censored below; NaN: no finite end to
    draw), ``bound_high`` (an unconverged bracket's upper end, NaN: unbounded), and the group's
    ``median`` and ``median_censored`` (NaN and None from a frame without them)."""
    parts = []
    keys = [k for k in TREND_KEYS if k in by_config.columns]
    for group_key, g in by_config.groupby(["config_id", "class", *keys], sort=True):
        config_id, cls, *values = group_key
        filters = {k: v for k, v in zip(keys, values, strict=True)}
        found = {}
        if "workload_sha256" in filters:
            found["workload"] = filters["workload_sha256"] or None
        if "simulated" in filters:
            found["simulated"] = bool(filters["simulated"])
        for k in ("ttft_ms", "tpot_ms", "backend"):
            if filters.get(k):
                found[k] = filters[k]
        trend = store.config_trend(int(config_id), cls, since_days, every_run=True, **found)
        if not trend.empty:
            label = g["label"].iloc[0] + (" [simulated]" if found.get("simulated") else "")
            if "workload" in g.columns and isinstance(g["workload"].iloc[0], str) and by_config["workload_sha256"].nunique() > 1:
                label += f" | {g['workload'].iloc[0]}"  # several workloads drawn: say which line is which
            censored = g["median_censored"].iloc[0] if "median_censored" in g.columns else None
            parts.append(trend.assign(config_id=int(config_id), label=label, median=float(g["median"].iloc[0]),
                                      median_censored=censored if isinstance(censored, str) else None))
    if not parts:
        return pd.DataFrame(columns=list(TREND_COLUMNS))
    trends = pd.concat(parts, ignore_index=True)
    upper = pd.to_numeric(trends["upper"], errors="coerce").to_numpy(dtype=float)
    lower, upper_end, kind = run_kinds(trends["capacity"].to_numpy(dtype=float), trends["censored"].to_numpy(dtype=object),
                                       trends["converged"].to_numpy(dtype=bool), upper)
    bound = np.where(kind == 2, upper_end, lower)
    return trends.assign(
        kind=np.array(KINDS, dtype=object)[kind], bound=np.where(np.isfinite(bound), bound, np.nan),
        bound_high=np.where((kind == 3) & np.isfinite(upper_end), upper_end, np.nan),
    )[list(TREND_COLUMNS)]


@dataclass(frozen=True)
class HistoryPlot:
    """A capacity-over-time plot written: its path and the runs drawn by kind (KINDS)."""

    path: Path
    runs: dict[str, int]

    def describe(self) -> str:
        """``9 runs drawn: 3 points, 3 censored above, ...``"""
        names = {"point": "point", "above": "censored above", "below": "censored below", "unconverged": "unconverged"}
        parts = [f"{n} {names[k]}" + ("s" if k == "point" and n != 1 else "") for k, n in self.runs.items() if n]
        return f"{sum(self.runs.values())} run(s) drawn: " + ", ".join(parts)


def plot_capacity_history(store: Store, by_config: pd.DataFrame, path: str | Path,
                          since_days: float | None = None) -> HistoryPlot | None:
    """Draw capacity over time per comparable group into ``path`` (PNG): every valid run, a
    censored one as the bound it is, and each group's median (report.plots.capacity_history);
    None when no valid run matches."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    trends = capacity_trends(store, by_config, since_days)
    written = plots.capacity_history(trends, out)
    if written is None:
        return None
    drawn = trends[trends["bound"].notna()]
    return HistoryPlot(written, {k: int((drawn["kind"] == k).sum()) for k in KINDS})


# -- sizing: what history says it takes to serve a rate (`orch capacity plan`) ----------------

# USD per GPU-hour, on demand. Source: the "specialty cloud" tier of mercatus-ai.com's cloud GPU
# pricing guide (May 2026; H100 SXM5 $2.50-3.50, H200 SXM5 $3.50-4.50): the midpoints. H100 PCIe
# is not listed there: $2.50, the low end of the H100 range, is an assumption. Prices move and
# differ by provider and commitment: override them in a prices file.
DEFAULT_GPU_PRICES: dict[str, float] = {"H100-PCIe": 2.50, "H100-SXM": 3.00, "H200": 4.00}
PRICE_SOURCE = ("on-demand midpoints of the specialty-cloud tier, mercatus-ai.com/blog/cloud-gpu-pricing "
                "(May 2026); H100-PCIe assumed at the low end of the H100 range")
# Evidence is thin below this many runs, past this age, or with a spread this wide.
THIN_MIN_RUNS = 3
THIN_MAX_AGE_DAYS = 90.0
THIN_SPREAD = 0.25
SIZING_COLUMNS = (
    "rank", "config_id", "label", "gpu", "layout", "simulated", "engine_version", "runs", "median", "p25",
    "p75", "spread", "copies", "copies_low", "copies_high", "shape", "gpus", "gpu_hours_day",
    "price_gpu_hour", "cost_day", "cost_day_low", "cost_day_high", "usd_per_m_output_tokens",
    "last_measured", "thin",
)
# What the runs were and the median's censoring (report.capacity_history's), carried into the
# sizing rows when the groups have them.
SIZING_CENSORED = ("n_points", "n_censored_above", "n_censored_below", "n_unconverged", "censored_above_from",
                   "censored_below_to", "median_censored", "median_low", "median_high", "median_level")


def _shape(cfg: dict, copies: int) -> str:
    if cfg.get("layout") == "disaggregated" and cfg.get("prefill_replicas") and cfg.get("decode_replicas"):
        return (f"{copies * cfg['prefill_replicas']}P(TP{cfg['prefill_tp']})"
                f"+{copies * cfg['decode_replicas']}D(TP{cfg['decode_tp']})")
    if cfg.get("replicas"):
        return f"{copies * cfg['replicas']} replicas x TP{cfg.get('tp', 1)}"
    return f"{copies} x ({cfg.get('gpus', '?')} GPUs)"


def size_configurations(
    by_config: pd.DataFrame, shapes: dict[int, dict], *, rate: float, output_tokens: float,
    prices: dict[str, float], headroom: float = 0.0, engine_version: str | None = None,
    now: pd.Timestamp | None = None,
) -> pd.DataFrame:
    """Rank the comparable groups of ``by_config`` (one workload, one class, its limits) by what
    serving ``rate`` requests/s of ``output_tokens`` replies costs.

    A group's measured deployment is copied ``copies = ceil(rate x output_tokens x (1 +
    headroom) / median capacity)`` times (capacity: goodput tok/s at >= 90% attainment; copies
    scale linearly behind a router, an assumption); the quartiles give the range (p75: fewest
    copies, p25: most), widened to the median where it lies outside them (runs censored above
    raise a median over its points). GPUs = copies x the configuration's GPUs; GPU-hours per day = GPUs x 24;
    cost per day at the GPU's price; USD per million output tokens = cost per hour / (output
    tokens served per hour / 1e6). Ranked by cost per day (unpriced GPUs last, by GPUs), then
    GPUs, then configuration id. ``thin`` lists why the evidence is weak: few runs, old runs,
    another engine version than ``engine_version`` (default: the newest measured among the
    groups), a wide spread, a simulator prediction, a censored median (report.capacity_history's
    groups: the median counts every valid run, and its counts are carried into each row)."""
    if by_config.empty:
        return pd.DataFrame(columns=list(SIZING_COLUMNS))
    now = now if now is not None else pd.Timestamp.now(tz="UTC")
    need = rate * output_tokens * (1.0 + headroom)
    served_per_hour_m = rate * output_tokens * 3600 / 1e6
    if engine_version is None:
        measured = by_config[~by_config["simulated"].astype(bool)]
        pool = measured if not measured.empty else by_config
        engine_version = str(pool.sort_values("last_measured").iloc[-1]["engine_version"])
    rows = []
    for r in by_config.to_dict(orient="records"):
        cfg = shapes.get(int(r["config_id"]), {})
        per_copy_gpus = int(cfg.get("gpus") or r.get("gpus") or 1)

        def copies_at(capacity: float) -> int:
            return max(1, math.ceil(need / capacity - 1e-9)) if capacity > 0 else 0

        copies = copies_at(r["median"])
        # the points' quartiles give the range, widened to the median where runs censored above
        # (or below) put it outside them; a group of censored runs only has none: the median
        p25 = r["median"] if pd.isna(r["p25"]) else min(r["p25"], r["median"])
        p75 = r["median"] if pd.isna(r["p75"]) else max(r["p75"], r["median"])
        low, high = copies_at(p75), copies_at(p25)
        if copies == 0:
            continue  # a zero capacity serves nothing at any size
        gpus = copies * per_copy_gpus
        price = prices.get(str(r["gpu"]))
        cost = None if price is None else gpus * 24 * price
        thin = []
        if r["runs"] < THIN_MIN_RUNS:
            thin.append(f"few runs ({int(r['runs'])} < {THIN_MIN_RUNS})")
        last = pd.Timestamp(r["last_measured"]) if r.get("last_measured") is not None else None
        if last is not None and not pd.isna(last):
            age = (now - (last if last.tzinfo else last.tz_localize("UTC"))).total_seconds() / 86400
            if age > THIN_MAX_AGE_DAYS:
                thin.append(f"old (last run {age:.0f} days ago)")
        if str(r["engine_version"]) != engine_version:
            thin.append(f"other engine version ({r['engine_version']}, not {engine_version})")
        spread = r.get("spread")
        if spread is not None and not pd.isna(spread) and spread > THIN_SPREAD:
            thin.append(f"wide spread ({spread:.0%})")
        if bool(r.get("simulated")):
            thin.append("simulator prediction, not a measurement")
        censored = r.get("median_censored")
        if censored == "above":
            thin.append(f"median censored: >= {r['median']:,.0f} tok/s per copy (copies an upper bound)")
        elif censored == "below":
            thin.append(f"median censored: <= {r['median']:,.0f} tok/s per copy (copies a lower bound)")
        rows.append({
            "config_id": int(r["config_id"]), "label": r["label"], "gpu": r["gpu"], "layout": r["layout"],
            "simulated": bool(r.get("simulated")), "engine_version": r["engine_version"], "runs": int(r["runs"]),
            "median": float(r["median"]), "p25": float(p25), "p75": float(p75),
            "spread": None if spread is None or pd.isna(spread) else float(spread),
            "copies": copies, "copies_low": low, "copies_high": high, "shape": _shape(cfg, copies),
            "gpus": gpus, "gpu_hours_day": gpus * 24.0, "price_gpu_hour": price, "cost_day": cost,
            "cost_day_low": None if price is None else low * per_copy_gpus * 24 * price,
            "cost_day_high": None if price is None else high * per_copy_gpus * 24 * price,
            "usd_per_m_output_tokens": None if cost is None else (cost / 24) / served_per_hour_m,
            "last_measured": last, "thin": thin, **{k: r[k] for k in SIZING_CENSORED if k in r},
        })
    if not rows:
        return pd.DataFrame(columns=list(SIZING_COLUMNS))
    frame = pd.DataFrame(rows)
    frame["_unpriced"] = frame["cost_day"].isna()
    frame = frame.sort_values(["_unpriced", "cost_day", "gpus", "config_id"], na_position="last", kind="stable")
    frame = frame.drop(columns="_unpriced").reset_index(drop=True)
    frame.insert(0, "rank", range(1, len(frame) + 1))
    return frame[[*SIZING_COLUMNS, *(k for k in SIZING_CENSORED if k in frame.columns)]]


def settle_plan(
    name: str, model: dict | str, arms: list[dict], workload: dict, service_class: dict, rate_at_capacity: float,
    backend: str = "kubernetes", blocks: int = 4,
) -> dict:
    """The plan (as data, to validate and write) of the experiment that would settle a sizing
    question: the best candidate (A) against the runner-up (B; A again when there is only one:
    an A/A run that measures its spread), on the asked workload and class, searching around the
    rate history puts their capacity at, with a capacity bar B/A >= 1.0."""
    a = arms[0]
    b = arms[1] if len(arms) > 1 else arms[0]
    top = min(100_000.0, max(0.2, rate_at_capacity * 2))
    return {
        "name": name,
        "hypothesis": f"settles `orch capacity plan`: does B's {service_class['name']} capacity reach A's "
                      "on this workload (fresh runs for thin history)?",
        "model": model, "arms": {"A": a, "B": b}, "workload": workload, "classes": [service_class],
        "search": {"rate": {"min": round(top / 8, 4), "max": round(top, 4)}, "precision": 0.05},
        "design": {"blocks": blocks, "order": "ABBA", "seed": 1},
        "bars": [{"id": f"{service_class['name']}-capacity", "metric": "capacity", "class": service_class["name"],
                  "compare": "B/A", "at_least": 1.0, "confidence": 0.95}],
        "backend": backend,
    }


# -- Pareto front: throughput per GPU against per-user speed (`orch capacity --pareto`) ---------

PARETO_COLUMNS = ("model", "workload", "workload_sha256", "simulated", "label", "gpu", "gpus", "offered_rate",
                  "per_user_tok_s", "tok_s_per_gpu", "tpot_p50_ms", "run_id")


def pareto_axes(points: pd.DataFrame) -> pd.DataFrame:
    """``points`` (store.load_points rows) with the front's two axes and the median TPOT in ms:
    per-user speed = 1 / median TPOT (tok/s), throughput per GPU = output tok/s / GPUs."""
    return points.assign(per_user_tok_s=1.0 / points["tpot_p50_s"],
                         tok_s_per_gpu=points["throughput_tok_s"] / points["gpus"],
                         tpot_p50_ms=points["tpot_p50_s"] * 1000)


def pareto_front(points: pd.DataFrame) -> pd.DataFrame:
    """Per model, workload and source (simulated or measured, never mixed), the stored load
    points no other point beats on both throughput per GPU (output tok/s / GPUs) and per-user
    speed (1 / median TPOT): the trade-off `vllm bench sweep` plots. Fastest per user first."""
    if points.empty:
        return pd.DataFrame(columns=list(PARETO_COLUMNS))
    keys = ["model", "workload_sha256", "simulated"]
    # Fastest per user first; within a speed, the higher throughput first: a point is on the
    # front when it beats every faster one's throughput (a running maximum per group).
    p = pareto_axes(points).sort_values([*keys, "per_user_tok_s", "tok_s_per_gpu"],
                                         ascending=[True, True, True, False, False])
    running_best = p.groupby(keys, sort=False)["tok_s_per_gpu"].cummax()
    best_before = running_best.groupby([p[k] for k in keys], sort=False).shift(fill_value=-math.inf)
    keep = p.index[p["tok_s_per_gpu"] > best_before]
    front = p.loc[keep]
    return front[list(PARETO_COLUMNS)].reset_index(drop=True)


def points_runs(points: pd.DataFrame, censored: set[int]) -> dict[str, int]:
    """How many valid runs a front's points come from, and how many of those runs have a censored
    or unconverged capacity (``censored``: their ids): their points count like any other's."""
    runs = {int(r) for r in points["run_id"]} if not points.empty else set()
    return {"runs": len(runs), "censored_runs": len(runs & censored)}


def points_runs_text(counts: dict[str, int]) -> str:
    """``points of 7 valid runs = 5 with a point capacity + 2 censored (counted like the rest)``."""
    n, k = counts["runs"], counts["censored_runs"]
    if not k:
        return f"points of {n} valid run(s), every capacity a point"
    return f"points of {n} valid run(s) = {n - k} with a point capacity + {k} censored or unconverged (counted too)"
def pareto_front_per_class(points: pd.DataFrame, attainment: pd.DataFrame) -> pd.DataFrame:
    """The Pareto front of each class over the points that met its SLO (``attainment``:
    store.point_attainment rows; a point meets a class's SLO when its attainment there is at
    least its plan's required one): PARETO_COLUMNS and ``class_name``, by class."""
    met = attainment[attainment["attainment"] >= attainment["required"]]
    fronts = [pareto_front(points[points["point_id"].isin(ids)]).assign(class_name=cls)
              for cls, ids in met.groupby("class_name", sort=True)["point_id"]]
    fronts = [f for f in fronts if not f.empty]
    if not fronts:
        return pd.DataFrame(columns=[*PARETO_COLUMNS, "class_name"])
    return pd.concat(fronts, ignore_index=True)
