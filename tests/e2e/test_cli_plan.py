"""`orch` as a user runs it: exit codes, one line per problem, no traceback, JSON output.

`orch` runs in this process (`main()` returns the exit code a process would exit with, and
writes the same stdout and stderr; an exception out of it is the traceback a user would see):
what these tests check is the command's, not the interpreter's, and a process per command cost
seconds of start-up and imports each."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from orchestrator.errors import UserError
from tests.e2e.helpers import orch_here

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def orch(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], no_sockets: list[str]):
    """`orch ARGS` in this process, from the repository root, ORCH_DEBUG unset unless ENV sets
    it: (exit code, stdout, stderr)."""
    monkeypatch.delenv("ORCH_DEBUG", raising=False)
    monkeypatch.chdir(ROOT)

    def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        return orch_here(*args, env=env or {}, monkeypatch=monkeypatch, capsys=capsys)

    return run


def test_validate_every_example_exits_0(orch) -> None:
    examples = sorted((ROOT / "examples").glob("*.yaml"))
    assert examples
    for p in examples:
        code, _, stderr = orch("plan", "validate", str(p))
        assert code == 0, (p, stderr)


def test_wrong_plan_exits_1_with_four_paths_and_no_traceback(orch) -> None:
    code, _, stderr = orch("plan", "validate", "tests/fixtures/plans/four-problems.yaml")
    assert code == 1
    lines = stderr.strip().splitlines()
    assert len(lines) == 4, stderr
    for path in ("arms.A.colour", "arms.B.decode.tp", "workload.output_tokens", "bars.0.class"):
        assert any(line.startswith(path + ":") for line in lines), (path, lines)
    assert "Traceback" not in stderr


def test_debug_switch_restores_the_traceback(orch) -> None:
    # ORCH_DEBUG=1: the error leaves main() (the interpreter prints its traceback) instead of
    # becoming one line per problem and an exit code.
    with pytest.raises(UserError) as raised:
        orch("plan", "validate", "tests/fixtures/plans/four-problems.yaml", env={"ORCH_DEBUG": "1"})
    assert any(p.startswith("arms.A.colour:") for p in raised.value.problems), raised.value.problems


def test_validate_json_is_one_document(orch) -> None:
    code, stdout, _ = orch("plan", "validate", "examples/quickstart.yaml", "--json")
    assert code == 0
    doc = json.loads(stdout)
    assert doc["plans"][0]["valid"] is True and len(doc["plans"][0]["sha256"]) == 64


def test_schema_command_validates_every_example(orch) -> None:
    code, stdout, _ = orch("plan", "schema")
    assert code == 0
    schema = json.loads(stdout)
    for p in sorted((ROOT / "examples").glob("*.yaml")):
        jsonschema.validate(yaml.safe_load(p.read_text()), schema)


def test_bad_flag_is_a_user_error(orch) -> None:
    code, _, stderr = orch("plan", "validate", "--no-such-flag", "x.yaml")
    assert code == 1 and "Traceback" not in stderr
