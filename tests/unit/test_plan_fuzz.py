"""Hostile plans: the loader and validator refuse them in bounded time and memory, with one line
per problem, and never fail any other way (DESIGN section 12).

A fuzz test (hypothesis, bounded examples and deadline) throws random YAML-ish text and random
mutations of the example plans at `load_plan_text`/`validate_plan` and at `orch plan validate`;
explicit tests pin each refusal: alias bombs, duplicate keys, non-UTF-8, deep nesting, inf/nan,
absurd numbers, and problems a wrong sibling field used to hide."""

from __future__ import annotations

import contextlib
import copy
import io
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator.errors import PlanError, UserError
from orchestrator.plan import Plan, load_plan_file, load_plan_text, loading, validate_plan
from orchestrator.plan.loading import MAX_PLAN_BYTES

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
EXAMPLE_DATA = [yaml.safe_load(p.read_text()) for p in EXAMPLES]
FUZZ = settings(max_examples=60, deadline=2000, suppress_health_check=[HealthCheck.too_slow],
                derandomize=True, database=None)


def outcome(fn: Any, *args: Any) -> Plan | PlanError | UserError:
    """What the loader may do: return a plan, or refuse it as the user's error. Nothing else."""
    try:
        plan: Plan = fn(*args)
        return plan
    except (PlanError, UserError) as e:
        assert e.problems and all(isinstance(p, str) and "\n" not in p for p in e.problems)
        return e


def cli_validate(path: Path) -> tuple[int, str]:
    from orchestrator.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", "validate", str(path)])
    return code, out.getvalue() + err.getvalue()


# -- fuzz -----------------------------------------------------------------------------------

YAML_BITS = st.sampled_from([
    "name: x\n", "arms:\n", "  A: {gpu: H200}\n", "- ", "[", "]", "{", "}", ":", "&a ", "*a", "<<: *a\n",
    ".inf", ".nan", "-.inf", "1e308", "!!binary AAAA", "!!python/object:os.system", "? ", "|\n  x\n",
    "'", '"', "\t", "\n", "  ", "#", "%YAML 1.1\n", "---\n", "...\n", "\x00", "\ufeff", "~", "0x" + "f" * 40,
    "9" * 5000, "bars: []\n", "search: {rate: {min: 1, max: 2}}\n",
])


@FUZZ
@given(st.one_of(st.text(max_size=300), st.lists(YAML_BITS, max_size=40).map("".join)))
def test_random_text_is_a_plan_or_a_plan_error(text: str) -> None:
    outcome(load_plan_text, text)


HOSTILE_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=20),
    st.sampled_from([1e308, -1e308, 1e12, 0, -1, 2**63, float("inf"), float("nan"), "H200", "disaggregated"]),
    st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=5), st.integers(), max_size=3),
)


def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(data, dict):
        for k, v in data.items():
            out.extend(_paths(v, (*prefix, k)))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            out.extend(_paths(v, (*prefix, i)))
    return out


@st.composite
def mutated_plans(draw: st.DrawFn) -> dict[str, Any]:
    data = copy.deepcopy(draw(st.sampled_from(EXAMPLE_DATA)))
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(data)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = data
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["set", "delete", "add"]))
        if action == "delete" and isinstance(parent, dict):
            del parent[path[-1]]
        elif action == "add" and isinstance(parent, dict):
            parent[draw(st.text(min_size=1, max_size=8))] = draw(HOSTILE_VALUES)
        else:
            parent[path[-1]] = draw(HOSTILE_VALUES)
    return data


@FUZZ
@given(mutated_plans())
def test_mutated_examples_are_a_plan_or_a_plan_error(data: dict[str, Any]) -> None:
    outcome(validate_plan, copy.deepcopy(data))
    text = yaml.safe_dump(data, allow_unicode=True)
    outcome(load_plan_text, text)


@settings(max_examples=8, deadline=10_000, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(mutated_plans().map(lambda d: yaml.safe_dump(d).encode()),
                 st.lists(YAML_BITS, max_size=30).map(lambda b: "".join(b).encode("utf-8", "surrogatepass")),
                 st.binary(max_size=200)))
def test_cli_validate_exits_0_or_1_without_a_traceback(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "plan.yaml"
        path.write_bytes(raw)
        code, output = cli_validate(path)
    assert code in (0, 1), output
    assert "Traceback" not in output


# -- explicit refusals ------------------------------------------------------------------------

def alias_bomb(depth: int) -> str:
    """Each level: a list of nine aliases of the level below (9**depth strings once expanded)."""
    lines = ['l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, depth + 1):
        lines.append(f"l{i}: &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("depth", [7, 10])
def test_alias_bomb_refused_fast_in_little_memory(depth: int) -> None:
    text = alias_bomb(depth)
    assert len(text) < 800
    tracemalloc.start()
    t0 = time.perf_counter()
    try:
        with pytest.raises(PlanError) as e:
            load_plan_text(text)
        elapsed = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert elapsed < 1.0
    assert peak < 100e6
    assert len(e.value.problems) == 1 and "aliases" in e.value.problems[0]


def test_an_anchor_in_an_otherwise_valid_plan_is_refused() -> None:
    text = (ROOT / "examples" / "quickstart.yaml").read_text().replace("search:", "search: &s", 1)
    with pytest.raises(PlanError) as e:
        load_plan_text(text)
    assert "anchors and aliases" in e.value.problems[0]


def test_duplicate_keys_name_both_lines() -> None:
    text = (ROOT / "examples" / "quickstart.yaml").read_text()
    first = next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith("search:"))
    text += "search: {rate: {min: 1, max: 2}}\n"
    last = len(text.splitlines())
    with pytest.raises(PlanError) as e:
        load_plan_text(text)
    assert len(e.value.problems) == 1
    line = e.value.problems[0]
    assert line.startswith("search:") and f"line {first}" in line and f"line {last}" in line


def test_nested_duplicate_key() -> None:
    with pytest.raises(PlanError) as e:
        load_plan_text("name: x\narms:\n  A:\n    gpu: H200\n    gpu: H100\n")
    assert e.value.problems == ["arms.A.gpu: duplicate key: given on line 4 and again on line 5 (line 5)"]


def test_non_utf8_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"name: x\nmodel: \xff\xfe\x00qwen\n")
    with pytest.raises(PlanError) as e:
        load_plan_file(path)
    assert len(e.value.problems) == 1 and "not UTF-8" in e.value.problems[0] and "line 2" in e.value.problems[0]
    code, output = cli_validate(path)
    assert code == 1 and "Traceback" not in output and len(output.strip().splitlines()) == 1


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, "{a: " * 50_000 + "1" + "}" * 50_000,
                                  "".join(f"{'  ' * i}k{i}:\n" for i in range(200)) + "  " * 200 + "v"])
def test_deep_nesting_is_one_line(text: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Refused as the composer passes MAX_DEPTH, not after building the whole tree: counted in
    # composed nodes (a wall-clock bound here would fail on a loaded machine).
    composed = [0]
    real = loading._PlanLoader.compose_node

    def counting(self: Any, parent: Any, index: Any) -> Any:
        composed[0] += 1
        return real(self, parent, index)

    monkeypatch.setattr(loading._PlanLoader, "compose_node", counting)
    with pytest.raises(PlanError) as e:
        load_plan_text(text)
    assert composed[0] <= 2 * (loading.MAX_DEPTH + 1)  # a mapping composes its key and its value
    monkeypatch.undo()
    assert len(e.value.problems) == 1 and "nested deeper" in e.value.problems[0]
    path = tmp_path / "deep.yaml"
    path.write_text(text)
    code, output = cli_validate(path)
    assert code == 1 and "Traceback" not in output


def test_oversized_file_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("# " + "x" * MAX_PLAN_BYTES + "\n")
    with pytest.raises(PlanError) as e:
        load_plan_file(path)
    assert "larger than" in e.value.problems[0]


def test_huge_integer_literal_is_a_plan_error() -> None:
    with pytest.raises(PlanError) as e:
        load_plan_text("name: x\nseed: " + "9" * 5000 + "\n")
    assert "cannot be read" in e.value.problems[0]


def _quickstart() -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    return data


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan", ".NaN", ".Inf"])
def test_non_finite_numbers_refused_everywhere(value: str) -> None:
    base = (ROOT / "examples" / "quickstart.yaml").read_text()
    for old, path in (("point_s: 6", "search.point_s"), ("precision: 0.05", "search.precision"),
                      ("max: 64", "search.rate.max")):
        text = base.replace(old, old.split(":")[0] + ": " + value, 1)
        with pytest.raises(PlanError) as e:
            load_plan_text(text)
        assert any(p.startswith(path + ":") and "finite" in p for p in e.value.problems), e.value.problems


def test_non_finite_in_data_refused_too() -> None:
    data = _quickstart()
    data["search"]["rate"]["max"] = float("inf")
    data["sim"] = {"noise": float("nan")}
    with pytest.raises(PlanError) as e:
        validate_plan(data)
    paths = {p.split(":")[0] for p in e.value.problems}
    assert {"search.rate.max", "sim.noise"} <= paths


@pytest.mark.parametrize(("path", "value"), [
    (("search", "rate", "max"), 1e9), (("search", "point_s"), 1e308), (("search", "warmup_s"), 1e7),
    (("workload", "prompts", "conversations"), 10**12), (("workload", "output_tokens"), 10**9),
    (("design", "blocks"), 10**6), (("workload", "prompts", "turns"), 10**6),
])
def test_absurd_values_refused(path: tuple[str, ...], value: float) -> None:
    data = _quickstart()
    node = data
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = value
    with pytest.raises(PlanError) as e:
        validate_plan(data)
    assert any(p.startswith(".".join(path) + ":") and "less than or equal" in p for p in e.value.problems)


def test_bounds_are_in_the_schema() -> None:
    from orchestrator.plan import json_schema

    schema = json_schema()
    search = schema["$defs"]["SearchSettings"]["properties"]
    assert search["point_s"]["maximum"] == 86_400 and "at most 86400" in search["point_s"]["description"]
    assert schema["$defs"]["RateRange"]["properties"]["max"]["maximum"] == 100_000


def test_unknown_key_does_not_hide_the_tp_rule() -> None:
    data = yaml.safe_load((ROOT / "examples" / "disagg-vs-colocated-h200.yaml").read_text())
    arm = next(a for a in data["arms"].values() if a.get("layout") == "disaggregated")
    name = next(k for k, a in data["arms"].items() if a is arm)
    arm["prefill"]["tp"] = 2
    arm["decode"]["tp"] = 1
    arm["colour"] = "blue"
    with pytest.raises(PlanError) as e:
        validate_plan(data)
    paths = [p.split(":")[0] for p in e.value.problems]
    assert f"arms.{name}.colour" in paths and f"arms.{name}.decode.tp" in paths, e.value.problems


def test_a_key_with_a_newline_is_reported_on_one_line() -> None:
    # Found by the fuzz test once the three-arm example joined the examples: an unknown key
    # "\n" made a two-line problem.
    data = copy.deepcopy(EXAMPLE_DATA[0])
    data["\n"] = None
    data["arms"]["A"]["x\ty"] = 1
    problems = outcome(validate_plan, data)
    assert isinstance(problems, PlanError)
    assert sorted(problems.problems)[0].startswith("\\n: unknown field")
    assert any(p.startswith("arms.A.x\\ty: unknown field") for p in problems.problems), problems.problems
