"""A sequential design run as a user runs it (issue 31): `orch run` stops at the first look at
which every bar is decided, stores where it stopped and the GPU-hours it saved with the verdict,
`orch verdict --gate` counts the experiment complete, and `orch plan simulate` prices the rule.
Virtual time: the real executor, store and verdicts over the simulated engine's records."""

from __future__ import annotations

import json

import pytest

from tests.e2e.helpers import orch_here

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300), pytest.mark.usefixtures("no_sockets")]

PLAN = "tests/e2e/plans/two-vs-one-sequential.yaml"


def test_an_obvious_win_stops_at_the_first_decisive_look(tmp_path, monkeypatch, capsys) -> None:
    env = {"ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}", "ORCH_STATE_DIR": str(tmp_path / "state")}

    def orch(*args: str) -> tuple[int, str, str]:
        return orch_here(*args, env=env, monkeypatch=monkeypatch, capsys=capsys)

    code, out, err = orch("run", PLAN, "--backend", "virtual", "--json")
    assert code == 0, err[-3000:]
    doc = json.loads(out)
    (v,) = doc["verdicts"]
    assert v["verdict"] == "ACCEPT", (v, err[-3000:])
    seq = v["sequential"]
    assert seq["stopped"] and seq["blocks"] < seq["planned"] == 8 and seq["blocks"] % 2 == 0
    assert seq["gpu_hours_saved"] > 0
    assert v["blocks"] <= seq["blocks"] and max(v["blocks_used"]) < seq["blocks"]
    assert "sequential look" in v["label"] and v["estimand"] == "median block ratio"
    name = doc["experiment"]["name"]

    code, out, _ = orch("status", name, "--json")
    runs = json.loads(out)["experiments"][0]["runs"]
    assert {r["block"] for r in runs} == set(range(seq["blocks"])), runs  # no block after the stop ran

    code, out, _ = orch("verdict", name, "--gate")  # complete: the blocks after the stop were never to run
    assert code == 0, out
    assert "sequential: stopped at look" in out and "estimand: the median block ratio" in out

    code, out, _ = orch("verdict", name, "--verify", "--json")
    assert code == 0, out


def test_plan_simulate_prices_the_sequential_rule(tmp_path, monkeypatch, capsys) -> None:
    env = {"ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}", "ORCH_STATE_DIR": str(tmp_path / "state")}
    code, out, err = orch_here("plan", "simulate", PLAN, "--replications", "40", "--seed", "3", env=env,
                               monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("sequential design (pocock)"))
    assert "of 8 blocks run on average" in line and "saves" in line
    code, out, err = orch_here("plan", "simulate", PLAN, "--replications", "40", "--seed", "3", "--json", env=env,
                               monkeypatch=monkeypatch, capsys=capsys)
    (bar,) = json.loads(out)["bars"]
    assert 2 <= bar["mean_blocks"] < 8
