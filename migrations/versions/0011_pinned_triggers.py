"""pinned triggers: every trigger function names its tables and functions by schema and pins its
search_path; no request or point is added to a finished run; the store's identity.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02

Issue 30 ("Results no one can quietly change"):

- PostgreSQL looks an unqualified name up in the session's search_path, and the session's
  temporary schema comes first (before pg_catalog) unless the path names it. The trigger
  functions of 0001, 0004 and 0006 named ``runs``, ``requests``, ``pg_class`` and their own
  helper ``orch_maintenance`` unqualified and pinned no search_path, so the runtime role (which
  may create temporary tables) could shadow them: ``CREATE TEMP TABLE runs`` with a 'running'
  row let it change a finished run's points and capacities, and ``CREATE TEMP TABLE pg_class``
  naming it the owner of ``runs`` opened the maintenance escape to it (a finished run's status,
  validity and reason). Each function is replaced (CREATE OR REPLACE: the triggers keep
  pointing at it) by one that names every table and helper by schema (the schema the tables
  are in, found at upgrade as ``current_schema()``; catalog objects as ``pg_catalog.``) and
  carries ``SET search_path = pg_catalog, pg_temp`` (the temporary schema last: PostgreSQL
  never looks functions or operators up there). SQLite binds a trigger's unqualified names to
  the trigger's own database (a TEMP table cannot shadow them): its triggers are unchanged.
- No INSERT into ``requests`` of a point whose run is not running (or of no point at all), and
  none into ``load_points`` for a run that is not running (0006 froze a finished run's rows
  against UPDATE and DELETE only). PostgreSQL: a statement-level AFTER INSERT trigger on
  requests over its transition table (one check per COPY batch, by distinct point), a row
  trigger on load_points; SQLite: row triggers. The owner's maintenance escape passes them.
- ``store_identity``: one row (id 1), a random identity (uuid4, 32 hex digits) written here,
  once, and never changed (UPDATE and DELETE refused as for measurements). A spool file is
  keyed by it (control/spool.py), so records spooled against one database are never replayed
  into another. PostgreSQL: every role that may read ``runs`` (a runtime role granted before
  this table existed) is granted SELECT on it.

Downgrade: the functions of 0001, 0004 and 0006 as they were, the new triggers and functions
dropped, ``store_identity`` dropped (a spool keyed by it then stays where it is, unread).
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

HINT = "measurements are append-only (DESIGN section 12)"
REFUSE_MESSAGE = "plan registrations are immutable: register a new plan instead"  # 0001's
RUN_IDENTITY = ("id", "experiment_id", "config_id", "arm", "block", "position", "attempt", "started_at")
CAPACITY_MEASURED = ("id", "run_id", "class_name", "capacity", "at_rate", "attainment", "points_used",
                     "censored", "converged", "upper")
PIN = "SET search_path = pg_catalog, pg_temp"
SQLITE_FREE = "NOT EXISTS (SELECT 1 FROM orch_maintenance)"


def _changed(columns: tuple[str, ...], op_: str) -> str:
    return " OR ".join(f"NEW.{c} {op_} OLD.{c}" for c in columns)


def _functions(s: str, pin: str) -> list[str]:
    """The trigger functions of 0001, 0004 and 0006: ``s`` the schema prefix of every table and
    helper ("" as they were), ``pin`` the SET clause ("" as they were)."""
    pg = "pg_catalog." if pin else ""
    return [
        f"""
        CREATE OR REPLACE FUNCTION {s}orch_maintenance(rel oid) RETURNS boolean LANGUAGE sql STABLE {pin} AS $$
            SELECT coalesce({pg}current_setting('orchestrator.maintenance', true), '') = 'on'
               AND {pg}pg_has_role(current_user, (SELECT relowner FROM {pg}pg_class WHERE oid = rel), 'USAGE')
        $$
        """,
        f"""
        CREATE OR REPLACE FUNCTION {s}orch_refuse_measurement_change() RETURNS trigger LANGUAGE plpgsql {pin} AS $$
        BEGIN
            IF {s}orch_maintenance(TG_RELID) THEN
                IF TG_LEVEL = 'STATEMENT' THEN RETURN NULL; END IF;
                IF TG_OP = 'DELETE' THEN RETURN OLD; END IF;
                RETURN NEW;
            END IF;
            RAISE EXCEPTION '%: % refused: {HINT}', TG_TABLE_NAME, TG_OP
                USING ERRCODE = 'integrity_constraint_violation';
        END $$
        """,
        f"""
        CREATE OR REPLACE FUNCTION {s}orch_run_forward_only() RETURNS trigger LANGUAGE plpgsql {pin} AS $$
        BEGIN
            IF {s}orch_maintenance(TG_RELID) THEN RETURN NEW; END IF;
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
        CREATE OR REPLACE FUNCTION {s}orch_point_while_running() RETURNS trigger LANGUAGE plpgsql {pin} AS $$
        BEGIN
            IF {s}orch_maintenance(TG_RELID) THEN RETURN NEW; END IF;
            IF NEW.id = OLD.id AND NEW.run_id = OLD.run_id
               AND EXISTS (SELECT 1 FROM {s}runs WHERE id = OLD.run_id AND status = 'running') THEN
                RETURN NEW;
            END IF;
            RAISE EXCEPTION 'load_points: point % belongs to a finished run and cannot change ({HINT})', OLD.id
                USING ERRCODE = 'integrity_constraint_violation';
        END $$
        """,
        f"""
        CREATE OR REPLACE FUNCTION {s}orch_capacity_while_running() RETURNS trigger LANGUAGE plpgsql {pin} AS $$
        BEGIN
            IF {s}orch_maintenance(TG_RELID) THEN RETURN NEW; END IF;
            IF NOT ({_changed(CAPACITY_MEASURED, "IS DISTINCT FROM")}) THEN RETURN NEW; END IF;
            IF NEW.id = OLD.id AND NEW.run_id = OLD.run_id AND NEW.class_name = OLD.class_name
               AND EXISTS (SELECT 1 FROM {s}runs WHERE id = OLD.run_id AND status = 'running') THEN
                RETURN NEW;
            END IF;
            RAISE EXCEPTION 'capacities: capacity % of a finished run cannot change ({HINT})', OLD.id
                USING ERRCODE = 'integrity_constraint_violation';
        END $$
        """,
        f"""
        CREATE OR REPLACE FUNCTION {s}orch_delete_point_requests() RETURNS trigger
        LANGUAGE plpgsql {pin} AS $$
        BEGIN
            DELETE FROM {s}requests r USING gone g WHERE r.point_id = g.id;
            RETURN NULL;
        END $$
        """,
        f"""
        CREATE OR REPLACE FUNCTION {s}orch_refuse_registration_change() RETURNS trigger
        LANGUAGE plpgsql {pin} AS $$
        BEGIN
            RAISE EXCEPTION '{REFUSE_MESSAGE} (% refused)', TG_OP
                USING ERRCODE = 'integrity_constraint_violation';
        END $$
        """,
    ]


def _pg_new(s: str) -> list[str]:
    return [
        f"""
        CREATE FUNCTION {s}orch_requests_of_running_runs() RETURNS trigger LANGUAGE plpgsql {PIN} AS $$
        DECLARE bad bigint;
        BEGIN
            IF {s}orch_maintenance(TG_RELID) THEN RETURN NULL; END IF;
            SELECT a.point_id INTO bad
              FROM (SELECT DISTINCT point_id FROM added) a
              LEFT JOIN {s}load_points p ON p.id = a.point_id
              LEFT JOIN {s}runs r ON r.id = p.run_id
             WHERE r.status IS DISTINCT FROM 'running'
             LIMIT 1;
            IF FOUND THEN
                RAISE EXCEPTION 'requests: point % is not a point of a running run: no record is added to a finished run ({HINT})', bad
                    USING ERRCODE = 'integrity_constraint_violation';
            END IF;
            RETURN NULL;
        END $$
        """,
        f"""
        CREATE FUNCTION {s}orch_point_of_running_run() RETURNS trigger LANGUAGE plpgsql {PIN} AS $$
        BEGIN
            IF {s}orch_maintenance(TG_RELID) THEN RETURN NEW; END IF;
            IF EXISTS (SELECT 1 FROM {s}runs WHERE id = NEW.run_id AND status = 'running') THEN
                RETURN NEW;
            END IF;
            RAISE EXCEPTION 'load_points: run % is not running: no point is added to a finished run ({HINT})',
                NEW.run_id USING ERRCODE = 'integrity_constraint_violation';
        END $$
        """,
        f"""
        CREATE TRIGGER requests_of_running_runs AFTER INSERT ON {s}requests REFERENCING NEW TABLE AS added
        FOR EACH STATEMENT EXECUTE FUNCTION {s}orch_requests_of_running_runs()
        """,
        f"""
        CREATE TRIGGER load_points_of_running_run BEFORE INSERT ON {s}load_points
        FOR EACH ROW EXECUTE FUNCTION {s}orch_point_of_running_run()
        """,
        f"""
        CREATE TRIGGER store_identity_insert_only BEFORE UPDATE OR DELETE OR TRUNCATE ON {s}store_identity
        FOR EACH STATEMENT EXECUTE FUNCTION {s}orch_refuse_measurement_change()
        """,
        # A runtime role granted SELECT ON ALL TABLES before this table existed reads it too.
        f"""
        DO $$
        DECLARE g oid;
        BEGIN
            FOR g IN SELECT DISTINCT a.grantee
                       FROM pg_catalog.pg_class c, pg_catalog.aclexplode(c.relacl) a
                      WHERE c.oid = '{s}runs'::regclass AND a.privilege_type = 'SELECT' AND a.grantee <> c.relowner
            LOOP
                EXECUTE pg_catalog.format('GRANT SELECT ON {s}store_identity TO %s',
                    CASE WHEN g = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g)) END);
            END LOOP;
        END $$
        """,
    ]


PG_DROP_NEW = [
    "DROP TRIGGER IF EXISTS store_identity_insert_only ON store_identity",
    "DROP TRIGGER IF EXISTS load_points_of_running_run ON load_points",
    "DROP TRIGGER IF EXISTS requests_of_running_runs ON requests",
    "DROP FUNCTION IF EXISTS orch_point_of_running_run()",
    "DROP FUNCTION IF EXISTS orch_requests_of_running_runs()",
]

SQLITE_UP = [
    f"""
    CREATE TRIGGER requests_of_running_runs BEFORE INSERT ON requests
    WHEN NOT EXISTS (SELECT 1 FROM load_points p JOIN runs r ON r.id = p.run_id
                     WHERE p.id = NEW.point_id AND r.status = 'running') AND {SQLITE_FREE}
    BEGIN SELECT RAISE(ABORT, 'requests: not a point of a running run: no record is added to a finished run ({HINT})'); END
    """,
    f"""
    CREATE TRIGGER load_points_of_running_run BEFORE INSERT ON load_points
    WHEN NOT EXISTS (SELECT 1 FROM runs WHERE id = NEW.run_id AND status = 'running') AND {SQLITE_FREE}
    BEGIN SELECT RAISE(ABORT, 'load_points: the run is not running: no point is added to a finished run ({HINT})'); END
    """,
    *[
        f"""
        CREATE TRIGGER store_identity_no_{what.lower()} BEFORE {what} ON store_identity WHEN {SQLITE_FREE}
        BEGIN SELECT RAISE(ABORT, 'store_identity: {what} refused: {HINT}'); END
        """
        for what in ("UPDATE", "DELETE")
    ],
]
SQLITE_DOWN = [
    "DROP TRIGGER IF EXISTS store_identity_no_delete",
    "DROP TRIGGER IF EXISTS store_identity_no_update",
    "DROP TRIGGER IF EXISTS load_points_of_running_run",
    "DROP TRIGGER IF EXISTS requests_of_running_runs",
]


def _pg() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _schema() -> str:
    """The schema the tables are in, quoted, with its dot."""
    bind = op.get_bind()
    name = bind.execute(sa.text("SELECT current_schema()")).scalar_one()
    return bind.dialect.identifier_preparer.quote_schema(name) + "."


def upgrade() -> None:
    op.create_table(
        "store_identity",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("identity", sa.String(length=32), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("id = 1", name=op.f("ck_store_identity_one_row")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_store_identity")),
    )
    op.execute(sa.text("INSERT INTO store_identity (id, identity, created_at) VALUES (1, :i, :t)")
               .bindparams(i=uuid.uuid4().hex, t=datetime.now(UTC)))
    if _pg():
        s = _schema()
        for sql in [*_functions(s, PIN), *_pg_new(s)]:
            op.execute(sql)
    else:
        for sql in SQLITE_UP:
            op.execute(sql)


def downgrade() -> None:
    if _pg():
        for sql in [*PG_DROP_NEW, *_functions("", "")]:
            op.execute(sql)
    else:
        for sql in SQLITE_DOWN:
            op.execute(sql)
    op.drop_table("store_identity")
