"""Arms: what one serving configuration is (GPU, layout, pools, engine knobs, router), or,
for backend external, where an already running stack serves and what it is (labels)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from orchestrator.plan.base import CrossFieldError, StrictModel, omit_while
from orchestrator.plan.catalog import SGLANG_IMAGE_TAG, VLLM_IMAGE_TAG, canonical_gpu
from orchestrator.plan.external import ArmLabels, ExternalEndpoint

TP_SIZES = (1, 2, 4, 8)
RouterPolicy = Literal["round_robin", "cache_aware", "power_of_two", "consistent_hash", "random"]
EngineKind = Literal["vllm", "sglang"]
KvConnectorName = Literal["nixl", "example", "lmcache", "mooncake"]
# What each engine's P/D mode can move KV with (the adapters map them to the engine's names):
# vLLM's connectors, SGLang's transfer backends (--disaggregation-transfer-backend).
KV_CONNECTORS_OF: dict[str, tuple[str, ...]] = {
    "vllm": ("nixl", "example", "lmcache"),
    "sglang": ("nixl", "mooncake"),
}
# The policies of each engine's router (sglang_router has no consistent_hash).
ROUTER_POLICIES_OF: dict[str, tuple[str, ...]] = {
    "vllm": ("round_robin", "cache_aware", "power_of_two", "consistent_hash", "random"),
    "sglang": ("round_robin", "cache_aware", "power_of_two", "random"),
}
ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang"}


class SpeculativeConfig(StrictModel):
    """Speculative decoding: a drafter proposes tokens, the model verifies them in one pass."""

    method: Literal["ngram", "eagle", "eagle3", "draft_model", "mtp"] = Field(
        description="Drafting method, as vLLM's speculative_config.method."
    )
    num_speculative_tokens: int = Field(ge=1, le=16, description="Draft tokens per pass (k).")
    acceptance: float = Field(
        default=0.7,
        gt=0,
        lt=1,
        description="Expected per-token acceptance rate (alpha); used by the simulator only.",
    )
    draft_cost: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="Cost of one draft step as a fraction of a model pass (c); simulator only.",
    )
    draft_model: str | None = Field(
        default=None, description="Drafter model id (method draft_model or eagle)."
    )


class EngineConfig(StrictModel):
    """The serving engine and the knobs the plan controls (each adapter maps them to its flags)."""

    kind: EngineKind = Field(
        default="vllm",
        description="Serving engine: vllm, or sglang (SGLang's server and sglang_router).",
    )
    kv_cache_dtype: Literal["auto", "fp8"] = Field(
        default="auto", description="KV cache precision (--kv-cache-dtype); fp8 halves it."
    )
    quantization: Literal["none", "fp8"] = Field(
        default="none", description="Weight quantization applied at load (--quantization)."
    )
    max_num_seqs: int = Field(default=256, ge=1, le=65536, description="Most sequences in one batch (at most 65536).")
    max_num_batched_tokens: int = Field(
        default=8192,
        ge=16,
        le=4_194_304,
        description="Per-step token budget; prompts longer than it are chunked (chunked prefill); "
        "at most 4194304.",
    )
    prefix_caching: bool = Field(default=True, description="Automatic prefix caching on or off.")
    gpu_memory_utilization: float = Field(
        default=0.90, gt=0.1, le=0.99, description="Share of GPU memory vLLM may use."
    )
    max_model_len: int | None = Field(
        default=None, ge=16, le=16_777_216, description="Longest context served; default: the model's (at most 16777216)."
    )
    speculative: SpeculativeConfig | None = Field(
        default=None, description="Speculative decoding, or none."
    )
    version: str = Field(
        default=VLLM_IMAGE_TAG,
        description="Engine version (image tag on Kubernetes; checked locally). Default: the tested one "
        f"({VLLM_IMAGE_TAG} for vllm, {SGLANG_IMAGE_TAG} for sglang).",
    )
    extra_args: tuple[str, ...] = Field(
        default=(), max_length=256,
        description="Further engine arguments (`vllm serve`, `sglang.launch_server`) passed through unchanged "
        "(at most 256).",
    )

    @model_validator(mode="before")
    @classmethod
    def _engine_version(cls, data: object) -> object:
        # An SGLang engine without a version runs the tested SGLang release, not vLLM's tag.
        if isinstance(data, dict) and data.get("kind") == "sglang" and "version" not in data:
            return {**data, "version": SGLANG_IMAGE_TAG}
        return data

    @model_serializer(mode="wrap")
    def _omit_default_kind(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Added after plans were registered: a vLLM engine (the default) leaves it out, so
        # every earlier plan keeps its canonical JSON and hash.
        return omit_while(handler(self), {"kind": "vllm"})

    @model_validator(mode="after")
    def _sglang_knobs(self) -> EngineConfig:
        spec = self.speculative
        if self.kind == "sglang" and spec is not None and spec.method in ("eagle", "eagle3", "draft_model") \
                and not spec.draft_model:
            raise CrossFieldError([("speculative.draft_model", f"SGLang's {spec.method} drafting needs the "
                                    "drafter's model: give draft_model")])
        return self


class RouterConfig(StrictModel):
    """How requests are spread over the replicas of an arm (vllm-router)."""

    policy: RouterPolicy = Field(default="round_robin", description="Routing policy.")
    cache_threshold: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="cache_aware: minimum prefix-match share to follow the cache.",
    )
    balance_abs_threshold: int = Field(
        default=32,
        ge=0,
        le=1_000_000,
        description="cache_aware: load difference (requests) beyond which it balances instead (at most 1000000).",
    )


class PoolSpec(StrictModel):
    """A pool of identical vLLM workers."""

    replicas: int = Field(ge=1, le=64, description="Workers in the pool (at most 64).")
    tp: int = Field(default=1, description="Tensor-parallel size of each worker (GPUs per worker): 1, 2, 4 or 8.")

    @field_validator("tp")
    @classmethod
    def _tp_size(cls, v: int) -> int:
        if v not in TP_SIZES:
            raise ValueError(f"tp must be one of {TP_SIZES}")
        return v


def router_policy_problem(kind: str, policy: str) -> str:
    """Why ``kind``'s router cannot run ``policy`` (one line, for the field's path)."""
    return (f"{ENGINE_NAMES[kind]}'s router has no {policy} policy: use one of "
            f"{', '.join(ROUTER_POLICIES_OF[kind])}")


# Fields that provision an arm: an external arm (already running) sets none of them.
PoolRole = Literal["worker", "prefill", "decode"]  # the keys of Arm.pools()
PROVISIONING_FIELDS = ("gpu", "layout", "replicas", "tp", "prefill", "decode", "kv_connector", "engine", "router")


class Arm(StrictModel):
    """One serving configuration: colocated replicas, or prefill and decode pools; or, with
    ``endpoint`` (backend external), a stack that already runs, described by ``labels``."""

    gpu: str | None = Field(
        default=None, description="GPU type: H100-PCIe, H100-SXM (alias H100) or H200 (external arms: labels.gpu)."
    )
    layout: Literal["colocated", "disaggregated"] | None = Field(
        default=None,
        description="colocated: each worker prefills and decodes; disaggregated: separate pools "
        "(external arms: labels.layout).",
    )
    replicas: int | None = Field(
        default=None, ge=1, le=64, description="colocated: number of workers (at most 64)."
    )
    tp: int = Field(default=1, description="colocated: tensor-parallel size of each worker: 1, 2, 4 or 8.")
    prefill: PoolSpec | None = Field(default=None, description="disaggregated: the prefill pool.")
    decode: PoolSpec | None = Field(default=None, description="disaggregated: the decode pool.")
    kv_connector: KvConnectorName | None = Field(
        default=None,
        description="disaggregated: how KV moves from prefill to decode (default nixl). vllm: nixl, "
        "example or lmcache; sglang: nixl or mooncake (its transfer backends).",
    )
    engine: EngineConfig = Field(default_factory=EngineConfig, description="The serving engine and its knobs.")
    router: RouterConfig | None = Field(
        default=None, description="Router for this arm; default: the plan's router."
    )
    description: str = Field(default="", description="Free text shown in reports.")
    endpoint: ExternalEndpoint | None = Field(
        default=None, description="backend external: the running stack's URL and served model."
    )
    labels: ArmLabels | None = Field(
        default=None, description="backend external: what serves behind the endpoint (for history)."
    )

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str | None) -> str | None:
        return None if v is None else canonical_gpu(v)

    @field_validator("tp")
    @classmethod
    def _tp_size(cls, v: int) -> int:
        if v not in TP_SIZES:
            raise ValueError(f"tp must be one of {TP_SIZES}")
        return v

    @model_validator(mode="before")
    @classmethod
    def _default_connector(cls, data: object) -> object:
        if isinstance(data, dict) and data.get("layout") == "disaggregated":
            data.setdefault("kv_connector", "nixl")
        return data

    @model_serializer(mode="wrap")
    def _omit_unset_external(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Absent external fields are left out of the dump, so every plan written before they
        # existed keeps its canonical JSON and hash (and its history its configuration ids);
        # an external arm leaves out the provisioning fields it never has.
        out = handler(self)
        if isinstance(out, dict):
            drop = PROVISIONING_FIELDS if self.endpoint is not None else ("endpoint", "labels")
            for key in drop:
                out.pop(key, None)
        return out

    @model_validator(mode="after")
    def _layout_fields(self) -> Arm:
        if self.endpoint is not None:
            return self._external_fields()
        problems: list[tuple[str, str]] = []
        if self.labels is not None:
            problems.append(("labels", "labels describe external arms (with an `endpoint`); "
                                       "a provisioned arm is described by its own fields"))
        for name in ("gpu", "layout"):
            if getattr(self, name) is None:
                problems.append((name, "required field is missing (or give an `endpoint` with backend external)"))
        if problems:
            raise CrossFieldError(problems)
        if self.layout == "colocated":
            if self.replicas is None:
                problems.append(("replicas", "a colocated arm needs `replicas`"))
            for pool in ("prefill", "decode"):
                if getattr(self, pool) is not None:
                    problems.append((pool, "a colocated arm has no prefill/decode pools"))
            if self.kv_connector is not None:
                problems.append(("kv_connector", "applies to disaggregated arms only"))
        else:
            for pool in ("prefill", "decode"):
                if getattr(self, pool) is None:
                    problems.append((pool, "a disaggregated arm needs both a prefill and a decode pool"))
            if self.replicas is not None:
                problems.append(("replicas", "a disaggregated arm sets replicas per pool"))
            if self.prefill and self.decode and self.decode.tp < self.prefill.tp:
                problems.append(
                    ("decode.tp", f"decode TP ({self.decode.tp}) must be >= prefill TP ({self.prefill.tp})")
                )
        problems.extend(self._engine_speaks())
        if problems:
            raise CrossFieldError(problems)
        return self

    def _engine_speaks(self) -> list[tuple[str, str]]:
        """What the arm's engine cannot express: a KV connector or a router policy it lacks."""
        kind = self.engine.kind
        out: list[tuple[str, str]] = []
        known = KV_CONNECTORS_OF[kind]
        if self.layout == "disaggregated" and self.kv_connector is not None and self.kv_connector not in known:
            out.append(("kv_connector", f"{ENGINE_NAMES[kind]} P/D has no {self.kv_connector} connector: "
                                        f"use {' or '.join(known)}"))
        if self.router is not None and self.router.policy not in ROUTER_POLICIES_OF[kind]:
            out.append(("router.policy", router_policy_problem(kind, self.router.policy)))
        return out

    def _external_fields(self) -> Arm:
        problems = [
            (name, "an external arm is already running and is not provisioned: describe it under "
                   "`labels` (gpu, layout, replicas, engine_version, tags)")
            for name in PROVISIONING_FIELDS
            if getattr(self, name) != type(self).model_fields[name].get_default(call_default_factory=True)
            # kv_connector is filled in for a disaggregated layout, which is reported itself
            and not (name == "kv_connector" and self.layout is not None)
        ]
        if problems:
            raise CrossFieldError(problems)
        return self

    @property
    def external(self) -> bool:
        """An already running stack behind ``endpoint`` (backend external)."""
        return self.endpoint is not None

    @property
    def gpus(self) -> int:
        """GPUs this arm occupies in all (an external arm: as its labels say, default 1)."""
        if self.endpoint is not None:
            lab = self.labels or ArmLabels()
            return lab.gpus or lab.replicas or 1
        if self.layout == "colocated":
            return (self.replicas or 0) * self.tp
        assert self.prefill and self.decode
        return self.prefill.replicas * self.prefill.tp + self.decode.replicas * self.decode.tp

    def pools(self) -> dict[PoolRole, PoolSpec]:
        """Role -> pool: {'worker': ...} when colocated, {'prefill': ..., 'decode': ...} otherwise.
        An external arm: one pool of its labelled replicas (what the prefix-hit estimate needs)."""
        if self.endpoint is not None:
            return {"worker": PoolSpec(replicas=min((self.labels or ArmLabels()).replicas or 1, 64))}
        if self.layout == "colocated":
            return {"worker": PoolSpec(replicas=self.replicas or 1, tp=self.tp)}
        assert self.prefill and self.decode
        return {"prefill": self.prefill, "decode": self.decode}
