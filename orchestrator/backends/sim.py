"""The sim backend: `orch sim serve` workers as local processes behind the real vllm-router.

Colocated arms get one worker per replica; disaggregated arms get prefill and decode workers
and the router's P/D mode. If the router binary cannot run here, the backend says so once and
falls back to the whole-arm sim server (`orch sim serve --whole-arm`), which routes internally.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from orchestrator import __version__
from orchestrator.backends.base import Deployment, Endpoint, RunKey
from orchestrator.backends.http import scrape_urls
from orchestrator.backends.processes import (
    ChildProcess,
    StateFile,
    free_port,
    start_process,
    stop_process,
)
from orchestrator.errors import PermanentError, TransientError
from orchestrator.plan import Plan, canonical_json

HOST = "127.0.0.1"


def router_binary() -> str | None:
    """Path of the vllm-router executable (next to this Python, or on PATH)."""
    beside = Path(sys.executable).parent / "vllm-router"
    if beside.exists():
        return str(beside)
    return shutil.which("vllm-router")


class SimBackend:
    """Arms on simulated engines, as real processes speaking vLLM's HTTP API."""

    name = "sim"

    def __init__(
        self,
        state_dir: Path,
        use_router: bool = True,
        faults: dict[tuple[str, int, int], list[str]] | None = None,
        log=print,
    ):
        self.state_dir = Path(state_dir)
        self.router = router_binary() if use_router else None
        # (arm, block, attempt) -> extra `orch sim serve` flags for the first worker (tests).
        self.faults = faults or {}
        self.log = log
        if use_router and self.router is None:
            self.log("vllm-router not found: falling back to the whole-arm sim server")

    # -- deploy -----------------------------------------------------------------------------
    def _run_dir(self, key: RunKey) -> Path:
        return self.state_dir / key.experiment / key.slug

    def _state(self, key: RunKey) -> StateFile:
        return StateFile(self._run_dir(key) / "processes.json")

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
        procs: list[ChildProcess] = []
        state = self._state(key)
        try:
            if self.router is None:
                port = free_port()
                argv = [*self._serve_argv(plan_file, arm, "both", port), "--whole-arm", *fault_flags]
                procs.append(start_process("arm", argv, port, run_dir / "arm.log"))
                state.write(procs)
                url = f"http://{HOST}:{port}"
                metrics = (f"{url}/metrics",)
                topology = "whole-arm sim server"
            else:
                workers: dict[str, list[str]] = {}
                for pool_role, pool in spec.pools().items():
                    role = "both" if pool_role == "worker" else pool_role
                    for i in range(pool.replicas):
                        port = free_port()
                        argv = self._serve_argv(plan_file, arm, role, port)
                        if fault_flags and not procs:
                            argv += fault_flags
                        procs.append(start_process(f"{role}-{i}", argv, port, run_dir / f"{role}-{i}.log"))
                        workers.setdefault(pool_role, []).append(f"http://{HOST}:{port}")
                        state.write(procs)
                rport, mport = free_port(), free_port()
                argv = self._router_argv(plan, arm, workers, rport, mport)
                procs.append(start_process("router", argv, rport, run_dir / "router.log"))
                state.write(procs)
                url = f"http://{HOST}:{rport}"
                metrics = tuple(f"{u}/metrics" for us in workers.values() for u in us)
                metrics += (f"http://{HOST}:{mport}/metrics",)
                topology = f"vllm-router {plan.router_for(arm).policy}" + (
                    " P/D" if spec.layout == "disaggregated" else ""
                )
        except OSError as e:
            for p in procs:
                stop_process(p.pid)
            state.remove()
            raise PermanentError(f"cannot start the sim arm: {e}") from e
        fingerprint: dict[str, Any] = {
            "backend": "sim",
            "engine_version": f"sim-{__version__}",
            "gpu_type": spec.gpu,
            "nodes": ["localhost"],
            "node_pool": "local",
            "driver": "simulated",
            "topology": topology,
        }
        return Deployment(
            key=key,
            endpoint=Endpoint(url=url, model=plan.model.hf_id or plan.model.name, metrics_urls=metrics),
            fingerprint=fingerprint,
            handles={"procs": procs},
        )

    def _router_argv(
        self, plan: Plan, arm: str, workers: dict[str, list[str]], port: int, metrics_port: int
    ) -> list[str]:
        rc = plan.router_for(arm)
        policy = rc.policy
        argv = [self.router or "vllm-router", "--host", HOST, "--port", str(port),
                "--prometheus-host", HOST, "--prometheus-port", str(metrics_port),
                "--log-level", "warning", "--disable-retries", "--disable-circuit-breaker"]
        if "prefill" in workers:
            argv += ["--vllm-pd-disaggregation"]
            for u in workers["prefill"]:
                argv += ["--prefill", u]
            for u in workers["decode"]:
                argv += ["--decode", u]
            argv += ["--policy", policy]
        else:
            argv += ["--worker-urls", *workers["worker"], "--policy", policy]
        if policy == "cache_aware":
            argv += ["--cache-threshold", str(rc.cache_threshold),
                     "--balance-abs-threshold", str(rc.balance_abs_threshold)]
        return argv

    # -- ready / scrape / teardown -------------------------------------------------------------
    def ready(self, deployment: Deployment, deadline_s: float) -> None:
        deadline = time.monotonic() + deadline_s
        procs: list[ChildProcess] = deployment.handles.get("procs", [])
        ep = deployment.endpoint
        last = "not started"
        with httpx.Client(timeout=5.0) as client:
            while time.monotonic() < deadline:
                dead = [p for p in procs if not p.alive()]
                if dead and dead[0].role == "router" and self.router is not None:
                    tail = _tail(Path(dead[0].log))
                    self.router = None  # this session's later deployments use the whole-arm server
                    self.log("vllm-router exited during start-up; falling back to the whole-arm sim "
                             f"server from now on. Router log tail:\n{tail}")
                    raise TransientError("vllm-router could not run here; retrying with the whole-arm sim server")
                if dead:
                    tail = _tail(Path(dead[0].log))
                    raise PermanentError(f"{dead[0].role} exited during start-up; log tail:\n{tail}")
                try:
                    r = client.post(
                        f"{ep.url}/v1/completions",
                        json={"model": ep.model, "prompt": "ready check", "max_tokens": 4,
                              "ignore_eos": True, "stream": False},
                    )
                    if r.status_code == 200 and r.json().get("usage", {}).get("completion_tokens") == 4:
                        return
                    last = f"HTTP {r.status_code}: {r.text[:200]}"
                except (httpx.HTTPError, ValueError) as e:
                    last = f"{type(e).__name__}: {e}"
                time.sleep(0.2)
        raise TransientError(f"arm not ready within {deadline_s:.0f}s (last: {last})", delay=1.0)

    def scrape(self, deployment: Deployment) -> dict[str, str]:
        return scrape_urls(deployment.endpoint.metrics_urls, timeout_s=5.0)

    def alive(self, deployment: Deployment) -> bool:
        """Whether every process of the deployment still runs."""
        return all(p.alive() for p in deployment.handles.get("procs", []))

    def teardown(self, deployment: Deployment) -> None:
        procs = deployment.handles.get("procs") or self._state(deployment.key).read()
        for p in reversed(procs):  # router first, then workers
            stop_process(p.pid)
        self._state(deployment.key).remove()

    def cleanup(self, experiment: str) -> int:
        removed = 0
        for state_path in (self.state_dir / experiment).glob("*/processes.json"):
            for p in reversed(StateFile(state_path).read()):
                removed += int(stop_process(p.pid))
            StateFile(state_path).remove()
        return removed


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
