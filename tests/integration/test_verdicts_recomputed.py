"""A stored verdict is never trusted (issue 30, part A): `orch verdict --gate` and `--verify`
judge every bar again from the stored records and the registered plan. A verdict forged with
one INSERT by the runtime role (bar_verdicts is insert-only, so the role may add a row, and the
latest row is the one read) used to turn the gate's 4 into 0 with `--verify` still exiting 0;
now both exit 6 and name the bar. On PostgreSQL as the runtime role, and on SQLite.

The experiment runs in virtual time (the real executor, store, guards and judge)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from orchestrator.store import Store
from tests.e2e.helpers import orch_here, run_virtual, small_plan
from tests.support.runtime_role import runtime_url

pytestmark = pytest.mark.timeout(300)
GATE = {"ACCEPT": 0, "REJECT": 3, "INCONCLUSIVE": 4}


def test_a_forged_verdict_is_refused_by_gate_and_verify(db_url: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    plan = small_plan(
        name="forged-verdict", design={"blocks": 2, "order": "ABBA", "seed": 9},
        bars=[{"id": "no-win", "metric": "capacity", "class": "standard", "at_least": 1.10,
               "confidence": 0.95}],
        sim={"noise": 0.03},
    )
    with runtime_url(db_url) as url:
        env = {"ORCH_DATABASE_URL": url, "ORCH_STATE_DIR": str(tmp_path / "state")}
        monkeypatch.delenv("ORCH_DEBUG", raising=False)

        def orch(*args: str) -> tuple[int, str, str]:
            return orch_here(*args, env=env, monkeypatch=monkeypatch, capsys=capsys)

        with Store.open(url) as store:
            out = run_virtual(store, plan, tmp_path / "state")
            assert out.complete
            (bar,) = out.bars
            honest = bar.judgement.verdict
            assert honest != "ACCEPT", bar.judgement  # A/A: a 10% win is not there
            exp = store.get_experiment(out.experiment_id)
        code, stdout, err = orch("verdict", exp.name, "--gate", "--json")
        assert code == GATE[honest], (code, err[-2000:])
        assert orch("verdict", exp.name, "--verify")[0] == 0

        # The forgery: one INSERT, as the runtime role (the latest row of a bar is the one read).
        with Store.open(url) as store:
            with store.engine.begin() as conn:
                conn.execute(sa.text(
                    "insert into bar_verdicts (experiment_id, registration_id, bar_id, verdict, estimate, lower, "
                    "upper, blocks, judged_at) values (:e, :r, 'no-win', 'ACCEPT', 1.5, 1.3, 1.7, 2, :t)"),
                    {"e": exp.id, "r": exp.registration_id, "t": datetime.now(UTC)})
            assert [v.verdict for v in store.verdicts(exp.id)] == ["ACCEPT"]  # what a reader of the table sees

        for flags in (("--gate",), ("--verify",), ("--gate", "--verify")):
            code, stdout, err = orch("verdict", exp.name, *flags)
            assert code == 6, (flags, code, stdout[-2000:], err[-2000:])
            lines = err.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("bar no-win: stored verdict ACCEPT (estimate 1.5"), lines
            assert f"records give: {honest}" in lines[0], lines
        code, stdout, _ = orch("verdict", exp.name, "--gate", "--json")
        doc = json.loads(stdout)
        assert code == 6 and doc["verdicts"][0]["verdict"] == honest and doc["gate_exit_code"] == GATE[honest]
        assert doc["verdict_check"]["differ"] == ["no-win"]
        # Without --gate or --verify the stored row is shown as stored (nothing is gated on it).
        assert orch("verdict", exp.name)[0] == 0
