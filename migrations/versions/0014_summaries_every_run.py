"""capacity summaries keep the figures of every valid run, censored ones too.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-07

Issue 32: `orch capacity` shows capacity over history from every valid run (the Turnbull NPMLE
median, its order-statistic interval and the counts of points and censored runs:
report.capacity_history), which read every capacity of the groups shown (2-13x slower than the
point-only summaries). ``capacity_summaries`` now keeps those figures per comparable group so an
all-time question reads one row per group again:

- ``n_points``, ``n_censored_above``, ``n_censored_below``, ``n_unconverged``: what the group's
  valid runs were; ``censored_above_from`` (the lowest bound of the runs censored above) and
  ``censored_below_to`` (the highest of those below); ``npmle_median`` with ``median_censored``
  (NULL, 'above', 'below'), ``median_low``, ``median_high`` (inf: unbounded) and
  ``median_level``; ``last_run_measured`` (the last of all its runs, censored ones too).
- A group of censored runs only gets a row too: ``runs`` 0 (``runs`` and the statistics beside it
  stay those of the point estimates, capacity_by_config's, which skips such rows), its
  ``median``, ``p25``, ``p75``, ``min`` and ``max`` NULL (nullable from here).

The figures are the estimator's (orchestrator.analysis.censored_groups), which a revision cannot
import (it keeps meaning what it meant): here every existing row, and a row for each group of
censored runs only, is left with ``n_points`` NULL (not computed), which history reads live, and
the Store computes them right after migrating to the head (store.database.upgrade ->
summaries.refill; `Store.rebuild_capacity_summaries` does it too). On PostgreSQL every role
granted UPDATE on the summaries' statistics gets it on the new columns (runtime_grants lists
them). Downgrade: the rows of censored runs only are deleted, the columns dropped.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

NEW_COLUMNS = (
    ("n_points", sa.Integer()), ("n_censored_above", sa.Integer()), ("n_censored_below", sa.Integer()),
    ("n_unconverged", sa.Integer()), ("censored_above_from", sa.Double()), ("censored_below_to", sa.Double()),
    ("npmle_median", sa.Double()), ("median_censored", sa.String(5)), ("median_low", sa.Double()),
    ("median_high", sa.Double()), ("median_level", sa.Double()), ("last_run_measured", sa.DateTime(timezone=True)),
)
STATS = ("median", "p25", "p75", "min", "max")
KEYS = ("workload_sha256", "ttft_ms", "tpot_ms", "backend", "simulated")


def _pg() -> bool:
    return op.get_bind().dialect.name == "postgresql"


def _schema() -> str:
    bind = op.get_bind()
    name = bind.execute(sa.text("SELECT current_schema()")).scalar_one()
    return bind.dialect.identifier_preparer.quote_schema(name) + "."


def _nullable_stats(nullable: bool) -> None:
    with op.batch_alter_table("capacity_summaries") as batch:  # SQLite: a copy of the table (no triggers)
        for name in STATS:
            batch.alter_column(name, existing_type=sa.Double(), nullable=nullable)


def upgrade() -> None:
    _nullable_stats(True)
    for name, type_ in NEW_COLUMNS:
        op.add_column("capacity_summaries", sa.Column(name, type_, nullable=True))
    # a row (figures not computed) for each group whose valid runs are all censored
    false = "false" if _pg() else "0"
    keys = [f"COALESCE(c.{k}, {v})" for k, v in zip(KEYS, ("''", "0", "0", "''", false), strict=True)]
    match = " AND ".join(f"s.{k} = {v}" for k, v in zip(KEYS, keys, strict=True))
    op.execute(
        f"INSERT INTO capacity_summaries (config_id, class_name, {', '.join(KEYS)}, runs) "
        f"SELECT DISTINCT r.config_id, c.class_name, {', '.join(keys)}, 0 FROM capacities c "
        "JOIN runs r ON r.id = c.run_id WHERE r.valid AND r.status = 'done' AND NOT EXISTS "
        f"(SELECT 1 FROM capacity_summaries s WHERE s.config_id = r.config_id AND s.class_name = c.class_name "
        f"AND {match})")
    if _pg():
        columns, s = ", ".join(name for name, _ in NEW_COLUMNS), _schema()
        op.execute(f"""
            DO $$
            DECLARE g oid;
            BEGIN
                FOR g IN SELECT DISTINCT a.grantee
                           FROM pg_catalog.pg_attribute t, pg_catalog.aclexplode(t.attacl) a
                          WHERE t.attrelid = '{s}capacity_summaries'::regclass AND t.attname = 'runs'
                            AND a.privilege_type = 'UPDATE'
                LOOP
                    EXECUTE pg_catalog.format('GRANT UPDATE ({columns}) ON {s}capacity_summaries TO %s',
                        CASE WHEN g = 0 THEN 'PUBLIC' ELSE pg_catalog.quote_ident(pg_catalog.pg_get_userbyid(g)) END);
                END LOOP;
            END $$
        """)


def downgrade() -> None:
    op.execute("DELETE FROM capacity_summaries WHERE runs = 0")
    with op.batch_alter_table("capacity_summaries") as batch:
        for name, _ in reversed(NEW_COLUMNS):
            batch.drop_column(name)
    _nullable_stats(False)
