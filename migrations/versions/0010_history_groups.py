"""history groups: each comparable group numbered once, every capacity carrying its number.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01

A live history aggregate (a time range, an observed-fingerprint filter) grouped a range of
capacities by seven columns (configuration, class, workload signature, the class's two limits,
backend, simulated); that sort was most of its time (benchmarks/store_bench.py: ~10 of 24 ms
for 17,000 capacities). ``history_groups`` numbers each group once ('' / 0 / false for an
unknown key, as capacity_summaries stores it) and ``capacities.group_id`` carries the number,
written with the keys by the repository (store.groups), so the aggregate groups by one integer.

- ``history_groups``: id, the seven columns (NOT NULL, unique), the configuration's foreign key.
- ``capacities.group_id``: plain ADD COLUMN (no batch rebuild on SQLite, which would drop 0006's
  triggers); not a measured column, so 0006's triggers let it be written on a finished run's
  capacities.
- PostgreSQL: the partial covering index of 0003/0009 (capacities that count, by end time)
  covers the group number, the capacity and the observed fingerprint (GPU products and engine:
  the filters that always aggregate live) instead of the configuration, class and seven key
  columns (the other filters choose groups: a semi-join on history_groups): narrower,
  index-only for every live filter. SQLite has no INCLUDE: that index is unchanged there.
- ``ix_capacities_counted_group`` (both databases; partial, capacities that count): by group
  and capacity, so an aggregate over all time with an observed filter, or over few groups,
  reads each group's capacities in order, index-only (the seven-key index scan and sort of
  ~24,000 capacities took 53 of 55 ms; 10 ms this way).

Back-fill: every existing group gets its row and every capacity with a configuration its number.
Downgrade: the index of 0009 again, the column and the table dropped.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

INDEX = "ix_capacities_counted_measured_at"
OLD_INCLUDE = ["config_id", "class_name", "capacity", "workload_sha256", "ttft_ms", "tpot_ms", "backend",
               "simulated", "observed_engine"]
NEW_INCLUDE = ["group_id", "capacity", "observed_engine", "observed_gpu"]
GROUP_INDEX = "ix_capacities_counted_group"
GROUP = ("config_id", "class_name", "workload_sha256", "ttft_ms", "tpot_ms", "backend", "simulated")
# a capacity's group, unknown keys as the summaries store them
KEYS_SQL = ("c.config_id, c.class_name, coalesce(c.workload_sha256, ''), coalesce(c.ttft_ms, 0), "
            "coalesce(c.tpot_ms, 0), coalesce(c.backend, ''), coalesce(c.simulated, false)")
MATCH_SQL = ("g.config_id = c.config_id AND g.class_name = c.class_name "
             "AND g.workload_sha256 = coalesce(c.workload_sha256, '') AND g.ttft_ms = coalesce(c.ttft_ms, 0) "
             "AND g.tpot_ms = coalesce(c.tpot_ms, 0) AND g.backend = coalesce(c.backend, '') "
             "AND g.simulated = coalesce(c.simulated, false)")


def _index(include: list[str]) -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index(INDEX, table_name="capacities")
    op.create_index(INDEX, "capacities", ["measured_at"], postgresql_include=include,
                    postgresql_where=sa.text("counted"))


def upgrade() -> None:
    op.create_table(
        "history_groups",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=False),
        sa.Column("config_id", sa.BigInteger(), nullable=False),
        sa.Column("class_name", sa.String(length=60), nullable=False),
        sa.Column("workload_sha256", sa.String(length=64), nullable=False),
        sa.Column("ttft_ms", sa.Double(), nullable=False),
        sa.Column("tpot_ms", sa.Double(), nullable=False),
        sa.Column("backend", sa.String(length=20), nullable=False),
        sa.Column("simulated", sa.Boolean(), nullable=False),
        sa.ForeignKeyConstraint(["config_id"], ["deployment_configs.id"],
                                name=op.f("fk_history_groups_config_id_deployment_configs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_history_groups")),
        sa.UniqueConstraint(*GROUP, name="uq_history_groups_key"),
    )
    op.add_column("capacities", sa.Column("group_id", sa.BigInteger(), nullable=True))
    op.execute(f"INSERT INTO history_groups ({', '.join(GROUP)}) "
               f"SELECT DISTINCT {KEYS_SQL} FROM capacities c WHERE c.config_id IS NOT NULL")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"UPDATE capacities c SET group_id = g.id FROM history_groups g WHERE {MATCH_SQL}")
    else:
        op.execute(f"UPDATE capacities AS c SET group_id = (SELECT g.id FROM history_groups g WHERE {MATCH_SQL})")
    _index(NEW_INCLUDE)
    op.create_index(GROUP_INDEX, "capacities", ["group_id", "capacity"],
                    postgresql_include=["measured_at", "observed_engine", "observed_gpu"],
                    postgresql_where=sa.text("counted"), sqlite_where=sa.text("counted"))


def downgrade() -> None:
    op.drop_index(GROUP_INDEX, table_name="capacities")
    _index(OLD_INCLUDE)
    op.execute("ALTER TABLE capacities DROP COLUMN group_id")
    op.drop_table("history_groups")
