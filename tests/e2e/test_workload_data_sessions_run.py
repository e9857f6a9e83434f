"""A multi-turn ShareGPT file replayed as live sessions through `orch run` on the sim backend
(simulated engines behind the real router, real HTTP), to stored verdicts. Real time on a
shared machine: it asserts what load cannot change (the run ends, every stored later turn was
due after the reply before it, the verdict is stored), not that the timing guards passed; the
exact timing is tested in virtual time (test_workload_data_sessions_virtual.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from orchestrator.store import Store
from tests.e2e.test_workload_data_sessions_virtual import sharegpt_file

pytestmark = pytest.mark.timeout(300)


def test_orch_run_replays_a_sharegpt_file_as_sessions_to_a_stored_verdict(tmp_path: Path) -> None:
    data = sharegpt_file(tmp_path / "sharegpt.json", conversations=20)
    plan = {
        "name": "sharegpt-sessions", "model": "qwen3-8b",
        "arms": {k: {"gpu": "H100-PCIe", "layout": "colocated", "replicas": 1,
                     "engine": {"max_num_seqs": 32, "max_num_batched_tokens": 2048}} for k in ("A", "B")},
        "workload": {"sessions": {"think": {"mean_s": 0.1}}, "source": {"kind": "prompts", "path": data.name},
                     "api": "chat"},
        "classes": ["standard"],
        "search": {"rate": {"min": 0.5, "max": 4}, "precision": 0.25, "point_s": 2, "warmup_s": 0.5,
                   "cooldown_s": 0, "max_points": 2, "use_prior": False},
        "bars": [{"id": "standard-capacity", "metric": "capacity", "class": "standard", "compare": "B/A",
                  "at_least": 0.9}],
        "design": {"blocks": 1, "order": "ABBA", "seed": 13, "max_retries": 0},
        "backend": "sim",
    }
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(yaml.safe_dump(plan))
    db = tmp_path / "orch.sqlite"
    env = {**os.environ, "ORCH_DATABASE_URL": f"sqlite:///{db}", "ORCH_STATE_DIR": str(tmp_path / "state"),
           "ORCH_SKIP_CALIBRATION": "1"}
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "run", str(plan_file), "--json",
                        "--allow-low-power"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=280)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr
    doc = json.loads(r.stdout)
    assert doc["experiment"]["rate_unit"] == "sessions/s"
    (v,) = doc["verdicts"]
    assert v["bar"] == "standard-capacity" and v["verdict"] in ("INCONCLUSIVE", "ACCEPT", "REJECT"), v
    with Store.open(f"sqlite:///{db}") as store:
        (exp,) = store.list_experiments()
        assert [s.bar_id for s in store.verdicts(exp.id)] == ["standard-capacity"]  # stored, not only printed
        runs = store.runs(exp.id)
        assert {x.arm for x in runs} == {"A", "B"} and all(x.status in ("done", "failed") for x in runs)
        later = 0
        for run in runs:
            for _, pt in store.points(run.id).iterrows():
                assert pt.context["loop"]["kind"] == "sessions"
                recs = {(x.conversation_id, x.turn): x for x in store.requests(int(pt.id))}
                for (c, t), rec in recs.items():
                    if t == 0 or rec.status == "unsent":
                        continue
                    prev = recs[(c, t - 1)]
                    assert prev.last_token_s is not None and rec.scheduled_s >= prev.last_token_s
                    later += 1
        assert later > 0  # the file's conversations went on past their first turn
