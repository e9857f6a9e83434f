"""One controller owns an experiment at a time (DESIGN 12): a second `orch run` of a live
experiment is refused naming the owner and leaves the first untouched; `--take-over` resumes
after the owner died; a stale owner's write is refused (fenced by experiments.controller_id)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from orchestrator.records import RequestRecord
from orchestrator.store import Store
from orchestrator.store.lease import ExperimentLease, LeaseHeld, LeaseLost
from tests.e2e.helpers import BASE, ROOT, small_plan

pytestmark = pytest.mark.timeout(600)


def _setup(store: Store) -> tuple[int, int, int]:
    plan = small_plan(name="own")
    reg = store.register_plan(plan)
    exp = store.create_experiment(reg.id)
    config = store.deployment_config(plan, "A")
    return reg.id, exp, config


def test_stale_owner_cannot_write(db_url: str) -> None:
    """Two Store objects, two sessions: the second takes the lease only once the first's is
    free; the first, now stale, cannot start or finish a run (nothing of it is committed)."""
    with Store.open(db_url) as s1, Store.open(db_url, migrate=False) as s2:
        _, exp, config = _setup(s1)
        first = ExperimentLease(s1, exp, "host-a:1").acquire()
        fenced1 = first.fenced()
        run = fenced1.start_run(exp, "A", 0, 0, 0, config)
        point = fenced1.record_point(run, seq=0, window_start_s=0.0, window_end_s=1.0)
        assert fenced1.ingest_requests(point, _records(0, 3)) == 3
        with pytest.raises(LeaseHeld, match=r"is being run by host-a:1.*orch cancel"):
            ExperimentLease(s2, exp, "host-b:2").acquire(take_over=True)
        first.release()  # as if host-a:1 died: its lock is gone, its process may linger
        second = ExperimentLease(s2, exp, "host-b:2").acquire(take_over=True)
        try:
            assert s2.get_experiment(exp).controller_id == "host-b:2"
            with pytest.raises(LeaseLost, match="now owned by host-b:2"):
                fenced1.finish_run(run, "done", True, None, {})
            with pytest.raises(LeaseLost):
                fenced1.start_run(exp, "B", 0, 1, 0, config)
            with pytest.raises(LeaseLost):  # request batches go around the ORM: fenced too
                fenced1.ingest_requests(point, _records(3, 2))
            assert len(s2.requests(point)) == 3
            with pytest.raises(LeaseLost):
                first.ensure()
            assert [(r.id, r.status) for r in s2.runs(exp)] == [(run, "running")]
            second.ensure()
            second.fenced().finish_run(run, "aborted", False, "interrupted", {})
            assert s2.runs(exp)[0].status == "aborted"
        finally:
            second.release()


def _records(first: int, n: int) -> list[RequestRecord]:
    return [RequestRecord(request_id=i, conversation_id=i, turn=0, phase="measure", scheduled_s=0.1 * i,
                          sent_s=0.1 * i, status="ok") for i in range(first, first + n)]


def _env(tmp_path: Path, db: str) -> dict[str, str]:
    return {**os.environ, "ORCH_DATABASE_URL": db, "ORCH_STATE_DIR": str(tmp_path / "state"),
            "ORCH_SKIP_CALIBRATION": "1"}


def _plan_file(tmp_path: Path, name: str) -> Path:
    plan = dict(BASE, name=name, design={"blocks": 1, "order": "ABBA", "seed": 3, "max_retries": 1},
                search={**BASE["search"], "max_points": 2})
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    return path


def exp_controller(store: Store, exp_id: int) -> str:
    return str(store.get_experiment(exp_id).controller_id)


def _wait_running(db: str, proc: subprocess.Popen[bytes], log: Path, points: int = 0) -> tuple[Store, int]:
    """Until the first process has a running run (with ``points`` points stored)."""
    store = None
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        time.sleep(0.5)
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            store = store or Store.open(db, migrate=False)
            exps = store.list_experiments()
            running = [r for r in store.runs(exps[0].id) if r.status == "running"] if exps else []
            if running and len(store.points(running[0].id)) >= points:
                return store, exps[0].id
        except Exception:  # noqa: BLE001 - the first process may still be migrating
            continue
    pytest.fail("the first run never started a run")


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_second_run_refused_while_first_completes_untouched(tmp_path: Path, database: str,
                                                            request: pytest.FixtureRequest) -> None:
    plan_file = _plan_file(tmp_path, "own-concurrent")
    db = f"sqlite:///{tmp_path / 'orch.sqlite'}" if database == "sqlite" else request.getfixturevalue("pg_url")
    env = _env(tmp_path, db)
    cmd = [sys.executable, "-m", "orchestrator.cli.main", "run", str(plan_file), "--json"]
    log = tmp_path / "first.log"
    first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"),  # noqa: SIM115
                             start_new_session=True)
    try:
        store, exp_id = _wait_running(db, first, log)
        # The first process (and its servers) is held stopped while the two commands look: it
        # keeps its lease (a lock the OS or the server holds for a live process) and cannot
        # finish meanwhile, however slow the machine. SQLite is in WAL mode, so its readers never
        # wait on a writer that stopped mid-transaction.
        os.killpg(first.pid, signal.SIGSTOP)
        try:
            second = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
            taken = subprocess.run([*cmd, "--take-over"], cwd=ROOT, env=env, capture_output=True,
                                   text=True, timeout=240)
        finally:
            os.killpg(first.pid, signal.SIGCONT)
        assert second.returncode == 2, second.stderr[-2000:]
        lines = [ln for ln in second.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "is being run by" in lines[0] and f":{first.pid}" in lines[0], second.stderr
        assert "orch cancel" in lines[0]
        assert taken.returncode == 2, taken.stderr[-2000:]
        assert "is being run by" in taken.stderr and "takes only a lease whose owner has died" in taken.stderr
        assert first.wait(180) == 0, log.read_text()[-3000:]
        runs = store.runs(exp_id)
        # The first process ran every run to its end (whether its timing guards passed on this
        # machine is not the subject: a failed one was retried by that same process), and the
        # refused commands wrote nothing: every run is the first process's, none left running.
        assert {r.arm for r in runs} == {"A", "B"} and all(r.status in ("done", "failed") for r in runs), runs
        assert {r.fingerprint.get("session") for r in runs} == {exp_controller(store, exp_id)}, runs
        exp = store.get_experiment(exp_id)
        assert exp.status == "done" and exp.controller_id.endswith(f":{first.pid}")
        store.close()
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
            first.wait(10)


def test_take_over_after_owner_killed_resumes(tmp_path: Path) -> None:
    plan_file = _plan_file(tmp_path, "own-takeover")
    db = f"sqlite:///{tmp_path / 'orch.sqlite'}"
    env = _env(tmp_path, db)
    cmd = [sys.executable, "-m", "orchestrator.cli.main", "run", str(plan_file), "--json"]
    log = tmp_path / "first.log"
    first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"),  # noqa: SIM115
                             start_new_session=True)
    try:
        store, exp_id = _wait_running(db, first, log, points=1)
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(10)
    killed = next(r for r in store.runs(exp_id) if r.status == "running")
    again = subprocess.run([*cmd, "--take-over"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    runs = store.runs(exp_id)
    assert next(r for r in runs if r.id == killed.id).status == "aborted"
    # Resumed to the end: nothing left running; a (block, arm) counted at most once.
    assert not [r for r in runs if r.status == "running"]
    valid = [(r.block, r.arm) for r in runs if r.status == "done" and r.valid]
    assert len(valid) == len(set(valid))
    exp = store.get_experiment(exp_id)
    assert exp.status == "done" and exp.controller_id != f"{killed.id}" and f":{first.pid}" not in exp.controller_id
    store.close()


def test_controller_refuses_another_database() -> None:
    """Issue 18 item 7: the detached Ray controller keeps the first submitter's database; a
    submit (or cancel) for another database is refused instead of landing there."""
    from orchestrator.control.controller import check_database, same_database
    from orchestrator.errors import EnvironmentProblem

    served = "postgresql+psycopg://orch:secret@db:5432/orch"
    assert same_database(served, "postgresql://orch:other@db:5432/orch")
    assert not same_database(served, "postgresql+psycopg://orch@db:5432/other")
    assert not same_database(served, "sqlite:////tmp/orch.sqlite")
    check_database(served, "postgresql://orch@db:5432/orch")
    with pytest.raises(EnvironmentProblem, match=r"stores experiments in .*db:5432/orch, not in sqlite") as e:
        check_database(served, "sqlite:////tmp/orch.sqlite")
    assert "secret" not in str(e.value)
