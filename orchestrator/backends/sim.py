"""The sim backend: `orch sim serve` workers as local processes behind the arm's engine's real
router (vllm-router; for SGLang arms sglang_router, where it is installed in this interpreter).

Colocated arms get one worker per replica; disaggregated arms get prefill and decode workers
and the router's P/D mode. The workers speak the arm's engine (its metric names and endpoints).
If the router cannot run here, the backend says so once and falls back to the whole-arm sim
server (`orch sim serve --whole-arm`), which routes internally.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

from orchestrator import __version__, logs
from orchestrator.backends.base import Deployment, Endpoint, Fingerprint, RunKey
from orchestrator.backends.http import scrape_urls
from orchestrator.backends.processes import ProcessBackend, ProcessHandles, free_port, log_tail
from orchestrator.backends.readiness import wait_until_serving
from orchestrator.engines import ENGINES, EngineAdapter, RouterTarget, StaticWorkers, engine_for
from orchestrator.errors import TransientError
from orchestrator.plan import Plan, canonical_json

_log = logs.get_logger(__name__)

HOST = "127.0.0.1"
ROUTER_NAMES = {"vllm": "vllm-router", "sglang": "sglang_router"}


def engine_for_kind(kind: str) -> EngineAdapter:
    return ENGINES[kind]


def router_binary() -> str | None:
    """Path of the vllm-router executable (next to this Python, or on PATH)."""
    beside = Path(sys.executable).parent / "vllm-router"
    if beside.exists():
        return str(beside)
    return shutil.which("vllm-router")


def module_router(adapter: EngineAdapter) -> tuple[str, ...] | None:
    """The command of an engine's router that is a Python module (``-m`` form, SGLang's),
    when that module is installed in this interpreter; else None."""
    mod = adapter.router_module
    if mod is None or len(mod) < 2:
        return None
    try:
        found = importlib.util.find_spec(mod[1]) is not None
    except ImportError:  # its package is absent
        found = False
    return (sys.executable, *mod) if found else None


class SimBackend(ProcessBackend):
    """Arms on simulated engines, as real processes speaking vLLM's HTTP API."""

    name = "sim"

    def __init__(
        self,
        state_dir: Path,
        use_router: bool = True,
        faults: dict[tuple[str, int, int], list[str]] | None = None,
        log: Callable[[str], None] | None = None,  # None: this module's logger (orchestrator.logs)
    ):
        super().__init__(state_dir)
        self.router = router_binary() if use_router else None  # vllm-router (vLLM arms)
        self.use_router = use_router
        # Engines whose router is a module (SGLang's): found when first asked; None: not here.
        self.module_routers: dict[str, tuple[str, ...] | None] = {}
        # (arm, block, attempt) -> extra `orch sim serve` flags for the first worker (tests).
        self.faults = faults or {}
        self.log = log or _log.info
        if use_router and self.router is None:
            self.log("vllm-router not found: falling back to the whole-arm sim server")

    # -- deploy -----------------------------------------------------------------------------
    def _serve_argv(self, plan_file: Path, arm: str, role: str, port: int) -> list[str]:
        return [sys.executable, "-m", "orchestrator.cli.main", "sim", "serve", "--plan",
                str(plan_file), "--arm", arm, "--role", role, "--host", HOST, "--port", str(port)]

    def deploy(self, plan: Plan, arm: str, key: RunKey) -> Deployment:
        run_dir = self._run_dir(key)
        run_dir.mkdir(parents=True, exist_ok=True)
        plan_file = run_dir / "plan.json"
        plan_file.write_text(canonical_json(plan))
        spec = plan.arm(arm)
        fault_flags = list(self.faults.get((arm, key.block, key.attempt), []))
        specs: list[tuple[str, list[str], int, dict[str, str] | None]] = []
        router = self._router_command(spec.engine.kind)
        if router is None:
            port = free_port()
            specs.append(("arm", [*self._serve_argv(plan_file, arm, "both", port), "--whole-arm", *fault_flags],
                          port, None))
            url = f"http://{HOST}:{port}"
            metrics: tuple[str, ...] = (f"{url}/metrics",)
            topology = "whole-arm sim server"
        else:
            workers: dict[str, list[str]] = {}
            for pool_role, pool in spec.pools().items():
                role = "both" if pool_role == "worker" else pool_role
                for i in range(pool.replicas):
                    port = free_port()
                    argv = self._serve_argv(plan_file, arm, role, port)
                    if fault_flags and not specs:
                        argv += fault_flags
                    specs.append((f"{role}-{i}", argv, port, None))
                    workers.setdefault(pool_role, []).append(f"http://{HOST}:{port}")
            rport, mport = free_port(), free_port()
            specs.append(("router", self._router_argv(plan, arm, workers, rport, mport), rport, None))
            url = f"http://{HOST}:{rport}"
            metrics = tuple(f"{u}/metrics" for us in workers.values() for u in us)
            metrics += (f"http://{HOST}:{mport}/metrics",)
            topology = f"{ROUTER_NAMES.get(spec.engine.kind, 'router')} {plan.router_for(arm).policy}" + (
                " P/D" if spec.layout == "disaggregated" else ""
            )
        procs = self._start_all(key, specs, "the sim arm")
        fingerprint = Fingerprint(
            backend="sim", gpu_type=spec.gpu, engine_version=f"sim-{__version__}",
            engine_version_source="package", gpu_products=(f"simulated {spec.gpu}",),
            node_pools=("local",), driver_versions=("simulated",), nodes=("localhost",),
            kv_transport="simulated" if spec.layout == "disaggregated" else None, topology=topology,
        )
        return Deployment(
            key=key,
            endpoint=Endpoint(url=url, model=engine_for(spec).served_name(plan), metrics_urls=metrics),
            fingerprint=fingerprint,
            handles=ProcessHandles(procs, spec.engine.kind),
        )

    def _router_argv(
        self, plan: Plan, arm: str, workers: dict[str, list[str]], port: int, metrics_port: int
    ) -> list[str]:
        # The workers start with the router: a short start-up check interval (the adapter's).
        target = RouterTarget(host=HOST, port=port, metrics_host=HOST, metrics_port=metrics_port,
                              workers=StaticWorkers(tuple(workers.get("worker", ())), tuple(workers.get("prefill", ())),
                                                    tuple(workers.get("decode", ())), startup_check_s=1))
        adapter = engine_for(plan.arm(arm))
        head = [self.router or "vllm-router"] if adapter.router_module is None else \
            list(self._router_command(adapter.kind) or (sys.executable, *adapter.router_module))
        return [*head, *adapter.router_args(plan, arm, target)]

    def _router_command(self, kind: str) -> tuple[str, ...] | None:
        """What runs engine ``kind``'s router here (None: the whole-arm sim server instead)."""
        adapter = engine_for_kind(kind)
        if adapter.router_module is None:
            return (self.router,) if self.router is not None else None
        if kind not in self.module_routers:
            self.module_routers[kind] = module_router(adapter) if self.use_router else None
            if self.use_router and self.module_routers[kind] is None:
                self.log(f"{ROUTER_NAMES.get(kind, kind)} is not installed here: {kind} arms run on the "
                         "whole-arm sim server")
        return self.module_routers[kind]

    # -- ready / scrape ------------------------------------------------------------------------
    def ready(self, deployment: Deployment, deadline_s: float) -> None:
        wait_until_serving(deployment.endpoint, deadline_s, f"sim arm {deployment.key.arm}",
                           checks=lambda: self._startup_check(deployment), poll_s=0.2, retry_delay_s=1.0)

    def _startup_check(self, deployment: Deployment) -> None:
        held = deployment.handles_as(ProcessHandles)
        dead = [p for p in held.procs if not p.alive()]
        kind = held.engine
        if dead and dead[0].role == "router" and self._router_command(kind) is not None:
            tail = log_tail(dead[0].log, 15)
            # This session's later deployments of the engine use the whole-arm server.
            if engine_for_kind(kind).router_module is None:
                self.router = None
            else:
                self.module_routers[kind] = None
            name = ROUTER_NAMES.get(kind, "the router")
            self.log(f"{name} exited during start-up; falling back to the whole-arm sim "
                     f"server from now on. Router log tail:\n{tail}")
            raise TransientError(f"{name} could not run here; retrying with the whole-arm sim server",
                                 delay=0.0)
        self.exited_check(deployment)

    def scrape(self, deployment: Deployment) -> dict[str, str]:
        return scrape_urls(deployment.endpoint.metrics_urls, timeout_s=5.0)
