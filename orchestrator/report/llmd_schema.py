"""The part of llm-d-benchmark's benchmark report format v0.2 that the exporter writes, as strict
pydantic models (field names, required fields, enums and unit lists as that schema defines
them), so every exported report is checked against the format before it is written.

Structure: version, run {uid, eid, cid, time, user}, scenario {stack: [component], load},
results {request_performance {aggregate {requests, latency, throughput}}, observability}.
A component has metadata {kind, label, cfg_id, ...}, standardized (for kind inference_engine:
tool, tool_version, role replica|prefill|decode, model, accelerator {model, count,
parallelism {dp, ep, pp, tp}}) and native {args, envars, config}.
"""

from __future__ import annotations

import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

VERSION: Literal["0.2"] = "0.2"
UNITS_QUANTITY = ("count",)
UNITS_TIME = ("ms", "s")
UNITS_GEN_LATENCY = ("ms/token", "s/token")
UNITS_GEN_THROUGHPUT = ("tokens/s",)
UNITS_REQUEST_THROUGHPUT = ("queries/s",)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ComponentMetadata(_Strict):
    kind: Literal["inference_engine", "generic"]
    schema_version: str = "0.0.1"
    label: str
    cfg_id: str
    description: str | None = None


class Parallelism(_Strict):
    dp: int = Field(1, ge=1)
    ep: int = Field(1, ge=1)
    pp: int = Field(1, ge=1)
    tp: int = Field(1, ge=1)


class Accelerator(_Strict):
    model: str
    count: int = Field(ge=1)
    parallelism: Parallelism


class EngineModel(_Strict):
    name: str


class InferenceEngine(_Strict):
    tool: str
    tool_version: str
    role: Literal["replica", "prefill", "decode"]
    model: EngineModel
    accelerator: Accelerator


class Generic(BaseModel):
    """kind generic: tool and tool_version required, anything else allowed."""

    model_config = ConfigDict(extra="allow", frozen=True)
    tool: str
    tool_version: str


class ComponentNative(_Strict):
    args: dict[str, Any] | None = None
    envars: dict[str, Any] | None = None
    config: Any | None = None


class Component(_Strict):
    metadata: ComponentMetadata
    standardized: InferenceEngine | Generic
    native: ComponentNative

    @model_validator(mode="after")
    def _kind_matches(self) -> Component:
        engine = isinstance(self.standardized, InferenceEngine)
        if engine != (self.metadata.kind == "inference_engine"):
            raise ValueError(f"component {self.metadata.label}: standardized does not match kind {self.metadata.kind}")
        return self


class SequenceLength(_Strict):
    distribution: Literal["fixed", "gaussian", "random", "other"]
    value: float = Field(ge=1)
    std_dev: float | None = Field(None, ge=0)
    min: int | None = Field(None, ge=0)
    max: int | None = Field(None, ge=1)


class LoadPrefix(_Strict):
    prefix_len: SequenceLength
    num_groups: int = Field(ge=1)
    num_users_per_group: int = Field(ge=1)
    num_prefixes: int = Field(ge=1)


class MultiTurn(_Strict):
    enabled: bool = True
    max_turns: SequenceLength | None = None


class LoadStandardized(_Strict):
    tool: str
    tool_version: str
    source: Literal["random", "sampled"]
    stage: int = Field(0, ge=0)
    input_seq_len: SequenceLength
    output_seq_len: SequenceLength | None = None
    prefix: LoadPrefix | None = None
    multi_turn: MultiTurn | None = None
    rate_qps: float | None = Field(None, gt=0)
    concurrency: int | float | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _concurrency(self) -> LoadStandardized:
        if isinstance(self.concurrency, float) and self.concurrency != float("inf"):
            raise ValueError("concurrency must be an integer or .inf")
        return self


class LoadMetadata(_Strict):
    schema_version: str = "0.0.1"
    cfg_id: str | None = None
    description: str | None = None


class Load(_Strict):
    metadata: LoadMetadata
    standardized: LoadStandardized
    native: ComponentNative


class Statistics(_Strict):
    units: str
    mean: float
    stddev: float | None = Field(None, ge=0)
    min: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None


def _units(stat: Statistics | None, allowed: tuple[str, ...], what: str) -> None:
    if stat is not None and stat.units not in allowed:
        raise ValueError(f"{what}: units {stat.units!r} must be one of {allowed}")


class AggregateRequests(_Strict):
    total: int = Field(ge=0)
    failures: int | None = Field(None, ge=0)
    incomplete: int | None = Field(None, ge=0)
    input_length: Statistics | None = None
    output_length: Statistics | None = None

    @model_validator(mode="after")
    def _check(self) -> AggregateRequests:
        _units(self.input_length, UNITS_QUANTITY, "input_length")
        _units(self.output_length, UNITS_QUANTITY, "output_length")
        return self


class AggregateLatency(_Strict):
    time_to_first_token: Statistics | None = None
    normalized_time_per_output_token: Statistics | None = None
    time_per_output_token: Statistics | None = None
    inter_token_latency: Statistics | None = None
    request_latency: Statistics | None = None

    @model_validator(mode="after")
    def _check(self) -> AggregateLatency:
        _units(self.time_to_first_token, UNITS_TIME, "time_to_first_token")
        _units(self.normalized_time_per_output_token, UNITS_GEN_LATENCY, "normalized_time_per_output_token")
        _units(self.time_per_output_token, UNITS_GEN_LATENCY, "time_per_output_token")
        _units(self.inter_token_latency, UNITS_GEN_LATENCY, "inter_token_latency")
        _units(self.request_latency, UNITS_TIME, "request_latency")
        return self


class AggregateThroughput(_Strict):
    input_token_rate: Statistics | None = None
    output_token_rate: Statistics | None = None
    total_token_rate: Statistics | None = None
    requests_rate: Statistics | None = None

    @model_validator(mode="after")
    def _check(self) -> AggregateThroughput:
        for name in ("input_token_rate", "output_token_rate", "total_token_rate"):
            _units(getattr(self, name), UNITS_GEN_THROUGHPUT, name)
        _units(self.requests_rate, UNITS_REQUEST_THROUGHPUT, "requests_rate")
        return self


class AggregateRequestPerformance(_Strict):
    requests: AggregateRequests | None = None
    latency: AggregateLatency | None = None
    throughput: AggregateThroughput | None = None


class RequestPerformance(_Strict):
    aggregate: AggregateRequestPerformance | None = None


class Observability(BaseModel):
    """Permissive in v0.2 (its schema is not defined yet)."""

    model_config = ConfigDict(extra="allow", frozen=True)


class Results(_Strict):
    request_performance: RequestPerformance | None = None
    observability: Observability | None = None


class RunTime(_Strict):
    start: datetime.datetime | None = None
    end: datetime.datetime | None = None
    duration: str | None = None


class Run(_Strict):
    uid: str | None = None
    eid: str | None = None
    cid: str | None = None
    time: RunTime | None = None
    user: str | None = None


class Scenario(_Strict):
    stack: list[Component] | None = None
    load: Load | None = None


class BenchmarkReport(_Strict):
    version: Literal["0.2"] = VERSION
    run: Run
    scenario: Scenario | None = None
    results: Results

    def dump(self) -> dict[str, Any]:
        """As the format's own tools write it: JSON types, no empty fields."""
        return self.model_dump(mode="json", exclude_none=True)
