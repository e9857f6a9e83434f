"""Over-saturation early stop (issue 20 item 5): the runner's stop signal against the null
server on loopback (real time), and a search point far past its knee on the virtual backend
(virtual time: the same stop decision, no socket)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from orchestrator.analysis.search import CapacitySearch
from orchestrator.backends.base import RunKey
from orchestrator.backends.virtual import VirtualBackend
from orchestrator.control.points import PointRunner
from orchestrator.loadgen.null_server import NullServerConfig, NullServerProcess
from orchestrator.loadgen.runner import STOPPED_EARLY, run_point
from orchestrator.loadgen.workloads import build_requests
from orchestrator.plan import Workload
from orchestrator.store import Store
from tests.e2e.helpers import small_plan

pytestmark = pytest.mark.timeout(120)


def test_stop_signal_ends_sending_and_records_every_request() -> None:
    n, gap = 200, 0.01  # 2 s of schedule; stop asked after 0.5 s
    wl = Workload.model_validate({"prompts": {"input_tokens": {"mean": 32}, "conversations": 500}, "output_tokens": 4})
    reqs = build_requests(wl, n, seed=3)
    asked: list[float] = []

    def stop_when(records, now) -> bool:
        asked.append(now)
        return now - records[0].scheduled_s > 0.5

    with NullServerProcess(NullServerConfig()) as url:
        s = asyncio.run(run_point(url, "null", reqs, np.arange(n) * gap, ["measure"] * n, keep_records=True,
                                  stop_when=stop_when, check_every_s=0.05))
    assert s.records is not None and len(s.records) == n  # nothing dropped
    assert sorted(r.request_id for r in s.records) == list(range(n))
    stopped_at = s.extra["stopped_at"]
    sent = [r for r in s.records if r.sent_s is not None]
    unsent = [r for r in s.records if r.status == "unsent"]
    assert 20 < len(sent) < n - 50 and len(sent) + len(unsent) == n
    assert all(r.sent_s <= stopped_at + 0.01 for r in sent)
    assert all("stopped early" in (r.error or "") for r in unsent)
    assert all(r.error == STOPPED_EARLY for r in unsent)
    assert len(asked) >= 5


def test_a_point_far_past_the_knee_ends_early_and_fails_like_the_full_one(store: Store, tmp_path: Path,
                                                                           no_sockets) -> None:
    search = {"rate": {"min": 1, "max": 32}, "precision": 0.25, "point_s": 4, "warmup_s": 1,
              "cooldown_s": 0.5, "max_points": 3, "use_prior": False}
    plans = {flag: small_plan(name=f"early-stop-{flag}", search={**search, "early_stop": flag})
             for flag in (True, False)}
    backend = VirtualBackend()
    dep = backend.deploy(plans[True], "A", RunKey("early", "A", 0))
    try:
        backend.ready(dep, 120)
        out, runs = {}, {}
        for flag, plan in plans.items():
            reg = store.register_plan(plan)
            exp = store.create_experiment(reg.id)
            run = store.start_run(exp, "A", 0, 0, 0, store.deployment_config(plan, "A"))
            runs[flag] = run
            runner = PointRunner(store, backend, plan, tmp_path / f"spool-{flag}", None)
            out[flag, "past"] = runner.measure(dep, run, "A", int(not flag), 0, 16.0, "standard")  # own prompts
            if flag:
                out[flag, "below"] = runner.measure(dep, run, "A", 0, 1, 1.0, "standard")
        early, full, below = out[True, "past"], out[False, "past"], out[True, "below"]
        stored = store.points(runs[True]).set_index("id")
    finally:
        backend.teardown(dep)

    # Far past the knee: stopped early, every scheduled request recorded, a valid failing point.
    stopped = [r for r in early.records if "stopped early" in (r.error or "")]
    assert stopped, "the point far past the knee was not stopped"
    assert len(early.records) == stored.loc[early.point_id, "n_scheduled"]  # every scheduled request: nothing dropped
    assert early.valid, [g for g in early.failed_guards]
    assert full.valid, [g for g in full.failed_guards]
    ctx = stored.loc[early.point_id, "context"]
    assert ctx["early_stop"]["at_s"] >= 0.3 * 4 and "past capacity" in ctx["early_stop"]["reason"]
    assert ctx["early_stop"]["n_unsent"] == len(stopped)
    assert "early_stop" not in stored.loc[below.point_id, "context"]
    assert len(store.requests(early.point_id)) == len(early.records)  # every record stored
    att_early, _ = early.class_values("standard")
    att_full, _ = full.class_values("standard")
    assert att_early < 0.9 and att_full < 0.9  # the same verdict as the full point: failing
    # Below the knee nothing stops.
    assert not any("stopped early" in (r.error or "") for r in below.records)
    assert below.class_values("standard")[0] >= 0.9
    # The search reads the stopped point as a fail: the same bracket as with the full point.
    for p in (early, full):
        s = CapacitySearch(1, 32, 0.25, 0.9, 3)
        s.observe(1.0, *below.class_values("standard"))
        s.observe(16.0, *p.class_values("standard"))
        res = s.result()
        assert res.bracket == (1.0, 16.0) and res.capacity == pytest.approx(below.class_values("standard")[1])
        assert [q.passed for q in res.points] == [True, False]
