"""Every plan, run, point, request, guard result, capacity and verdict: SQLAlchemy + Alembic.

The one entry point is ``Store.open(url)``; history queries return pandas DataFrames.
"""

from orchestrator.store.database import ENV_VAR, default_url
from orchestrator.store.ingest import DuplicateRequestRecords, UnknownPoint
from orchestrator.store.integrity import ImmutableRegistration, NotFound, StoreConflict, same_plan
from orchestrator.store.protocol import StoreLike
from orchestrator.store.repository import Store
from orchestrator.store.rows import (
    ExperimentInfo,
    GuardRecord,
    Registration,
    RunInfo,
    VerdictInfo,
    arm_config,
    config_columns,
)

__all__ = [
    "ENV_VAR", "DuplicateRequestRecords", "ExperimentInfo", "GuardRecord", "ImmutableRegistration",
    "NotFound", "Registration", "RunInfo", "Store", "StoreConflict", "StoreLike", "UnknownPoint", "VerdictInfo", "arm_config", "same_plan",
    "config_columns", "default_url",
]
