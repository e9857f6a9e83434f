"""append-only measurements: requests, points, runs, guard results, capacities, metric samples
and verdicts refuse UPDATE and DELETE (triggers on both databases); a run's digest; a verdict is
a new row each time.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

What the triggers allow (DESIGN section 12; issue 18):

- requests, guard_results, bar_verdicts, metric_samples: INSERT only. PostgreSQL refuses an
  UPDATE, DELETE or TRUNCATE statement on them (statement-level triggers, so COPY of requests
  costs nothing more); SQLite refuses each updated or deleted row.
- load_points: a point may be completed (``finish_point``) while its run is ``running``; a point
  of a finished run cannot change; no point is deleted. capacities: the measured columns (run,
  class, capacity, at_rate, attainment, points_used, censored, converged, upper) change only
  while the run is ``running`` (a resumed search re-records its capacity); the copied columns
  (config_id, counted, measured_at: summaries.mark_capacities) may be refreshed at any time; no
  capacity is deleted.
- runs: only forward. A ``running`` run may change (and be finished: done, failed, aborted);
  a run in a terminal state cannot change at all (status, valid, reason, fingerprint, digest);
  a run's identity (experiment, configuration, arm, block, position, attempt, start) never
  changes; no run is deleted.
- bar_verdicts loses its unique (experiment_id, bar_id): a new verdict is a new row and the
  latest (highest id) is the verdict read (an index on (experiment_id, bar_id) replaces it).
- runs.digest: sha256 of the run's records (orchestrator.store.appendonly.run_digest), stored
  when the run finishes; NULL for runs finished before this revision.

The escape (deleting a whole experiment: ``Store.delete_experiment``, an operator's command),
in force for one transaction only:

- PostgreSQL: ``SET LOCAL orchestrator.maintenance = 'on'``, and only for a role that is (a
  member of) the table's owner: the runtime role, which owns nothing, cannot use it.
- SQLite: a row in ``orch_maintenance`` inserted and deleted within the same transaction
  (SQLite's one writer at a time keeps it invisible to every other connection). The table
  exists on PostgreSQL too (one schema on both databases) but is not read there.

A later revision that rebuilds one of these tables on SQLite (batch mode copies the table)
drops its triggers and must create them again.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

UQ_VERDICT = "uq_bar_verdicts_experiment_id_bar_id"
IX_VERDICT = "ix_bar_verdicts_experiment_id_bar_id"
INSERT_ONLY = ("requests", "guard_results", "bar_verdicts", "metric_samples")
NO_DELETE = ("runs", "load_points", "capacities")
ALL = INSERT_ONLY + NO_DELETE
RUN_IDENTITY = ("id", "experiment_id", "config_id", "arm", "block", "position", "attempt", "started_at")
CAPACITY_MEASURED = ("id", "run_id", "class_name", "capacity", "at_rate", "attainment", "points_used",
                     "censored", "converged", "upper")
HINT = "measurements are append-only (DESIGN section 12)"


def _changed(columns: tuple[str, ...], op_: str) -> str:
    return " OR ".join(f"NEW.{c} {op_} OLD.{c}" for c in columns)


PG_UP = [
    """
    CREATE FUNCTION orch_maintenance(rel oid) RETURNS boolean LANGUAGE sql STABLE AS $$
        SELECT coalesce(current_setting('orchestrator.maintenance', true), '') = 'on'
           AND pg_has_role(current_user, (SELECT relowner FROM pg_class WHERE oid = rel), 'USAGE')
    $$
    """,
    f"""
    CREATE FUNCTION orch_refuse_measurement_change() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF orch_maintenance(TG_RELID) THEN
            IF TG_LEVEL = 'STATEMENT' THEN RETURN NULL; END IF;
            IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
            RETURN NEW;
        END IF;
        RAISE EXCEPTION '%: % refused: {HINT}', TG_TABLE_NAME, TG_OP
            USING ERRCODE = 'integrity_constraint_violation';
    END $$
    """,
    f"""
    CREATE FUNCTION orch_run_forward_only() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF orch_maintenance(TG_RELID) THEN RETURN NEW; END IF;
        IF OLD.status <> 'running' THEN
            RAISE EXCEPTION 'runs: run % is %: a finished run cannot change ({HINT})', OLD.id, OLD.status
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        IF {_changed(RUN_IDENTITY, "IS DISTINCT FROM")} THEN
            RAISE EXCEPTION 'runs: the identity of run % cannot change ({HINT})', OLD.id
                USING ERRCODE = 'integrity_constraint_violation';
        END IF;
        RETURN NEW;
    END $$
    """,
    f"""
    CREATE FUNCTION orch_point_while_running() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF orch_maintenance(TG_RELID) THEN RETURN NEW; END IF;
        IF NEW.id = OLD.id AND NEW.run_id = OLD.run_id
           AND EXISTS (SELECT 1 FROM runs WHERE id = OLD.run_id AND status = 'running') THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'load_points: point % belongs to a finished run and cannot change ({HINT})', OLD.id
            USING ERRCODE = 'integrity_constraint_violation';
    END $$
    """,
    f"""
    CREATE FUNCTION orch_capacity_while_running() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF orch_maintenance(TG_RELID) THEN RETURN NEW; END IF;
        IF NOT ({_changed(CAPACITY_MEASURED, "IS DISTINCT FROM")}) THEN RETURN NEW; END IF;
        IF NEW.id = OLD.id AND NEW.run_id = OLD.run_id AND NEW.class_name = OLD.class_name
           AND EXISTS (SELECT 1 FROM runs WHERE id = OLD.run_id AND status = 'running') THEN
            RETURN NEW;
        END IF;
        RAISE EXCEPTION 'capacities: capacity % of a finished run cannot change ({HINT})', OLD.id
            USING ERRCODE = 'integrity_constraint_violation';
    END $$
    """,
    *[
        f"""
        CREATE TRIGGER {t}_insert_only BEFORE UPDATE OR DELETE OR TRUNCATE ON {t}
        FOR EACH STATEMENT EXECUTE FUNCTION orch_refuse_measurement_change()
        """
        for t in INSERT_ONLY
    ],
    *[
        f"""
        CREATE TRIGGER {t}_no_delete BEFORE DELETE ON {t}
        FOR EACH ROW EXECUTE FUNCTION orch_refuse_measurement_change()
        """
        for t in NO_DELETE
    ],
    *[
        f"""
        CREATE TRIGGER {t}_no_truncate BEFORE TRUNCATE ON {t}
        FOR EACH STATEMENT EXECUTE FUNCTION orch_refuse_measurement_change()
        """
        for t in NO_DELETE
    ],
    """
    CREATE TRIGGER runs_forward_only BEFORE UPDATE ON runs
    FOR EACH ROW EXECUTE FUNCTION orch_run_forward_only()
    """,
    """
    CREATE TRIGGER load_points_while_running BEFORE UPDATE ON load_points
    FOR EACH ROW EXECUTE FUNCTION orch_point_while_running()
    """,
    """
    CREATE TRIGGER capacities_while_running BEFORE UPDATE ON capacities
    FOR EACH ROW EXECUTE FUNCTION orch_capacity_while_running()
    """,
]
PG_DOWN = [
    "DROP TRIGGER IF EXISTS capacities_while_running ON capacities",
    "DROP TRIGGER IF EXISTS load_points_while_running ON load_points",
    "DROP TRIGGER IF EXISTS runs_forward_only ON runs",
    *[f"DROP TRIGGER IF EXISTS {t}_no_truncate ON {t}" for t in NO_DELETE],
    *[f"DROP TRIGGER IF EXISTS {t}_no_delete ON {t}" for t in NO_DELETE],
    *[f"DROP TRIGGER IF EXISTS {t}_insert_only ON {t}" for t in INSERT_ONLY],
    "DROP FUNCTION IF EXISTS orch_capacity_while_running()",
    "DROP FUNCTION IF EXISTS orch_point_while_running()",
    "DROP FUNCTION IF EXISTS orch_run_forward_only()",
    "DROP FUNCTION IF EXISTS orch_refuse_measurement_change()",
    "DROP FUNCTION IF EXISTS orch_maintenance(oid)",
]

SQLITE_FREE = "NOT EXISTS (SELECT 1 FROM orch_maintenance)"
SQLITE_RUNNING = "EXISTS (SELECT 1 FROM runs WHERE id = OLD.run_id AND status = 'running')"
SQLITE_UP = [
    *[
        f"""
        CREATE TRIGGER {t}_no_{what.lower()} BEFORE {what} ON {t} WHEN {SQLITE_FREE}
        BEGIN SELECT RAISE(ABORT, '{t}: {what} refused: {HINT}'); END
        """
        for t in INSERT_ONLY for what in ("UPDATE", "DELETE")
    ],
    *[
        f"""
        CREATE TRIGGER {t}_no_delete BEFORE DELETE ON {t} WHEN {SQLITE_FREE}
        BEGIN SELECT RAISE(ABORT, '{t}: DELETE refused: {HINT}'); END
        """
        for t in NO_DELETE
    ],
    f"""
    CREATE TRIGGER runs_finished_frozen BEFORE UPDATE ON runs
    WHEN {SQLITE_FREE} AND OLD.status <> 'running'
    BEGIN SELECT RAISE(ABORT, 'runs: a finished run cannot change ({HINT})'); END
    """,
    f"""
    CREATE TRIGGER runs_identity_fixed BEFORE UPDATE ON runs
    WHEN {SQLITE_FREE} AND ({_changed(RUN_IDENTITY, "IS NOT")})
    BEGIN SELECT RAISE(ABORT, 'runs: the identity of a run cannot change ({HINT})'); END
    """,
    f"""
    CREATE TRIGGER load_points_while_running BEFORE UPDATE ON load_points
    WHEN {SQLITE_FREE} AND (NEW.id IS NOT OLD.id OR NEW.run_id IS NOT OLD.run_id OR NOT {SQLITE_RUNNING})
    BEGIN SELECT RAISE(ABORT, 'load_points: a point of a finished run cannot change ({HINT})'); END
    """,
    f"""
    CREATE TRIGGER capacities_while_running BEFORE UPDATE ON capacities
    WHEN {SQLITE_FREE} AND ({_changed(CAPACITY_MEASURED, "IS NOT")})
         AND (NEW.id IS NOT OLD.id OR NEW.run_id IS NOT OLD.run_id OR NEW.class_name IS NOT OLD.class_name
              OR NOT {SQLITE_RUNNING})
    BEGIN SELECT RAISE(ABORT, 'capacities: a capacity of a finished run cannot change ({HINT})'); END
    """,
]
SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS capacities_while_running",
    "DROP TRIGGER IF EXISTS load_points_while_running",
    "DROP TRIGGER IF EXISTS runs_identity_fixed",
    "DROP TRIGGER IF EXISTS runs_finished_frozen",
    *[f"DROP TRIGGER IF EXISTS {t}_no_delete" for t in NO_DELETE],
    *[f"DROP TRIGGER IF EXISTS {t}_no_{w}" for t in INSERT_ONLY for w in ("update", "delete")],
]


def _pg() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def upgrade() -> None:
    op.create_table(
        "orch_maintenance",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_orch_maintenance")),
    )
    op.add_column("runs", sa.Column("digest", sa.String(64), nullable=True))
    with op.batch_alter_table("bar_verdicts") as batch:
        batch.drop_constraint(op.f(UQ_VERDICT), type_="unique")
        batch.create_index(op.f(IX_VERDICT), ["experiment_id", "bar_id"], unique=False)
    for sql in PG_UP if _pg() else SQLITE_UP:
        op.execute(sql)


def downgrade() -> None:
    for sql in PG_DOWN if _pg() else SQLITE_DOWN:
        op.execute(sql)
    # one verdict per bar again: the latest stays
    op.execute(
        "DELETE FROM bar_verdicts WHERE id NOT IN "
        "(SELECT max(id) FROM bar_verdicts GROUP BY experiment_id, bar_id)"
    )
    with op.batch_alter_table("bar_verdicts") as batch:
        batch.drop_index(op.f(IX_VERDICT))
        batch.create_unique_constraint(op.f(UQ_VERDICT), ["experiment_id", "bar_id"])
    # not batch mode: rebuilding runs on SQLite would cascade its DROP TABLE into every point
    op.execute("ALTER TABLE runs DROP COLUMN digest")
    op.drop_table("orch_maintenance")
