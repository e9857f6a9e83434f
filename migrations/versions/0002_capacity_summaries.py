"""capacity summaries: per configuration and class, statistics of valid runs' capacities.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29

Derived data kept by the repository so all-time history queries read one row per configuration
and class. Existing history is summarised here, in batches, with the same linear-interpolation
quartiles as PostgreSQL's percentile_cont (no ORM imports: plain SQL through the connection).
"""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

BATCH = 10_000


def _quantile(sorted_values: list[float], q: float) -> float:
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def upgrade() -> None:
    table = op.create_table(
        "capacity_summaries",
        sa.Column("config_id", sa.BigInteger(), nullable=False),
        sa.Column("class_name", sa.String(length=60), nullable=False),
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("median", sa.Double(), nullable=False),
        sa.Column("p25", sa.Double(), nullable=False),
        sa.Column("p75", sa.Double(), nullable=False),
        sa.Column("min", sa.Double(), nullable=False),
        sa.Column("max", sa.Double(), nullable=False),
        sa.Column("last_measured", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["config_id"], ["deployment_configs.id"],
                                name=op.f("fk_capacity_summaries_config_id_deployment_configs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("config_id", "class_name", name=op.f("pk_capacity_summaries")),
    )
    rows = op.get_bind().execute(sa.text(
        "SELECT r.config_id, c.class_name, c.capacity, r.finished_at FROM capacities c "
        "JOIN runs r ON r.id = c.run_id WHERE r.valid AND r.status = 'done'"
    ))
    groups: dict[tuple[int, str], list[tuple[float, object]]] = defaultdict(list)
    for config_id, class_name, capacity, finished_at in rows:
        if isinstance(finished_at, str):  # SQLite hands timestamps back as text (naive UTC)
            finished_at = datetime.fromisoformat(finished_at)
        groups[(config_id, class_name)].append((capacity, finished_at))
    summaries = []
    for (config_id, class_name), items in groups.items():
        values = sorted(v for v, _ in items)
        stamps = [t for _, t in items if t is not None]
        summaries.append({
            "config_id": config_id, "class_name": class_name, "runs": len(values),
            "median": _quantile(values, 0.5), "p25": _quantile(values, 0.25), "p75": _quantile(values, 0.75),
            "min": values[0], "max": values[-1], "last_measured": max(stamps) if stamps else None,
        })
    for start in range(0, len(summaries), BATCH):
        op.bulk_insert(table, summaries[start : start + BATCH])


def downgrade() -> None:
    op.drop_table("capacity_summaries")
