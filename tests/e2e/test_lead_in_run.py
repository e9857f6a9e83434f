"""Lead-in runs as a user runs them (issue 31, ``design.carryover.lead_in_s``): `orch run` runs a
lead-in of each block's first arm before its measured runs, stores only the measured runs, and
every verdict says the lead-ins ran; `orch verdict --verify` agrees; `orch plan simulate` prices
them. Virtual time: the real executor, store and verdicts over the simulated engine's records."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300), pytest.mark.usefixtures("no_sockets")]

PLAN = "tests/e2e/plans/two-vs-one-lead-in.yaml"


def test_orch_run_leads_in_each_block_and_the_verdicts_say_so(orch) -> None:
    r = orch("run", PLAN, "--backend", "virtual", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    leads = [line for line in r.stderr.splitlines() if "lead-in" in line and "unmeasured" in line]
    blocks = [int(line.split("block ")[1].split(":")[0]) for line in leads]
    assert set(blocks) == {0, 1, 2, 3}, r.stderr[-3000:]  # one a block, and one more for a retried second run
    for b, line in zip(blocks, leads, strict=True):  # always of the block's first arm (ABBA: A, B, A, B)
        assert f"of arm {'AB'[b % 2]} " in line, line
    assert "the search's lowest rate" in leads[0] and "its last capacity" in leads[-1]  # loaded as a run of it
    assert len(doc["verdicts"]) == 2
    for v in doc["verdicts"]:
        assert v["lead_in_s"] == 2 and "lead-in runs (2 s)" in v["note"], v
    name = doc["experiment"]["name"]
    status = json.loads(orch("status", name, "--json").stdout)["experiments"][0]
    assert {(run["block"], run["arm"]) for run in status["runs"]} == {(b, a) for b in range(4) for a in ("A", "B")}
    assert all(run["attempt"] >= 0 for run in status["runs"]), status["runs"]  # lead-ins are not stored runs
    check = orch("verdict", name, "--verify")
    assert check.returncode == 0, check.stdout + check.stderr
    assert "lead-in runs (2 s)" in orch("verdict", name, "--details").stdout


def test_plan_simulate_prices_the_lead_ins(orch) -> None:
    r = orch("plan", "simulate", PLAN, "--replications", "20", "--seed", "3")
    assert r.returncode == 0, r.stderr
    assert "lead-in runs: 4 (A 2, B 2), 242 s each with its deployment" in r.stdout + r.stderr

