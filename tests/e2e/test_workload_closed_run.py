"""A closed-loop plan through `orch run` on the sim backend: it runs (no crash on the missing
arrival process), stores its points at N users and judges its goodput/attainment bars."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.store import Store
from tests.e2e.helpers import ROOT

pytestmark = pytest.mark.timeout(300)


def test_closed_loop_plan_runs_and_stores_points_and_verdicts(tmp_path: Path) -> None:
    # The example's plan, made light for a shared 2-core machine: 4 users, short replies.
    data = yaml.safe_load((ROOT / "examples" / "open-vs-closed.yaml").read_text())
    data["name"] = "open-vs-closed-short"
    data["workload"] = {"closed": {"users": 4}, "output_tokens": 32,
                        "prompts": {"input_tokens": {"mean": 1000}, "conversations": 100000}}
    data["search"] = {"rate": {"min": 0.5, "max": 8}, "point_s": 2, "warmup_s": 0.5, "cooldown_s": 0}
    data["guards"] = {"max_send_lag_p99_ms": 50}
    data["design"] = {"blocks": 1, "order": "ABBA", "seed": 11}  # one block: one run per arm
    plan_file = tmp_path / "closed.yaml"
    plan_file.write_text(yaml.safe_dump(data))
    db = tmp_path / "orch.sqlite"
    env = {**os.environ, "ORCH_DATABASE_URL": f"sqlite:///{db}", "ORCH_STATE_DIR": str(tmp_path / "state"),
           "ORCH_SKIP_CALIBRATION": "1"}
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "run", str(plan_file), "--json"],
                       cwd=ROOT, capture_output=True, text=True, env=env, timeout=280)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    doc = json.loads(r.stdout)
    assert doc["experiment"]["complete"] is True
    verdicts = {v["bar"]: v for v in doc["verdicts"]}
    assert set(verdicts) == {"standard-goodput-at-users", "standard-attainment-at-users"}
    for v in verdicts.values():
        # Judged from the closed-loop points (a missing figure would drop the block): the same
        # server twice gives B/A 1; one block is never enough to accept (DESIGN 9.10).
        assert v["blocks"] == 1 and v["blocks_used"] == [0] and v["rate"] is None
        assert v["estimate"] == pytest.approx(1.0, abs=0.05) and v["verdict"] == "INCONCLUSIVE", v

    store = Store.open(f"sqlite:///{db}")
    try:
        (exp,) = store.list_experiments()
        runs = store.runs(exp.id)
        assert len(runs) == 2 and all(run.valid for run in runs)
        for run in runs:
            pts = store.points(run.id)
            assert len(pts) == 1
            point = pts.iloc[0]
            assert point.users == 4 and point.offered_rate is None and bool(point.valid)
            assert point.throughput_tok_s > 0
            assert point.context["loop"]["kind"] == "closed"
            records = store.requests(int(point.id))
            measured = [x for x in records if x.phase == "measure"]
            assert len(measured) == point.context["loop"]["n_in_window"] > 0
            # A user sends its next request only after its reply: at most 4 in flight at once.
            events = sorted([(x.sent_s, 1) for x in records if x.sent_s is not None]
                            + [(x.last_token_s, -1) for x in records if x.last_token_s is not None])
            depth = peak = 0
            for _, step in events:
                depth += step
                peak = max(peak, depth)
            assert peak <= 4
        assert {v.bar_id: v.verdict for v in store.verdicts(exp.id)} == {
            "standard-goodput-at-users": "INCONCLUSIVE", "standard-attainment-at-users": "INCONCLUSIVE"}
    finally:
        store.close()
