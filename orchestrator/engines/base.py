"""What every backend asks an engine adapter: the engine's command line for one worker, the
router's command line over an arm's workers, and the names of the engine's metrics.

Pure (the plan in, strings out): a backend says *where* a process runs (``ServeTarget``,
``RouterTarget``: host, port, which launcher, how workers are found); the adapter alone says
*what* the engine and the router are asked to do, so an arm is the same engine on a
workstation, on a cluster and in the llm-d export.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from orchestrator.plan import Arm, Plan

Role = Literal["worker", "prefill", "decode"]


@dataclass(frozen=True)
class ServeTarget:
    """Where one engine process runs and what it is handed there."""

    model: str  # what the engine loads: a hub id or a local folder
    host: str
    port: int
    tp: int
    role: Role = "worker"
    device: Literal["cuda", "cpu"] = "cuda"
    max_model_len: int | None = None  # used where the arm sets none (a CPU box's smaller default)
    kv_dir: str | None = None  # shared storage of a storage-based KV connector (one host)
    bootstrap_port: int | None = None  # a prefill worker's KV hand-off port, where the engine has one


@dataclass(frozen=True)
class StaticWorkers:
    """Workers the router is told by URL (one host: local processes, sim servers)."""

    workers: tuple[str, ...] = ()
    prefill: tuple[str, ...] = ()
    decode: tuple[str, ...] = ()
    prefill_bootstrap_ports: tuple[int, ...] = ()  # beside ``prefill``, where the engine has them
    startup_check_s: int = 2
    startup_timeout_s: int | None = None


@dataclass(frozen=True)
class DiscoveredWorkers:
    """Workers the router finds by label selector (Kubernetes service discovery)."""

    namespace: str
    port: int
    run_selector: str  # e.g. orchestrator.dev/run=abc123
    role_label: str  # the label whose value is the pool's role


@dataclass(frozen=True)
class RouterTarget:
    host: str
    port: int
    metrics_host: str
    metrics_port: int
    workers: StaticWorkers | DiscoveredWorkers
    kv_connector: str | None = None  # the engine-side connector configured (None: colocated)


@dataclass(frozen=True)
class KvConnector:
    """The KV connector a P/D worker is configured with: its engine-side name and config."""

    name: str
    config: dict[str, object]


@dataclass(frozen=True)
class Launcher:
    """What a backend puts before an adapter's serve arguments: a command (an interpreter's
    ``-m module`` on the local backend, the container's command on Kubernetes) and, where the
    engine does not take the model as its first argument, the flag the model follows."""

    command: tuple[str, ...]
    model_flag: str | None = None

    def args(self, serve_args: Sequence[str]) -> tuple[str, ...]:
        """``serve_args`` (the model first) as this launcher takes them."""
        if self.model_flag is None:
            return tuple(serve_args)
        model, *flags = serve_args
        return (self.model_flag, model, *flags)

    def argv(self, serve_args: Sequence[str], python: str | None = None) -> tuple[str, ...]:
        """The whole command line (``python`` first when the command is a module's)."""
        head = (python,) if python is not None else ()
        return (*head, *self.command, *self.args(serve_args))


@dataclass(frozen=True)
class EngineMetrics:
    """The engine's Prometheus names a run reads (scrapes, guards, the report).

    An empty string: the engine exports no such series (SGLang has no per-request prefill and
    decode time histograms, for one). Readers then find no sample of that name and skip it;
    the simulated servers export nothing under it."""

    prefix: str  # every engine metric starts with it (what tells them from the process's own)
    running: str
    waiting: str
    kv_usage: str
    prefix_queries: str
    prefix_hits: str
    cache_config_info: str  # labels: block size, cache dtype, blocks (None where not exported)
    version_labels: tuple[str, ...]  # label keys that may carry the engine's version
    prompt_tokens: str  # counters (exported with a _total suffix)
    generation_tokens: str
    request_success: str
    preemptions: str
    ttft: str  # histograms (seconds)
    itl: str
    tpot: str  # per request
    tpot_per_token: str  # the older per-token histogram, where the per-request one is absent
    prefill_time: str
    decode_time: str


class EngineAdapter(Protocol):
    """One engine's command lines and names (``orchestrator.engines.engine_for``)."""

    kind: str
    metrics: EngineMetrics
    container: Launcher  # the serve command in the engine's image (Kubernetes)
    router_module: tuple[str, ...] | None  # ``-m module`` of its router; None: its own executable
    ready_path: str  # answers once the engine serves (Kubernetes startup and readiness probes)
    version_path: str  # GET: a JSON object whose "version" is the engine's
    bootstrap_port: int | None  # a P/D prefill worker's extra KV hand-off port (None: none)
    kv_side_channel_env: tuple[str, str] | None  # env names of a NIXL side channel (host, port)
    distributions: tuple[str, ...]  # package names whose installed version is the engine's

    def launcher(self, device: Literal["cuda", "cpu"]) -> Launcher:
        """The serve command behind an interpreter of the engine's environment (local backend)."""
        ...

    def pod_annotations(self, role: Role) -> dict[str, str]:
        """Annotations a worker pod of ``role`` carries for the engine's router (Kubernetes)."""
        ...

    def served_name(self, plan: Plan) -> str:
        """The model name requests carry and the engine serves under."""
        ...

    def kv_connector(self, arm: Arm, role: Role, device: str, kv_dir: str | None) -> KvConnector | None:
        """The connector of one worker (None for a colocated worker)."""
        ...

    def serve_args(self, plan: Plan, arm: Arm, target: ServeTarget) -> tuple[str, ...]:
        """The serve command's arguments: the model first, then flags."""
        ...

    def router_args(self, plan: Plan, arm_name: str, target: RouterTarget) -> tuple[str, ...]:
        """The router's arguments (without its executable)."""
        ...
