"""The plan language: strictness, cross-field checks, catalogs, hashing, schema."""

from __future__ import annotations

import copy
from pathlib import Path

import jsonschema
import pytest
import yaml
from pydantic import ValidationError

from orchestrator.errors import PlanError
from orchestrator.plan import (
    MODELS,
    SERVICE_CLASSES,
    canonical_gpu,
    json_schema,
    load_plan_file,
    load_plan_text,
    plan_from_canonical,
    plan_hash,
    plan_warnings,
    validate_plan,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


def raw(path: Path = QUICKSTART) -> dict:
    return yaml.safe_load(path.read_text())


def problems_of(data: dict) -> list[str]:
    with pytest.raises(PlanError) as e:
        validate_plan(data)
    return list(e.value.problems)


def test_examples_exist_and_validate() -> None:
    names = {p.name for p in EXAMPLES}
    assert {"quickstart.yaml", "disagg-vs-colocated-h200.yaml", "fp8-kv-h100.yaml",
            "router-cache-aware.yaml"} <= names
    for p in EXAMPLES:
        plan = load_plan_file(p)
        arms = {"three-arms.yaml": "ABC", "sweep.yaml": "ABCDEF"}.get(p.name, "AB")
        assert set(plan.arms) == set(arms)


def test_unknown_key_is_an_error_with_its_path() -> None:
    data = raw()
    data["workload"]["prompts"]["shared_prefx"] = 0.3
    probs = problems_of(data)
    assert any(p.startswith("workload.prompts.shared_prefx: unknown field") for p in probs), probs


def test_four_problems_reported_at_once_with_paths_and_lines() -> None:
    with pytest.raises(PlanError) as e:
        load_plan_file(ROOT / "tests" / "fixtures" / "plans" / "four-problems.yaml")
    probs = e.value.problems
    assert len(probs) == 4, probs
    joined = "\n".join(probs)
    assert "arms.A.colour: unknown field" in joined
    assert "arms.B.decode.tp: decode TP (1) must be >= prefill TP (2)" in joined
    assert "workload.output_tokens:" in joined and "'lots'" in joined
    assert "bars.0.class: class 'agent' is not measured" in joined
    assert all("(line " in p for p in probs)


def test_yaml_syntax_error_names_the_line() -> None:
    with pytest.raises(PlanError) as e:
        load_plan_text("name: x\narms: {A: [1, 2}\n")
    assert "YAML syntax" in e.value.problems[0] and "(line 2)" in e.value.problems[0]


def test_models_are_frozen() -> None:
    plan = load_plan_file(QUICKSTART)
    with pytest.raises(ValidationError):
        plan.design.blocks = 9  # type: ignore[misc]


@pytest.mark.parametrize(
    ("mutate", "expected"),
    [
        (lambda d: d["arms"]["B"].pop("decode"), "arms.B.decode: a disaggregated arm needs both"),
        (lambda d: d["arms"]["A"].pop("replicas"), "arms.A.replicas: a colocated arm needs"),
        (lambda d: d["arms"].pop("B"), "arms: arms must be named by consecutive letters from A"),
        (lambda d: d["arms"]["A"].update(tp=3), "arms.A.tp: tp must be one of"),
        (lambda d: d["arms"]["A"].update(gpu="A100"), "arms.A.gpu: unknown GPU type 'A100'"),
        (lambda d: d.update(model="gpt-9"), "model: unknown model 'gpt-9'"),
        (lambda d: d["bars"][0].update(at_most=2.0), "bars.0.at_least: give exactly one"),
        (lambda d: d["bars"][0].update(metric="goodput_at"), "bars.0.rate: metric goodput_at needs"),
        (lambda d: d["search"]["rate"].update(max=0.5), "search.rate.max: max (0.5) must exceed min"),
        (lambda d: d.update(classes=["interactive", "interactive"]), "classes.1: class 'interactive' is listed twice"),
    ],
)
def test_cross_field_checks(mutate, expected: str) -> None:
    data = copy.deepcopy(raw())
    mutate(data)
    probs = problems_of(data)
    assert any(p.startswith(expected) for p in probs), probs


def test_capacity_bar_needs_open_loop() -> None:
    data = raw()
    data["workload"].pop("arrival")
    data["workload"]["closed"] = {"users": 64}
    probs = problems_of(data)
    assert any(p.startswith("bars.0.metric: capacity comes from open-loop runs only") for p in probs)


def test_weights_must_fit_the_gpu_at_tp() -> None:
    data = raw()
    data["model"] = "llama-3.1-70b"
    data["arms"]["A"]["gpu"] = "H100"
    probs = problems_of(data)
    assert any(p.startswith("arms.A.tp: llama-3.1-70b weights need 141.2 GB per GPU at TP 1") for p in probs), probs
    data["arms"]["A"]["tp"] = 2
    data["arms"]["B"]["prefill"]["tp"] = 2
    data["arms"]["B"]["decode"]["tp"] = 2
    validate_plan(data)


def test_kv_fit_warning_states_how_many_fit() -> None:
    data = raw()
    data["arms"]["A"]["gpu"] = "H100-PCIe"
    data["arms"]["A"]["engine"]["max_num_seqs"] = 1024
    warnings = plan_warnings(validate_plan(data))
    assert any(w.startswith("arms.A: the KV cache holds about") for w in warnings), warnings


def test_catalogs_carry_the_seed_figures() -> None:
    q = MODELS["qwen3-8b"]
    assert q.kv_bytes_per_token("auto") == 147_456  # 144 KiB
    assert q.kv_bytes_per_token("fp8") == 147_456 / 2
    assert q.weight_bytes("fp8") == pytest.approx(8.19e9)
    moe = MODELS["qwen3-30b-a3b"]
    assert moe.active < moe.params
    assert SERVICE_CLASSES["interactive"].ttft_ms == 300 and SERVICE_CLASSES["agent"].tpot_ms == 20
    assert canonical_gpu("h100") == "H100-SXM" and canonical_gpu("H200") == "H200"


def test_builtin_classes_are_registered_with_their_limits() -> None:
    plan = load_plan_file(QUICKSTART)
    assert plan.classes[0].name == "interactive" and plan.classes[0].tpot_ms == 10
    data = raw()
    data["classes"] = ["interactive", {"name": "batch", "ttft_ms": 10000, "tpot_ms": 200}]
    assert validate_plan(data).service_class("batch").tpot_ms == 200


def test_hash_ignores_key_order_and_layout() -> None:
    data = raw()
    reordered = dict(reversed(list(data.items())))
    reordered["arms"] = {"B": data["arms"]["B"], "A": dict(reversed(list(data["arms"]["A"].items())))}
    text = yaml.safe_dump(reordered, default_flow_style=False, sort_keys=False, indent=4)
    assert plan_hash(load_plan_text(text)) == plan_hash(load_plan_file(QUICKSTART))


def test_hash_changes_with_any_semantic_change() -> None:
    base = plan_hash(load_plan_file(QUICKSTART))
    data = raw()
    data["bars"][0]["at_least"] = 1.06
    assert plan_hash(validate_plan(data)) != base
    data = raw()
    data["design"]["seed"] = 8
    assert plan_hash(validate_plan(data)) != base


def test_explicit_default_hashes_like_omitted_default() -> None:
    data = raw()
    data["design"]["max_retries"] = 2  # the default
    assert plan_hash(validate_plan(data)) == plan_hash(load_plan_file(QUICKSTART))


def test_canonical_round_trip() -> None:
    from orchestrator.plan import canonical_json

    plan = load_plan_file(QUICKSTART)
    again = plan_from_canonical(canonical_json(plan))
    assert again == plan and plan_hash(again) == plan_hash(plan)


def test_schema_validates_every_example_and_rejects_unknown_keys() -> None:
    schema = json_schema()
    for p in EXAMPLES:
        jsonschema.validate(raw(p), schema)
    bad = raw()
    bad["arms"]["A"]["colour"] = "red"
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


def test_every_field_is_described() -> None:
    schema = json_schema()
    missing = []
    for name, definition in {"Plan": schema, **schema["$defs"]}.items():
        for field, prop in definition.get("properties", {}).items():
            if not prop.get("description"):
                missing.append(f"{name}.{field}")
    assert not missing, missing
