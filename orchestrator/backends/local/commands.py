"""Command lines of the local backend: what each engine worker and the router of an arm get.

Pure: it reads the plan, the ``Device`` and ``LocalSettings`` it is handed and the ports it
draws from the iterator it is handed, and asks the machine nothing (detection is ``device``,
free ports and processes are ``backend``). Golden-tested in tests/unit/test_local_commands.py;
see ``orchestrator.backends.local`` for what an arm becomes and why.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from orchestrator.backends.local.device import Device
from orchestrator.backends.local.settings import LocalSettings
from orchestrator.backends.vllm_env import TINY_MODEL_ID
from orchestrator.engines import Role, RouterTarget, ServeTarget, StaticWorkers, engine_for
from orchestrator.errors import EnvironmentProblem, PermanentError, UserError
from orchestrator.plan import GPUS, Arm, Plan

HOST = "127.0.0.1"
TASKSET = "taskset"  # util-linux: pins a CPU engine's process tree (children inherit it)


# -- the command lines -----------------------------------------------------------------------
@dataclass(frozen=True)
class ProcessSpec:
    """One process to start: its name, role, command line, the variables it adds, its port."""

    name: str  # worker-0, prefill-0, decode-1, router
    role: Literal["worker", "prefill", "decode", "router"]
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    port: int

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"


@dataclass(frozen=True)
class ArmLayout:
    """The processes of one arm and where load goes."""

    engines: tuple[ProcessSpec, ...]
    router: ProcessSpec
    router_metrics_port: int
    served_model: str
    kv_connector: str | None  # the connector actually configured (None when colocated)
    kv_dir: str | None  # ExampleConnector's shared storage folder
    router_policy: str

    @property
    def metrics_urls(self) -> tuple[str, ...]:
        return (*(f"{e.url}/metrics" for e in self.engines),
                f"http://{HOST}:{self.router_metrics_port}/metrics")

    def describe(self) -> str:
        """Human-readable text of every command line (the golden tests' format)."""
        out: list[str] = []
        for p in (*self.engines, self.router):
            out.append(f"# {p.name} ({p.role}) port {p.port}")
            out.extend(f"{k}={v}" for k, v in p.env)
            out.append(_wrap(p.argv))
            out.append("")
        return "\n".join(out)


def _wrap(argv: tuple[str, ...]) -> str:
    """One argument per line, flags with their values, shell-quoted."""
    lines: list[str] = []
    cur: list[str] = []
    for a in argv:
        if a.startswith("--") and cur:
            lines.append(" ".join(shlex.quote(x) for x in cur))
            cur = []
        cur.append(a)
    if cur:
        lines.append(" ".join(shlex.quote(x) for x in cur))
    return " \\\n    ".join(lines)


def model_source(plan: Plan, settings: LocalSettings) -> str:
    """What ``--model`` gets: the override, the tiny model, or the plan's hub id / path."""
    if settings.model_path:
        return settings.model_path
    hf_id = plan.model.hf_id or plan.model.name
    if hf_id == TINY_MODEL_ID:
        if not settings.tiny_model_dir:
            raise PermanentError(f"the plan serves {TINY_MODEL_ID} but no tiny model folder is set")
        return settings.tiny_model_dir
    return hf_id


def served_name(plan: Plan, arm: Arm | None = None) -> str:
    """The ``model`` field requests carry (the arm's engine adapter's rule, as on every backend)."""
    return engine_for(arm).served_name(plan)


def engine_python(arm: Arm, arm_name: str, settings: LocalSettings) -> str:
    """The interpreter of the arm's engine environment, or EnvironmentProblem naming the setting."""
    python = settings.python_for(arm.engine.kind)
    if python is None:
        raise EnvironmentProblem(
            f"arms.{arm_name} serves {arm.engine.kind}, but no {arm.engine.kind} environment is set "
            f"for the local backend: set ORCH_{arm.engine.kind.upper()}_PYTHON to the interpreter of an "
            f"environment with {arm.engine.kind} installed")
    return python


def engine_argv(
    plan: Plan, arm_name: str, role: Role, port: int, tp: int, device: Device,
    settings: LocalSettings, kv_dir: str | None, bootstrap_port: int | None = None,
) -> tuple[str, ...]:
    """The exact engine command line of one worker: the adapter's arguments behind its launcher
    for this box, run by the engine environment's interpreter (vLLM: ``vllm serve`` on a GPU
    box, the OpenAI server module with ``--model`` on CPU; SGLang: ``sglang.launch_server``)."""
    arm = plan.arm(arm_name)
    kind: Literal["cuda", "cpu"] = "cuda" if device.kind == "cuda" else "cpu"
    target = ServeTarget(model=model_source(plan, settings), host=HOST, port=port, tp=tp, role=role,
                         device=kind,
                         max_model_len=settings.cpu_max_model_len if device.kind == "cpu" else None,
                         kv_dir=kv_dir, bootstrap_port=bootstrap_port)
    adapter = engine_for(arm)
    return adapter.launcher(kind).argv(adapter.serve_args(plan, arm, target),
                                       python=engine_python(arm, arm_name, settings))


def router_argv(
    plan: Plan, arm_name: str, port: int, metrics_port: int, settings: LocalSettings,
    workers: list[str], prefill: list[str], decode: list[str], kv_connector: str | None,
    prefill_bootstrap_ports: tuple[int, ...] = (),
) -> tuple[str, ...]:
    """The arm's engine's router over the workers by URL (the adapter's arguments): vllm-router's
    executable, or a router module run by the engine environment's interpreter (SGLang's)."""
    arm = plan.arm(arm_name)
    adapter = engine_for(arm)
    target = RouterTarget(host=HOST, port=port, metrics_host=HOST, metrics_port=metrics_port,
                          workers=StaticWorkers(tuple(workers), tuple(prefill), tuple(decode),
                                                prefill_bootstrap_ports=prefill_bootstrap_ports,
                                                startup_check_s=2, startup_timeout_s=settings.router_startup_s),
                          kv_connector=kv_connector)
    head = ((settings.router,) if adapter.router_module is None
            else (engine_python(arm, arm_name, settings), *adapter.router_module))
    return (*head, *adapter.router_args(plan, arm_name, target))


def render_arm(
    plan: Plan, arm_name: str, device: Device, settings: LocalSettings, ports: Iterator[int],
    run_dir: Path, run_label: str,
) -> ArmLayout:
    """Every process of an arm: engines (GPUs assigned by TP) and the router. Pure but for
    ``ports``; raises PermanentError when the arm cannot run on ``device``."""
    arm = plan.arm(arm_name)
    if arm.external:
        raise UserError(f"arms.{arm_name} is an external endpoint: the local backend has nothing to start")
    if device.kind == "cuda":
        _check_gpus(arm, arm_name, device)
    kv_dir = str(run_dir / "kv")
    base_env: dict[str, str] = {"ORCH_RUN": run_label}
    if device.kind == "cpu":
        base_env |= {
            "VLLM_CPU_KVCACHE_SPACE": str(settings.cpu_kvcache_gib),
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
        }
    engines: list[ProcessSpec] = []
    urls: dict[str, list[str]] = {"worker": [], "prefill": [], "decode": []}
    bootstrap: list[int] = []  # prefill workers' KV hand-off ports (engines that have them)
    connector: str | None = None
    next_gpu = 0
    tps = [pool.tp for pool in arm.pools().values() for _ in range(pool.replicas)]
    shares = iter(cpu_shares(device.cpus, tps, settings.cpu_reserved) if device.kind == "cpu"
                  else [CpuShare(None, None)] * len(tps))
    adapter = engine_for(arm)
    for role, pool in arm.pools().items():
        kv = adapter.kv_connector(arm, role, "cuda" if device.kind == "cuda" else "cpu", kv_dir)
        if kv is not None:
            connector = kv.name
        for i in range(pool.replicas):
            port = next(ports)
            env = dict(base_env)
            share = next(shares)
            if share.omp_bind is not None:
                env["VLLM_CPU_OMP_THREADS_BIND"] = share.omp_bind
            if device.kind == "cuda":
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in range(next_gpu, next_gpu + pool.tp))
                next_gpu += pool.tp
                if kv is not None and kv.name == "NixlConnector" and adapter.kv_side_channel_env:
                    # Each NIXL agent on one host needs its own side-channel port.
                    env[adapter.kv_side_channel_env[1]] = str(next(ports))
            boot = None
            if kv is not None and role == "prefill" and adapter.bootstrap_port is not None:
                boot = next(ports)  # one host: each prefill worker its own bootstrap server
                bootstrap.append(boot)
            argv = engine_argv(plan, arm_name, role, port, pool.tp, device, settings, kv_dir, boot)
            if share.affinity is not None:
                argv = (TASKSET, "-c", share.affinity, *argv)
            spec = ProcessSpec(name=f"{role}-{i}", role=role,
                               argv=argv, env=tuple(sorted(env.items())), port=port)
            engines.append(spec)
            urls[role].append(spec.url)
    rport, mport = next(ports), next(ports)
    router = ProcessSpec(
        name="router", role="router",
        argv=router_argv(plan, arm_name, rport, mport, settings, urls["worker"], urls["prefill"],
                         urls["decode"], connector, tuple(bootstrap)),
        env=(("ORCH_RUN", run_label),), port=rport,
    )
    return ArmLayout(engines=tuple(engines), router=router, router_metrics_port=mport,
                     served_model=served_name(plan, arm), kv_connector=connector,
                     kv_dir=kv_dir if connector == "ExampleConnector" else None,
                     router_policy=plan.router_for(arm_name).policy)


@dataclass(frozen=True)
class CpuShare:
    """Where one CPU engine runs: ``affinity`` (taskset list for its whole process tree; None:
    unpinned) and ``omp_bind`` (``VLLM_CPU_OMP_THREADS_BIND``; None: vLLM's "auto")."""

    affinity: str | None
    omp_bind: str | None


def cpu_shares(cpus: tuple[int, ...], tps: list[int], reserved: int = 1) -> list[CpuShare]:
    """The cores of each engine of a CPU arm (``tps``: each engine's TP).

    ``reserved`` cores (the last allowed ones) are kept free of engines for the load generator
    and the router: an engine saturated by an overloaded point busy-polls (its scheduler and
    worker processes spin on shared memory), and a generator sharing those cores falls seconds
    behind its schedule (measured on 2 cores: p99 send lag 0.4-1.6 s unpinned, 1.5 ms pinned).
    Each engine's process tree is pinned to its share with taskset; when every core would be
    reserved, nothing is pinned.

    One engine keeps vLLM's own OpenMP binding inside its share ("auto", which leaves a core
    to its scheduler when it has two or more). With two or more engines, "auto" would bind them
    all to the same first cores, so the engines' cores are split into contiguous, disjoint
    shares, one per rank (the first ranks get one more when they do not divide evenly); an
    engine's ranks are joined by ``|`` (vLLM's form for TP on CPU). With fewer cores than
    ranks, ranks share cores round robin."""
    if not cpus:
        return [CpuShare(None, None)] * len(tps)
    pinned = 0 < reserved < len(cpus)
    own = list(cpus[: len(cpus) - reserved]) if pinned else list(cpus)
    ranks = sum(tps)
    if len(tps) == 1:
        return [CpuShare(_id_list(own) if pinned else None, None)]
    if len(own) < ranks:
        flat = [own[i % len(own)] for i in range(ranks)]
        per_rank = [[c] for c in flat]
    else:
        per_rank = _split(own, ranks)  # one share per rank: a TP-2 engine gets two
    out: list[CpuShare] = []
    at = 0
    for tp in tps:
        mine = per_rank[at:at + tp]
        at += tp
        cores = sorted({c for part in mine for c in part})
        out.append(CpuShare(_id_list(cores) if pinned else None, "|".join(_id_list(part) for part in mine)))
    return out


def _split(items: list[int], n: int) -> list[list[int]]:
    """``items`` in ``n`` contiguous parts, sizes differing by at most one (larger first)."""
    q, r = divmod(len(items), n)
    out: list[list[int]] = []
    at = 0
    for i in range(n):
        size = q + (1 if i < r else 0)
        out.append(items[at:at + size])
        at += size
    return out


def _id_list(ids: list[int]) -> str:
    """CPU ids in vLLM's list form: ``0-3,6``."""
    parts: list[str] = []
    start = prev = ids[0]
    for i in [*ids[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ",".join(parts)


def _check_gpus(arm: Arm, arm_name: str, device: Device) -> None:
    if arm.gpus > device.gpus:
        raise PermanentError(
            f"arm {arm_name} needs {arm.gpus} GPUs; this machine has {device.gpus}: "
            "lower replicas or tp, or use the kubernetes backend"
        )
    assert arm.gpu is not None  # plan validation: a provisioned arm names its GPU (external ones were refused)
    labels = [lbl.lower().replace("-", " ") for lbl in GPUS[arm.gpu].node_labels]
    have = device.name.lower().replace("-", " ")
    if device.name and not any(have.startswith(lbl) or lbl.startswith(have) for lbl in labels):
        raise PermanentError(
            f"arm {arm_name} asks for {arm.gpu} but this machine's GPUs are {device.name!r}: "
            f"change arms.{arm_name}.gpu or run where that GPU is"
        )


def sequential_ports(start: int) -> Iterator[int]:
    """Ports start, start+1, ... (golden tests)."""
    p = start
    while True:
        yield p
        p += 1
