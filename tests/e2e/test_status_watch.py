"""`orch status --watch EXPERIMENT` follows an experiment from the store: progress lines while it
runs (runs done of planned, the current run, its points, the ETA), then the final status; exit 0
when it ends, exit 1 with one line for an experiment that is not there."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from orchestrator.cli.main import main
from orchestrator.plan import load_plan_file
from orchestrator.store import Store
from tests.support.seeding import running_experiment

ROOT = Path(__file__).resolve().parents[2]


def running_experiment_of_quickstart(url: str) -> int:
    return running_experiment(url, load_plan_file(ROOT / "examples" / "quickstart.yaml"), "watched")


def test_watch_follows_until_the_experiment_ends(sqlite_url: str, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ORCH_DATABASE_URL", sqlite_url)
    exp = running_experiment_of_quickstart(sqlite_url)
    blocks = load_plan_file(ROOT / "examples" / "quickstart.yaml").design.blocks

    def finish() -> None:
        time.sleep(1.0)
        with Store.open(sqlite_url) as st:
            st.set_experiment_status(exp, "done")

    t = threading.Thread(target=finish)
    t.start()
    t0 = time.monotonic()
    try:
        code = main(["status", "--watch", "watched", "--interval", "0.1"])
    finally:
        t.join()
    took = time.monotonic() - t0
    out = capsys.readouterr().out
    assert code == 0, out
    assert took < 10, took
    lines = out.splitlines()
    # one progress line (it did not change while polled), then the final status
    assert lines[0].startswith(f"watched (id {exp}): running, runs 1/{2 * blocks} done | block 0 arm B: "
                               "1 point(s), last 1.5 req/s: attainment interactive 0.93 | ETA "), out
    assert sum("running, runs" in line for line in lines) == 1, out
    assert lines[1] == f"watched (id {exp}): done, 1/{2 * blocks} valid runs", out


def test_watch_of_an_experiment_already_ended_prints_its_status(sqlite_url: str, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ORCH_DATABASE_URL", sqlite_url)
    exp = running_experiment_of_quickstart(sqlite_url)
    with Store.open(sqlite_url) as st:
        st.set_experiment_status(exp, "cancelled")
    assert main(["status", "--watch", str(exp), "--interval", "0.1"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith(f"watched (id {exp}): cancelled, 1/")


def test_watch_of_an_unknown_experiment_waits_then_is_one_line_and_exit_1(
        sqlite_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import run_cmd

    monkeypatch.setenv("ORCH_DATABASE_URL", sqlite_url)
    monkeypatch.delenv("ORCH_DEBUG", raising=False)
    monkeypatch.setattr(run_cmd, "WATCH_APPEAR_S", 0.3)
    assert main(["status", "--watch", "nope", "--interval", "0.1"]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["waiting for experiment nope to start (its run may still be in the dry run)"]
    assert captured.err.strip().splitlines() == ["no experiment 'nope' appeared within 0s (`orch status` lists them)"]


def test_watch_waits_for_an_experiment_still_in_its_dry_run(sqlite_url: str, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 32: `orch status --watch NAME` started beside `orch run`, before the run has made
    its experiment (the dry run comes first), follows it once it appears."""
    monkeypatch.setenv("ORCH_DATABASE_URL", sqlite_url)

    def appear() -> None:
        time.sleep(0.5)
        exp = running_experiment_of_quickstart(sqlite_url)
        time.sleep(0.5)
        with Store.open(sqlite_url) as st:
            st.set_experiment_status(exp, "done")

    t = threading.Thread(target=appear)
    t.start()
    try:
        code = main(["status", "--watch", "watched", "--interval", "0.1"])
    finally:
        t.join()
    lines = capsys.readouterr().out.splitlines()
    assert code == 0, lines
    assert lines[0].startswith("waiting for experiment watched to start"), lines
    assert any(ln.startswith("watched (id ") and ": done, 1/" in ln for ln in lines), lines


def test_watch_as_a_process(sqlite_url: str) -> None:
    """`python -m orchestrator.cli.main status --watch`: its first progress line comes while the
    experiment runs; marked done by another process (this test), it prints the status and exits 0."""
    exp = running_experiment_of_quickstart(sqlite_url)
    env = {**os.environ, "ORCH_DATABASE_URL": sqlite_url}
    env.pop("ORCH_DEBUG", None)
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator.cli.main", "status", "--watch", "watched",
                             "--interval", "0.2"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    guard = threading.Timer(60, proc.kill)  # a watch that never prints must not hang the suite
    guard.start()
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.startswith(f"watched (id {exp}): running, runs 1/"), first
        with Store.open(sqlite_url) as st:
            st.set_experiment_status(exp, "done")
        out, err = proc.communicate(timeout=60)
    finally:
        guard.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert out.splitlines()[0].startswith(f"watched (id {exp}): done, 1/"), out


def test_stored_progress_names_the_point_being_measured(sqlite_url: str) -> None:
    from orchestrator.control.progress import stored_progress

    exp = running_experiment_of_quickstart(sqlite_url)
    with Store.open(sqlite_url) as st:
        b = next(r for r in st.runs(exp) if r.arm == "B")
        st.record_point(b.id, seq=1, window_start_s=1, window_end_s=2, offered_rate=3.0)  # records not in yet
        p = stored_progress(st, "watched")
    assert p.current == ("block 0 arm B: 2 point(s), measuring 3 req/s, "
                         "last 1.5 req/s: attainment interactive 0.93")
    assert (p.estimate.done_runs, p.valid_runs) == (1, 1)


def test_watch_needs_an_experiment_and_no_json(sqlite_url: str, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("ORCH_DATABASE_URL", sqlite_url)
    monkeypatch.delenv("ORCH_DEBUG", raising=False)
    assert main(["status", "--watch"]) == 1
    assert main(["status", "--watch", "x", "--json"]) == 1
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 2
