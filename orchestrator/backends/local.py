"""The local backend: real vLLM engines and the real vllm-router as processes on this machine.

A user with one GPU box and no Kubernetes runs ``backend: local``; on a machine without a GPU
the same code runs vLLM's CPU build (``make vllm``) with the tiny model, so the whole pipeline
is proven against the real engine.

What an arm becomes (``render_arm``, pure and golden-tested):
- one ``vllm serve`` process per worker. On a GPU box each gets ``CUDA_VISIBLE_DEVICES`` with
  its TP-many GPUs (prefill pool first, then decode); on CPU, ``VLLM_CPU_KVCACHE_SPACE`` sizes
  the KV cache. The GPU form is the ``vllm`` console entry point's module
  (``python -m vllm.entrypoints.cli.main serve``), exactly ``vllm serve``; the CPU packaging
  (``vllm-cpu``) breaks the console command, so there the OpenAI server module runs directly.
- disaggregated arms: ``--kv-transfer-config`` with NixlConnector on GPUs; on CPU, where NIXL
  has no transport, ExampleConnector (the shared-storage connector): the producer writes each
  prompt's KV to a folder of the run, the consumer reads it back (``external_prefix_cache_hits``).
- ``vllm-router`` in front: the plan's policy over the workers, or its P/D mode
  (``--vllm-pd-disaggregation``: prefill with max_tokens 1, then decode). Retries and the
  circuit breaker are off: a retried request would hide a failure the guards must count.

Every process runs in its own process group, logs to a file in the run's folder, carries
``ORCH_RUN=<slug>`` in its environment, and is listed in a state file so ``cleanup`` finds the
leftovers of a crashed controller.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx
from pydantic import Field

from orchestrator.backends.base import Deployment, Endpoint, RunKey
from orchestrator.backends.processes import (
    ChildProcess,
    StateFile,
    free_port,
    start_process,
)
from orchestrator.backends.vllm_env import TINY_MODEL_ID, VllmEnv
from orchestrator.errors import PermanentError, TransientError
from orchestrator.plan import GPUS, Arm, Plan
from orchestrator.plan.base import StrictModel

HOST = "127.0.0.1"
ENGINE_MODULE_GPU = ("-m", "vllm.entrypoints.cli.main", "serve")  # what `vllm serve` runs
ENGINE_MODULE_CPU = ("-m", "vllm.entrypoints.openai.api_server")
READY_PROMPT = "baba babe babi babo babu"
READY_TOKENS = 4


# -- where and how ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Device:
    """What the engines run on: ``cuda`` with ``gpus`` GPUs named ``name``, or ``cpu``."""

    kind: Literal["cuda", "cpu"]
    gpus: int = 0
    name: str = ""

    @classmethod
    def detect(cls) -> Device:
        """GPUs as nvidia-smi lists them (respecting CUDA_VISIBLE_DEVICES), else the CPU."""
        smi = shutil.which("nvidia-smi")
        if smi:
            try:
                out = subprocess.run(
                    [smi, "--query-gpu=name", "--format=csv,noheader"],
                    capture_output=True, text=True, timeout=20, check=True,
                ).stdout
                names = [n.strip() for n in out.splitlines() if n.strip()]
                visible = os.environ.get("CUDA_VISIBLE_DEVICES")
                if visible is not None:
                    keep = [int(i) for i in visible.split(",") if i.strip().isdigit()]
                    names = [names[i] for i in keep if i < len(names)]
                if names:
                    return cls(kind="cuda", gpus=len(names), name=names[0])
            except (OSError, subprocess.SubprocessError, ValueError):
                pass
        return cls(kind="cpu", gpus=0, name=_cpu_name())


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "cpu"


class LocalSettings(StrictModel):
    """How the local backend starts engines; defaults fit the CPU environment of ``make vllm``."""

    python: str = Field(description="Interpreter of the vLLM environment (runs the engines).")
    router: str = Field(description="The vllm-router executable.")
    model_path: str | None = Field(
        default=None,
        description="Weights folder or hub id served instead of the plan's model.hf_id "
        f"(the plan's id {TINY_MODEL_ID!r} always means the tiny model of `make vllm`).",
    )
    tiny_model_dir: str | None = Field(default=None, description="Folder of the tiny model.")
    cpu_kvcache_gib: int = Field(default=1, ge=1, description="CPU: KV cache size, GiB per engine.")
    cpu_max_model_len: int = Field(
        default=1024, ge=16, description="CPU: context length when the plan sets none."
    )
    router_startup_s: int = Field(
        default=600, ge=1, description="How long the router waits for its workers to answer."
    )
    stop_grace_s: float = Field(
        default=15.0, gt=0, description="Teardown: seconds between SIGTERM and SIGKILL."
    )
    check_version: bool = Field(
        default=True, description="Refuse an arm whose engine.version differs from the installed vLLM."
    )

    @classmethod
    def from_env(cls, env: VllmEnv | None = None, **over: Any) -> LocalSettings:
        """Settings pointing at the vLLM environment built by ``make vllm`` (or ORCH_VLLM_PYTHON)."""
        env = env or VllmEnv.default()
        python = os.environ.get("ORCH_VLLM_PYTHON") or str(env.python)
        router = _router_binary() or "vllm-router"
        return cls(python=python, router=router, tiny_model_dir=str(env.model_dir), **over)


def _router_binary() -> str | None:
    beside = Path(sys.executable).parent / "vllm-router"
    if beside.exists():
        return str(beside)
    return shutil.which("vllm-router")


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
    import shlex

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


def served_name(plan: Plan) -> str:
    """The ``model`` field requests carry (the same rule as the sim backend)."""
    return plan.model.hf_id or plan.model.name


def _connector_config(arm: Arm, role: str, device: Device, kv_dir: str) -> tuple[str, dict[str, Any]]:
    """(connector name, --kv-transfer-config) of a prefill or decode worker."""
    wanted = arm.kv_connector or "nixl"
    if wanted == "lmcache":
        if device.kind == "cpu":
            raise PermanentError("kv_connector lmcache does not run on CPU (LMCache needs CUDA); "
                                 "use nixl or example")
        return "LMCacheConnectorV1", {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}
    if wanted == "nixl" and device.kind == "cuda":
        return "NixlConnector", {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
    # example, or nixl on CPU (NIXL has no CPU-to-CPU transport here): shared storage.
    kv_role = "kv_producer" if role == "prefill" else "kv_consumer"
    return "ExampleConnector", {
        "kv_connector": "ExampleConnector",
        "kv_role": kv_role,
        "kv_connector_extra_config": {"shared_storage_path": kv_dir},
    }


def _speculative_config(arm: Arm) -> dict[str, Any] | None:
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
        cfg.pop("method")  # vLLM infers a draft model from `model`
    return cfg


def engine_argv(
    plan: Plan, arm_name: str, role: str, port: int, tp: int, device: Device,
    settings: LocalSettings, kv_config: dict[str, Any] | None,
) -> tuple[str, ...]:
    """The exact engine command line of one worker."""
    arm = plan.arm(arm_name)
    eng = arm.engine
    model = model_source(plan, settings)
    if device.kind == "cuda":
        argv: list[str] = [settings.python, *ENGINE_MODULE_GPU, model]
    else:
        argv = [settings.python, *ENGINE_MODULE_CPU, "--model", model]
    argv += ["--served-model-name", served_name(plan), "--host", HOST, "--port", str(port)]
    argv += ["--tensor-parallel-size", str(tp)]
    argv += ["--max-num-seqs", str(eng.max_num_seqs)]
    argv += ["--max-num-batched-tokens", str(eng.max_num_batched_tokens)]
    argv += ["--kv-cache-dtype", eng.kv_cache_dtype]
    argv += ["--enable-prefix-caching" if eng.prefix_caching else "--no-enable-prefix-caching"]
    if device.kind == "cuda":
        argv += ["--gpu-memory-utilization", f"{eng.gpu_memory_utilization:g}"]
    max_len = eng.max_model_len or (settings.cpu_max_model_len if device.kind == "cpu" else None)
    if max_len:
        argv += ["--max-model-len", str(max_len)]
    if eng.quantization != "none":
        argv += ["--quantization", eng.quantization]
    spec = _speculative_config(arm)
    if spec is not None:
        argv += ["--speculative-config", json.dumps(spec, sort_keys=True, separators=(",", ":"))]
    if kv_config is not None:
        argv += ["--kv-transfer-config", json.dumps(kv_config, sort_keys=True, separators=(",", ":"))]
    argv += list(eng.extra_args)
    return tuple(argv)


def router_argv(
    plan: Plan, arm_name: str, port: int, metrics_port: int, settings: LocalSettings,
    workers: list[str], prefill: list[str], decode: list[str], kv_connector: str | None,
) -> tuple[str, ...]:
    """vllm-router over the workers with the arm's policy, or in P/D mode."""
    rc = plan.router_for(arm_name)
    argv = [settings.router, "--host", HOST, "--port", str(port),
            "--prometheus-host", HOST, "--prometheus-port", str(metrics_port),
            "--log-level", "warning", "--disable-retries", "--disable-circuit-breaker",
            "--worker-startup-timeout-secs", str(settings.router_startup_s)]
    if prefill:
        argv += ["--vllm-pd-disaggregation"]
        for u in prefill:
            argv += ["--prefill", u]
        for u in decode:
            argv += ["--decode", u]
        if kv_connector == "NixlConnector":
            argv += ["--kv-connector", "nixl"]
    else:
        argv += ["--worker-urls", *workers]
    argv += ["--policy", rc.policy]
    if rc.policy == "cache_aware":
        argv += ["--cache-threshold", f"{rc.cache_threshold:g}",
                 "--balance-abs-threshold", str(rc.balance_abs_threshold)]
    return tuple(argv)


def render_arm(
    plan: Plan, arm_name: str, device: Device, settings: LocalSettings, ports: Iterator[int],
    run_dir: Path, run_label: str,
) -> ArmLayout:
    """Every process of an arm: engines (GPUs assigned by TP) and the router. Pure but for
    ``ports``; raises PermanentError when the arm cannot run on ``device``."""
    arm = plan.arm(arm_name)
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
    connector: str | None = None
    next_gpu = 0
    for role, pool in arm.pools().items():
        kv_config = None
        if role != "worker":
            connector, kv_config = _connector_config(arm, role, device, kv_dir)
        for i in range(pool.replicas):
            port = next(ports)
            env = dict(base_env)
            if device.kind == "cuda":
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in range(next_gpu, next_gpu + pool.tp))
                next_gpu += pool.tp
                if connector == "NixlConnector":
                    # Each NIXL agent on one host needs its own side-channel port.
                    env["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(next(ports))
            argv = engine_argv(plan, arm_name, role, port, pool.tp, device, settings, kv_config)
            spec = ProcessSpec(name=f"{role}-{i}", role=role,  # type: ignore[arg-type]
                               argv=argv, env=tuple(sorted(env.items())), port=port)
            engines.append(spec)
            urls[role].append(spec.url)
    rport, mport = next(ports), next(ports)
    router = ProcessSpec(
        name="router", role="router",
        argv=router_argv(plan, arm_name, rport, mport, settings, urls["worker"], urls["prefill"],
                         urls["decode"], connector),
        env=(("ORCH_RUN", run_label),), port=rport,
    )
    return ArmLayout(engines=tuple(engines), router=router, router_metrics_port=mport,
                     served_model=served_name(plan), kv_connector=connector,
                     kv_dir=kv_dir if connector == "ExampleConnector" else None)


def _check_gpus(arm: Arm, arm_name: str, device: Device) -> None:
    if arm.gpus > device.gpus:
        raise PermanentError(
            f"arm {arm_name} needs {arm.gpus} GPUs; this machine has {device.gpus}: "
            "lower replicas or tp, or use the kubernetes backend"
        )
    labels = [lbl.lower().replace("-", " ") for lbl in GPUS[arm.gpu].node_labels]
    have = device.name.lower().replace("-", " ")
    if device.name and not any(have.startswith(lbl) or lbl.startswith(have) for lbl in labels):
        raise PermanentError(
            f"arm {arm_name} asks for {arm.gpu} but this machine's GPUs are {device.name!r}: "
            "change arms.{arm_name}.gpu or run where that GPU is"
        )


def sequential_ports(start: int) -> Iterator[int]:
    """Ports start, start+1, ... (golden tests)."""
    p = start
    while True:
        yield p
        p += 1


def free_ports() -> Iterator[int]:
    """Ports free on the loopback right now, none repeated."""
    seen: set[int] = set()
    while True:
        p = free_port(HOST)
        if p not in seen:
            seen.add(p)
            yield p


# -- the backend -----------------------------------------------------------------------------
class LocalBackend:
    """Real vLLM engines and vllm-router as local processes (GPU box, or CPU with the tiny model)."""

    name = "local"

    def __init__(
        self,
        state_dir: Path,
        settings: LocalSettings | None = None,
        device: Device | None = None,
        log: Callable[[str], None] = print,
    ):
        self.state_dir = Path(state_dir)
        self.settings = settings or LocalSettings.from_env()
        self.device = device or Device.detect()
        self.log = log
        self._engine_info: dict[str, Any] | None = None

    # -- environment ----------------------------------------------------------------------------
    def engine_info(self) -> dict[str, Any]:
        """vLLM and torch versions of the engine interpreter (asked once)."""
        if self._engine_info is None:
            if not Path(self.settings.python).exists():
                raise PermanentError(
                    f"the vLLM environment is missing ({self.settings.python}): run `make vllm`"
                )
            probe = ("import json, importlib.metadata as m, torch\n"
                     "def v(d):\n"
                     "    try: return m.version(d)\n"
                     "    except m.PackageNotFoundError: return None\n"
                     "print(json.dumps({'vllm': v('vllm') or v('vllm-cpu'), 'torch': torch.__version__}))")
            try:
                out = subprocess.run([self.settings.python, "-c", probe], capture_output=True,
                                     text=True, timeout=120, check=True).stdout
                self._engine_info = json.loads(out.strip().splitlines()[-1])
            except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
                raise PermanentError(f"cannot read the vLLM environment's versions: {e}") from e
        return dict(self._engine_info)

    def fingerprint(self, arm: Arm, layout: ArmLayout) -> dict[str, Any]:
        info = self.engine_info()
        cuda = self.device.kind == "cuda"
        return {
            "backend": "local",
            "engine_version": info["vllm"],
            "torch_version": info["torch"],
            "device": self.device.kind,
            "device_name": self.device.name,
            "gpu_type": arm.gpu if cuda else "cpu",
            "nodes": [socket.gethostname()],
            "node_pool": "local",
            "driver": "vllm",
            "kv_connector": layout.kv_connector,
            "topology": f"vllm-router {_policy(layout)}" + (" P/D" if layout.kv_connector else ""),
        }

    # -- deploy ---------------------------------------------------------------------------------
    def _run_dir(self, key: RunKey) -> Path:
        return self.state_dir / key.experiment / key.slug

    def _state(self, key: RunKey) -> StateFile:
        return StateFile(self._run_dir(key) / "processes.json")

    def render(self, plan: Plan, arm: str, key: RunKey, ports: Iterator[int] | None = None) -> ArmLayout:
        return render_arm(plan, arm, self.device, self.settings, ports or free_ports(),
                          self._run_dir(key), key.slug)

    def deploy(self, plan: Plan, arm: str, key: RunKey) -> Deployment:
        spec = plan.arm(arm)
        info = self.engine_info()
        if self.settings.check_version:
            want = spec.engine.version.lstrip("v")
            if want != info["vllm"]:
                raise PermanentError(
                    f"arms.{arm}.engine.version is {spec.engine.version} but the local vLLM is "
                    f"{info['vllm']}: set the version to {info['vllm']} or install vLLM {want}"
                )
        layout = self.render(plan, arm, key)
        run_dir = self._run_dir(key)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "commands.txt").write_text(layout.describe())
        if layout.kv_dir:
            Path(layout.kv_dir).mkdir(parents=True, exist_ok=True)
        state = self._state(key)
        procs: list[ChildProcess] = []
        try:
            for p in (*layout.engines, layout.router):
                procs.append(start_process(p.name, list(p.argv), p.port, run_dir / f"{p.name}.log",
                                           env=dict(p.env)))
                state.write(procs)
        except OSError as e:
            for p in reversed(procs):
                _stop_group(p.pid)
            state.remove()
            raise PermanentError(f"cannot start the local arm {arm}: {e}") from e
        return Deployment(
            key=key,
            endpoint=Endpoint(url=layout.router.url, model=layout.served_model,
                              metrics_urls=layout.metrics_urls),
            fingerprint=self.fingerprint(spec, layout),
            handles={"procs": procs, "engines": [e.url for e in layout.engines],
                     "router": layout.router.url, "kv_dir": layout.kv_dir},
        )

    # -- ready / scrape / teardown ----------------------------------------------------------------
    def ready(self, deployment: Deployment, deadline_s: float) -> None:
        """Every engine's /health, then the router's, then a test completion that must return
        exactly the asked tokens (ignore_eos honoured)."""
        deadline = time.monotonic() + deadline_s
        procs: list[ChildProcess] = deployment.handles.get("procs", [])
        pending = list(deployment.handles.get("engines", []))
        router = deployment.handles.get("router", deployment.endpoint.url)
        last = "engines starting"
        with httpx.Client(timeout=10.0) as client:
            while time.monotonic() < deadline:
                dead = [p for p in procs if not p.alive()]
                if dead:
                    raise PermanentError(
                        f"{dead[0].role} exited during start-up (log {dead[0].log}); log tail:\n"
                        f"{_tail(Path(dead[0].log))}"
                    )
                try:
                    pending = [u for u in pending if not _healthy(client, u)]
                    if pending:
                        last = f"waiting for {len(pending)} engine(s): {pending[0]}/health"
                    elif not _healthy(client, router):
                        last = f"waiting for the router {router}/health"
                    else:
                        got = _test_completion(client, deployment.endpoint)
                        if got == READY_TOKENS:
                            return
                        raise PermanentError(
                            f"the test completion asked {READY_TOKENS} tokens with ignore_eos and got "
                            f"{got}: the engine does not honour the output limit"
                        )
                except (httpx.HTTPError, ValueError, KeyError) as e:
                    last = f"{type(e).__name__}: {e}"
                time.sleep(0.5)
        raise TransientError(f"local arm not ready within {deadline_s:.0f}s (last: {last})", delay=5.0)

    def scrape(self, deployment: Deployment) -> dict[str, str]:
        out: dict[str, str] = {}
        with httpx.Client(timeout=10.0) as client:
            for url in deployment.endpoint.metrics_urls:
                try:
                    r = client.get(url)
                except httpx.HTTPError as e:
                    raise TransientError(f"cannot scrape {url}: {e}") from e
                if r.status_code == 200:
                    out[url] = r.text
        return out

    def alive(self, deployment: Deployment) -> bool:
        """Whether every process of the deployment still runs."""
        return all(p.alive() for p in deployment.handles.get("procs", []))

    def teardown(self, deployment: Deployment) -> None:
        procs = deployment.handles.get("procs") or self._state(deployment.key).read()
        for p in reversed(procs):  # router first, then engines
            _stop_group(p.pid, self.settings.stop_grace_s)
        kv_dir = deployment.handles.get("kv_dir")
        if kv_dir:
            shutil.rmtree(kv_dir, ignore_errors=True)
        self._state(deployment.key).remove()

    def cleanup(self, experiment: str) -> int:
        removed = 0
        for state_path in (self.state_dir / experiment).glob("*/processes.json"):
            for p in reversed(StateFile(state_path).read()):
                removed += int(_stop_group(p.pid, self.settings.stop_grace_s))
            shutil.rmtree(state_path.parent / "kv", ignore_errors=True)
            StateFile(state_path).remove()
        return removed


def _policy(layout: ArmLayout) -> str:
    argv = layout.router.argv
    return argv[argv.index("--policy") + 1]


def _healthy(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(f"{url}/health").status_code == 200
    except httpx.HTTPError:
        return False


def _test_completion(client: httpx.Client, endpoint: Endpoint) -> int:
    r = client.post(
        f"{endpoint.url}/v1/completions",
        json={"model": endpoint.model, "prompt": READY_PROMPT, "max_tokens": READY_TOKENS,
              "ignore_eos": True, "temperature": 1.0, "stream": False},
        timeout=120.0,
    )
    if r.status_code != 200:
        raise ValueError(f"test completion: HTTP {r.status_code}: {r.text[:200]}")
    return int(r.json()["usage"]["completion_tokens"])


# vLLM and vllm-router rename themselves (setproctitle: "VLLM::EngineCore", "vllm::router"),
# which also overwrites /proc/PID/environ; so ownership is read from the command line, and
# only of group leaders we started (pgid == pid) and their group.
OWN_MARKERS = ("vllm::", "vllm.entrypoints", "vllm-router", "vllm_router", "orchestrator")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ours(pid: int) -> bool:
    cmd = _cmdline(pid).lower()
    return any(m in cmd for m in OWN_MARKERS)


def group_members(pgid: int) -> list[int]:
    """Live pids whose process group is ``pgid``: the leader and what it spawned (EngineCore,
    workers), which may outlive their leader."""
    out: list[int] = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # Fields after the command: state, ppid, pgrp, ...; zombies are already dead.
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def _stop_group(pgid: int, grace_s: float = 15.0) -> bool:
    """SIGTERM the process group of a leader we started, SIGKILL what is left after
    ``grace_s``; True if something was stopped. A group none of whose members is ours (a
    reused pid) is left alone."""
    members = group_members(pgid)
    if not members or not any(_ours(pid) for pid in members):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and group_members(pgid):
        _reap(pgid)
        time.sleep(0.1)
    if group_members(pgid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        for _ in range(100):
            _reap(pgid)
            if not group_members(pgid):
                break
            time.sleep(0.05)
    _reap(pgid)
    return True


def _reap(pid: int) -> None:
    """Collect the exit status of a child of ours, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
