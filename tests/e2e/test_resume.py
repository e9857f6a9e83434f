"""Kill `orch run` mid-experiment, start it again: it resumes at the first unfinished run,
keeps every stored record, stops what the dead process left running, and produces no
duplicate runs or points.

The kill is real (SIGKILL to a real `orch run` on the sim backend, its servers left behind), so
this is the real-time tier: it asserts what a loaded machine cannot change (records kept, no
duplicates, the leftovers stopped, the killed run aborted, exit 0), not that every retried run
passed its timing guards. The resume's exact outcome is checked in virtual time below."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.backends.processes import StateFile
from orchestrator.store import Store
from tests.e2e.helpers import BASE, ROOT, small_plan

pytestmark = pytest.mark.timeout(900)


def test_killed_run_resumes_without_losing_or_duplicating(tmp_path: Path) -> None:
    # One block, two points a search: the kill lands in the block's second run (or a retry);
    # the resume's exact outcome over two blocks is the virtual-time test below.
    plan = dict(BASE, name="e2e-resume", design={"blocks": 1, "order": "ABBA", "seed": 3, "max_retries": 1},
                search={**BASE["search"], "max_points": 2})
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(plan))
    db = f"sqlite:///{tmp_path / 'orch.sqlite'}"
    env = {**os.environ, "ORCH_DATABASE_URL": db, "ORCH_STATE_DIR": str(tmp_path / "state"),
           "ORCH_SKIP_CALIBRATION": "1"}
    cmd = [sys.executable, "-m", "orchestrator.cli.main", "run", str(plan_file), "--json"]
    first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                             stderr=open(tmp_path / "first.log", "wb"), start_new_session=True)  # noqa: SIM115
    store = None
    try:
        # Wait until one run has ended and the next one has stored a point, then kill -9.
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            time.sleep(1)
            if not Path(tmp_path / "orch.sqlite").exists():
                continue
            store = store or Store.open(db, migrate=False)
            try:
                exps = store.list_experiments()
                runs = store.runs(exps[0].id) if exps else []
            except Exception:  # noqa: BLE001 - the schema may still be migrating
                continue
            running = [r for r in runs if r.status == "running"]
            # One run ended (valid or failed by a timing guard: a loaded machine fails them all)
            # and the next one has stored a point.
            if (any(r.status in ("done", "failed") for r in runs) and running
                    and len(store.points(running[0].id)) >= 1):
                break
            assert first.poll() is None, (tmp_path / "first.log").read_text()[-3000:]
        else:
            pytest.fail("the first run never reached its second run")
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)

        exp_id = store.list_experiments()[0].id
        killed = next(r for r in store.runs(exp_id) if r.status == "running")
        before_points = {int(p) for r in store.runs(exp_id) for p in store.points(r.id).id}
        before_requests = {p: len(store.requests(p)) for p in before_points}
        leftovers = [p for f in (tmp_path / "state").rglob("processes.json") for p in StateFile(f).read()]
        assert leftovers, "the killed run should have left its sim servers behind"

        second = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
        assert second.returncode == 0, second.stderr[-3000:]
        doc = json.loads(second.stdout)
        assert doc["experiment"]["id"] == exp_id and doc["experiment"]["resumed"] is True

        runs = store.runs(exp_id)
        assert len(store.list_experiments()) == 1
        aborted = next(r for r in runs if r.id == killed.id)
        assert aborted.status == "aborted" and "interrupted" in (aborted.invalid_reason or "")
        valid = [(r.block, r.arm) for r in runs if r.status == "done" and r.valid]
        assert len(valid) == len(set(valid)), "a (block, arm) counted twice"
        # Every (block, arm) was run to its end after the resume: valid, or failed on each allowed
        # attempt (a timing guard on a loaded machine); none is left running.
        assert not [r for r in runs if r.status == "running"]
        for block in (0,):
            for arm in "AB":
                tries = [r for r in runs if (r.block, r.arm) == (block, arm)]
                assert (block, arm) in valid or sum(1 for r in tries if r.status == "failed") == 2, tries
        for pid, n in before_requests.items():  # nothing stored before the kill was lost
            assert len(store.requests(pid)) >= n
        seqs = [(r.id, int(s)) for r in runs for s in store.points(r.id).seq]
        assert len(seqs) == len(set(seqs)), "duplicate points"
        for p in leftovers:  # the dead process's servers were stopped by the resume
            with contextlib.suppress(ChildProcessError):
                os.waitpid(p.pid, os.WNOHANG)
            assert not Path(f"/proc/{p.pid}").exists() or b"orchestrator" not in Path(f"/proc/{p.pid}/cmdline").read_bytes()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        if store is not None:
            store.close()


class _Killed(BaseException):
    """Stands for SIGKILL: nothing of the executor's own handling may swallow it."""


def test_a_resume_continues_at_the_first_unfinished_run_in_virtual_time(store, state, no_sockets) -> None:
    """The resume's control logic, exactly: the first process dies inside block 1's first run
    (after one of its points was stored); the rerun aborts that run, keeps its records,
    continues there and ends with each (block, arm) valid exactly once."""
    from orchestrator.backends.virtual import VirtualBackend
    from orchestrator.control.executor import Executor, ExecutorConfig
    from orchestrator.control.progress import PlainProgress

    plan = small_plan(name="vt-resume", design={"blocks": 2, "order": "ABBA", "seed": 3})

    class DiesInBlockOne(VirtualBackend):
        def alive(self, deployment):  # asked after each point: die after block 1's first point
            if deployment.key.block == 1:
                raise _Killed()
            return super().alive(deployment)

    with pytest.raises(_Killed):
        Executor(store, DiesInBlockOne(), ExecutorConfig(state_dir=state), PlainProgress()).run(plan)
    (exp,) = store.list_experiments()
    killed = next(r for r in store.runs(exp.id) if r.status == "running")
    assert killed.block == 1 and len(store.points(killed.id)) == 1
    kept = {int(p): len(store.requests(int(p))) for r in store.runs(exp.id) for p in store.points(r.id).id}

    out = Executor(store, VirtualBackend(), ExecutorConfig(state_dir=state), PlainProgress()).run(plan)
    assert out.resumed and out.experiment_id == exp.id and out.complete
    runs = store.runs(exp.id)
    assert next(r for r in runs if r.id == killed.id).status == "aborted"
    assert sorted((r.block, r.arm) for r in runs if r.status == "done" and r.valid) == [
        (0, "A"), (0, "B"), (1, "A"), (1, "B")]
    assert len(runs) == 5  # the four counted runs and the aborted one: nothing run twice
    assert all(len(store.requests(p)) == n for p, n in kept.items())
