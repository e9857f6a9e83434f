"""capacities that are no point estimate: a partial index by group.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-06

Issue 32 (item 1): capacity over history counts every valid run, censored and unconverged ones
too (report.capacity_history). The point estimates are read from the covering indexes of
0009/0010 (they count); the others (censored, unconverged, or zero: a few percent of a history)
were a scan of every capacity (~40 ms at 50,000 runs in benchmarks/store_bench.py). This partial
index holds only them, by comparable group (0010), on PostgreSQL and SQLite alike.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

INDEX = "ix_capacities_not_point_group"
NOT_POINT = "censored IS NOT NULL OR converged IS false OR capacity <= 0"


def upgrade() -> None:
    op.create_index(INDEX, "capacities", ["group_id"], postgresql_where=sa.text(NOT_POINT),
                    sqlite_where=sa.text(NOT_POINT))


def downgrade() -> None:
    op.drop_index(INDEX, table_name="capacities")
