"""``LocalBackend``: starts, checks, scrapes and stops the processes ``commands`` renders
(the package docstring says what an arm becomes)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from orchestrator import logs
from orchestrator.backends.base import Deployment, Endpoint, Fingerprint, RunKey
from orchestrator.backends.http import scrape_urls
from orchestrator.backends.local.commands import HOST, TASKSET, ArmLayout, render_arm
from orchestrator.backends.local.device import Device
from orchestrator.backends.local.settings import LocalSettings
from orchestrator.backends.processes import ProcessBackend, ProcessHandles, free_port
from orchestrator.backends.readiness import wait_until_serving
from orchestrator.engines import ENGINES
from orchestrator.errors import EnvironmentProblem, PermanentError
from orchestrator.plan import Arm, Plan
from orchestrator.plan.arms import ENGINE_NAMES

ROUTER_NAMES = {"vllm": "vllm-router", "sglang": "sglang_router"}

_log = logs.get_logger(__name__)


@dataclass
class LocalHandles(ProcessHandles):
    """A local arm's processes, and the engines' and router's URLs (each health-checked)."""

    engines: list[str] = field(default_factory=list)
    router: str = ""
    kv_dir: str | None = None  # a storage-based KV connector's shared folder


class LocalBackend(ProcessBackend):
    """Real engines and their router as local processes (GPU box, or CPU with the tiny model):
    vLLM and vllm-router, or SGLang and sglang_router (an SGLang environment: ORCH_SGLANG_PYTHON)."""

    name = "local"
    # A cold vLLM start (weights, compile, CUDA graphs) takes minutes, on CPU too.
    STARTUP_BUDGET_S = 900.0

    def __init__(
        self,
        state_dir: Path,
        settings: LocalSettings | None = None,
        device: Device | None = None,
        log: Callable[[str], None] | None = None,  # None: this module's logger (orchestrator.logs)
    ):
        super().__init__(state_dir)
        self.settings = settings or LocalSettings.from_env()
        self.stop_grace_s = self.settings.stop_grace_s
        self.device = device or Device.detect()
        self.log = log or _log.info
        self._engine_infos: dict[str, dict[str, Any]] = {}

    def startup_budget_s(self, plan: Plan, arm: str) -> float:
        return self.STARTUP_BUDGET_S

    # -- environment ----------------------------------------------------------------------------
    def engine_info(self, kind: str = "vllm") -> dict[str, Any]:
        """The engine's and torch's versions in the interpreter of engine ``kind`` (asked once):
        ``{"engine": version, "torch": version}`` (and, for vLLM, ``"vllm"`` as before)."""
        if kind not in self._engine_infos:
            adapter = ENGINES[kind]
            python = self.settings.python_for(kind)
            if kind != "vllm" and (python is None or not Path(python).exists()):
                raise EnvironmentProblem(
                    f"no {kind} environment for the local backend ({python or 'none set'}): set "
                    f"ORCH_{kind.upper()}_PYTHON to the interpreter of an environment with {kind} installed")
            if python is None or not Path(python).exists():
                raise PermanentError(
                    f"the vLLM environment is missing ({self.settings.python}): run `make vllm`"
                )
            probe = ("import json, importlib.metadata as m, torch\n"
                     "def v(d):\n"
                     "    try: return m.version(d)\n"
                     "    except m.PackageNotFoundError: return None\n"
                     f"names = {list(adapter.distributions)!r}\n"
                     "ver = next((v(d) for d in names if v(d)), None)\n"
                     f"print(json.dumps({{'engine': ver, {kind!r}: ver, 'torch': torch.__version__}}))")
            try:
                out = subprocess.run([python, "-c", probe], capture_output=True,
                                     text=True, timeout=120, check=True).stdout
                info = json.loads(out.strip().splitlines()[-1])
            except (OSError, subprocess.SubprocessError, ValueError, IndexError) as e:
                raise PermanentError(f"cannot read the {kind} environment's versions: {e}") from e
            info["engine"] = info.get("engine") or info.get(kind)  # the probe names it both ways
            if info["engine"] is None and kind != "vllm":
                raise EnvironmentProblem(f"{python} has no {kind} installed: set ORCH_{kind.upper()}_PYTHON "
                                         f"to the interpreter of an environment with {kind}")
            info[kind] = info["engine"]  # the older key (vLLM's callers read info["vllm"])
            self._engine_infos[kind] = info
        return dict(self._engine_infos[kind])

    def check_environment(self, plan: Plan) -> None:
        """Every engine the plan's arms serve is installed here (before any arm is deployed)."""
        for kind in dict.fromkeys(a.engine.kind for a in plan.arms.values() if not a.external):
            self.engine_info(kind)

    def fingerprint(self, arm: Arm, layout: ArmLayout) -> Fingerprint:
        kind = arm.engine.kind
        info = self.engine_info(kind)
        cuda = self.device.kind == "cuda"
        return Fingerprint(
            backend="local", gpu_type=arm.gpu if cuda else "cpu", engine_version=info["engine"],
            engine_version_source="package", gpu_products=(self.device.name,), node_pools=("local",),
            driver_versions=(kind,), nodes=(socket.gethostname(),), kv_transport=layout.kv_connector,
            topology=f"{ROUTER_NAMES.get(kind, kind + ' router')} {layout.router_policy}"
            + (" P/D" if layout.kv_connector else ""),
            details={"torch_version": info["torch"], "device": self.device.kind},
        )

    # -- deploy ---------------------------------------------------------------------------------
    def render(self, plan: Plan, arm: str, key: RunKey, ports: Iterator[int] | None = None) -> ArmLayout:
        return render_arm(plan, arm, self.device, self.settings, ports or free_ports(),
                          self._run_dir(key), key.slug)

    def deploy(self, plan: Plan, arm: str, key: RunKey) -> Deployment:
        spec = plan.arm(arm)
        self.check_environment(plan)  # every arm's engine: the first deploy fails before any starts
        kind = spec.engine.kind
        info = self.engine_info(kind)
        if self.settings.check_version:
            want = spec.engine.version.lstrip("v")
            if want != info["engine"]:
                name = ENGINE_NAMES.get(kind, kind)
                raise PermanentError(
                    f"arms.{arm}.engine.version is {spec.engine.version} but the local {name} is "
                    f"{info['engine']}: set the version to {info['engine']} or install {name} {want}"
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
            handles=LocalHandles(procs, spec.engine.kind, engines=[e.url for e in layout.engines],
                                 router=layout.router.url, kv_dir=layout.kv_dir),
        )

    # -- ready / scrape ------------------------------------------------------------------------
    def ready(self, deployment: Deployment, deadline_s: float) -> None:
        """Every engine's /health, then the router's, then the one readiness check."""
        h = deployment.handles_as(LocalHandles)
        wait_until_serving(
            deployment.endpoint, deadline_s, f"local arm {deployment.key.arm}",
            health_urls=[*h.engines, h.router],
            checks=lambda: self.exited_check(deployment), poll_s=0.5,
        )

    def scrape(self, deployment: Deployment) -> dict[str, str]:
        return scrape_urls(deployment.endpoint.metrics_urls, timeout_s=10.0)

    def _after_stop(self, run_dir: Path) -> None:
        shutil.rmtree(run_dir / "kv", ignore_errors=True)


def free_ports() -> Iterator[int]:
    """Ports free on the loopback right now, none repeated."""
    seen: set[int] = set()
    while True:
        p = free_port(HOST)
        if p not in seen:
            seen.add(p)
            yield p
