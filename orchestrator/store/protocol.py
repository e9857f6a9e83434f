"""What the control layer (and the commands over it) asks of a store: ``StoreLike``.

The :class:`~orchestrator.store.repository.Store` satisfies it structurally, and so does the
:class:`~orchestrator.store.retry.ResilientStore` wrapped around one (its ``__getattr__``
forwards every call). The signatures are the Store's own; keep them in step with it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from orchestrator.store.rows import (
    ExperimentInfo,
    GuardRecord,
    PointOwner,
    Registration,
    RunInfo,
    VerdictInfo,
)

if TYPE_CHECKING:
    import pandas as pd

    from orchestrator.plan import Plan
    from orchestrator.records import RequestRecord


class StoreLike(Protocol):
    """The Store methods the executor, point runner, spool, verdicts and `orch` commands call."""

    # -- plans and experiments ------------------------------------------------------------------
    def register_plan(self, plan: Plan) -> Registration: ...

    def get_registration(self, key: int | str) -> Registration: ...

    def create_experiment(
        self, registration_id: int, name: str | None = None, controller_id: str | None = None
    ) -> int: ...

    def set_experiment_status(
        self, experiment_id: int, status: str, controller_id: str | None = None
    ) -> None: ...

    def get_experiment(self, key: int | str) -> ExperimentInfo: ...

    def list_experiments(self) -> list[ExperimentInfo]: ...

    # -- configurations and runs ----------------------------------------------------------------
    def deployment_config(self, plan: Plan, arm: str) -> int: ...

    def start_run(
        self, experiment_id: int, arm: str, block: int, position: int, attempt: int, config_id: int
    ) -> int: ...

    def finish_run(
        self,
        run_id: int,
        status: str,
        valid: bool,
        invalid_reason: str | None = None,
        fingerprint: Mapping[str, Any] | None = None,
    ) -> None: ...

    def runs(self, experiment_id: int) -> list[RunInfo]: ...

    # -- measurements ---------------------------------------------------------------------------
    def record_point(
        self,
        run_id: int,
        *,
        seq: int,
        window_start_s: float,
        window_end_s: float,
        offered_rate: float | None = None,
        users: int | None = None,
        achieved_rate: float | None = None,
        throughput_tok_s: float | None = None,
        n_scheduled: int | None = None,
        per_class: Mapping[str, Any] | None = None,
        percentiles: Mapping[str, Any] | None = None,
        valid: bool = True,
        search_class: str | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> int: ...

    def finish_point(
        self,
        point_id: int,
        *,
        achieved_rate: float | None,
        throughput_tok_s: float | None,
        per_class: Mapping[str, Any],
        percentiles: Mapping[str, Any],
        valid: bool,
        context: Mapping[str, Any] | None = None,
    ) -> None: ...

    def points(self, run_id: int) -> pd.DataFrame: ...

    def identity(self) -> str: ...

    def chain_head(self) -> str | None: ...

    def point_owner(self, point_id: int) -> PointOwner: ...

    def ingest_requests(self, point_id: int, records: Iterable[RequestRecord]) -> int: ...

    def record_guards(self, run_id: int, point_id: int | None, results: Sequence[Any]) -> None: ...

    def guard_results(self, run_id: int) -> list[GuardRecord]: ...

    def record_capacity(
        self, run_id: int, class_name: str, capacity: float, at_rate: float | None,
        attainment: float | None, points_used: int, *, censored: str | None = None,
        converged: bool = True, upper: float | None = None,
    ) -> None: ...

    def capacities(self, experiment_id: int) -> pd.DataFrame: ...

    def record_verdict(
        self, experiment_id: int, registration_id: int, bar_id: str, verdict: str,
        estimate: float | None, lower: float | None, upper: float | None, blocks: int,
        *, label: str | None = None, note: str | None = None,
        evidence: Mapping[str, Any] | None = None,
    ) -> None: ...

    def verdicts(self, experiment_id: int, *, history: bool = False) -> list[VerdictInfo]: ...

    def record_metric_samples(
        self, run_id: int, point_id: int | None,
        samples: Iterable[tuple[float, str, Mapping[str, str], float]],
    ) -> int: ...
