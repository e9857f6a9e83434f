"""SIGTERM and SIGHUP stop a command as Ctrl-C does (issues 30 and 32): `orch run` aborts the
running run with the signal as its reason (records kept, experiment resumable), stops every
process it started and exits 128 + the signal's number with one line; `orch loadgen
calibrate` stops its null server. Real processes on loopback; the signal is sent only once the
command is known to be mid-point, so the outcome does not depend on the machine's speed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.store import Store
from tests.e2e.helpers import BASE, ROOT

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


def _children() -> dict[int, list[int]]:
    """ppid -> pids, read from /proc."""
    out: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        out.setdefault(ppid, []).append(int(entry.name))
    return out


def _descendants(pid: int) -> set[int]:
    tree, found, todo = _children(), set(), [pid]
    while todo:
        for child in tree.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _wait_for(what: str, check, proc: subprocess.Popen[str], log: Path, timeout_s: float = 150.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"exited before {what}: {log.read_text()[-3000:]}"
        try:
            got = check()
        except Exception:  # noqa: BLE001 - the database may still be being created
            got = None
        if got:
            return got
        time.sleep(0.3)
    pytest.fail(f"never saw {what}: {log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen[str], sig: signal.Signals, log: Path) -> tuple[int, set[int]]:
    """Send ``sig`` to the command alone (as `timeout` does); its exit code and the processes
    it had started."""
    started = _descendants(proc.pid)
    os.kill(proc.pid, sig)
    try:
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return code, started


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_orch_run_stops_as_ctrl_c_does(tmp_path: Path, sig: signal.Signals) -> None:
    plan = dict(BASE, name=f"stop-{sig.name.lower()}", design={"blocks": 1, "order": "ABBA", "seed": 5, "max_retries": 0},
                search={**BASE["search"], "max_points": 4})
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(plan))
    db = f"sqlite:///{tmp_path / 'orch.sqlite'}"
    env = {**os.environ, "ORCH_DATABASE_URL": db, "ORCH_STATE_DIR": str(tmp_path / "state"),
           "ORCH_SKIP_CALIBRATION": "1"}
    log = tmp_path / "run.log"
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "run", str(plan_file)], cwd=ROOT,
                            env=env, stdout=subprocess.DEVNULL, stderr=open(log, "w"), text=True,  # noqa: SIM115
                            start_new_session=True)
    store: Store | None = None

    def mid_point() -> int | None:
        nonlocal store
        store = store or Store.open(db, migrate=False)
        exps = store.list_experiments()
        running = [r for r in store.runs(exps[0].id) if r.status == "running"] if exps else []
        return exps[0].id if running and len(store.points(running[0].id)) >= 1 else None

    exp_id = _wait_for("a run with a point", mid_point, proc, log)
    code, started = _stop(proc, sig, log)
    text = log.read_text()
    assert code == 128 + sig.value, text[-3000:]
    assert started, "the run had started servers (sim engines, router)"
    assert not [p for p in started if _alive(p)], f"left running: {[p for p in started if _alive(p)]}"
    said = [ln for ln in text.splitlines() if ln.startswith("terminated")]
    assert said == [said[0]] and sig.name in said[0], text[-3000:]
    assert store is not None
    runs = store.runs(exp_id)
    aborted = [r for r in runs if r.status == "aborted"]
    assert len(aborted) == 1 and aborted[0].invalid_reason == f"interrupted: {sig.name} received", runs
    assert not [r for r in runs if r.status == "running"]
    assert len(store.points(aborted[0].id)) >= 1  # what it had measured is kept
    assert store.get_experiment(exp_id).status == "running"  # resumable by `orch run` of the plan
    store.close()


def test_loadgen_calibrate_stops_its_null_server(tmp_path: Path) -> None:
    log = tmp_path / "calibrate.log"
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "loadgen", "calibrate", "--step-s", "30"],
                            cwd=ROOT, env=dict(os.environ), stdout=subprocess.DEVNULL,
                            stderr=open(log, "w"), text=True, start_new_session=True)  # noqa: SIM115

    def null_server() -> set[int]:
        return {p for p in _descendants(proc.pid)
                if "orchestrator.loadgen.null_server" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")}

    _wait_for("the null server", null_server, proc, log)
    code, started = _stop(proc, signal.SIGTERM, log)
    assert code == 143, log.read_text()[-3000:]
    assert started and not [p for p in started if _alive(p)], log.read_text()[-3000:]
