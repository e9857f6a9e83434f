"""`orch plan register`, `orch capacity`, `orch db upgrade` as a user runs them.

One test runs the real `orch` process; the rest call the same entry point in process (an `orch`
start-up costs seconds on a loaded machine) with the same arguments, environment and streams.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.cli.main import main
from orchestrator.plan import load_plan_file, validate_plan
from orchestrator.store import Store

ROOT = Path(__file__).resolve().parents[2]
ORCH = [sys.executable, "-m", "orchestrator.cli.main"]


def orch_process(*args: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("ORCH_DATABASE_URL", "ORCH_DEBUG")}
    return subprocess.run([*ORCH, *args], cwd=cwd, capture_output=True, text=True, env={**full, **env}, timeout=120)


@pytest.fixture
def orch(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]):
    """`orch ARGS` in process: returns (exit code, stdout, stderr)."""

    def run(*args: str, env: dict[str, str], cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
        monkeypatch.delenv("ORCH_DATABASE_URL", raising=False)
        monkeypatch.delenv("ORCH_DEBUG", raising=False)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.chdir(cwd)
        capsys.readouterr()
        code = main(list(args))
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out, out.err)

    return run


def test_register_twice_prints_the_same_id_and_sha256(sqlite_url: str, orch) -> None:
    env = {"ORCH_DATABASE_URL": sqlite_url}
    first = orch_process("plan", "register", "examples/quickstart.yaml", "--json", env=env)
    again = orch_process("plan", "register", "examples/quickstart.yaml", "--json", env=env)
    assert first.returncode == 0 and again.returncode == 0, (first.stderr, again.stderr)
    a, b = json.loads(first.stdout), json.loads(again.stdout)
    assert (a["id"], a["sha256"]) == (b["id"], b["sha256"])
    assert a["created"] is True and b["created"] is False
    plain = orch("plan", "register", "examples/quickstart.yaml", env=env)
    assert f"id {a['id']}" in plain.stdout and a["sha256"] in plain.stdout


def test_default_database_is_created_in_the_user_data_dir(tmp_path: Path, orch) -> None:
    env = {"XDG_DATA_HOME": str(tmp_path / "data"), "HOME": str(tmp_path)}
    r = orch("plan", "register", str(ROOT / "examples/quickstart.yaml"), "--json", env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    db = tmp_path / "data" / "orchestrator" / "orchestrator.sqlite"
    assert db.exists()
    up = orch("db", "upgrade", "--json", env=env, cwd=tmp_path)  # from any folder
    assert up.returncode == 0, up.stderr
    doc = json.loads(up.stdout)
    assert doc["revision"] == doc["head"] == doc["from_revision"]  # migrated on first use


def test_db_upgrade_migrates_an_empty_database(db_url: str, orch) -> None:
    r = orch("db", "upgrade", "--json", env={"ORCH_DATABASE_URL": db_url})
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["from_revision"] is None and doc["revision"] == doc["head"]


@pytest.mark.parametrize("command", [("capacity",), ("db", "upgrade"), ("plan", "register", "examples/quickstart.yaml")])
def test_unreachable_database_exits_2_with_one_line(command: tuple[str, ...], orch) -> None:
    r = orch(*command, env={"ORCH_DATABASE_URL": "postgresql://nobody@127.0.0.1:1/none"})
    assert r.returncode == 2
    assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "unreachable" in r.stderr and "ORCH_DATABASE_URL" in r.stderr


def test_capacity_prints_history_as_table_and_json(db_url: str, orch) -> None:
    plan = load_plan_file(ROOT / "examples/quickstart.yaml")
    with Store.open(db_url) as store:
        exp = store.create_experiment(store.register_plan(plan).id)
        for block, (arm, cap, valid) in enumerate([("A", 1200.0, True), ("B", 1500.0, True), ("A", 9e9, False)]):
            run = store.start_run(exp, arm, block, 0, 0, store.deployment_config(plan, arm))
            store.record_capacity(run, "interactive", cap, 3.0, 0.91, 6)
            store.finish_run(run, "done", valid=valid)
    env = {"ORCH_DATABASE_URL": db_url}
    r = orch("capacity", "--gpu", "h200", "--class", "interactive", "--json", env=env)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["filters"] == {"gpu": "H200", "service_class": "interactive"}
    assert [(row["layout"], row["median"], row["runs"]) for row in doc["rows"]] == [
        ("disaggregated", 1500.0, 1), ("colocated", 1200.0, 1)]
    table = orch("capacity", "--layout", "colocated", env=env)
    assert table.returncode == 0 and "1,200" in table.stdout and "9,000,000,000" not in table.stdout
    assert "1,500" not in table.stdout
    assert orch("capacity", "--model", "nope", env=env).stdout.strip() == "no valid runs match these filters"
    bad = orch("capacity", "--gpu", "A100", env=env)
    assert bad.returncode == 1 and "unknown GPU type" in bad.stderr


def test_register_is_idempotent_on_postgresql_too(pg_url: str, orch) -> None:
    env = {"ORCH_DATABASE_URL": pg_url}
    docs = [json.loads(orch("plan", "register", "examples/quickstart.yaml", "--json", env=env).stdout)
            for _ in range(2)]
    assert (docs[0]["id"], docs[0]["sha256"]) == (docs[1]["id"], docs[1]["sha256"])


def test_capacity_filters_external_arms_without_a_layout_label(sqlite_url: str, orch) -> None:
    data = yaml.safe_load((ROOT / "examples/external-ab.yaml").read_text())
    del data["arms"]["B"]["labels"]["layout"]  # a stack whose layout nobody stated
    plan = validate_plan(data)
    with Store.open(sqlite_url) as store:
        exp = store.create_experiment(store.register_plan(plan).id)
        for block, (arm, cap) in enumerate([("A", 700.0), ("B", 950.0)]):
            run = store.start_run(exp, arm, block, 0, 0, store.deployment_config(plan, arm))
            store.record_capacity(run, "standard", cap, 3.0, 0.91, 6)
            store.finish_run(run, "done", valid=True)
    r = orch("capacity", "--layout", "external", "--json", env={"ORCH_DATABASE_URL": sqlite_url})
    assert r.returncode == 0, r.stderr
    assert [(row["layout"], row["median"]) for row in json.loads(r.stdout)["rows"]] == [("external", 950.0)]
    bad = orch("capacity", "--layout", "sideways", env={"ORCH_DATABASE_URL": sqlite_url})
    assert bad.returncode == 1 and "colocated, disaggregated or external" in bad.stderr


def test_a_locked_sqlite_file_is_one_line(tmp_path: Path, orch) -> None:
    """Issue 30: another process holding the SQLite file's write lock longer than the busy
    wait is the environment's problem: one line naming it and the remedy, exit 2."""
    import sqlite3

    db = tmp_path / "orch.sqlite"
    env = {"ORCH_DATABASE_URL": f"sqlite:///{db}"}
    assert orch("plan", "register", "examples/quickstart.yaml", env=env).returncode == 0
    holder = sqlite3.connect(db, isolation_level=None)
    try:
        holder.execute("BEGIN EXCLUSIVE")  # what a long write of another process holds
        r = orch("plan", "register", "examples/three-arms.yaml", env=env)
    finally:
        holder.close()
    assert r.returncode == 2, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "database is locked" in lines[0] and "PostgreSQL" in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    assert orch("plan", "register", "examples/three-arms.yaml", env=env).returncode == 0  # nothing lost
