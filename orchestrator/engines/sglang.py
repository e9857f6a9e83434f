"""SGLang and its router (sglang_router): every flag and metric name of theirs the project uses
is written here.

The serve arguments are ``python -m sglang.launch_server``'s (the model first here; the
launchers put it behind ``--model-path``). Written against SGLang 0.5.23 (its
``ServerArgs.add_cli_args`` and ``sglang_router`` 0.3.2's ``RouterArgs.add_cli_args``), and
checked by those parsers in ``tests/sglang/test_rendered_commands.py`` where an SGLang
environment is given.

How the plan's knobs map (vLLM's meaning on the left):

- ``max_num_seqs`` -> ``--max-running-requests``; ``max_num_batched_tokens`` (the per-step
  token budget, prompts chunked beyond it) -> ``--chunked-prefill-size`` and
  ``--max-prefill-tokens``;
- ``gpu_memory_utilization`` -> ``--mem-fraction-static`` (SGLang's share of GPU memory for
  weights and the KV pool: the nearest knob, not the same quantity);
- ``prefix_caching: false`` -> ``--disable-radix-cache``; ``kv_cache_dtype: fp8`` -> ``fp8_e4m3``;
  ``max_model_len`` -> ``--context-length``; ``quantization: fp8`` -> ``--quantization fp8``;
- speculative: ngram -> NGRAM, eagle -> EAGLE, eagle3 -> EAGLE3, draft_model -> STANDALONE,
  mtp -> NEXTN (the model's own MTP layers), k draft tokens as ``--speculative-num-steps k``,
  ``--speculative-eagle-topk 1`` and ``--speculative-num-draft-tokens k+1`` (a chain);
- P/D: ``--disaggregation-mode prefill|decode`` with ``--disaggregation-transfer-backend`` the
  arm's ``kv_connector`` (nixl or mooncake; the plan refuses the others for SGLang); a prefill
  worker's bootstrap server (``--disaggregation-bootstrap-port``) is where decode fetches KV.

Metrics: SGLang has no per-request prefill or decode time histogram, no per-token TPOT
histogram beside the per-request one, and no cache-config info series: those names are empty
(``EngineMetrics``: not exported). Its prefix cache counts cached prompt tokens
(``sglang:cached_tokens_total``) against all prompt tokens (``sglang:prompt_tokens_total``),
so the queries counter is the prompt-token counter.
"""

from __future__ import annotations

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

# The plan's connector -> SGLang's --disaggregation-transfer-backend.
TRANSFER_BACKENDS = {"nixl": "nixl", "mooncake": "mooncake"}
SPECULATIVE_ALGORITHMS = {"ngram": "NGRAM", "eagle": "EAGLE", "eagle3": "EAGLE3",
                          "draft_model": "STANDALONE", "mtp": "NEXTN"}
KV_CACHE_DTYPES = {"auto": "auto", "fp8": "fp8_e4m3"}
BOOTSTRAP_PORT = 8998  # SGLang's default --disaggregation-bootstrap-port
# The annotation sglang_router's service discovery reads a prefill pod's bootstrap port from.
BOOTSTRAP_ANNOTATION = "sglang.ai/bootstrap-port"

METRICS = EngineMetrics(
    prefix="sglang:",
    running="sglang:num_running_reqs",
    waiting="sglang:num_queue_reqs",
    kv_usage="sglang:token_usage",
    prefix_queries="sglang:prompt_tokens",
    prefix_hits="sglang:cached_tokens",
    cache_config_info="",
    version_labels=(),  # its series carry no version (GET /get_server_info has it)
    prompt_tokens="sglang:prompt_tokens",
    generation_tokens="sglang:generation_tokens",
    request_success="sglang:num_requests",
    preemptions="sglang:num_retracted_requests",  # SGLang retracts where vLLM preempts
    ttft="sglang:time_to_first_token_seconds",
    itl="sglang:inter_token_latency_seconds",
    tpot="sglang:request_time_per_output_token_seconds",
    tpot_per_token="",
    prefill_time="",
    decode_time="",
)


class SglangAdapter:
    kind: str = "sglang"
    metrics: EngineMetrics = METRICS
    # The lmsysorg/sglang image has no entry point of its own; it ships sglang_router too.
    container: Launcher = Launcher(("python3", "-m", "sglang.launch_server"), "--model-path")
    router_module: tuple[str, ...] | None = ("-m", "sglang_router.launch_router")
    ready_path: str = "/health"  # 503 while starting, 200 once it serves
    version_path: str = "/get_server_info"  # its "version" among the server's settings
    bootstrap_port: int | None = BOOTSTRAP_PORT
    kv_side_channel_env: tuple[str, str] | None = None
    distributions: tuple[str, ...] = ("sglang",)

    def launcher(self, device: Literal["cuda", "cpu"]) -> Launcher:
        return Launcher(("-m", "sglang.launch_server"), "--model-path")

    def pod_annotations(self, role: Role) -> dict[str, str]:
        return {BOOTSTRAP_ANNOTATION: str(BOOTSTRAP_PORT)} if role == "prefill" else {}

    def served_name(self, plan: Plan) -> str:
        return plan.model.hf_id or plan.model.name

    def kv_connector(self, arm: Arm, role: Role, device: str, kv_dir: str | None) -> KvConnector | None:
        """The transfer backend of a P/D worker. Both of SGLang's move KV between GPUs; it has
        no CPU path (nor a shared-folder one), so a CPU box cannot run its P/D mode."""
        if role == "worker" or arm.layout != "disaggregated":
            return None
        wanted = arm.kv_connector or "nixl"
        if wanted not in TRANSFER_BACKENDS:
            raise PermanentError(f"kv_connector {wanted}: SGLang's P/D moves KV with nixl or mooncake only")
        if device != "cuda":
            raise PermanentError("SGLang's P/D mode needs GPUs (its nixl and mooncake transfer backends "
                                 "have no CPU path): run it on a GPU box, or colocate the arm")
        backend = TRANSFER_BACKENDS[wanted]
        return KvConnector(backend, {"disaggregation_mode": role, "transfer_backend": backend})

    def speculative_args(self, arm: Arm) -> list[str]:
        spec = arm.engine.speculative
        if spec is None:
            return []
        k = spec.num_speculative_tokens
        args = ["--speculative-algorithm", SPECULATIVE_ALGORITHMS[spec.method]]
        if spec.method == "ngram":
            return [*args, "--speculative-num-draft-tokens", str(k)]
        if spec.draft_model:
            args += ["--speculative-draft-model-path", spec.draft_model]
        return [*args, "--speculative-num-steps", str(k), "--speculative-eagle-topk", "1",
                "--speculative-num-draft-tokens", str(k + 1)]

    def serve_args(self, plan: Plan, arm: Arm, target: ServeTarget) -> tuple[str, ...]:
        eng = arm.engine
        args = [target.model, "--served-model-name", self.served_name(plan),
                "--host", target.host, "--port", str(target.port),
                "--tp-size", str(target.tp),
                "--max-running-requests", str(eng.max_num_seqs),
                "--chunked-prefill-size", str(eng.max_num_batched_tokens),
                "--max-prefill-tokens", str(eng.max_num_batched_tokens),
                "--kv-cache-dtype", KV_CACHE_DTYPES[eng.kv_cache_dtype],
                "--enable-metrics"]
        if not eng.prefix_caching:
            args += ["--disable-radix-cache"]
        if target.device == "cuda":
            args += ["--mem-fraction-static", f"{eng.gpu_memory_utilization:g}"]
        else:
            args += ["--device", "cpu"]
        max_len = eng.max_model_len or target.max_model_len
        if max_len:
            args += ["--context-length", str(max_len)]
        if eng.quantization != "none":
            args += ["--quantization", eng.quantization]
        args += self.speculative_args(arm)
        kv = self.kv_connector(arm, target.role, target.device, target.kv_dir)
        if kv is not None:
            args += ["--disaggregation-mode", target.role, "--disaggregation-transfer-backend", kv.name]
            if target.role == "prefill" and target.bootstrap_port is not None:
                args += ["--disaggregation-bootstrap-port", str(target.bootstrap_port)]
        return (*args, *eng.extra_args)

    def router_args(self, plan: Plan, arm_name: str, target: RouterTarget) -> tuple[str, ...]:
        """sglang_router with the arm's policy, or in P/D mode (prefill workers with their
        bootstrap ports). Retries and the circuit breaker are off, as for vLLM's router."""
        rc = plan.router_for(arm_name)
        args: list[Any] = ["--host", target.host, "--port", str(target.port),
                           "--prometheus-host", target.metrics_host, "--prometheus-port", str(target.metrics_port),
                           "--log-level", "warn", "--disable-retries", "--disable-circuit-breaker"]
        w = target.workers
        pd = plan.arm(arm_name).layout == "disaggregated"
        if isinstance(w, DiscoveredWorkers):
            args += ["--service-discovery", "--service-discovery-port", str(w.port),
                     "--service-discovery-namespace", w.namespace]
            if pd:  # prefill pods' bootstrap ports: their annotation (pod_annotations)
                args += ["--pd-disaggregation",
                         "--prefill-selector", w.run_selector, f"{w.role_label}=prefill",
                         "--decode-selector", w.run_selector, f"{w.role_label}=decode"]
            else:
                args += ["--selector", w.run_selector, f"{w.role_label}=worker"]
        else:
            args += ["--worker-startup-check-interval", str(w.startup_check_s)]
            if w.startup_timeout_s is not None:
                args += ["--worker-startup-timeout-secs", str(w.startup_timeout_s)]
            if pd:
                args += ["--pd-disaggregation"]
                ports = list(w.prefill_bootstrap_ports)
                for i, u in enumerate(w.prefill):
                    args += ["--prefill", u, str(ports[i]) if i < len(ports) else "none"]
                for u in w.decode:
                    args += ["--decode", u]
            else:
                args += ["--worker-urls", *w.workers]
        args += ["--policy", rc.policy]
        if rc.policy == "cache_aware":
            args += ["--cache-threshold", f"{rc.cache_threshold:g}",
                     "--balance-abs-threshold", str(rc.balance_abs_threshold)]
        return tuple(args)


SGLANG = SglangAdapter()
