"""The Ray controller: a detached, named actor holding the queue of experiments.

Status lives in the store (so a restarted controller re-queues what was queued or running).
GPU pools are Ray custom resources (``ray start --head --resources '{"H200": 8}'``, or on
KubeRay from node labels): each experiment runs as a Ray task that asks for the GPUs of its
larger arm per GPU type (the arms run back to back, never at once), so Ray starts it only when
those GPUs are free.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import ray
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from orchestrator.errors import EnvironmentProblem
from orchestrator.plan import Plan, plan_from_canonical, validate_plan

NAME = "orchestrator-controller"
NAMESPACE = "orchestrator"


def gpu_demand(plan: Plan) -> dict[str, float]:
    """GPUs an experiment holds while it runs: per GPU type, the larger arm's count."""
    need: dict[str, float] = {}
    for arm in plan.arms.values():
        if arm.external or arm.gpu is None:  # served elsewhere: holds none of our pools
            continue
        need[arm.gpu] = max(need.get(arm.gpu, 0.0), float(arm.gpus))
    return need


def _run_experiment(db_url: str, experiment_id: int, state_root: str) -> dict[str, Any]:
    """Body of the Ray task that runs one experiment (in a Ray worker process)."""
    from pathlib import Path

    from orchestrator import logs
    from orchestrator.control.progress import PlainProgress
    from orchestrator.control.session import build_executor
    from orchestrator.store import Store
    from orchestrator.store.lease import LeaseHeld, LeaseLost
    from orchestrator.store.retry import DatabaseOutage

    # Experiments share the controller's log stream: each line says which one (and when).
    try:
        logs.configure(detailed=True)
    except ValueError:  # a bad ORCH_LOG_LEVEL must not fail the experiment
        logs.configure("INFO", detailed=True)
    with Store.open(db_url) as store:
        exp = store.get_experiment(experiment_id)
        plan = plan_from_canonical(store.get_registration(exp.registration_id).canonical_json)
        executor = build_executor(plan, store, None, Path(state_root), PlainProgress(),
                                  session=f"ray:{socket.gethostname()}:{os.getpid()}")
        try:
            out = executor.run(plan, experiment_id=experiment_id)
        except (LeaseHeld, LeaseLost, DatabaseOutage):
            raise  # another live owner's experiment, or one to resume: not failed
        except Exception:
            store.set_experiment_status(experiment_id, "failed")
            raise
        return {"experiment": out.experiment_name, "complete": out.complete,
                "verdicts": {o.bar.id: o.judgement.verdict for o in out.bars}}


_RUN_TASK = ray.remote(_run_experiment)


@ray.remote(num_cpus=0)
class Controller:
    """Queue of experiments; at most one Ray task per experiment."""

    def __init__(self, db_url: str, state_root: str):
        from orchestrator.store import Store

        self.db_url = db_url
        self.state_root = state_root
        self.store = Store.open(db_url)
        self.tasks: dict[int, Any] = {}
        self.resumed = self._resume()

    def _resume(self) -> list[int]:
        out = []
        for e in self.store.list_experiments():
            if e.status in ("queued", "running") and (e.controller_id or "").startswith("ray"):
                self._launch(e.id)
                out.append(e.id)
        return out

    def _launch(self, experiment_id: int) -> None:
        exp = self.store.get_experiment(experiment_id)
        plan = plan_from_canonical(self.store.get_registration(exp.registration_id).canonical_json)
        task = _RUN_TASK.options(
            num_cpus=1, resources=gpu_demand(plan), max_retries=0, name=f"experiment-{exp.name}",
        )
        self.tasks[experiment_id] = task.remote(self.db_url, experiment_id, self.state_root)

    def database(self) -> str:
        """The database this controller stores experiments in (password hidden)."""
        return redacted(self.db_url)

    def submit(self, plan_data: dict, name: str | None = None, db_url: str | None = None) -> dict[str, Any]:
        """Queue a plan. ``db_url``: the submitter's database; another one than this
        controller's is refused (its experiment would land where the submitter never looks)."""
        if db_url is not None and not same_database(db_url, self.db_url):
            return {"error": other_database(self.db_url, db_url)}
        plan = validate_plan(plan_data)
        total = ray.cluster_resources()
        short = {k: v for k, v in gpu_demand(plan).items() if total.get(k, 0.0) < v}
        if short:
            have = {k: total.get(k, 0.0) for k in short}
            return {"error": f"the cluster's GPU pools cannot hold this experiment: needs {short}, "
                             f"has {have} (start Ray with --resources, e.g. '{{\"H200\": 8}}')"}
        reg = self.store.register_plan(plan)
        exp_id = self.store.create_experiment(reg.id, name, controller_id="ray:controller")
        self.store.set_experiment_status(exp_id, "queued")
        self._launch(exp_id)
        exp = self.store.get_experiment(exp_id)
        return {"experiment_id": exp_id, "name": exp.name, "sha256": reg.sha256,
                "gpus": gpu_demand(plan)}

    def queue(self) -> list[dict[str, Any]]:
        out = []
        for exp_id, ref in list(self.tasks.items()):
            ready, _ = ray.wait([ref], timeout=0)
            state = "finished" if ready else "waiting or running"
            error = None
            if ready:
                try:
                    ray.get(ref)
                except Exception as e:  # noqa: BLE001 - reported, not raised
                    state, error = "failed", str(e).splitlines()[0] if str(e) else type(e).__name__
            exp = self.store.get_experiment(exp_id)
            out.append({"experiment_id": exp_id, "name": exp.name, "status": exp.status,
                        "task": state, "error": error})
        return out

    def cancel(self, experiment_id: int) -> bool:
        from pathlib import Path

        from orchestrator.control.session import make_backend

        ref = self.tasks.pop(experiment_id, None)
        if ref is not None:
            ray.cancel(ref, force=True)
        self.store.set_experiment_status(experiment_id, "cancelled")
        exp = self.store.get_experiment(experiment_id)
        plan = plan_from_canonical(self.store.get_registration(exp.registration_id).canonical_json)
        # The killed task's engines run in their own sessions: stop them by the run state.
        make_backend(plan.backend, Path(self.state_root)).cleanup(exp.name)
        return ref is not None

    def pools(self) -> dict[str, dict[str, float]]:
        total, free = ray.cluster_resources(), ray.available_resources()
        skip = {"CPU", "GPU", "memory", "object_store_memory"}
        return {k: {"total": v, "free": free.get(k, 0.0)} for k, v in total.items()
                if k not in skip and not k.startswith("node:") and not k.startswith("accelerator_type")}


def _identity(url: str) -> tuple[Any, ...]:
    u = make_url(url)
    return (u.get_backend_name(), u.host, u.port, u.database, u.username)


def same_database(a: str, b: str) -> bool:
    """The same database, whatever the driver spelling or the password."""
    try:
        return _identity(a) == _identity(b)
    except ArgumentError:
        return a == b


def redacted(url: str) -> str:
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparseable URL>"


def other_database(served: str, wanted: str) -> str:
    return (f"the cluster's controller stores experiments in {redacted(served)}, not in {redacted(wanted)} "
            "(ORCH_DATABASE_URL here): use that database, or stop the controller (`ray stop` on the head, "
            "or kill the detached actor orchestrator-controller) so the next submit starts one for yours")


def check_database(served: str, wanted: str) -> None:
    """EnvironmentProblem unless the controller's database is the one this command uses."""
    if not same_database(served, wanted):
        raise EnvironmentProblem(other_database(served, wanted))


def connect(address: str | None) -> None:
    """Join an existing Ray cluster (RAY_ADDRESS or --address); never starts one."""
    address = address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise EnvironmentProblem(
            "no Ray cluster to submit to: start one with `ray start --head --resources '{\"H200\": 8}'` "
            "and pass --address (or set RAY_ADDRESS), or run in the foreground with `orch run FILE`"
        )
    try:
        ray.init(address=address, namespace=NAMESPACE, ignore_reinit_error=True,
                 log_to_driver=False, include_dashboard=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise EnvironmentProblem(f"cannot reach the Ray cluster at {address}: {e}") from e


def controller(db_url: str, state_root: str) -> Any:
    """The cluster's controller actor, started (detached) if it does not exist yet.

    Typed Any: a Ray ``ActorHandle`` whose remote methods are found at runtime (ray types
    ``ActorHandle.__getattr__`` as returning Never, which would make every call unusable)."""
    return Controller.options(name=NAME, namespace=NAMESPACE, lifetime="detached",  # type: ignore[attr-defined]  # ray.remote turns the class into an ActorClass at runtime; mypy ignores class decorators
                              get_if_exists=True).remote(db_url, state_root)
