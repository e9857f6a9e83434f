"""Everything `orch run` needs around the executor: where state lives, which backend, the
generator's calibrated ceiling (cached), the simulator's priors, and one call to run a plan."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator import __version__
from orchestrator.backends.base import Backend
from orchestrator.control.executor import Executor, ExecutorConfig, ExperimentOutcome
from orchestrator.control.progress import ProgressSink, progress_for_terminal
from orchestrator.errors import EnvironmentProblem, UserError
from orchestrator.paths import data_root
from orchestrator.plan import Plan

CALIBRATION_MAX_AGE_S = 24 * 3600
NO_CEILING_MAX_AGE_S = 3600  # "no rate held" (a busy machine): measured again after an hour
LOAD_SLACK = 0.5  # load per core above the calibration's that makes it stale


def state_dir() -> Path:
    """Run state (process files, logs, spool): ORCH_STATE_DIR or the user's data directory."""
    path = Path(os.environ.get("ORCH_STATE_DIR") or data_root() / "state")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _sim(root: Path) -> Backend:
    from orchestrator.backends.sim import SimBackend

    return SimBackend(root / "sim")


def _virtual(root: Path) -> Backend:
    from orchestrator.backends.virtual import VirtualBackend

    return VirtualBackend()


def _local(root: Path) -> Backend:
    try:
        from orchestrator.backends.local import LocalBackend
    except ImportError as e:  # pragma: no cover - depends on the optional vLLM set-up
        raise EnvironmentProblem(f"the local backend cannot load: {e}") from e
    return LocalBackend(root / "local")


def _kubernetes(root: Path) -> Backend:
    from orchestrator.backends.kubernetes import KubernetesBackend

    return KubernetesBackend.from_environment()


def _external(root: Path) -> Backend:
    from orchestrator.backends.external import ExternalBackend

    return ExternalBackend()


# Every backend by the name a plan (or --backend) gives it: a factory taking the state root.
# Each imports its backend when called, so `orch --help` loads none of them.
BACKEND_FACTORIES: dict[str, Callable[[Path], Backend]] = {
    "sim": _sim,
    "virtual": _virtual,
    "local": _local,
    "kubernetes": _kubernetes,
    "external": _external,
}
BACKENDS: tuple[str, ...] = tuple(BACKEND_FACTORIES)
# Backends whose arms run on the plan's GPU type, where the simulator's prediction is a fair
# prior for the capacity search (the local backend may run vLLM's CPU build; external arms
# run on hardware the plan only describes).
PRIOR_BACKENDS = ("sim", "virtual", "kubernetes")


def make_backend(name: str, root: Path) -> Backend:
    """The backend a plan (or --backend) names, as every entry point builds it. Backends log
    through their modules' loggers (``orchestrator.logs``: the run's context on each record)."""
    factory = BACKEND_FACTORIES.get(name)
    if factory is None:
        raise UserError(f"unknown backend {name!r}: {', '.join(BACKENDS)}")
    return factory(root)


def choose_backend(plan: Plan, backend: str | None) -> str:
    """--backend over the plan's; external and provisioned arms are not interchangeable."""
    chosen = backend or plan.backend
    if "external" in (chosen, plan.backend) and chosen != plan.backend:
        raise UserError(f"--backend {chosen}: this plan's arms are "
                        f"{'endpoints that already run' if plan.backend == 'external' else 'provisioned'}"
                        f" (backend {plan.backend}); external and provisioned arms are not interchangeable")
    return chosen


def _calibration_path(plan: Plan, root: Path) -> Path:
    return root / f"calibration-{__version__}-{os.cpu_count()}-{plan.workload.output_tokens}-{plan.workload.api}.json"


@dataclass(frozen=True)
class Ceiling:
    """The generator's calibrated ceiling for a plan's reply length (None: unknown; no rate held
    the send-lag bound), and how it was had: ``age_s`` since it was measured (0: just now),
    ``why`` it was measured now (empty: the cached one was used)."""

    rate: float | None
    age_s: float
    why: str = ""

    def note(self) -> str:
        """The progress line that says it (with its age, and how to measure again)."""
        when = f"measured now: {self.why}" if self.why else \
            f"calibrated {_ago(self.age_s)} ago on this machine; ORCH_RECALIBRATE=1 measures again"
        if self.rate is not None:
            return f"load generator ceiling: {self.rate:.0f} req/s per process (p99 send lag < 1 ms; {when})"
        return ("load generator: no rate held p99 send lag < 1 ms on this machine (busy CPU?); no ceiling "
                f"enforced, the generator-lag guard still judges every point ({when})")


def _ago(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def _load_per_cpu() -> float:
    try:
        return os.getloadavg()[0] / (os.cpu_count() or 1)
    except OSError:
        return 0.0


def calibrated(plan: Plan, root: Path, refresh: bool = False) -> Ceiling | None:
    """The generator's ceiling for this plan's reply length (None: ORCH_SKIP_CALIBRATION=1),
    measured against a null server and cached per machine (its cores), version and reply
    shape: a ceiling for a day, "no rate held" for an hour (a busy machine is not measured
    again on every run). A cached one is measured again when the machine is busier now than
    when it was measured (its 1-minute load per core higher by LOAD_SLACK), or on
    ORCH_RECALIBRATE=1."""
    if os.environ.get("ORCH_SKIP_CALIBRATION") == "1":
        return None
    path = _calibration_path(plan, root)
    refresh = refresh or os.environ.get("ORCH_RECALIBRATE") == "1"
    why = "ORCH_RECALIBRATE=1" if refresh else "none cached"
    if not refresh and path.exists():
        try:
            doc = json.loads(path.read_text())
            age = time.time() - float(doc["at"])
            rate = float(doc["ceiling_rate"])
            limit = CALIBRATION_MAX_AGE_S if rate > 0 else NO_CEILING_MAX_AGE_S
            then, now = float(doc.get("load_per_cpu", 0.0)), _load_per_cpu()
            capped = doc.get("capped_at")
            if rate > 0 and doc.get("version") != __version__:
                why = "measured by another version"
            elif capped is not None and (need := _needed_rate(plan)) is not None and need > float(capped):
                why = f"the cached one was measured only up to {float(capped):g} req/s; this plan offers {need:g}"
            elif capped is not None and _needed_rate(plan) is None:
                why = f"the cached one was measured only up to {float(capped):g} req/s"
            elif age >= limit:
                why = f"the cached one is {_ago(age)} old"
            elif now > then + LOAD_SLACK:
                why = f"this machine is busier than when it was measured (load per core {now:.2f}, was {then:.2f})"
            else:
                return Ceiling(rate if rate > 0 else None, age)
        except (ValueError, KeyError, TypeError):
            why = "the cached one is unreadable"
    from orchestrator.loadgen.calibrate import calibrate

    load = _load_per_cpu()
    need = _needed_rate(plan)
    cal = calibrate(output_tokens=plan.workload.output_tokens, api=plan.workload.api, step_s=2.0,
                    min_requests=100, bisections=2, max_rate=need if need is not None else 20000.0)
    path.write_text(json.dumps({"at": time.time(), "version": __version__, "load_per_cpu": load, **cal.to_dict()},
                               default=str))
    return Ceiling(cal.ceiling_rate or None, 0.0, why)


def _needed_rate(plan: Plan) -> float | None:
    """The highest request rate an open-loop plan offers (its search's top, a bar's fixed rate):
    its calibration need only show that one process holds it. None (the whole ladder) for
    closed-loop and session plans, whose request rate is not the plan's rate."""
    if plan.workload.kind in ("closed", "sessions"):
        return None
    return max([plan.search.rate.max, *(b.rate for b in plan.bars if b.rate is not None)])


def generator_ceiling(plan: Plan, root: Path, refresh: bool = False) -> float | None:
    """Requests/s one generator process sustains with p99 send lag < 1 ms for this reply length
    (None: unknown or skipped); see ``calibrated``."""
    found = calibrated(plan, root, refresh)
    return None if found is None else found.rate


def calibration_record(plan: Plan, root: Path) -> dict[str, Any] | None:
    """The cached calibration behind the ceiling (its steps), to be stored with each run."""
    try:
        doc = json.loads(_calibration_path(plan, root).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def max_shards() -> int:
    """Ray load-generator shards a point may use above one process's ceiling:
    ORCH_LOADGEN_MAX_SHARDS, else one per core (at most 8). A point uses one process whenever
    that holds its rate; Ray starts only for a point that needs more."""
    raw = os.environ.get("ORCH_LOADGEN_MAX_SHARDS")
    if raw:
        try:
            return max(1, int(raw))
        except ValueError:
            raise UserError(f"ORCH_LOADGEN_MAX_SHARDS={raw!r}: give a whole number of shards (1: no Ray)") from None
    return max(1, min(8, os.cpu_count() or 1))


def simulator_priors(plan: Plan) -> dict[str, dict[str, float]]:
    """Predicted capacity rate per arm and class from the virtual-time engine (or none)."""
    try:
        from orchestrator.control.dryrun import predicted_capacity_rates
    except ImportError:
        return {}
    try:
        return predicted_capacity_rates(plan)
    except Exception:  # a prior is an optimisation: never fail a run for it  # noqa: BLE001
        return {}


def build_executor(
    plan: Plan,
    store: Any,
    backend: str | None,
    root: Path,
    progress: ProgressSink,
    blocks: int | None = None,
    backend_obj: Backend | None = None,
    session: str | None = None,
    take_over: bool = False,
    shards: int | None = None,
) -> Executor:
    """The one wiring of backend, generator ceiling and priors, for `orch run` in the
    foreground and for the Ray controller's experiment task. ``shards``: the most load-generator
    processes a point may use (`orch run --shards`; default ORCH_LOADGEN_MAX_SHARDS, else one
    per core up to 8)."""
    chosen = choose_backend(plan, backend)
    be = backend_obj or make_backend(chosen, root)
    # A virtual point is never sent late, and a cluster's own generator pod is not this machine:
    # only a generator of this process is calibrated.
    found = calibrated(plan, root) if be.sends_load_here(plan) else None
    ceiling = None if found is None else found.rate
    if be.name == "virtual":
        progress.note("virtual time: the simulated engine on its own clock (no servers, no load generator)")
    elif not be.sends_load_here(plan):
        progress.note("load generated in the cluster (a load-generator pod next to each run's router); "
                      "this machine keeps control")
    elif found is not None:
        progress.note(found.note())
    priors = simulator_priors(plan) if plan.search.use_prior and be.name in PRIOR_BACKENDS else {}
    config = ExecutorConfig(state_dir=root, max_blocks=blocks, generator_ceiling=ceiling, priors=priors,
                            max_shards=shards if shards is not None else max_shards(),
                            calibration=calibration_record(plan, root) if ceiling is not None else None)
    return Executor(store, be, config, progress, session=session, take_over=take_over)


def run_plan(
    plan: Plan,
    store: Any,
    backend: str | None = None,
    blocks: int | None = None,
    new: bool = False,
    name: str | None = None,
    progress: ProgressSink | None = None,
    backend_obj: Backend | None = None,
    take_over: bool = False,
    shards: int | None = None,
) -> ExperimentOutcome:
    """Run (or resume) a plan to its verdicts in this process."""
    progress = progress or progress_for_terminal()
    try:
        executor = build_executor(plan, store, backend, state_dir(), progress, blocks, backend_obj,
                                  take_over=take_over, shards=shards)
        return executor.run(plan, new=new, name=name)
    finally:
        progress.close()
