"""The live display's attainment so far (issue 20 item 6): a load point against the simulated
backend on loopback hands its records to the progress sink while it runs, so the display reads
a partial count and attainment before the point ends, and the last figure is the point's own."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from orchestrator.backends.base import RunKey
from orchestrator.backends.sim import SimBackend
from orchestrator.control.points import PointRunner
from orchestrator.control.progress import PlainProgress, SoFar
from orchestrator.store import Store
from tests.e2e.helpers import small_plan

pytestmark = pytest.mark.timeout(120)


class Recording(PlainProgress):
    """Keeps every attainment-so-far the point runner reports, with when it came."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[float, SoFar]] = []

    def point_progress(self, so_far: SoFar) -> None:
        self.seen.append((time.time(), so_far))


def test_a_running_point_reports_partial_attainment_before_it_ends(store: Store, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORCH_SKIP_CALIBRATION", "1")
    # A 6 s window at 2 req/s: the first requests end seconds before the last is due, even on a
    # busy CI machine (seen here: first report 2.1 s in, the last request due at 4.6 s of a 4 s window).
    # The point's validity is not asserted (default guard bounds: a loaded machine may fail them).
    plan = small_plan(name="live-attainment",
                      search={"rate": {"min": 1, "max": 32}, "precision": 0.25, "point_s": 6, "warmup_s": 1,
                              "cooldown_s": 0.5, "max_points": 3, "use_prior": False})
    backend = SimBackend(tmp_path / "sim")
    dep = backend.deploy(plan, "A", RunKey("live", "A", 0))
    progress = Recording()
    try:
        backend.ready(dep, 60)
        run = store.start_run(store.create_experiment(store.register_plan(plan).id), "A", 0, 0, 0,
                              store.deployment_config(plan, "A"))
        runner = PointRunner(store, backend, plan, tmp_path / "spool", None, progress=progress)
        outcome = runner.measure(dep, run, "A", 0, 0, 2.0, "standard")
        returned = time.time()
    finally:
        backend.teardown(dep)

    n_window = sum(1 for r in outcome.records if r.phase == "measure")
    assert n_window > 3 and progress.seen
    # Partial figures while the point ran: fewer requests ended than the window holds, reported
    # before the window's end (the sink is fed as requests end, not once at the end).
    last_in_window = max(r.scheduled_s for r in outcome.records if r.phase == "measure")
    partial = [(t, x) for t, x in progress.seen if 0 < x.ended < n_window]
    assert partial, [x for _, x in progress.seen]
    assert partial[0][0] < last_in_window < returned  # before the window's last request was due
    assert all(x.scheduled == n_window for _, x in progress.seen)
    assert [x.ended for _, x in progress.seen] == sorted(x.ended for _, x in progress.seen)
    att = partial[0][1].attainment("standard")
    assert att is not None and 0.0 <= att <= 1.0 and "window so far: " in partial[0][1].text()
    # The last figure covers every request of the window: the point's own attainment.
    last = progress.seen[-1][1]
    assert last.ended == n_window
    assert last.attainment("standard") == pytest.approx(outcome.class_values("standard")[0])
