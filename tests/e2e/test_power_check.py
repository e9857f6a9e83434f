"""`orch run` runs the dry run first: a plan whose bar it predicts cannot be judged with the
plan's blocks is refused in a non-interactive run (exit 1, one line) and runs with
--allow-low-power (issue 21). Through `orch` in this process on the virtual backend: no socket,
and the run is seconds."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from tests.e2e.helpers import BASE, orch_here

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_sockets")]


def test_low_power_plan_is_refused_non_interactively_and_runs_with_the_flag(tmp_path: Path, monkeypatch,
                                                                           capsys) -> None:
    data = copy.deepcopy(BASE)
    data["name"] = "e2e-low-power"
    data["search"] = {"rate": {"min": 1, "max": 4}, "precision": 0.25, "point_s": 2, "warmup_s": 0.5,
                      "cooldown_s": 0.5, "max_points": 2, "use_prior": False}
    data["design"] = {"blocks": 1, "order": "ABBA", "seed": 5, "max_retries": 1}
    # A and B are the same arm: a 1.3x win has no chance.
    data["bars"] = [{"id": "win", "metric": "capacity", "class": "standard", "at_least": 1.3, "confidence": 0.9}]
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(data, sort_keys=False))
    env = {"ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}",
           "ORCH_STATE_DIR": str(tmp_path / "state"), "ORCH_CACHE_DIR": str(tmp_path / "cache")}

    def orch(*args: str) -> SimpleNamespace:
        code, out, err = orch_here(*args, "--backend", "virtual", env=env, monkeypatch=monkeypatch, capsys=capsys)
        return SimpleNamespace(returncode=code, stdout=out, stderr=err)

    refused = orch("run", str(plan_file), "--json")
    assert refused.returncode == 1, refused.stderr[-2000:]
    assert refused.stdout == ""
    (line,) = refused.stderr.splitlines()
    assert line.startswith("low predicted power: bar win: predicted power 0% with 1 block(s)")
    assert "GPU-hours" in line and line.endswith("not run: pass --allow-low-power to run anyway")
    assert list((tmp_path / "cache" / "dryrun").glob("*.json"))  # the dry run is cached

    ran = orch("run", str(plan_file), "--json", "--allow-low-power")
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert "warning: low predicted power: bar win" in ran.stderr
    doc = json.loads(ran.stdout)
    assert [v["bar"] for v in doc["verdicts"]] == ["win"] and doc["verdicts"][0]["verdict"] != "ACCEPT"
