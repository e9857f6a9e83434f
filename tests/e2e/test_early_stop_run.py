"""`orch run` of a plan with `search.early_stop: true` (issue 20 item 5), the way a user runs it:
a point far past the knee stops sending and says so on its progress line, every request it
scheduled is kept in the store (sent, drained or never sent), it is judged a failing point, and
the runs stay valid. In virtual time, through `orch` in this process (no socket): the stop is
decided on the simulator's clock exactly as the real generator decides it on the wall clock."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from orchestrator.loadgen.runner import STOPPED_EARLY
from orchestrator.store import Store
from tests.e2e.helpers import BASE, orch_here

pytestmark = [pytest.mark.timeout(120), pytest.mark.usefixtures("no_sockets")]

PLAN = copy.deepcopy(BASE)
PLAN["name"] = "e2e-early-stop-cli"
# The search's second point (13.5 req/s) is about three times arm A's capacity (~4.7 req/s).
PLAN["search"] = {**BASE["search"], "early_stop": True}


def test_orch_run_stops_a_point_past_the_knee_and_keeps_every_request(tmp_path: Path, monkeypatch, capsys) -> None:
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(PLAN, sort_keys=False))
    url = f"sqlite:///{tmp_path / 'orch.sqlite'}"
    env = {"ORCH_DATABASE_URL": url, "ORCH_STATE_DIR": str(tmp_path / "state")}
    code, out, err = orch_here("run", str(plan_file), "--backend", "virtual", "--json", env=env,
                               monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, err[-3000:]
    said = [line for line in err.splitlines() if "[stopped early at" in line]
    assert said, err[-3000:]

    store = Store.open(url)
    try:
        runs = store.runs(json.loads(out)["experiment"]["id"])
        assert {run.arm for run in runs if run.valid} == {"A", "B"}
        stopped = []
        for run in runs:
            points = store.points(run.id)
            for point in points.itertuples():
                early = (point.context or {}).get("early_stop")
                if early is None:
                    continue
                stopped.append(point)
                records = store.requests(point.id)
                unsent = [x for x in records if x.error == STOPPED_EARLY]
                # Never-sent requests are stored, not judged; every other scheduled request is.
                assert unsent and len(unsent) == early["n_unsent"]
                assert all(x.sent_s is None for x in unsent)
                assert len(records) == point.n_scheduled  # every scheduled request stored: nothing lost
                assert early["n_judged"] == sum(1 for x in records if x.phase == "measure" and x.error != STOPPED_EARLY)
                assert 0 < early["at_s"] < PLAN["search"]["point_s"]
                # Judged a failing point: its attainment is below the search's bar.
                assert point.per_class["standard"]["attainment"] < PLAN["search"].get("attainment", 0.9)
        # Each stopped point was said on the progress line, and none other was.
        assert len(stopped) == len(said)
    finally:
        store.close()
