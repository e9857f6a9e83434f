"""The backend conformance suite: one set of checks every backend must pass, so a backend that
drops a method, renames a parameter or changes what an answer means fails here.

A backend's test module subclasses ``BackendSuite`` and gives a class-scoped ``case`` fixture
returning a ``BackendCase`` (how to build the backend, a plan, how to kill one of its servers,
what of a deployment may be left). Bindings: ``tests/integration/test_backend_suite.py`` (sim,
external, kubernetes) and ``tests/vllm/test_backend_suite_local.py`` (local, real vLLM).

What the checks prove (the meanings of ``orchestrator/backends/base.py``):

- the protocol: ``isinstance(b, Backend)``, and every protocol method exists with the
  protocol's parameters (names, kinds, defaults: ``inspect.signature``);
- deploy -> ready within the backend's own ``startup_budget_s`` -> the endpoint streams a
  completion of exactly the asked tokens with ignore_eos (the load generator's own client) ->
  ``scrape`` answers every metrics URL with Prometheus text carrying vLLM's metric names ->
  ``alive`` is True; one deployment serves all of these (deploys are the slow part);
- errors are typed: a server that returns a wrong token count makes ``ready`` raise
  PermanentError; a deadline that passes before the arm serves raises TransientError with a
  ``delay`` > 0; the leftovers of that crashed attempt (its Deployment object forgotten) are
  removed by ``cleanup(experiment)`` of a fresh backend on the same state (> 0 removed where
  the backend runs servers, then 0);
- the fingerprint is a ``Fingerprint`` naming the backend; a backend that runs the servers
  fills gpu_type, engine_version, node_pools and nodes;
- last (it destroys the shared deployment): kill one server -> ``alive`` False -> ``teardown``
  leaves nothing (no process, no object) -> a second ``teardown`` is a no-op.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

import pytest

from orchestrator.backends.base import Backend, Deployment, Fingerprint, RunKey
from orchestrator.backends.processes import group_members
from orchestrator.errors import PermanentError, TransientError
from orchestrator.loadgen.client import Clock, make_client, new_record
from orchestrator.loadgen.scrape import parse_metrics
from orchestrator.loadgen.workloads import build_requests
from orchestrator.plan import Plan
from orchestrator.records import RequestRecord

# Every method of the protocol (kept explicit: a method added to the protocol must be added
# here, and then every backend is checked for it).
PROTOCOL_METHODS = ("startup_budget_s", "sends_load_here", "deploy", "ready", "alive", "scrape", "teardown", "cleanup")


@dataclass
class BackendCase:
    """How the suite drives one backend."""

    name: str  # the backend's `name`
    make: Callable[[], Backend]  # a new backend object on the case's state (cluster, state dir)
    plan: Plan
    arm: str
    experiment: str  # the shared deployment's; the suite derives others from it
    runs_servers: bool  # the backend starts the servers (sim, local, kubernetes), not external
    kill: Callable[[Deployment], None]  # make one server of the deployment stop
    leftovers: Callable[[Deployment], list[str]]  # what of the deployment still exists
    # A backend, plan and key whose server answers with a wrong token count (torn down by
    # the suite); None: this backend cannot be given such a server (the test is removed).
    wrong_count: Callable[[], AbstractContextManager[tuple[Backend, Plan, RunKey]]] | None = None
    unready_plan: Plan | None = None  # deployed for the deadline check (default: plan)
    short_deadline_s: float = 0.3  # passes before a fresh deployment can serve
    settle_s: float = 0.0  # how long removal may take after teardown/cleanup returns
    request_timeout_s: float = 120.0


@dataclass
class Live:
    backend: Backend
    deployment: Deployment
    budget_s: float
    ready_s: float


def stream_one(deployment: Deployment, plan: Plan, timeout_s: float, seed: int = 11) -> tuple[RequestRecord, int]:
    """One streamed request of the plan's workload through the load generator's own client:
    its record and the tokens it asked for (with ignore_eos)."""
    spec = build_requests(plan.workload, 1, seed=seed)[0]
    ep = deployment.endpoint

    async def go() -> RequestRecord:
        client = make_client("httpx", ep.url, ep.model, plan.workload.api, Clock(), headers=dict(ep.headers))
        rec = new_record(spec, "measure", time.time())
        try:
            await asyncio.wait_for(client.stream(spec, rec), timeout_s)
        finally:
            await client.close()
        return rec

    return asyncio.run(go()), spec.max_tokens


def process_leftovers(dep: Deployment) -> list[str]:
    """For process backends (sim, local): live members of the deployment's process groups (the
    leader and what it spawned, e.g. vLLM's EngineCore)."""
    return [f"{p.role}: pids {group_members(p.pid)}" for p in getattr(dep.handles, "procs", []) if group_members(p.pid)]


def kill_first_process(dep: Deployment) -> None:
    """For process backends: SIGKILL the leader of the deployment's first server (a worker; the
    router starts last). Its children may live on: teardown must still stop them."""
    os.kill(dep.handles.procs[0].pid, signal.SIGKILL)


def wait_until(predicate: Callable[[], object], timeout_s: float, interval_s: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)


def _params(fn: Callable[..., object]) -> list[tuple[str, object, object]]:
    """A signature's parameters as (name, kind, default): what a caller relies on."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def _gone(case: BackendCase, dep: Deployment) -> list[str]:
    """What is left of ``dep`` once removal has had ``settle_s`` to finish."""
    wait_until(lambda: not case.leftovers(dep), case.settle_s)
    return case.leftovers(dep)


class BackendSuite:
    """The conformance checks; a subclass provides the class-scoped ``case`` fixture. Tests run
    in this order; the last one destroys the shared deployment."""

    @pytest.fixture(scope="class")
    def live(self, case: BackendCase) -> Iterator[Live]:
        """The shared deployment: deployed, ready within the backend's own budget; always torn
        down at the end (a no-op after the kill test's teardown)."""
        backend = case.make()
        budget = backend.startup_budget_s(case.plan, case.arm)
        dep = backend.deploy(case.plan, case.arm, RunKey(case.experiment, case.arm, 0))
        try:
            t0 = time.monotonic()
            backend.ready(dep, budget)
            yield Live(backend, dep, budget, time.monotonic() - t0)
        finally:
            backend.teardown(dep)

    # -- the protocol ----------------------------------------------------------------------

    def test_satisfies_the_protocol_with_its_signatures(self, case: BackendCase) -> None:
        backend = case.make()
        assert isinstance(backend, Backend)
        assert backend.name == case.name
        declared = {n for n, v in vars(Backend).items() if inspect.isfunction(v) and not n.startswith("_")}
        assert declared == set(PROTOCOL_METHODS), "the protocol changed: update PROTOCOL_METHODS"
        for method in PROTOCOL_METHODS:
            impl = getattr(type(backend), method, None)
            assert callable(impl), f"{type(backend).__name__} has no method {method}"
            want = _params(getattr(Backend, method))
            got = _params(impl)
            assert got == want, f"{type(backend).__name__}.{method}{inspect.signature(impl)} is not the protocol's"

    # -- one deployment, reused ------------------------------------------------------------

    def test_ready_within_its_startup_budget(self, live: Live) -> None:
        assert live.budget_s > 0
        assert live.ready_s <= live.budget_s

    def test_endpoint_streams_exactly_the_asked_tokens(self, case: BackendCase, live: Live) -> None:
        rec, asked = stream_one(live.deployment, case.plan, case.request_timeout_s)
        assert rec.status == "ok", (rec.status, rec.http_status, rec.error)
        assert rec.output_tokens == asked == case.plan.workload.output_tokens  # usage, with ignore_eos
        assert rec.chunks >= 1 and rec.first_token_s is not None

    def test_scrape_answers_every_metrics_url_with_vllm_metrics(self, live: Live) -> None:
        urls = live.deployment.endpoint.metrics_urls
        assert urls, "a deployment names the /metrics of its engines"
        texts = live.backend.scrape(live.deployment)
        assert isinstance(texts, dict)
        missing = [u for u in urls if u not in texts]
        assert not missing, f"scrape did not answer {missing}"
        engine_names: set[str] = set()
        for url in urls:
            names = {s.name for s in parse_metrics(texts[url])}
            vllm = [n for n in names if n.startswith(("vllm:", "vllm_"))]  # engines; vllm_router_*
            assert vllm, f"{url}: no vLLM metric among {sorted(names)[:10]}"
            engine_names |= {n for n in names if n.startswith("vllm:")}
        assert engine_names, "no engine metric (vllm:...) at any metrics URL"

    def test_alive_while_serving(self, live: Live) -> None:
        assert live.backend.alive(live.deployment) is True

    def test_fingerprint_is_typed_and_complete(self, case: BackendCase, live: Live) -> None:
        fp = live.deployment.fingerprint
        assert isinstance(fp, Fingerprint)
        assert fp.backend == case.name
        with pytest.raises(AttributeError):
            fp.backend = "changed"  # type: ignore[misc]  # frozen
        assert Fingerprint.from_dict(fp.to_dict()) == fp
        if case.runs_servers:
            assert fp.gpu_type, fp
            assert fp.engine_version, fp
            assert fp.node_pools and all(fp.node_pools), fp
            assert fp.nodes and all(fp.nodes), fp

    # -- errors are typed ------------------------------------------------------------------

    def test_wrong_token_count_is_permanent(self, case: BackendCase) -> None:
        assert case.wrong_count is not None
        with case.wrong_count() as (backend, plan, key):
            dep = backend.deploy(plan, key.arm, key)
            try:
                t0 = time.monotonic()
                budget = backend.startup_budget_s(plan, key.arm)
                with pytest.raises(PermanentError, match=r"asked for \d+ tokens with ignore_eos and got"):
                    backend.ready(dep, budget)
                assert time.monotonic() - t0 < budget / 2, "a wrong count is refused at once, not at the deadline"
            finally:
                backend.teardown(dep)

    def test_deadline_is_transient_and_cleanup_removes_the_crashed_attempt(
        self, case: BackendCase, live: Live
    ) -> None:
        plan = case.unready_plan or case.plan
        experiment = f"{case.experiment}-crash"
        dep = live.backend.deploy(plan, case.arm, RunKey(experiment, case.arm, 0, attempt=1))
        with pytest.raises(TransientError) as err:
            live.backend.ready(dep, case.short_deadline_s)
        assert err.value.delay > 0
        # The controller crashes here: the Deployment object is forgotten. A new controller
        # process builds a fresh backend on the same state and knows only the experiment.
        fresh = case.make()
        removed = fresh.cleanup(experiment)
        if case.runs_servers:
            assert removed > 0
            left = _gone(case, dep)
            assert not left, f"left after cleanup: {left}"
        else:
            assert removed == 0  # nothing was created, nothing is left behind
        assert fresh.cleanup(experiment) == 0
        assert live.backend.alive(live.deployment), "cleanup of another experiment touched this one"

    # -- last: destroys the shared deployment ----------------------------------------------

    def test_kill_one_server_then_teardown_leaves_nothing(self, case: BackendCase, live: Live) -> None:
        backend, dep = live.backend, live.deployment
        assert backend.alive(dep)
        case.kill(dep)
        assert wait_until(lambda: not backend.alive(dep), 30), "alive stayed True after a server was killed"
        backend.teardown(dep)
        left = _gone(case, dep)
        assert not left, f"left after teardown: {left}"
        backend.teardown(dep)  # idempotent
        assert not case.leftovers(dep)
