"""The Store: one facade over the database for everything an experiment records and reads.

Every write is its own short transaction, so a controller that dies loses at most the call it
was in, and a resumed one finds everything before it (DESIGN section 6).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from orchestrator.errors import EnvironmentProblem, UserError
from orchestrator.outcomes import CENSORING, VERDICTS
from orchestrator.plan import Plan, canonical_json, plan_from_canonical, plan_hash
from orchestrator.records import RequestRecord
from orchestrator.secrets import scrub, scrub_value
from orchestrator.store import chain, database, summaries
from orchestrator.store.appendonly import maintenance, run_digest
from orchestrator.store.history_api import HistoryQueries
from orchestrator.store.ingest import Fence, fetch_requests, ingest_requests
from orchestrator.store.integrity import (
    NotFound,
    StoreConflict,
    refused,
    same_plan,
)
from orchestrator.store.integrity_api import IntegrityQueries
from orchestrator.store.keys import RegistrationKeys, registration_keys
from orchestrator.store.models import (
    BarVerdict,
    Capacity,
    DeploymentConfig,
    Experiment,
    GuardResultRow,
    LoadPoint,
    MetricSample,
    PlanRegistration,
    Run,
)
from orchestrator.store.rows import (
    EXPERIMENT_STATUSES,
    RUN_STATUSES,
    TERMINAL_STATUSES,
    ExperimentInfo,
    GuardRecord,
    Registration,
    RunInfo,
    VerdictInfo,
    config_columns,
)
from orchestrator.store.types import utcnow


def _plain(obj: Any) -> Any:
    """Dataclasses and pydantic models (analysis results) as plain JSON-able data."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if hasattr(obj, "model_dump"):
        return obj.model_dump(mode="python")
    if isinstance(obj, Mapping):
        return {str(k): _plain(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_plain(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return obj.item()
    return obj


def _registration(row: PlanRegistration, created: bool = False) -> Registration:
    return Registration(row.id, row.sha256, row.name, row.registered_at, row.canonical_json, created)


def _experiment(row: Experiment) -> ExperimentInfo:
    return ExperimentInfo(
        row.id, row.name, row.registration_id, row.status, row.controller_id,
        row.created_at, row.started_at, row.finished_at,
    )


def _run(row: Run) -> RunInfo:
    return RunInfo(
        row.id, row.experiment_id, row.config_id, row.arm, row.block, row.position, row.attempt,
        row.status, row.valid, row.invalid_reason, row.fingerprint, row.started_at, row.finished_at,
    )


class Store(HistoryQueries, IntegrityQueries):
    """Plans, experiments, runs, points, requests, guards, capacities, verdicts; history."""

    # Checked inside every request batch's transaction when set (the lease's fencing, store/lease.py).
    fence: Fence | None = None

    def __init__(self, engine: sa.Engine):
        self.engine = engine
        self._sessions = sessionmaker(engine, expire_on_commit=False)
        self._reg_keys: dict[int, RegistrationKeys] = {}  # registrations never change
        self._identity: str | None = None  # the database's identity never changes either

    def _keys_of(self, s: Session, run: Run) -> RegistrationKeys:
        """The comparable-history keys of a run's registration (store.keys), cached."""
        reg_id = s.scalar(sa.select(Experiment.registration_id).where(Experiment.id == run.experiment_id))
        assert reg_id is not None  # a run's experiment exists (foreign key)
        if reg_id not in self._reg_keys:
            text = s.scalar(sa.select(PlanRegistration.canonical_json).where(PlanRegistration.id == reg_id))
            self._reg_keys[reg_id] = registration_keys(text or "{}")
        return self._reg_keys[reg_id]

    # -- opening ----------------------------------------------------------------------------

    @classmethod
    def open(cls, url: str | None = None, migrate: bool = True) -> Store:
        """Connect (default: ORCH_DATABASE_URL, else the SQLite file in the user data dir) and
        bring the schema to the latest revision. Unreachable -> EnvironmentProblem (exit 2)."""
        engine = database.create_engine(url or database.default_url())
        database.check_reachable(engine)
        if migrate:
            head = database.head_revision()
            current = database.current_revision(engine)
            if current != head:
                try:
                    database.upgrade(engine)
                except Exception as e:  # an unknown revision: the database is newer than us
                    raise EnvironmentProblem(
                        f"cannot migrate the database from revision {current} to {head}: {e}; "
                        "is this orchestrator older than the database? upgrade it"
                    ) from None
        return cls(engine)

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plans ------------------------------------------------------------------------------

    def register_plan(self, plan: Plan) -> Registration:
        """Store the plan's canonical JSON and hash; the same plan again returns the same row.

        "The same plan" includes one registered by an earlier version of the plan language: its
        canonical JSON lacks fields added since (with defaults), so its hash differs, but read
        by today's language it is this plan; its registration (and its verdicts) stand."""
        sha = plan_hash(plan)
        with self._sessions.begin() as s:
            row = s.scalar(sa.select(PlanRegistration).where(PlanRegistration.sha256 == sha))
            if row is not None:
                return _registration(row)
            older = s.scalars(
                sa.select(PlanRegistration).where(PlanRegistration.name == plan.name)
                .order_by(PlanRegistration.id)
            ).all()
            for row in older:
                if same_plan(row.canonical_json, plan):
                    return _registration(row)
        try:
            with self._sessions.begin() as s:
                row = PlanRegistration(sha256=sha, name=plan.name, canonical_json=canonical_json(plan))
                s.add(row)
                s.flush()
                return _registration(row, created=True)
        except IntegrityError:  # registered concurrently by someone else: theirs is ours
            return self.get_registration(sha)

    def get_registration(self, key: int | str) -> Registration:
        """By id, full sha256, or an unambiguous sha256 prefix (at least 8 characters)."""
        with self._sessions() as s:
            if isinstance(key, int) or (isinstance(key, str) and key.isdigit() and len(key) < 16):
                row = s.get(PlanRegistration, int(key))
            elif len(key) == 64:
                row = s.scalar(sa.select(PlanRegistration).where(PlanRegistration.sha256 == key))
            elif len(key) >= 8:
                rows = s.scalars(
                    sa.select(PlanRegistration).where(PlanRegistration.sha256.startswith(key)).limit(2)
                ).all()
                if len(rows) > 1:
                    raise UserError(f"sha256 prefix {key!r} matches several plans; give more of it")
                row = rows[0] if rows else None
            else:
                raise UserError(f"{key!r}: give a registration id or at least 8 characters of a sha256")
            if row is None:
                raise NotFound(f"no registered plan {key!r}")
            return _registration(row)

    def plan_of(self, registration: Registration | int | str) -> Plan:
        """The registered plan, rebuilt from its canonical JSON."""
        reg = registration if isinstance(registration, Registration) else self.get_registration(registration)
        return plan_from_canonical(reg.canonical_json)

    # -- experiments ------------------------------------------------------------------------

    def create_experiment(
        self, registration_id: int, name: str | None = None, controller_id: str | None = None
    ) -> int:
        """A new experiment of a registration; without a name: `<plan name>-<n>`."""
        with self._sessions.begin() as s:
            reg = s.get(PlanRegistration, registration_id)
            if reg is None:
                raise NotFound(f"no registered plan with id {registration_id}")
            if name is None:
                taken = s.scalars(
                    sa.select(Experiment.name).where(Experiment.name.startswith(f"{reg.name}-"))
                ).all()
                n = 1 + max((int(t.rsplit("-", 1)[1]) for t in taken if t.rsplit("-", 1)[1].isdigit()), default=0)
                name = f"{reg.name}-{n}"
            elif s.scalar(sa.select(Experiment.id).where(Experiment.name == name)) is not None:
                raise UserError(f"experiment name {name!r} is taken; choose another")
            row = Experiment(name=name, registration_id=registration_id, controller_id=controller_id)
            s.add(row)
            s.flush()
            return row.id

    def set_experiment_status(self, experiment_id: int, status: str, controller_id: str | None = None) -> None:
        """queued | running | done | failed | cancelled; stamps started_at and finished_at."""
        if status not in EXPERIMENT_STATUSES:
            raise ValueError(f"experiment status {status!r} is not one of {EXPERIMENT_STATUSES}")
        with self._sessions.begin() as s:
            row = s.get(Experiment, experiment_id)
            if row is None:
                raise NotFound(f"no experiment with id {experiment_id}")
            row.status = status
            if controller_id is not None:
                row.controller_id = controller_id
            if status == "running" and row.started_at is None:
                row.started_at = utcnow()
            row.finished_at = utcnow() if status in TERMINAL_STATUSES else None

    def get_experiment(self, key: int | str) -> ExperimentInfo:
        """By id or by name."""
        with self._sessions() as s:
            row = s.scalar(sa.select(Experiment).where(Experiment.name == str(key)))
            # An id fits a 64-bit integer; a longer run of digits is a name that is not there.
            if row is None and (isinstance(key, int) or str(key).isdigit()) and 0 <= int(key) < 2**63:
                row = s.get(Experiment, int(key))
            if row is None:
                raise NotFound(f"no experiment {key!r} (`orch status` lists them)")
            return _experiment(row)

    def list_experiments(self) -> list[ExperimentInfo]:
        """Newest first."""
        with self._sessions() as s:
            return [_experiment(r) for r in s.scalars(sa.select(Experiment).order_by(Experiment.id.desc()))]

    def delete_experiment(self, experiment_id: int) -> None:
        """Remove an experiment and everything it measured (the registration stays).

        Measurements are append-only (migration 0006): this is the one delete the store makes,
        through the maintenance escape (appendonly.maintenance) for this transaction only. On
        PostgreSQL the escape works only for the tables' owner, so it needs the migration
        owner's DSN; the runtime role is refused."""
        with self._sessions.begin() as s, maintenance(s):
            touched = summaries.groups_of_runs(s, Run.experiment_id == experiment_id)
            s.execute(sa.delete(Experiment).where(Experiment.id == experiment_id))
            for config_id, classes in touched.items():
                summaries.refresh(s, config_id, classes)

    # -- configurations and runs ------------------------------------------------------------

    def deployment_config(self, plan: Plan, arm: str) -> int:
        """The id of the arm's configuration; one row per distinct configuration, ever."""
        cols = config_columns(plan, arm)
        query = sa.select(DeploymentConfig.id).where(DeploymentConfig.config_sha256 == cols["config_sha256"])
        with self._sessions.begin() as s:
            found = s.scalar(query)
            if found is not None:
                return found
        try:
            with self._sessions.begin() as s:
                row = DeploymentConfig(**cols)
                s.add(row)
                s.flush()
                return row.id
        except IntegrityError:
            with self._sessions() as s:
                found = s.scalar(query)
            assert found is not None  # the unique key we collided with: another writer's row
            return found

    def start_run(
        self, experiment_id: int, arm: str, block: int, position: int, attempt: int, config_id: int
    ) -> int:
        """A run begins (status running). The same (experiment, block, arm, attempt) twice is refused."""
        try:
            with self._sessions.begin() as s:
                row = Run(
                    experiment_id=experiment_id, arm=arm, block=block, position=position,
                    attempt=attempt, config_id=config_id, status="running",
                )
                s.add(row)
                s.flush()
                return row.id
        except IntegrityError as e:
            raise StoreConflict(
                f"run of arm {arm} in block {block}, attempt {attempt} of experiment {experiment_id} "
                f"already exists or refers to a missing experiment/config ({str(e.orig).splitlines()[0]})"
            ) from None

    def finish_run(
        self,
        run_id: int,
        status: str,
        valid: bool,
        invalid_reason: str | None = None,
        fingerprint: Mapping[str, Any] | None = None,
    ) -> None:
        """A run ended. The fingerprint's engine_version, image_digest, gpu_type, nodes and
        driver are also kept as columns; the whole mapping is kept as JSON."""
        if status not in RUN_STATUSES:
            raise ValueError(f"run status {status!r} is not one of {RUN_STATUSES}")
        fp = _plain(dict(fingerprint or {}))
        try:
            self._finish_run(run_id, status, valid, invalid_reason, fp)
        except IntegrityError as e:  # a finished run cannot change (append-only, 0006)
            raise refused(f"finishing run {run_id} as {status}", e) from None

    def _finish_run(self, run_id: int, status: str, valid: bool, invalid_reason: str | None,
                    fp: dict[str, Any]) -> None:
        with self._sessions.begin() as s:
            row = s.get(Run, run_id)
            if row is None:
                raise NotFound(f"no run with id {run_id}")
            reason = None if invalid_reason is None else scrub(invalid_reason)
            # over the records and the outcome written below (appendonly: digest version 2)
            row.digest = run_digest(s, run_id, (status, bool(valid), reason))
            row.status, row.valid = status, bool(valid)
            row.invalid_reason = reason
            row.fingerprint = fp
            for key in ("engine_version", "image_digest", "gpu_type", "driver"):
                if fp.get(key) is not None:
                    setattr(row, key, str(fp[key]))
            if fp.get("nodes") is not None:
                row.nodes = fp["nodes"]
            row.finished_at = utcnow()
            s.flush()
            summaries.mark_capacities(s, row, self._keys_of(s, row))
            classes = s.scalars(sa.select(Capacity.class_name).where(Capacity.run_id == run_id)).all()
            summaries.refresh(s, row.config_id, classes)
            chain.append(s, "run", run_id, row.experiment_id, row.digest)  # sealed with it (store/chain.py)

    def runs(self, experiment_id: int) -> list[RunInfo]:
        """Every run of the experiment (all attempts), in execution order."""
        with self._sessions() as s:
            rows = s.scalars(
                sa.select(Run).where(Run.experiment_id == experiment_id)
                .order_by(Run.block, Run.position, Run.attempt)
            )
            return [_run(r) for r in rows]

    # -- measurements -----------------------------------------------------------------------

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
    ) -> int:
        """One load point's figures (per_class: class -> goodput, attainment, ...; percentiles:
        latency percentiles; context: what it was measured under). Returns its id."""
        with self._sessions.begin() as s:
            row = LoadPoint(
                run_id=run_id, seq=seq, search_class=search_class, offered_rate=offered_rate,
                users=users, window_start_s=window_start_s, window_end_s=window_end_s,
                achieved_rate=achieved_rate, throughput_tok_s=throughput_tok_s,
                n_scheduled=n_scheduled, per_class=_plain(dict(per_class or {})),
                percentiles=_plain(dict(percentiles or {})), valid=bool(valid),
                context=None if context is None else _plain(dict(context)),
            )
            s.add(row)
            s.flush()
            return row.id

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
    ) -> None:
        """Complete a point opened by ``record_point`` before its records streamed in."""
        try:
            with self._sessions.begin() as s:
                row = s.get(LoadPoint, point_id)
                if row is None:
                    raise NotFound(f"no load point with id {point_id}")
                row.achieved_rate, row.throughput_tok_s = achieved_rate, throughput_tok_s
                row.per_class, row.percentiles = _plain(dict(per_class)), _plain(dict(percentiles))
                if context is not None:
                    row.context = _plain(dict(context))
                row.valid = bool(valid)
        except IntegrityError as e:  # a point of a finished run cannot change (0006)
            raise refused(f"completing load point {point_id}", e) from None

    def points(self, run_id: int) -> pd.DataFrame:
        """A run's load points in the order they were measured."""
        stmt = sa.select(LoadPoint.__table__).where(LoadPoint.run_id == run_id).order_by(LoadPoint.seq, LoadPoint.id)
        with self._sessions() as s:
            rows = [dict(r._mapping) for r in s.execute(stmt)]
        return pd.DataFrame(rows, columns=[c.name for c in LoadPoint.__table__.columns])

    def ingest_requests(self, point_id: int, records: Iterable[RequestRecord]) -> int:
        """Append a batch of a point's request records (COPY on PostgreSQL). Returns the count."""
        clean = (dataclasses.replace(r, error=scrub(r.error)) if r.error else r for r in records)
        return ingest_requests(self.engine, point_id, clean, self.fence)

    def requests(self, point_id: int) -> list[RequestRecord]:
        """A point's request records, as they were ingested."""
        return fetch_requests(self.engine, point_id)

    def record_guards(self, run_id: int, point_id: int | None, results: Sequence[Any]) -> None:
        """Guard results: tuples (name, passed, value, threshold, detail) or objects with those fields."""
        rows = []
        for r in results:
            name, passed, value, threshold, detail = (
                r if isinstance(r, tuple) else (r.name, r.passed, r.value, r.threshold, r.detail)
            )
            rows.append(GuardResultRow(
                run_id=run_id, point_id=point_id, name=name, passed=bool(passed),
                value=None if value is None else float(value),
                threshold=None if threshold is None else float(threshold), detail=scrub(detail or ""),
            ))
        with self._sessions.begin() as s:
            s.add_all(rows)

    def guard_results(self, run_id: int) -> list[GuardRecord]:
        with self._sessions() as s:
            rows = s.scalars(sa.select(GuardResultRow).where(GuardResultRow.run_id == run_id).order_by(GuardResultRow.id))
            return [GuardRecord(r.name, r.passed, r.value, r.threshold, r.detail, r.point_id) for r in rows]

    def record_capacity(
        self, run_id: int, class_name: str, capacity: float, at_rate: float | None,
        attainment: float | None, points_used: int, *, censored: str | None = None,
        converged: bool = True, upper: float | None = None,
    ) -> None:
        """A run's capacity at a class with its censoring (None, below_min, above_max or
        at_ceiling), whether the search converged, and the upper bound on the true capacity
        (None or inf: unbounded); recording it again replaces it (a resumed search) while the
        run is running; once the run finished its capacities cannot change (0006)."""
        if censored is not None and censored not in CENSORING:
            raise ValueError(f"censored must be None or one of {', '.join(CENSORING)} (got {censored!r})")
        top = None if upper is None or not math.isfinite(float(upper)) else float(upper)
        values = dict(capacity=float(capacity), at_rate=at_rate, attainment=attainment, points_used=int(points_used),
                      censored=censored, converged=bool(converged), upper=top)
        try:
            with self._sessions.begin() as s:
                run = s.get(Run, run_id)
                if run is None:
                    raise NotFound(f"no run with id {run_id}")
                row = s.scalar(sa.select(Capacity).where(Capacity.run_id == run_id, Capacity.class_name == class_name))
                if row is None:
                    s.add(Capacity(run_id=run_id, class_name=class_name, **values))
                else:
                    for k, v in values.items():
                        setattr(row, k, v)
                s.flush()
                summaries.mark_capacities(s, run, self._keys_of(s, run))
                summaries.refresh(s, run.config_id, [class_name])
        except IntegrityError as e:  # a capacity of a finished run cannot change (0006)
            raise refused(f"recording the {class_name} capacity of run {run_id}", e) from None

    def capacities(self, experiment_id: int) -> pd.DataFrame:
        """Per run and class: arm, block, attempt, validity, capacity and its censoring
        (censored, converged, upper: NULL/None is unbounded) - the input to a bar's statistics."""
        stmt = (
            sa.select(
                Run.id.label("run_id"), Run.arm, Run.block, Run.position, Run.attempt, Run.status,
                Run.valid, Capacity.class_name, Capacity.capacity, Capacity.at_rate,
                Capacity.attainment, Capacity.points_used, Capacity.censored, Capacity.converged,
                Capacity.upper,
            )
            .join(Capacity, Capacity.run_id == Run.id)
            .where(Run.experiment_id == experiment_id)
            .order_by(Run.block, Run.position, Run.attempt, Capacity.class_name)
        )
        with self.engine.connect() as conn:
            return pd.read_sql(stmt, conn)

    def record_verdict(
        self, experiment_id: int, registration_id: int, bar_id: str, verdict: str,
        estimate: float | None, lower: float | None, upper: float | None, blocks: int,
        *, label: str | None = None, note: str | None = None, evidence: Mapping[str, Any] | None = None,
    ) -> None:
        """A bar's verdict, judged against the experiment's registration (the only one allowed),
        with what it rests on: ``label`` (exactly what lower..upper is), ``note`` and
        ``evidence`` (blocks used, censored and dropped blocks and why). Append-only: judging a
        bar again adds a row; ``verdicts`` reads the latest."""
        if verdict not in VERDICTS:
            raise ValueError(f"verdict {verdict!r} is not one of {VERDICTS}")
        values = dict(
            registration_id=registration_id, verdict=verdict, estimate=estimate, lower=lower,
            upper=upper, blocks=int(blocks), judged_at=utcnow(), label=label or None,
            note=scrub(note) if note else None,
            evidence=None if evidence is None else scrub_value(_plain(dict(evidence))),
        )
        with self._sessions.begin() as s:
            exp = s.get(Experiment, experiment_id)
            if exp is None:
                raise NotFound(f"no experiment with id {experiment_id}")
            if exp.registration_id != registration_id:
                raise StoreConflict(
                    f"experiment {experiment_id} runs registration {exp.registration_id}; a verdict "
                    f"judged against registration {registration_id} is refused"
                )
            row = BarVerdict(experiment_id=experiment_id, bar_id=bar_id, **values)
            s.add(row)
            s.flush()
            s.expire(row)  # sealed as the database keeps it (read back), not as it was given
            chain.append(s, "verdict", row.id, experiment_id, chain.verdict_payload(row))

    def verdicts(self, experiment_id: int, *, history: bool = False) -> list[VerdictInfo]:
        """Each bar's latest verdict, by bar id (``history``: every verdict, oldest first per bar)."""
        with self._sessions() as s:
            rows = s.scalars(sa.select(BarVerdict).where(BarVerdict.experiment_id == experiment_id)
                             .order_by(BarVerdict.bar_id, BarVerdict.id)).all()
            if not history:
                rows = list({r.bar_id: r for r in rows}.values())  # the last row of each bar wins
            return [
                VerdictInfo(r.experiment_id, r.registration_id, r.bar_id, r.verdict, r.estimate,
                            r.lower, r.upper, r.blocks, r.judged_at, r.label, r.note, r.evidence)
                for r in rows
            ]

    def record_metric_samples(
        self, run_id: int, point_id: int | None, samples: Iterable[tuple[float, str, Mapping[str, str], float]]
    ) -> int:
        """Scraped server metric samples (t, name, labels, value). Returns the count."""
        rows = [
            {"run_id": run_id, "point_id": point_id, "t": float(t), "name": name,
             "labels": dict(labels), "value": float(value)}
            for t, name, labels, value in samples
        ]
        if rows:
            with self._sessions.begin() as s:
                s.execute(sa.insert(MetricSample), rows)
        return len(rows)

    def metric_samples(self, run_id: int) -> pd.DataFrame:
        stmt = (sa.select(MetricSample.t, MetricSample.name, MetricSample.labels, MetricSample.value,
                          MetricSample.point_id)
                .where(MetricSample.run_id == run_id).order_by(MetricSample.t, MetricSample.id))
        with self._sessions() as s:
            rows = [dict(r._mapping) for r in s.execute(stmt)]
        return pd.DataFrame(rows, columns=["t", "name", "labels", "value", "point_id"])
