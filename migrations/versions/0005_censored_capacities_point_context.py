"""censored capacities, a load point's context in its own column, what a verdict rests on.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

- capacities.censored (below_min | above_max | at_ceiling, NULL: not censored), converged (the
  search's bound closed before it ran out of points; true for every capacity stored before,
  which is what the verdict assumed of them) and upper (a bound on the true capacity; NULL:
  unbounded). A censored or unconverged capacity is a bound, never a point estimate (DESIGN
  section 7; issue 17).
- load_points.context: what a point was measured under (server and ideal prefix hit rates, send
  lag, start time, seed, ...), until now kept as the "context" key of the percentiles document
  (issue 16). Moved in batches of point ids; the downgrade puts it back.
- bar_verdicts.label (exactly what the interval is), note (why a verdict is what it is: censored
  blocks, Holm, an unbalanced design) and evidence (blocks used, censored and dropped blocks with
  their reasons, the levels of each bound), so a stored verdict shows what it rests on.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
CENSORED_CHECK = "censored"  # ck_capacities_censored under the naming convention
BATCH = 5000

# Move "context" between percentiles and its own column, for the points with lo < id <= hi.
UP = {
    "postgresql": (
        "UPDATE load_points SET context = percentiles -> 'context', percentiles = percentiles - 'context' "
        "WHERE id > :lo AND id <= :hi AND percentiles -> 'context' IS NOT NULL"
    ),
    "sqlite": (
        "UPDATE load_points SET context = json_extract(percentiles, '$.context'), "
        "percentiles = json_remove(percentiles, '$.context') "
        "WHERE id > :lo AND id <= :hi AND json_type(percentiles, '$.context') IS NOT NULL"
    ),
}
DOWN = {
    "postgresql": (
        "UPDATE load_points SET percentiles = percentiles || jsonb_build_object('context', context), "
        "context = NULL WHERE id > :lo AND id <= :hi AND context IS NOT NULL"
    ),
    "sqlite": (
        "UPDATE load_points SET percentiles = json_set(percentiles, '$.context', json(context)), "
        "context = NULL WHERE id > :lo AND id <= :hi AND context IS NOT NULL"
    ),
}


def _in_batches(statements: dict[str, str]) -> None:
    bind = op.get_bind()
    sql = sa.text(statements["postgresql" if bind.dialect.name == "postgresql" else "sqlite"])
    top = bind.execute(sa.text("SELECT max(id) FROM load_points")).scalar()
    lo = 0
    while top is not None and lo < top:
        bind.execute(sql, {"lo": lo, "hi": lo + BATCH})
        lo += BATCH


def upgrade() -> None:
    with op.batch_alter_table("capacities") as batch:
        batch.add_column(sa.Column("censored", sa.String(20), nullable=True))
        batch.add_column(sa.Column("converged", sa.Boolean(), server_default=sa.true(), nullable=False))
        batch.add_column(sa.Column("upper", sa.Double(), nullable=True))
        batch.create_check_constraint(
            op.f(f"ck_capacities_{CENSORED_CHECK}"),
            "censored IS NULL OR censored IN ('below_min', 'above_max', 'at_ceiling')",
        )
    with op.batch_alter_table("load_points") as batch:
        batch.add_column(sa.Column("context", JSON_DOC, nullable=True))
    _in_batches(UP)
    with op.batch_alter_table("bar_verdicts") as batch:
        batch.add_column(sa.Column("label", sa.Text(), nullable=True))
        batch.add_column(sa.Column("note", sa.Text(), nullable=True))
        batch.add_column(sa.Column("evidence", JSON_DOC, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("bar_verdicts") as batch:
        batch.drop_column("evidence")
        batch.drop_column("note")
        batch.drop_column("label")
    _in_batches(DOWN)
    with op.batch_alter_table("load_points") as batch:
        batch.drop_column("context")
    with op.batch_alter_table("capacities") as batch:
        batch.drop_constraint(op.f(f"ck_capacities_{CENSORED_CHECK}"), type_="check")
        batch.drop_column("upper")
        batch.drop_column("converged")
        batch.drop_column("censored")
