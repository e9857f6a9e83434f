"""Kill `orch run` mid-experiment, start it again: it resumes at the first unfinished run,
keeps every stored record, stops what the dead process left running, and produces no
duplicate runs or points."""

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
from tests.e2e.helpers import BASE, ROOT

pytestmark = pytest.mark.timeout(900)


def test_killed_run_resumes_without_losing_or_duplicating(tmp_path: Path) -> None:
    plan = dict(BASE, name="e2e-resume", design={"blocks": 2, "order": "ABBA", "seed": 3, "max_retries": 1})
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
        # Wait until one run is done and the next one has stored a point, then kill -9.
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
            if any(r.status == "done" for r in runs) and running and len(store.points(running[0].id)) >= 1:
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
        assert sorted(valid) == [(0, "A"), (0, "B"), (1, "A"), (1, "B")]  # each exactly once
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
