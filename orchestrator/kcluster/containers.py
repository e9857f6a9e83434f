"""What the kubelet runs for a container spec: the simulated engine for a vLLM container, the
real ``vllm-router`` for a router container, and, for an image a test registers
(``EmulatedCluster.run_on_host``), the container's own command on this machine
(``host_launch``: its ConfigMap and emptyDir volumes are folders here).

A vLLM container's command line is read the way ``vllm serve`` reads it (the flags the
backend renders and the common others); a flag vLLM would reject, or a value it could not
parse, makes the container exit with vLLM's words (exit 2 for the command line, 1 for a start-up
failure such as more tensor-parallel ranks than GPUs) and the pod crash-loops. The flags the
simulated engine models are handed to ``orch sim serve``; the rest are accepted and ignored
(``ACCEPTED_NOT_MODELLED``). The GPU comes from the node's ``nvidia.com/gpu.product`` label,
the role from the pod's ``orchestrator/role`` label (worker -> both).

The router's arguments go to the real binary unchanged except that ``0.0.0.0`` binds become the
pod IP (the pod's own network namespace, here a loopback address); its Kubernetes service
discovery reaches the emulated API server through KUBECONFIG (kube-rs reads it before falling
back to in-cluster config), so discovery is the router's own list + watch of pods.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator.backends.sim import router_binary
from orchestrator.plan import GPUS, MODELS

Obj = dict[str, Any]
ROLE_LABEL = "orchestrator/role"
KV_CACHE_DTYPES = ("auto", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla")
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
ACCEPTED_NOT_MODELLED = (
    "--gpu-memory-utilization", "--max-model-len", "--quantization", "--speculative-config",
    "--dtype", "--block-size", "--swap-space", "--enforce-eager", "--trust-remote-code",
    "--disable-log-stats", "--disable-log-requests", "--enable-log-requests",
    "--enable-chunked-prefill", "--pipeline-parallel-size", "--data-parallel-size",
    "--max-num-partial-prefills", "--uvicorn-log-level", "--download-dir", "--load-format",
    "--async-scheduling", "--compilation-config", "--generation-config", "--api-key",
)


class ContainerError(Exception):
    """The container exits at start: ``exit_code`` and what it printed last."""

    def __init__(self, message: str, exit_code: int = 1):
        super().__init__(message)
        self.message, self.exit_code = message, exit_code


class MountPending(ContainerError):
    """A volume cannot be set up yet (its ConfigMap does not exist): the container waits in
    ContainerCreating with a FailedMount event, as the kubelet retries the mount."""


@dataclass
class Launch:
    """A process to start for a container."""

    kind: str  # "vllm" | "router"
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    port: int = 8000
    details: dict[str, Any] = field(default_factory=dict)


def is_vllm(c: Obj) -> bool:
    cmd = [*(c.get("command") or []), *(c.get("args") or [])]
    return "vllm-openai" in (c.get("image") or "") or cmd[:2] == ["vllm", "serve"] or any(
        "vllm.entrypoints.openai.api_server" in a for a in cmd[:3])


def is_router(c: Obj) -> bool:
    cmd = c.get("command") or []
    return "vllm-router" in (c.get("image") or "") or bool(cmd and cmd[0].endswith("vllm-router"))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ContainerError(f"vllm serve: error: {message}", exit_code=2)


def _kv_transfer_config(text: str) -> dict[str, Any]:
    try:
        cfg = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"Value {text} cannot be converted to KVTransferConfig: {e}") from e
    if not isinstance(cfg, dict):
        raise argparse.ArgumentTypeError(f"Value {text} cannot be converted to KVTransferConfig")
    if not cfg.get("kv_connector"):
        raise argparse.ArgumentTypeError("KVTransferConfig: kv_connector is required")
    if cfg.get("kv_role") not in KV_ROLES:
        raise argparse.ArgumentTypeError(f"Unsupported kv_role: {cfg.get('kv_role')}. Supported roles are {list(KV_ROLES)}")
    return cfg


def _json_object(text: str) -> dict[str, Any]:
    try:
        out = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(f"invalid JSON {text!r}: {e}") from e
    if not isinstance(out, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text!r}")
    return out


def _unit_float(text: str) -> float:
    v = float(text)
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"gpu_memory_utilization must be in (0, 1], got {v}")
    return v


def vllm_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="vllm serve", add_help=False, allow_abbrev=False)
    p.add_argument("model_tag", nargs="?")
    p.add_argument("--model")
    p.add_argument("--served-model-name", nargs="+")
    p.add_argument("--host", default=None)
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1)
    p.add_argument("--pipeline-parallel-size", "-pp", type=int, default=1)
    p.add_argument("--data-parallel-size", "-dp", type=int, default=1)
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default="auto")
    p.add_argument("--max-num-seqs", type=int)
    p.add_argument("--max-num-batched-tokens", type=int)
    p.add_argument("--gpu-memory-utilization", type=_unit_float, default=0.9)
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--quantization", "-q")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-size", type=int)
    p.add_argument("--swap-space", type=float)
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=None)
    p.add_argument("--kv-transfer-config", type=_kv_transfer_config)
    p.add_argument("--speculative-config", type=_json_object)
    p.add_argument("--compilation-config", type=_json_object)
    p.add_argument("--generation-config")
    p.add_argument("--max-num-partial-prefills", type=int)
    p.add_argument("--uvicorn-log-level")
    p.add_argument("--download-dir")
    p.add_argument("--load-format")
    p.add_argument("--api-key")
    for flag in ("--enforce-eager", "--trust-remote-code", "--disable-log-stats",
                 "--disable-log-requests", "--enable-log-requests"):
        p.add_argument(flag, action="store_true")
    return p


def vllm_command_args(c: Obj) -> list[str]:
    """The arguments after ``vllm serve`` (or the api_server module) of a container."""
    cmd = [*(c.get("command") or []), *(c.get("args") or [])]
    if cmd[:2] == ["vllm", "serve"]:
        return cmd[2:]
    for i, a in enumerate(cmd[:3]):
        if "vllm.entrypoints.openai.api_server" in a:
            return cmd[i + 1:]
    if not c.get("command"):  # the image's entrypoint is `vllm serve` (vllm-openai)
        return list(c.get("args") or [])
    raise ContainerError(f'exec: "{cmd[0] if cmd else ""}": executable file not found in $PATH', exit_code=127)


def model_name(model: str) -> str:
    for m in MODELS.values():
        if model in (m.name, m.hf_id):
            return m.name
    raise ContainerError(
        f"OSError: {model} is not a local folder and is not a valid model identifier listed on "
        "'https://huggingface.co/models' (the emulator serves the catalog models: "
        f"{', '.join(m.hf_id or m.name for m in MODELS.values())})")


def gpu_name(product: str | None) -> str:
    for g in GPUS.values():
        if product in g.node_labels:
            return g.name
    raise ContainerError(f"RuntimeError: the emulator has no GPU model for node product {product!r}")


def vllm_launch(c: Obj, pod: Obj, node: Obj, pod_ip: str) -> Launch:
    """``orch sim serve`` for a vLLM container (ContainerError if vLLM would not start)."""
    args = vllm_parser().parse_args(vllm_command_args(c))
    model = args.model or args.model_tag
    if not model:
        raise ContainerError("vllm serve: error: the following arguments are required: model_tag", 2)
    name = model_name(model)
    gpus = int(float(((c.get("resources") or {}).get("limits") or {}).get("nvidia.com/gpu", 0)))
    world = args.tensor_parallel_size * args.pipeline_parallel_size
    if world > gpus:
        raise ContainerError(f"ValueError: World size ({world}) is larger than the number of available "
                             f"GPUs ({gpus}) in this node. If this is intentional, use a Ray cluster.")
    if args.pipeline_parallel_size != 1 or args.data_parallel_size != 1:
        raise ContainerError("RuntimeError: the emulator models tensor parallelism only")
    if (args.max_num_seqs and args.max_num_batched_tokens
            and args.max_num_batched_tokens < args.max_num_seqs):
        raise ContainerError(f"ValueError: max_num_batched_tokens ({args.max_num_batched_tokens}) must be "
                             f"greater than or equal to max_num_seqs ({args.max_num_seqs}).")
    labels = (node.get("metadata") or {}).get("labels") or {}
    gpu = gpu_name(labels.get("nvidia.com/gpu.product"))
    role = {"worker": "both", "prefill": "prefill", "decode": "decode"}.get(
        ((pod.get("metadata") or {}).get("labels") or {}).get(ROLE_LABEL, "worker"), "both")
    served = args.served_model_name[0] if args.served_model_name else model
    kv = "fp8" if args.kv_cache_dtype.startswith("fp8") else "auto"
    argv = [sys.executable, "-m", "orchestrator.cli.main", "sim", "serve", "--model", name, "--gpu", gpu,
            "--tp", str(args.tensor_parallel_size), "--role", role, "--kv-cache-dtype", kv,
            "--served-model-name", served, "--host", pod_ip, "--port", str(args.port),
            "--seed", str(args.seed)]
    if args.max_num_seqs:
        argv += ["--max-num-seqs", str(args.max_num_seqs)]
    if args.max_num_batched_tokens:
        argv += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    if args.enable_prefix_caching is False:
        argv += ["--no-prefix-caching"]
    details = {"model": name, "served_model_name": served, "gpu": gpu, "tp": args.tensor_parallel_size,
               "role": role, "kv_cache_dtype": args.kv_cache_dtype, "max_num_seqs": args.max_num_seqs,
               "max_num_batched_tokens": args.max_num_batched_tokens,
               "prefix_caching": args.enable_prefix_caching is not False,
               "kv_transfer_config": args.kv_transfer_config}
    return Launch("vllm", argv, port=args.port, details=details)


def router_launch(c: Obj, pod_ip: str, kubeconfig: str) -> Launch:
    """The real vllm-router with the container's arguments (0.0.0.0 binds become the pod IP)."""
    binary = router_binary()
    if binary is None:
        raise ContainerError('exec: "vllm-router": executable file not found in $PATH', exit_code=127)
    args = list(c.get("args") or [])
    cmd = list(c.get("command") or [])
    if cmd[1:]:
        args = [*cmd[1:], *args]
    out = []
    for i, a in enumerate(args):
        if i > 0 and args[i - 1] in ("--host", "--prometheus-host") and a in ("0.0.0.0", "::", "[::]"):
            a = pod_ip
        out.append(a)
    port = 30000
    for i, a in enumerate(out[:-1]):
        if a == "--port":
            port = int(out[i + 1]) if out[i + 1].isdigit() else port
    if "--host" not in out:  # the router's default (127.0.0.1) would not be reachable from other pods
        pass
    return Launch("router", [binary, *out], env={"KUBECONFIG": kubeconfig}, port=port,
                  details={"args": out})


def container_env(c: Obj, pod: Obj, lookup: Any) -> dict[str, str]:
    """The container's env with ``fieldRef`` resolved and secret/configMap refs read through
    ``lookup(kind, name, key)`` (ContainerError CreateContainerConfigError when one is missing)."""
    out: dict[str, str] = {}
    meta, status, spec = pod.get("metadata") or {}, pod.get("status") or {}, pod.get("spec") or {}
    fields = {"status.podIP": status.get("podIP", ""), "metadata.name": meta.get("name", ""),
              "metadata.namespace": meta.get("namespace", ""), "spec.nodeName": spec.get("nodeName", ""),
              "status.hostIP": status.get("hostIP", ""), "metadata.uid": meta.get("uid", ""),
              "spec.serviceAccountName": spec.get("serviceAccountName", "")}
    for e in c.get("env") or []:
        if "value" in e:
            out[e["name"]] = str(e["value"])
            continue
        vf = e.get("valueFrom") or {}
        if "fieldRef" in vf:
            out[e["name"]] = str(fields.get(vf["fieldRef"].get("fieldPath", ""), ""))
        for kind, ref_key in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
            if ref_key in vf:
                ref = vf[ref_key]
                value = lookup(kind, ref.get("name"), ref.get("key"))
                if value is None and not ref.get("optional"):
                    raise ContainerError(f'{kind.lower()} "{ref.get("name")}" not found', exit_code=-1)
                if value is not None:
                    out[e["name"]] = value
    return out


def host_launch(c: Obj, pod: Obj, executables: dict[str, str], root: Path,
                configmap: Callable[[str], dict[str, str] | None]) -> Launch:
    """The container's command (``command`` + ``args``) as a process here: each mounted
    ConfigMap (its keys as files) and emptyDir is a folder under ``root``, and the arguments and
    env values under a mount path are rewritten to it; the program (``python``) is mapped
    through ``executables``. The image's own entrypoint is not known: a command is required."""
    volumes = {v.get("name"): v for v in (pod.get("spec") or {}).get("volumes") or []}
    mounts: dict[str, str] = {}
    for m in c.get("volumeMounts") or []:
        vol = volumes.get(m.get("name")) or {}
        folder = root / str(m.get("name"))
        folder.mkdir(parents=True, exist_ok=True)
        if "configMap" in vol:
            name = vol["configMap"].get("name", "")
            data = configmap(name)
            if data is None:
                raise MountPending(f'MountVolume.SetUp failed for volume "{m.get("name")}" : '
                                   f'configmap "{name}" not found')
            for key, text in data.items():
                (folder / key).write_text(text)
        elif "emptyDir" not in vol:
            raise ContainerError(f"volume {m.get('name')!r}: the emulated kubelet mounts configMap and "
                                 "emptyDir volumes only", exit_code=1)
        mounts[m["mountPath"].rstrip("/")] = str(folder)

    def here(arg: str) -> str:
        for path in sorted(mounts, key=len, reverse=True):
            if arg == path or arg.startswith(path + "/"):
                return mounts[path] + arg[len(path):]
        return arg

    argv = [*(c.get("command") or []), *(c.get("args") or [])]
    if not argv:
        raise ContainerError(f"image {c.get('image')!r}: no command (the image's entrypoint is not emulated)")
    # A pod has a network namespace of its own; here it is its loopback address: a bind to every
    # address (0.0.0.0) becomes one to the pod's IP, so pods can serve on the same port.
    pod_ip = (pod.get("status") or {}).get("podIP") or ""
    argv = [pod_ip if pod_ip and i > 0 and argv[i - 1] == "--host" and a in ("0.0.0.0", "::") else a
            for i, a in enumerate(argv)]
    env = {e["name"]: here(str(e["value"])) for e in c.get("env") or [] if "value" in e}
    return Launch("host", [executables.get(argv[0], argv[0]), *(here(a) for a in argv[1:])], env=env,
                  details={"mounts": mounts})
