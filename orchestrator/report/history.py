"""History views over every experiment: capacity over time per configuration."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from orchestrator.report import plots


def capacity_trends(store, by_config: pd.DataFrame, since_days: float | None = None) -> pd.DataFrame:
    """Run-by-run capacity of every (configuration, class) in ``by_config`` (rows of
    store.capacity_by_config), oldest first, with the configuration's label beside it."""
    parts = []
    for (config_id, cls), g in by_config.groupby(["config_id", "class"], sort=True):
        trend = store.config_trend(int(config_id), cls, since_days)
        if not trend.empty:
            parts.append(trend.assign(config_id=int(config_id), label=g["label"].iloc[0]))
    if not parts:
        return pd.DataFrame(columns=["measured_at", "run_id", "experiment", "class", "capacity",
                                     "at_rate", "attainment", "engine_version", "config_id", "label"])
    return pd.concat(parts, ignore_index=True)


def plot_capacity_history(store, by_config: pd.DataFrame, path: str | Path,
                          since_days: float | None = None) -> Path | None:
    """Draw capacity over time per configuration and class into ``path`` (PNG); None when no
    valid run matches."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    return plots.capacity_history(capacity_trends(store, by_config, since_days), out)
