"""`orch` given paths it cannot write, numbers out of range and databases it does not speak:
exit 1 or 2 with one line, never a traceback; nothing created for an experiment that is not
there; a new SQLite file opened by six processes at once migrates once, and all six exit 0."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from orchestrator.plan import load_plan_file
from orchestrator.store import Store

ROOT = Path(__file__).resolve().parents[2]
ORCH = [sys.executable, "-m", "orchestrator.cli.main"]


def orch(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "ORCH_DATABASE_URL": url}
    env.pop("ORCH_DEBUG", None)
    return subprocess.run([*ORCH, *args], cwd=ROOT, capture_output=True, text=True, env=env, timeout=120)


def assert_one_line(r: subprocess.CompletedProcess[str], codes: tuple[int, ...] = (1, 2)) -> str:
    assert r.returncode in codes, (r.returncode, r.stdout, r.stderr)
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert 1 <= len(lines) <= 3, r.stderr  # click's usage errors add a usage line and a hint
    return r.stderr


@pytest.fixture
def experiment(sqlite_url: str) -> str:
    """An experiment with nothing measured yet, in a fresh SQLite file."""
    with Store.open(sqlite_url) as store:
        reg = store.register_plan(load_plan_file(ROOT / "examples" / "quickstart.yaml"))
        store.create_experiment(reg.id, name="cli-errors")
    return "cli-errors"


def test_report_out_that_cannot_be_created(sqlite_url: str, experiment: str, tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    for out in ("/proc/orch-report", str(a_file / "sub"), str(a_file)):
        r = orch("report", experiment, "--out", out, url=sqlite_url)
        assert r.returncode == 1, (out, r.stderr)
        assert "--out" in assert_one_line(r)


def test_export_out_under_a_file(sqlite_url: str, experiment: str, tmp_path: Path) -> None:
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    r = orch("export", experiment, "--format", "csv", "--out", str(a_file / "sub"), url=sqlite_url)
    assert_one_line(r)


def test_report_and_export_create_nothing_for_an_unknown_experiment(sqlite_url: str, tmp_path: Path) -> None:
    for cmd in ("report", "export"):
        out = tmp_path / f"{cmd}-out"
        r = orch(cmd, "no-such-experiment", "--out", str(out), url=sqlite_url)
        assert r.returncode == 1 and "no experiment" in assert_one_line(r), r.stderr
        assert not out.exists()


def test_out_of_range_numbers(sqlite_url: str) -> None:
    for args in (("capacity", "--since", "1e308"), ("capacity", "--since", "inf"),
                 ("status", "99999999999999999999999"), ("verdict", "99999999999999999999999"),
                 ("sim", "serve", "--model", "qwen3-8b", "--gpu", "H200", "--port", "99999999"),
                 ("loadgen", "calibrate", "--step-s", "1e308"),
                 ("run", "examples/quickstart.yaml", "--blocks", "99999999999999999999")):
        r = orch(*args, url=sqlite_url)
        assert_one_line(r)


@pytest.mark.parametrize("url", ["mysql://u@localhost/db", "foo://", "postgresql+asyncpg://u@localhost/db",
                                 "sqlite+aiosqlite:///x.db", "::::"])
def test_unsupported_database_url(url: str) -> None:
    r = orch("status", url=url)
    assert r.returncode == 1
    assert_one_line(r)


def test_six_processes_on_a_new_sqlite_file_all_exit_0(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'first-use.sqlite'}"
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: orch("status", "--json", url=url), range(6)))
    for r in results:
        assert r.returncode == 0, r.stderr
        assert "Traceback" not in r.stderr
