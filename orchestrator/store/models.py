"""The schema: SQLAlchemy 2.0 typed models of everything an experiment produces.

The migrations in ``migrations/versions`` create the same tables without importing this module
(a revision must keep meaning what it meant when it was released); a test checks that the two
agree. Measurements are append-only (migration 0006: triggers; orchestrator.store.appendonly).
Deleting an experiment (an operator's command, through the maintenance escape) removes its runs,
points, requests, guard results, capacities, metric samples and verdicts (ON DELETE CASCADE;
requests by trigger): no orphans. Registrations and deployment configurations are shared
history and are never deleted through an experiment.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from orchestrator.store.types import JSONDoc, UTCDateTime, utcnow

# Stable constraint names, so migrations can refer to them on both databases.
NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-increments INTEGER PRIMARY KEY; BIGINT there would never get a value.
BigId = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
CASCADE = "CASCADE"


class Base(DeclarativeBase):
    metadata = sa.MetaData(naming_convention=NAMING)


class PlanRegistration(Base):
    """A plan as registered before its first run: canonical JSON and its sha256. Immutable."""

    __tablename__ = "plan_registrations"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    sha256: Mapped[str] = mapped_column(sa.String(64), unique=True)
    name: Mapped[str] = mapped_column(sa.String(200))
    canonical_json: Mapped[str] = mapped_column(sa.Text)
    registered_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class DeploymentConfig(Base):
    """One row per distinct arm configuration; the columns users filter history by."""

    __tablename__ = "deployment_configs"
    __table_args__ = (
        sa.Index("ix_deployment_configs_model_gpu_layout", "model", "gpu", "layout"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    config_sha256: Mapped[str] = mapped_column(sa.String(64), unique=True)
    label: Mapped[str] = mapped_column(sa.String(300))
    model: Mapped[str] = mapped_column(sa.String(120))
    gpu: Mapped[str] = mapped_column(sa.String(40))
    layout: Mapped[str] = mapped_column(sa.String(20))
    gpus: Mapped[int] = mapped_column(sa.Integer)
    tp: Mapped[int] = mapped_column(sa.Integer)
    replicas: Mapped[int | None] = mapped_column(sa.Integer)
    prefill_replicas: Mapped[int | None] = mapped_column(sa.Integer)
    prefill_tp: Mapped[int | None] = mapped_column(sa.Integer)
    decode_replicas: Mapped[int | None] = mapped_column(sa.Integer)
    decode_tp: Mapped[int | None] = mapped_column(sa.Integer)
    kv_connector: Mapped[str | None] = mapped_column(sa.String(20))
    kv_cache_dtype: Mapped[str] = mapped_column(sa.String(10), index=True)
    quantization: Mapped[str] = mapped_column(sa.String(10))
    max_num_seqs: Mapped[int] = mapped_column(sa.Integer, index=True)
    max_num_batched_tokens: Mapped[int] = mapped_column(sa.Integer)
    prefix_caching: Mapped[bool] = mapped_column(sa.Boolean)
    router_policy: Mapped[str] = mapped_column(sa.String(30), index=True)
    speculative_method: Mapped[str | None] = mapped_column(sa.String(20))
    num_speculative_tokens: Mapped[int | None] = mapped_column(sa.Integer)
    engine_version: Mapped[str] = mapped_column(sa.String(40), index=True)
    config: Mapped[Any] = mapped_column(JSONDoc)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Experiment(Base):
    """One execution of a registered plan."""

    __tablename__ = "experiments"
    # (id, registration_id) is unique so a verdict can reference both at once: the database
    # then refuses a verdict judged against any registration but its experiment's.
    __table_args__ = (sa.UniqueConstraint("id", "registration_id"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(200), unique=True)
    registration_id: Mapped[int] = mapped_column(
        sa.ForeignKey("plan_registrations.id", ondelete="RESTRICT"), index=True
    )
    status: Mapped[str] = mapped_column(sa.String(20), default="queued")
    controller_id: Mapped[str | None] = mapped_column(sa.String(200))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class Run(Base):
    """One arm deployed once within a block (one attempt), with its environment fingerprint."""

    __tablename__ = "runs"
    __table_args__ = (
        sa.UniqueConstraint("experiment_id", "block", "arm", "attempt"),
        sa.Index("ix_runs_config_id_valid_finished_at", "config_id", "valid", "finished_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(
        sa.ForeignKey("experiments.id", ondelete=CASCADE), index=True
    )
    config_id: Mapped[int] = mapped_column(sa.ForeignKey("deployment_configs.id", ondelete="RESTRICT"))
    arm: Mapped[str] = mapped_column(sa.String(8))
    block: Mapped[int] = mapped_column(sa.Integer)
    position: Mapped[int] = mapped_column(sa.Integer)
    attempt: Mapped[int] = mapped_column(sa.Integer, default=0)
    status: Mapped[str] = mapped_column(sa.String(20), default="running")
    valid: Mapped[bool | None] = mapped_column(sa.Boolean)
    invalid_reason: Mapped[str | None] = mapped_column(sa.Text)
    engine_version: Mapped[str | None] = mapped_column(sa.String(40))
    image_digest: Mapped[str | None] = mapped_column(sa.String(200))
    gpu_type: Mapped[str | None] = mapped_column(sa.String(40))
    nodes: Mapped[Any] = mapped_column(JSONDoc, nullable=True)
    driver: Mapped[str | None] = mapped_column(sa.String(40))
    fingerprint: Mapped[Any] = mapped_column(JSONDoc, nullable=True)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # sha256 of the run's records, stored when it finishes (appendonly.run_digest; 0006)
    digest: Mapped[str | None] = mapped_column(sa.String(64))


class LoadPoint(Base):
    """One fixed-length load point of a run: offered load, what was achieved, how it was served."""

    __tablename__ = "load_points"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete=CASCADE), index=True)
    seq: Mapped[int] = mapped_column(sa.Integer)
    search_class: Mapped[str | None] = mapped_column(sa.String(60))
    offered_rate: Mapped[float | None] = mapped_column(sa.Double)
    users: Mapped[int | None] = mapped_column(sa.Integer)
    window_start_s: Mapped[float] = mapped_column(sa.Double)
    window_end_s: Mapped[float] = mapped_column(sa.Double)
    achieved_rate: Mapped[float | None] = mapped_column(sa.Double)
    throughput_tok_s: Mapped[float | None] = mapped_column(sa.Double)
    n_scheduled: Mapped[int | None] = mapped_column(sa.Integer)
    per_class: Mapped[Any] = mapped_column(JSONDoc)
    percentiles: Mapped[Any] = mapped_column(JSONDoc)  # latency percentiles (ttft_s, tpot_s, ...)
    # What the point was measured under: prefix hit rates, send lag, start time, seed (0005).
    context: Mapped[Any] = mapped_column(JSONDoc, nullable=True)
    valid: Mapped[bool] = mapped_column(sa.Boolean)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class Request(Base):
    """One scheduled request of a point (orchestrator.records.RequestRecord), never dropped."""

    __tablename__ = "requests"

    # No foreign key: the point is checked (and locked) once per ingested batch, and a trigger
    # deletes a point's requests with it (migration 0004: a per-row check cost 60% of COPY).
    point_id: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True, autoincrement=False)
    request_id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)
    conversation_id: Mapped[int] = mapped_column(sa.Integer)
    turn: Mapped[int] = mapped_column(sa.Integer)
    phase: Mapped[str] = mapped_column(sa.String(10))
    scheduled_s: Mapped[float] = mapped_column(sa.Double)
    sent_s: Mapped[float | None] = mapped_column(sa.Double)
    first_token_s: Mapped[float | None] = mapped_column(sa.Double)
    last_token_s: Mapped[float | None] = mapped_column(sa.Double)
    prompt_tokens: Mapped[int] = mapped_column(sa.Integer)
    output_tokens_asked: Mapped[int] = mapped_column(sa.Integer)
    output_tokens: Mapped[int | None] = mapped_column(sa.Integer)
    cached_tokens: Mapped[int | None] = mapped_column(sa.Integer)
    chunks: Mapped[int] = mapped_column(sa.Integer)
    max_gap_s: Mapped[float | None] = mapped_column(sa.Double)
    status: Mapped[str] = mapped_column(sa.String(12))
    http_status: Mapped[int | None] = mapped_column(sa.Integer)
    error: Mapped[str | None] = mapped_column(sa.Text)
    prompt_hash: Mapped[str] = mapped_column(sa.String(64))
    output_hash: Mapped[str] = mapped_column(sa.String(64))
    server_prompt_tokens: Mapped[int | None] = mapped_column(sa.Integer)  # usage.prompt_tokens (0008)


class GuardResultRow(Base):
    """A validity guard's judgement of a run (point_id NULL) or of one point."""

    __tablename__ = "guard_results"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete=CASCADE), index=True)
    point_id: Mapped[int | None] = mapped_column(
        sa.ForeignKey("load_points.id", ondelete=CASCADE), index=True
    )
    name: Mapped[str] = mapped_column(sa.String(60))
    passed: Mapped[bool] = mapped_column(sa.Boolean)
    value: Mapped[float | None] = mapped_column(sa.Double)
    threshold: Mapped[float | None] = mapped_column(sa.Double)
    detail: Mapped[str] = mapped_column(sa.Text, default="")


# A capacity that is no point estimate (the partial index's predicate, and history's filter:
# written alike so PostgreSQL sees the index covers the query).
NOT_POINT_SQL = "censored IS NOT NULL OR converged IS false OR capacity <= 0"


class Capacity(Base):
    """A run's capacity at one service class (DESIGN section 7), with its censoring: ``censored``
    (NULL, below_min, above_max or at_ceiling), ``converged`` and ``upper`` (a bound on the true
    capacity; NULL: unbounded). Only an uncensored, converged capacity is a point estimate."""

    __tablename__ = "capacities"
    __table_args__ = (
        sa.UniqueConstraint("run_id", "class_name"),
        sa.CheckConstraint("censored IS NULL OR censored IN ('below_min', 'above_max', 'at_ceiling')",
                           name="censored"),
        # time-ranged history reads one range of this index (capacities that count only),
        # index-only: it covers the comparable group (one integer since 0010; the other filters
        # choose groups) and the observed fingerprint (filters that always aggregate live)
        sa.Index(
            "ix_capacities_counted_measured_at", "measured_at",
            postgresql_include=["group_id", "capacity", "observed_engine", "observed_gpu"],
            postgresql_where=sa.text("counted"), sqlite_where=sa.text("counted"),
        ),
        # a live aggregate over chosen groups, or over all time with an observed-fingerprint
        # filter, reads each group's capacities in order, index-only (0010)
        sa.Index(
            "ix_capacities_counted_group", "group_id", "capacity",
            postgresql_include=["measured_at", "observed_engine", "observed_gpu"],
            postgresql_where=sa.text("counted"), sqlite_where=sa.text("counted"),
        ),
        # the capacities that are no point estimate (censored, unconverged, zero: few), by group:
        # history of every valid run reads them beside the counted ones (0013)
        sa.Index(
            "ix_capacities_not_point_group", "group_id",
            postgresql_where=sa.text(NOT_POINT_SQL), sqlite_where=sa.text(NOT_POINT_SQL),
        ),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete=CASCADE))
    class_name: Mapped[str] = mapped_column(sa.String(60), index=True)
    capacity: Mapped[float] = mapped_column(sa.Double)
    at_rate: Mapped[float | None] = mapped_column(sa.Double)
    attainment: Mapped[float | None] = mapped_column(sa.Double)
    points_used: Mapped[int] = mapped_column(sa.Integer)
    censored: Mapped[str | None] = mapped_column(sa.String(20))
    converged: Mapped[bool] = mapped_column(sa.Boolean, default=True, server_default=sa.true())
    upper: Mapped[float | None] = mapped_column(sa.Double)
    # Copies of the run's configuration, validity and end time, kept by the repository
    # (summaries.sync_capacities) so history needs no join to runs.
    config_id: Mapped[int | None] = mapped_column(sa.ForeignKey("deployment_configs.id", ondelete=CASCADE))
    counted: Mapped[bool] = mapped_column(sa.Boolean, default=False, server_default=sa.false())
    measured_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # What makes capacities comparable beyond the configuration (DESIGN section 7; 0007), copied
    # from the run's registration and fingerprint by the repository (history.keys): the workload
    # signature, the class's limits, the plan's backend and whether the engine was simulated;
    # and the observed GPU products and engine version (filters).
    workload_sha256: Mapped[str | None] = mapped_column(sa.String(64))
    ttft_ms: Mapped[float | None] = mapped_column(sa.Double)
    tpot_ms: Mapped[float | None] = mapped_column(sa.Double)
    backend: Mapped[str | None] = mapped_column(sa.String(20))
    simulated: Mapped[bool | None] = mapped_column(sa.Boolean)
    observed_gpu: Mapped[str | None] = mapped_column(sa.String(200))
    observed_engine: Mapped[str | None] = mapped_column(sa.String(40))
    # The comparable group of those keys (HistoryGroup.id; 0010), written with them: history
    # groups and sorts by this one integer instead of seven columns. NULL until the run's
    # configuration is copied (a capacity no history question counts yet).
    group_id: Mapped[int | None] = mapped_column(sa.BigInteger)


class HistoryGroup(Base):
    """Derived (0010): one row per comparable group a capacity ever had, configuration, class
    and its limits, workload signature, backend, simulated or measured, with an unknown key
    stored as '' (text) or 0 (limits) as in the summaries; never deleted (a group with no
    capacity left is simply never matched). Written by store.groups whenever a capacity's keys
    are."""

    __tablename__ = "history_groups"
    __table_args__ = (
        sa.UniqueConstraint("config_id", "class_name", "workload_sha256", "ttft_ms", "tpot_ms", "backend",
                            "simulated", name="uq_history_groups_key"),  # the convention's name is too long
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    config_id: Mapped[int] = mapped_column(sa.BigInteger, sa.ForeignKey("deployment_configs.id", ondelete=CASCADE))
    class_name: Mapped[str] = mapped_column(sa.String(60))
    workload_sha256: Mapped[str] = mapped_column(sa.String(64))
    ttft_ms: Mapped[float] = mapped_column(sa.Double)
    tpot_ms: Mapped[float] = mapped_column(sa.Double)
    backend: Mapped[str] = mapped_column(sa.String(20))
    simulated: Mapped[bool] = mapped_column(sa.Boolean)


class BarVerdict(Base):
    """A bar's verdict, always tied to the registration it was judged against."""

    __tablename__ = "bar_verdicts"
    # Append-only (0006): a new verdict is a new row; the latest (highest id) per bar is read.
    __table_args__ = (
        sa.Index("ix_bar_verdicts_experiment_id_bar_id", "experiment_id", "bar_id"),
        sa.ForeignKeyConstraint(
            ["experiment_id", "registration_id"],
            ["experiments.id", "experiments.registration_id"],
            ondelete=CASCADE,
            name="fk_bar_verdicts_experiment_registration",
        ),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(sa.BigInteger)
    registration_id: Mapped[int] = mapped_column(
        sa.ForeignKey("plan_registrations.id", ondelete="RESTRICT"), index=True
    )
    bar_id: Mapped[str] = mapped_column(sa.String(100))
    verdict: Mapped[str] = mapped_column(sa.String(20))
    estimate: Mapped[float | None] = mapped_column(sa.Double)
    lower: Mapped[float | None] = mapped_column(sa.Double)
    upper: Mapped[float | None] = mapped_column(sa.Double)
    blocks: Mapped[int] = mapped_column(sa.Integer)
    label: Mapped[str | None] = mapped_column(sa.Text)  # exactly what lower..upper is (0005)
    note: Mapped[str | None] = mapped_column(sa.Text)
    # blocks used, censored and dropped blocks with their reasons, the level of each bound
    evidence: Mapped[Any] = mapped_column(JSONDoc, nullable=True)
    judged_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class MetricSample(Base):
    """One scraped sample of a server metric (`vllm:` series) during a run."""

    __tablename__ = "metric_samples"
    __table_args__ = (sa.Index("ix_metric_samples_run_id_name", "run_id", "name"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_id: Mapped[int] = mapped_column(sa.ForeignKey("runs.id", ondelete=CASCADE))
    point_id: Mapped[int | None] = mapped_column(
        sa.ForeignKey("load_points.id", ondelete=CASCADE), index=True
    )
    t: Mapped[float] = mapped_column(sa.Double)
    name: Mapped[str] = mapped_column(sa.String(200))
    labels: Mapped[Any] = mapped_column(JSONDoc)
    value: Mapped[float] = mapped_column(sa.Double)


class CapacitySummary(Base):
    """Derived, kept by the repository: per comparable group (configuration, class and its
    limits, workload signature, backend, simulated or measured), the statistics of the
    capacities of its valid finished runs, so history questions over all time read one row per
    group instead of aggregating every run (`Store.rebuild_capacity_summaries` rebuilds it from
    the runs if they were edited outside the Store). 0007 added the keys after config and class;
    an unknown key is stored as '' (text) or 0 (limits). ``runs`` to ``last_measured``: the point
    estimates' (capacity_by_config's; ``runs`` 0 and the rest NULL for a group of censored runs
    only, which it skips); from ``n_points`` on (0014): report.capacity_history's figures of every
    valid run (analysis.censored_groups), NULL until computed (summaries.refill)."""

    __tablename__ = "capacity_summaries"

    config_id: Mapped[int] = mapped_column(
        sa.BigInteger, sa.ForeignKey("deployment_configs.id", ondelete=CASCADE), primary_key=True
    )
    class_name: Mapped[str] = mapped_column(sa.String(60), primary_key=True)
    workload_sha256: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    ttft_ms: Mapped[float] = mapped_column(sa.Double, primary_key=True)
    tpot_ms: Mapped[float] = mapped_column(sa.Double, primary_key=True)
    backend: Mapped[str] = mapped_column(sa.String(20), primary_key=True)
    simulated: Mapped[bool] = mapped_column(sa.Boolean, primary_key=True)
    runs: Mapped[int] = mapped_column(sa.Integer)
    median: Mapped[float | None] = mapped_column(sa.Double)
    p25: Mapped[float | None] = mapped_column(sa.Double)
    p75: Mapped[float | None] = mapped_column(sa.Double)
    min: Mapped[float | None] = mapped_column(sa.Double)
    max: Mapped[float | None] = mapped_column(sa.Double)
    last_measured: Mapped[datetime | None] = mapped_column(UTCDateTime)
    n_points: Mapped[int | None] = mapped_column(sa.Integer)
    n_censored_above: Mapped[int | None] = mapped_column(sa.Integer)
    n_censored_below: Mapped[int | None] = mapped_column(sa.Integer)
    n_unconverged: Mapped[int | None] = mapped_column(sa.Integer)
    censored_above_from: Mapped[float | None] = mapped_column(sa.Double)
    censored_below_to: Mapped[float | None] = mapped_column(sa.Double)
    npmle_median: Mapped[float | None] = mapped_column(sa.Double)
    median_censored: Mapped[str | None] = mapped_column(sa.String(5))
    median_low: Mapped[float | None] = mapped_column(sa.Double)
    median_high: Mapped[float | None] = mapped_column(sa.Double)
    median_level: Mapped[float | None] = mapped_column(sa.Double)
    last_run_measured: Mapped[datetime | None] = mapped_column(UTCDateTime)


class WorkloadSignatureRow(Base):
    """One row per distinct workload signature (orchestrator.plan.signature, 0007): the readable
    summary and the values range filters use, and the effective workload that was hashed."""

    __tablename__ = "workload_signatures"

    sha256: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    summary: Mapped[str] = mapped_column(sa.String(200))
    input_mean: Mapped[float | None] = mapped_column(sa.Double)
    input_sd: Mapped[float | None] = mapped_column(sa.Double)
    output_tokens: Mapped[float | None] = mapped_column(sa.Double)
    shared_prefix: Mapped[float | None] = mapped_column(sa.Double)
    arrival: Mapped[str] = mapped_column(sa.String(40))
    doc: Mapped[Any] = mapped_column(JSONDoc)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class MaintenanceFlag(Base):
    """SQLite's maintenance escape (migration 0006): while a row exists in the writer's own
    transaction, the append-only triggers let an operator's delete through. Never committed
    with a row in it; unused on PostgreSQL (a session setting there)."""

    __tablename__ = "orch_maintenance"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)


REQUEST_COLUMNS: tuple[str, ...] = tuple(c.name for c in Request.__table__.columns)


class StoreIdentity(Base):
    """The database's identity (migration 0011): one row, a random id written once at upgrade
    and never changed. A spool file is keyed by it (control/spool.py), so records spooled
    against one database are never replayed into another."""

    __tablename__ = "store_identity"
    __table_args__ = (sa.CheckConstraint("id = 1", name="one_row"),)

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=False)
    identity: Mapped[str] = mapped_column(sa.String(32))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class ChainEntry(Base):
    """One link of the hash chain over finished rows (migration 0012; store/chain.py): a run
    when it finishes, a verdict when it is judged. ``sha256`` covers the previous link's, so
    the last one (the head) printed and kept outside the database proves nothing before it
    changed. Append-only; ``seq`` and ``prev_sha256`` unique, so the chain never forks."""

    __tablename__ = "chain_entries"

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    seq: Mapped[int] = mapped_column(sa.BigInteger, unique=True)
    kind: Mapped[str] = mapped_column(sa.String(16))  # run | verdict
    ref_id: Mapped[int] = mapped_column(sa.BigInteger)
    experiment_id: Mapped[int] = mapped_column(sa.BigInteger, index=True)
    payload_sha256: Mapped[str] = mapped_column(sa.String(64))
    prev_sha256: Mapped[str] = mapped_column(sa.String(64), unique=True)
    sha256: Mapped[str] = mapped_column(sa.String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
