"""The Store's history questions (a mixin of ``Store``): capacity by comparable group, per GPU,
the best configurations, trends, configuration details and workload signatures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd
import sqlalchemy as sa

from orchestrator.store import history, history_censored, point_slo, summaries


class HistoryQueries:
    """History over every experiment stored; needs ``self.engine``."""

    engine: sa.Engine

    def rebuild_capacity_summaries(self) -> int:
        """Recompute the derived capacity summaries from the runs; returns the groups written.
        Needed only after runs or capacities were edited outside the Store."""
        return summaries.rebuild(self.engine)

    def capacity_by_config(self, **filters: Any) -> pd.DataFrame:
        """See history.capacity_by_config."""
        return history.capacity_by_config(self.engine, **filters)

    def capacity_per_gpu(self, **filters: Any) -> pd.DataFrame:
        """See history.capacity_per_gpu."""
        return history.capacity_per_gpu(self.engine, **filters)

    def best_config(self, service_class: str, **filters: Any) -> pd.DataFrame:
        """See history.best_config."""
        return history.best_config(self.engine, service_class, **filters)

    def config_trend(self, config_id: int, service_class: str | None = None, since_days: float | None = None,
                     every_run: bool = False, **keys: Any) -> pd.DataFrame:
        """See history.config_trend."""
        return history.config_trend(self.engine, config_id, service_class, since_days, every_run, **keys)

    def config_details(self, config_ids: list[int]) -> dict[int, dict[str, Any]]:
        """See history.config_details."""
        return history.config_details(self.engine, config_ids)

    def workload_signatures(self, prefix: str | None = None) -> list[dict[str, Any]]:
        """See history.workload_signatures."""
        return history.workload_signatures(self.engine, prefix)

    def load_points(self, **filters: Any) -> pd.DataFrame:
        """See history.load_points."""
        return history.load_points(self.engine, **filters)

    def capacity_runs(self, **filters: Any) -> tuple[pd.DataFrame, pd.DataFrame]:
        """See history_censored.capacity_runs."""
        return history_censored.capacity_runs(self.engine, **filters)

    def summarised_history(self, **filters: Any) -> pd.DataFrame | None:
        """See history_censored.from_summaries."""
        return history_censored.from_summaries(self.engine, **filters)

    def censored_runs(self, run_ids: list[int]) -> set[int]:
        """See history_censored.censored_runs."""
        return history_censored.censored_runs(self.engine, run_ids)

    def point_attainment(self, point_ids: Sequence[int]) -> pd.DataFrame:
        """See point_slo.point_attainment."""
        return point_slo.point_attainment(self.engine, point_ids)
