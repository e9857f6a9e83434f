"""history covering index: the partial index of the capacities that count also covers the
comparable-history keys and the observed engine version.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01

A time-ranged history question ("capacity by configuration since 90 days") groups by the
configuration, the class and the comparable keys (workload signature, the class's limits,
backend, simulated; 0007). The index of 0003 covered only the configuration, class and
capacity, so PostgreSQL read the whole table instead (8,355 pages at 50,000 runs: ~46 ms of a
76 ms aggregate in benchmarks/store_bench.py); covering the keys (and the observed engine, a
filter that always aggregates live) makes it one index-only range. SQLite has no INCLUDE: its
index (a partial index on measured_at) is unchanged.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

INDEX = "ix_capacities_counted_measured_at"
OLD_INCLUDE = ["config_id", "class_name", "capacity"]
NEW_INCLUDE = ["config_id", "class_name", "capacity", "workload_sha256", "ttft_ms", "tpot_ms", "backend",
               "simulated", "observed_engine"]


def _recreate(include: list[str]) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index(INDEX, table_name="capacities")
    op.create_index(INDEX, "capacities", ["measured_at"], postgresql_include=include,
                    postgresql_where=sa.text("counted"))


def upgrade() -> None:
    _recreate(NEW_INCLUDE)


def downgrade() -> None:
    _recreate(OLD_INCLUDE)
