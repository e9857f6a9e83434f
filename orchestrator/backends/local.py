"""The local backend: real vLLM engines and the real vllm-router as processes on this machine.

A user with one GPU box and no Kubernetes runs ``backend: local``; on a machine without a GPU
the same code runs vLLM's CPU build (``make vllm``) with the tiny model, so the whole pipeline
is proven against the real engine.

What an arm becomes (``local_commands.render_arm``, pure and golden-tested):
- one ``vllm serve`` process per worker. On a GPU box each gets ``CUDA_VISIBLE_DEVICES`` with
  its TP-many GPUs (prefill pool first, then decode); on CPU, ``VLLM_CPU_KVCACHE_SPACE`` sizes
  the KV cache; one core is kept free for the load generator and the engines' process trees
  are pinned to the others (taskset: a saturated engine busy-polls, and a generator sharing its
  cores falls behind its schedule); with two or more engines, ``VLLM_CPU_OMP_THREADS_BIND``
  gives each its own share of those cores (vLLM's "auto" would bind them all to the same ones). The GPU form is the ``vllm`` console entry point's module
  (``python -m vllm.entrypoints.cli.main serve``), exactly ``vllm serve``; the CPU packaging
  (``vllm-cpu``) breaks the console command, so there the OpenAI server module runs directly.
- disaggregated arms: ``--kv-transfer-config`` with NixlConnector on GPUs; on CPU, where NIXL
  has no transport, ExampleConnector (the shared-storage connector): the producer writes each
  prompt's KV to a folder of the run, the consumer reads it back (``external_prefix_cache_hits``).
- ``vllm-router`` in front: the plan's policy over the workers, or its P/D mode
  (``--vllm-pd-disaggregation``: prefill with max_tokens 1, then decode). Retries and the
  circuit breaker are off: a retried request would hide a failure the guards must count.

Every process runs in its own process group (teardown stops the whole group, so EngineCore
and worker children go too), logs to a file in the run's folder (commands.txt beside them),
carries ``ORCH_RUN=<slug>`` in its environment, and is listed in a state file so ``cleanup``
finds the leftovers of a crashed controller.
"""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from orchestrator.backends.base import Deployment, Endpoint, RunKey
from orchestrator.backends.http import scrape_urls
from orchestrator.backends.local_commands import (
    HOST,
    TASKSET,
    ArmLayout,
    CpuShare,
    Device,
    LocalSettings,
    ProcessSpec,
    cpu_shares,
    engine_argv,
    free_ports,
    model_source,
    render_arm,
    router_argv,
    sequential_ports,
    served_name,
)
from orchestrator.backends.processes import (
    ChildProcess,
    StateFile,
    group_members,
    start_process,
    stop_group,
)
from orchestrator.errors import PermanentError, TransientError
from orchestrator.plan import Arm, Plan

__all__ = [
    "HOST", "ArmLayout", "Device", "LocalBackend", "LocalSettings", "ProcessSpec", "CpuShare",
    "cpu_shares", "engine_argv",
    "free_ports", "group_members", "model_source", "render_arm", "router_argv",
    "sequential_ports", "served_name", "stop_group",
]

READY_PROMPT = "baba babe babi babo babu"
READY_TOKENS = 4


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
        if any(e.argv[0] == TASKSET for e in layout.engines) and shutil.which(TASKSET) is None:
            raise PermanentError(
                "CPU engines are pinned with taskset, which is not installed: install util-linux, "
                "or set LocalSettings.cpu_reserved to 0 (the load generator then shares the engines' cores)"
            )
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
                stop_group(p.pid)
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
        return scrape_urls(deployment.endpoint.metrics_urls, timeout_s=10.0)

    def alive(self, deployment: Deployment) -> bool:
        """Whether every process of the deployment still runs."""
        return all(p.alive() for p in deployment.handles.get("procs", []))

    def teardown(self, deployment: Deployment) -> None:
        procs = deployment.handles.get("procs") or self._state(deployment.key).read()
        for p in reversed(procs):  # router first, then engines
            stop_group(p.pid, self.settings.stop_grace_s)
        kv_dir = deployment.handles.get("kv_dir")
        if kv_dir:
            shutil.rmtree(kv_dir, ignore_errors=True)
        self._state(deployment.key).remove()

    def cleanup(self, experiment: str) -> int:
        removed = 0
        for state_path in (self.state_dir / experiment).glob("*/processes.json"):
            for p in reversed(StateFile(state_path).read()):
                removed += int(stop_group(p.pid, self.settings.stop_grace_s))
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


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
