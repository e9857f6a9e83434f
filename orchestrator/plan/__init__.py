"""The plan language: models, catalogs, loading and hashing. Pure: no I/O beyond reading a file."""

from orchestrator.plan.arms import Arm, EngineConfig, PoolSpec, RouterConfig, SpeculativeConfig
from orchestrator.plan.catalog import (
    GPUS,
    MODELS,
    SERVICE_CLASSES,
    GPUSpec,
    ModelSpec,
    ServiceClass,
    canonical_gpu,
    gpu,
)
from orchestrator.plan.experiment import (
    Bar,
    Design,
    GuardThresholds,
    Plan,
    SearchSettings,
    SimSettings,
    plan_warnings,
)
from orchestrator.plan.external import ArmLabels, ExternalEndpoint, HeaderFromEnv
from orchestrator.plan.loading import (
    canonical_json,
    json_schema,
    load_plan_file,
    load_plan_text,
    plan_from_canonical,
    plan_hash,
    validate_plan,
)
from orchestrator.plan.workload import (
    RATE_UNITS,
    ClosedLoop,
    LengthDist,
    OpenLoop,
    PromptSpec,
    Workload,
    WorkloadKind,
    kind_of_doc,
)

__all__ = [
    "GPUS", "MODELS", "RATE_UNITS", "SERVICE_CLASSES", "Arm", "ArmLabels", "Bar", "ClosedLoop", "Design", "EngineConfig",
    "ExternalEndpoint", "GPUSpec", "GuardThresholds", "HeaderFromEnv", "LengthDist", "ModelSpec", "OpenLoop", "Plan", "PoolSpec",
    "PromptSpec", "RouterConfig", "SearchSettings", "ServiceClass", "SimSettings",
    "SpeculativeConfig", "Workload", "WorkloadKind", "canonical_gpu", "canonical_json", "gpu", "json_schema",
    "kind_of_doc", "load_plan_file", "load_plan_text", "plan_from_canonical", "plan_hash", "plan_warnings",
    "validate_plan",
]
