"""Store helpers that need no database: JSON with infinities, configuration columns, quartiles,
the default location and URL handling."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from orchestrator.errors import UserError
from orchestrator.plan import validate_plan
from orchestrator.store.database import create_engine, default_url
from orchestrator.store.rows import config_columns
from orchestrator.store.summaries import quantile
from orchestrator.store.types import from_json_safe, to_json_safe

ROOT = Path(__file__).resolve().parents[2]


def _plan(**arm_b: object):
    data = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    data["arms"]["B"].update(arm_b)
    return validate_plan(data)


def test_json_keeps_infinities_that_strict_json_cannot_carry() -> None:
    doc = {"ttft_p99": math.inf, "low": -math.inf, "nested": [1.5, {"x": math.nan}], "ok": 2}
    safe = to_json_safe(doc)
    assert safe == {"ttft_p99": "Infinity", "low": "-Infinity", "nested": [1.5, {"x": "NaN"}], "ok": 2}
    back = from_json_safe(safe)
    assert back["ttft_p99"] == math.inf and back["low"] == -math.inf and math.isnan(back["nested"][1]["x"])
    assert back["ok"] == 2 and back["nested"][0] == 1.5


def test_config_columns_describe_each_layout() -> None:
    plan = _plan()
    a, b = config_columns(plan, "A"), config_columns(plan, "B")
    assert (a["layout"], a["replicas"], a["tp"], a["gpus"], a["prefill_replicas"]) == ("colocated", 2, 1, 2, None)
    assert (b["layout"], b["prefill_replicas"], b["decode_replicas"], b["kv_connector"]) == ("disaggregated", 1, 1, "nixl")
    assert a["model"] == "qwen3-8b" and a["router_policy"] == "round_robin"
    assert a["config_sha256"] != b["config_sha256"]
    assert a["label"].startswith("H200 2x TP1 kv=auto seqs=64")


def test_a_description_does_not_make_a_new_configuration() -> None:
    base = config_columns(_plan(), "B")
    described = config_columns(_plan(description="the disaggregated arm"), "B")
    assert described["config_sha256"] == base["config_sha256"]
    changed = config_columns(_plan(decode={"replicas": 2, "tp": 1}), "B")
    assert changed["config_sha256"] != base["config_sha256"] and changed["gpus"] == 3


def test_quantile_is_linear_interpolation() -> None:
    values = [100.0, 200.0, 400.0, 800.0]
    assert (quantile(values, 0.25), quantile(values, 0.5), quantile(values, 0.75)) == (175.0, 300.0, 500.0)
    assert quantile([7.0], 0.5) == 7.0


def test_default_url_is_the_env_var_else_a_file_in_the_user_data_dir(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("ORCH_DATABASE_URL", "postgresql://u@db/orch")
    assert default_url() == "postgresql://u@db/orch"
    monkeypatch.delenv("ORCH_DATABASE_URL")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    assert default_url() == f"sqlite:///{tmp_path / 'orchestrator' / 'orchestrator.sqlite'}"


def test_bad_urls_are_user_errors() -> None:
    with pytest.raises(UserError, match="not a valid"):
        create_engine("not a url")
    with pytest.raises(UserError, match="not supported"):
        create_engine("mysql://u@h/db")
    assert create_engine("postgres://u@h/db").url.drivername == "postgresql+psycopg"
