"""`orch` as a user runs it: exit codes, one line per problem, no traceback, JSON output."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[2]
ORCH = [sys.executable, "-m", "orchestrator.cli.main"]


def orch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, **(env or {})}
    full_env.pop("ORCH_DEBUG", None) if env is None or "ORCH_DEBUG" not in env else None
    return subprocess.run([*ORCH, *args], cwd=ROOT, capture_output=True, text=True, env=full_env, timeout=120)


def test_validate_every_example_exits_0() -> None:
    for p in sorted((ROOT / "examples").glob("*.yaml")):
        r = orch("plan", "validate", str(p))
        assert r.returncode == 0, (p, r.stderr)


def test_wrong_plan_exits_1_with_four_paths_and_no_traceback() -> None:
    r = orch("plan", "validate", "tests/fixtures/plans/four-problems.yaml")
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 4, r.stderr
    for path in ("arms.A.colour", "arms.B.decode.tp", "workload.output_tokens", "bars.0.class"):
        assert any(line.startswith(path + ":") for line in lines), (path, lines)
    assert "Traceback" not in r.stderr


def test_debug_switch_restores_the_traceback() -> None:
    r = orch("plan", "validate", "tests/fixtures/plans/four-problems.yaml", env={"ORCH_DEBUG": "1"})
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_validate_json_is_one_document() -> None:
    r = orch("plan", "validate", "examples/quickstart.yaml", "--json")
    assert r.returncode == 0
    doc = json.loads(r.stdout)
    assert doc["plans"][0]["valid"] is True and len(doc["plans"][0]["sha256"]) == 64


def test_schema_command_validates_every_example() -> None:
    r = orch("plan", "schema")
    assert r.returncode == 0
    schema = json.loads(r.stdout)
    for p in sorted((ROOT / "examples").glob("*.yaml")):
        jsonschema.validate(yaml.safe_load(p.read_text()), schema)


def test_bad_flag_is_a_user_error() -> None:
    r = orch("plan", "validate", "--no-such-flag", "x.yaml")
    assert r.returncode == 1 and "Traceback" not in r.stderr
