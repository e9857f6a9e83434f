"""backend external in the plan language: endpoints, labels, cross-field rules, history columns."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from orchestrator.errors import PlanError
from orchestrator.plan import (
    canonical_json,
    load_plan_file,
    load_plan_text,
    plan_from_canonical,
    plan_hash,
    plan_warnings,
    validate_plan,
)
from orchestrator.store.rows import arm_config, config_columns

ROOT = Path(__file__).resolve().parents[2]
EXTERNAL = ROOT / "examples" / "external-ab.yaml"
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


def raw(path: Path = EXTERNAL) -> dict:
    return yaml.safe_load(path.read_text())


def problems_of(data: dict) -> list[str]:
    with pytest.raises(PlanError) as e:
        validate_plan(data)
    return list(e.value.problems)


def test_the_example_is_external_and_round_trips_through_its_canonical_form() -> None:
    plan = load_plan_file(EXTERNAL)
    assert plan.backend == "external" and all(a.external for a in plan.arms.values())
    # A trailing /v1 is the same base URL.
    assert plan.arms["B"].endpoint.url == "http://127.0.0.1:8002"
    again = plan_from_canonical(canonical_json(plan))
    assert again == plan and plan_hash(again) == plan_hash(plan)
    # An external arm's canonical form holds no provisioning fields, and no secret: only the
    # name of the variable the header's value is read from.
    data = raw()
    data["arms"]["B"]["endpoint"]["headers"] = {"Authorization": {"env": "MY_API_KEY", "scheme": "Bearer"}}
    arm_b = json.loads(canonical_json(validate_plan(data)))["plan"]["arms"]["B"]
    assert set(arm_b) == {"description", "endpoint", "labels"}
    assert arm_b["endpoint"]["headers"] == {"Authorization": {"env": "MY_API_KEY", "scheme": "Bearer"}}


def test_plans_without_external_fields_keep_their_canonical_form() -> None:
    # Registered hashes and history configuration ids of existing plans must not move.
    plan = load_plan_file(QUICKSTART)
    for arm in canonical_json_arms(plan).values():
        assert "endpoint" not in arm and "labels" not in arm and arm["gpu"] == "H200"
    assert "endpoint" not in arm_config(plan, "A")["arm"]


def canonical_json_arms(plan) -> dict:
    return json.loads(canonical_json(plan))["plan"]["arms"]


def test_backend_external_needs_an_endpoint_on_every_arm() -> None:
    data = raw()
    data["arms"]["A"] = {"gpu": "H200", "layout": "colocated", "replicas": 1}
    probs = problems_of(data)
    assert any(p.startswith("arms.A.endpoint: backend external") for p in probs), probs


def test_other_backends_refuse_an_endpoint() -> None:
    data = raw()
    data["backend"] = "sim"
    probs = problems_of(data)
    assert any(p.startswith("arms.A.endpoint: backend sim provisions") for p in probs), probs
    assert any(p.startswith("arms.B.endpoint: backend sim provisions") for p in probs), probs


def test_an_external_arm_takes_no_provisioning_fields() -> None:
    data = raw()
    data["arms"]["A"].update({"gpu": "H200", "replicas": 2, "engine": {"max_num_seqs": 8}})
    probs = problems_of(data)
    for field in ("gpu", "replicas", "engine"):
        assert any(p.startswith(f"arms.A.{field}: an external arm is already running") for p in probs), probs


def test_a_provisioned_arm_still_needs_gpu_and_layout_and_takes_no_labels() -> None:
    data = yaml.safe_load(QUICKSTART.read_text())
    del data["arms"]["A"]["gpu"]
    del data["arms"]["B"]["layout"]
    data["arms"]["A"]["labels"] = {"gpu": "H200"}
    probs = problems_of(data)
    assert any(p.startswith("arms.A.gpu: required field is missing") for p in probs), probs
    assert any(p.startswith("arms.B.layout: required field is missing") for p in probs), probs
    assert any(p.startswith("arms.A.labels: labels describe external arms") for p in probs), probs


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://10.0.0.1:8000", "must start with http:// or https://"),
        ("localhost:8000", "must start with http:// or https://"),
        ("http://", "has no host"),
        ("http://10.0.0.1:99999", "bad port"),
        ("http://10.0.0.1:8000/v1?key=1", "no query or fragment"),
        ("https://user:secret@api.example.com", "must not carry credentials"),
    ],
)
def test_endpoint_urls_must_be_well_formed(url: str, message: str) -> None:
    data = raw()
    data["arms"]["A"]["endpoint"]["url"] = url
    data["arms"]["B"]["endpoint"]["metrics_url"] = url
    probs = problems_of(data)
    assert any(p.startswith("arms.A.endpoint.url:") and message in p for p in probs), probs
    assert any(p.startswith("arms.B.endpoint.metrics_url:") and message in p for p in probs), probs


def test_url_errors_carry_the_yaml_line() -> None:
    text = EXTERNAL.read_text().replace(" url: http://127.0.0.1:8001 ", " url: tcp://127.0.0.1:8001 ")
    with pytest.raises(PlanError) as e:
        load_plan_text(text)
    (problem,) = e.value.plan_problems
    line = next(i for i, s in enumerate(text.splitlines(), 1) if "tcp://" in s)
    assert problem.path == "arms.A.endpoint.url" and problem.line == line


def test_headers_name_an_environment_variable_and_never_override_the_protocol() -> None:
    data = raw()
    data["arms"]["A"]["endpoint"]["headers"] = {"Content-Type": {"env": "X"}}
    data["arms"]["B"]["endpoint"]["headers"] = {"Authorization": {"env": "1BAD"}}
    probs = problems_of(data)
    assert any(p.startswith("arms.A.endpoint.headers:") and "load generator" in p for p in probs), probs
    assert any(p.startswith("arms.B.endpoint.headers.Authorization.env:") for p in probs), probs
    data = raw()
    data["arms"]["B"]["endpoint"]["headers"] = {"Authorization": "Bearer sk-literal"}
    probs = problems_of(data)
    assert any(p.startswith("arms.B.endpoint.headers.Authorization") for p in probs), probs


def test_labels_are_strict_and_use_the_gpu_catalog() -> None:
    data = raw()
    data["arms"]["A"]["labels"] = {"gpu": "h100", "tags": {"stack": "today"}}
    plan = validate_plan(data)
    assert plan.arms["A"].labels.gpu == "H100-SXM"
    data["arms"]["A"]["labels"] = {"gpu": "A100", "layout": "mesh", "colour": "red", "tags": {"bad key": "x"}}
    probs = problems_of(data)
    for path in ("arms.A.labels.gpu", "arms.A.labels.layout", "arms.A.labels.colour", "arms.A.labels.tags"):
        assert any(p.startswith(path + ":") for p in probs), (path, probs)


def test_a_capacity_bar_still_needs_open_loop_load() -> None:
    data = raw()
    data["workload"]["arrival"] = None
    data["workload"]["closed"] = {"users": 8, "think_s": 0.0}
    probs = problems_of(data)
    assert any(p.startswith("bars.0.metric: capacity comes from open-loop runs only") for p in probs), probs


def test_warnings_for_missing_labels_and_an_a_a_comparison() -> None:
    data = raw()
    data["arms"]["B"]["endpoint"] = copy.deepcopy(data["arms"]["A"]["endpoint"])
    del data["arms"]["A"]["labels"]
    warnings = plan_warnings(validate_plan(data))
    assert any(w.startswith("arms.A: no `labels`") for w in warnings), warnings
    assert any("A/A comparison" in w for w in warnings), warnings
    assert not plan_warnings(load_plan_file(EXTERNAL))


def test_pools_and_gpus_of_an_external_arm_come_from_its_labels() -> None:
    data = raw()
    data["arms"]["A"]["labels"] = {"replicas": 4}
    data["arms"]["B"]["labels"] = {"replicas": 2, "gpus": 8}
    plan = validate_plan(data)
    assert plan.arms["A"].pools()["worker"].replicas == 4 and plan.arms["A"].gpus == 4
    assert plan.arms["B"].gpus == 8


def test_history_columns_of_an_external_arm_come_from_its_labels() -> None:
    plan = load_plan_file(EXTERNAL)
    a, b = config_columns(plan, "A"), config_columns(plan, "B")
    assert (a["gpu"], a["layout"], a["replicas"], a["engine_version"]) == ("H100-SXM", "colocated", 1, "v0.32.0")
    assert b["gpu"] == "H200" and a["config_sha256"] != b["config_sha256"]
    assert "[stack=candidate]" in b["label"] and b["config"]["arm"]["labels"]["tags"] == {"stack": "candidate"}
    assert a["model"] == "qwen3-8b" and a["router_policy"] == "external"
    # Unlabelled: unknown, never guessed from defaults.
    data = raw()
    del data["arms"]["A"]["labels"]
    cols = config_columns(validate_plan(data), "A")
    assert (cols["gpu"], cols["layout"], cols["engine_version"], cols["kv_cache_dtype"]) == (
        "unknown", "external", "unknown", "unknown")
