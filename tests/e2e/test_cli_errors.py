"""`orch` given paths it cannot write, numbers out of range and databases it does not speak:
exit 1 or 2 with one line, never a traceback; nothing created for an experiment that is not
there; a new SQLite file opened by six processes at once migrates once, and all six exit 0.

The command's behaviour (exit code, stderr, what it creates) is the same in this process as in
its own, so `orch` runs in-process here (`main()` returns the exit code; an exception out of it
is the traceback a user would see) under `no_sockets`, so that a number that slipped through
starts no server, generator or run. Only the six-process test starts processes: forked from
this one, each runs `orch status` on the new file at the same moment, with no interpreter
start-up or imports to pay (what made it slow), and each its own process, file locks and
SQLite connection."""

from __future__ import annotations

import multiprocessing
import os
import sys
import traceback
from pathlib import Path

import pytest
import sqlalchemy as sa

# Imported here, at collection: matplotlib may run fc-list once to build its font cache, a
# process no_sockets would refuse inside a test.
import orchestrator.report  # noqa: F401
from orchestrator.cli.main import main
from orchestrator.plan import load_plan_file
from orchestrator.store import Store, database
from tests.e2e.helpers import orch_here

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def orch(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_sockets: list[str]):
    """`orch ARGS` against URL, in this process (ORCH_DEBUG unset): (exit code, stdout, stderr)."""
    monkeypatch.delenv("ORCH_DEBUG", raising=False)
    monkeypatch.chdir(ROOT)  # relative paths (examples/...) as the subprocess had them

    def run(*args: str, url: str) -> tuple[int, str, str]:
        return orch_here(*args, env={"ORCH_DATABASE_URL": url}, monkeypatch=monkeypatch, capsys=capsys)

    return run


def assert_one_line(r: tuple[int, str, str], codes: tuple[int, ...] = (1, 2)) -> str:
    code, stdout, stderr = r
    assert code in codes, (code, stdout, stderr)
    assert "Traceback" not in stderr + stdout, stderr
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert 1 <= len(lines) <= 3, stderr  # click's usage errors add a usage line and a hint
    return stderr


@pytest.fixture
def experiment(sqlite_url: str) -> str:
    """An experiment with nothing measured yet, in a fresh SQLite file."""
    with Store.open(sqlite_url) as store:
        reg = store.register_plan(load_plan_file(ROOT / "examples" / "quickstart.yaml"))
        store.create_experiment(reg.id, name="cli-errors")
    return "cli-errors"


def test_report_out_that_cannot_be_created(orch, sqlite_url: str, experiment: str, tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for out in ("/proc/orch-report", str(a_file / "sub"), str(a_file)):
        r = orch("report", experiment, "--out", out, url=sqlite_url)
        assert r[0] == 1, (out, r)
        assert "--out" in assert_one_line(r)


def test_export_out_under_a_file(orch, sqlite_url: str, experiment: str, tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    r = orch("export", experiment, "--format", "csv", "--out", str(a_file / "sub"), url=sqlite_url)
    assert_one_line(r)


def test_report_and_export_create_nothing_for_an_unknown_experiment(orch, sqlite_url: str, tmp_path: Path) -> None:
    for cmd in ("report", "export"):
        out = tmp_path / f"{cmd}-out"
        r = orch(cmd, "no-such-experiment", "--out", str(out), url=sqlite_url)
        assert r[0] == 1 and "no experiment" in assert_one_line(r), r
        assert not out.exists()


def test_out_of_range_numbers(orch, sqlite_url: str) -> None:
    for args in (("capacity", "--since", "1e308"), ("capacity", "--since", "inf"),
                 ("status", "99999999999999999999999"), ("verdict", "99999999999999999999999"),
                 ("sim", "serve", "--model", "qwen3-8b", "--gpu", "H200", "--port", "99999999"),
                 ("loadgen", "calibrate", "--step-s", "1e308"),
                 ("run", "examples/quickstart.yaml", "--blocks", "99999999999999999999")):
        r = orch(*args, url=sqlite_url)
        assert_one_line(r)


@pytest.mark.parametrize("url", ["mysql://u@localhost/db", "foo://", "postgresql+asyncpg://u@localhost/db",
                                 "sqlite+aiosqlite:///x.db", "::::"])
def test_unsupported_database_url(orch, url: str) -> None:
    r = orch("status", url=url)
    assert r[0] == 1
    assert_one_line(r)


def _orch_status_in_child(url: str, go: multiprocessing.synchronize.Event, out: str) -> None:
    """A forked child: `orch status --json` on URL once `go` is set, its stdout and stderr to
    OUT.stdout/.stderr; its exit code is the process's."""
    os.environ["ORCH_DATABASE_URL"] = url
    os.environ.pop("ORCH_DEBUG", None)
    with open(f"{out}.stdout", "w") as so, open(f"{out}.stderr", "w") as se:
        sys.stdout, sys.stderr = so, se
        go.wait(60)
        try:
            code = main(["status", "--json"])
        except BaseException:  # what a user would see as the traceback
            traceback.print_exc()
            code = 70
        so.flush()
        se.flush()
    sys.exit(code)


def test_six_processes_on_a_new_sqlite_file_all_exit_0(tmp_path: Path) -> None:
    db = tmp_path / "first-use.sqlite"
    url = f"sqlite:///{db}"
    ctx = multiprocessing.get_context("fork")
    go = ctx.Event()
    procs = [ctx.Process(target=_orch_status_in_child, args=(url, go, str(tmp_path / f"p{i}"))) for i in range(6)]
    for p in procs:
        p.start()
    go.set()  # all six open the new file at once
    for p in procs:
        p.join(120)
    try:
        assert all(p.exitcode is not None for p in procs), "a process did not finish"
        for i, p in enumerate(procs):
            stderr = (tmp_path / f"p{i}.stderr").read_text()
            assert p.exitcode == 0, (p.exitcode, stderr)
            assert "Traceback" not in stderr, stderr
            assert (tmp_path / f"p{i}.stdout").read_text().strip().startswith(("{", "[")), i
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
    # Migrated, to the head revision.
    engine = sa.create_engine(url)
    try:
        assert database.current_revision(engine) == database.head_revision()
    finally:
        engine.dispose()
