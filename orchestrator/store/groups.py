"""Comparable groups as one integer (migration 0010).

A capacity's comparable group (configuration, class and its limits, workload signature, backend,
simulated or measured: DESIGN section 7) is seven columns; grouping and sorting a time range of
capacities by seven columns (text among them) was most of a live history aggregate's time.
``history_groups`` numbers each group once and every capacity carries its number
(``capacities.group_id``), written whenever its keys are (summaries.mark_capacities,
mark_all_keys), so the live aggregate groups by one integer and joins the group's columns back
onto one row per group. An unknown key is stored as the summaries store it ('' or 0, False),
so a group here is exactly a summary's group.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from orchestrator.store.models import Capacity, HistoryGroup

GROUP_COLUMNS = ("config_id", "class_name", "workload_sha256", "ttft_ms", "tpot_ms", "backend", "simulated")
# an unknown key, as capacity_summaries stores it (primary-key columns cannot be NULL)
UNKNOWN: dict[str, Any] = {"workload_sha256": "", "ttft_ms": 0.0, "tpot_ms": 0.0, "backend": "", "simulated": False}


def _capacity_keys() -> list[Any]:
    """A capacity's group, column by column, unknown keys as stored in history_groups."""
    out: list[Any] = [Capacity.config_id, Capacity.class_name]
    for name in GROUP_COLUMNS[2:]:
        col = getattr(Capacity, name)
        unknown = sa.false() if name == "simulated" else sa.literal(UNKNOWN[name], col.type)
        out.append(sa.func.coalesce(col, unknown))
    return out


def assign(session: Session, where: sa.ColumnElement[bool]) -> None:
    """Number the groups of the capacities matching ``where`` (new groups get a row; concurrent
    writers: the first one wins) and write each capacity's number; a capacity with no
    configuration copied yet gets NULL. In the caller's transaction."""
    keys = _capacity_keys()
    dialect = session.get_bind().dialect.name
    insert = (postgresql.insert if dialect == "postgresql" else sqlite.insert)(HistoryGroup)
    new = sa.select(*keys).where(where, Capacity.config_id.is_not(None)).distinct()
    session.execute(insert.from_select(list(GROUP_COLUMNS), new).on_conflict_do_nothing(
        index_elements=list(GROUP_COLUMNS)))
    hg = HistoryGroup
    number = sa.select(hg.id).where(*(getattr(hg, c) == k for c, k in zip(GROUP_COLUMNS, keys, strict=True)))
    session.execute(
        sa.update(Capacity).where(where).values(group_id=number.scalar_subquery()),
        execution_options={"synchronize_session": False},
    )
