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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from orchestrator.backends.base import Deployment, Endpoint, Fingerprint, RunKey
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
from orchestrator.backends.processes import ProcessBackend, group_members, stop_group
from orchestrator.backends.readiness import wait_until_serving
from orchestrator.errors import PermanentError
from orchestrator.plan import Arm, Plan

__all__ = [
    "HOST", "ArmLayout", "Device", "LocalBackend", "LocalSettings", "ProcessSpec", "CpuShare",
    "cpu_shares", "engine_argv",
    "free_ports", "group_members", "model_source", "render_arm", "router_argv",
    "sequential_ports", "served_name", "stop_group",
]


# -- the backend -----------------------------------------------------------------------------
class LocalBackend(ProcessBackend):
    """Real vLLM engines and vllm-router as local processes (GPU box, or CPU with the tiny model)."""

    name = "local"
    # A cold vLLM start (weights, compile, CUDA graphs) takes minutes, on CPU too.
    STARTUP_BUDGET_S = 900.0

    def __init__(
        self,
        state_dir: Path,
        settings: LocalSettings | None = None,
        device: Device | None = None,
        log: Callable[[str], None] = print,
    ):
        super().__init__(state_dir)
        self.settings = settings or LocalSettings.from_env()
        self.stop_grace_s = self.settings.stop_grace_s
        self.device = device or Device.detect()
        self.log = log
        self._engine_info: dict[str, Any] | None = None

    def startup_budget_s(self, plan: Plan, arm: str) -> float:
        return self.STARTUP_BUDGET_S

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

    def fingerprint(self, arm: Arm, layout: ArmLayout) -> Fingerprint:
        info = self.engine_info()
        cuda = self.device.kind == "cuda"
        return Fingerprint(
            backend="local", gpu_type=arm.gpu if cuda else "cpu", engine_version=info["vllm"],
            engine_version_source="package", gpu_products=(self.device.name,), node_pools=("local",),
            driver_versions=("vllm",), nodes=(socket.gethostname(),), kv_transport=layout.kv_connector,
            topology=f"vllm-router {_policy(layout)}" + (" P/D" if layout.kv_connector else ""),
            details={"torch_version": info["torch"], "device": self.device.kind},
        )

    # -- deploy ---------------------------------------------------------------------------------
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
        procs = self._start_all(
            key, [(p.name, list(p.argv), p.port, dict(p.env)) for p in (*layout.engines, layout.router)],
            f"the local arm {arm}",
        )
        return Deployment(
            key=key,
            endpoint=Endpoint(url=layout.router.url, model=layout.served_model,
                              metrics_urls=layout.metrics_urls),
            fingerprint=self.fingerprint(spec, layout),
            handles={"procs": procs, "engines": [e.url for e in layout.engines],
                     "router": layout.router.url, "kv_dir": layout.kv_dir},
        )

    # -- ready / scrape ------------------------------------------------------------------------
    def ready(self, deployment: Deployment, deadline_s: float) -> None:
        """Every engine's /health, then the router's, then the one readiness check."""
        h = deployment.handles
        wait_until_serving(
            deployment.endpoint, deadline_s, f"local arm {deployment.key.arm}",
            health_urls=[*h.get("engines", []), h.get("router", deployment.endpoint.url)],
            checks=lambda: self.exited_check(deployment), poll_s=0.5,
        )

    def scrape(self, deployment: Deployment) -> dict[str, str]:
        return scrape_urls(deployment.endpoint.metrics_urls, timeout_s=10.0)

    def _after_stop(self, run_dir: Path) -> None:
        shutil.rmtree(run_dir / "kv", ignore_errors=True)


def _policy(layout: ArmLayout) -> str:
    argv = layout.router.argv
    return argv[argv.index("--policy") + 1]
