"""The calibration ladder's logic (the null server and the runner replaced by a fake whose send
lag grows with the rate): a failed step is tried again before it counts, a failed first step
sends the ladder down, and an unknown ceiling is never cached as 0 req/s."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from orchestrator.loadgen import calibrate as cal


def _fake_generator(monkeypatch: pytest.MonkeyPatch, lag_of_rate, hiccups: set[float] = frozenset()):
    calls: list[float] = []
    hiccuped: set[float] = set()

    async def run_point(url, model, reqs, offs, phases, **kw):
        r = run_point.rate  # type: ignore[attr-defined]  # the rate the schedule was drawn for
        calls.append(r)
        lag = lag_of_rate(r)
        if r in hiccups and r not in hiccuped:  # one OS hiccup, the first time only
            hiccuped.add(r)
            lag = 0.050
        n = len(offs)
        return SimpleNamespace(scheduled=n, by_status={"ok": n}, achieved_ratio=1.0, send_lag_p99_s=lag,
                               chunks_per_s=0.0)

    real_offsets = cal.open_loop_offsets

    def offsets(arrival, rate, duration, seed):
        run_point.rate = rate  # type: ignore[attr-defined]
        return real_offsets(arrival, rate, duration, seed)

    monkeypatch.setattr(cal, "run_point", run_point)
    monkeypatch.setattr(cal, "open_loop_offsets", offsets)
    monkeypatch.setattr(cal, "NullServerProcess", lambda cfg: contextlib.nullcontext("http://null"))
    return calls


def _run(**kw) -> cal.Calibration:
    return cal.calibrate(output_tokens=8, step_s=0.2, min_requests=10, bisections=2, **kw)


def test_one_hiccup_does_not_set_the_ceiling(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_generator(monkeypatch, lambda r: 0.0002 if r <= 200 else 0.01, hiccups={25.0})
    result = _run(start_rate=25.0)
    assert calls[:2] == [25.0, 25.0]  # the hiccup at 25 req/s was measured again
    assert 150 <= result.ceiling_rate <= 200


def test_a_failed_first_step_sends_the_ladder_down(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _fake_generator(monkeypatch, lambda r: 0.0002 if r <= 7 else 0.01)
    result = _run(start_rate=25.0)
    assert result.ceiling_rate > 0 and result.ceiling_rate <= 7
    assert min(calls) < 25.0


def test_no_step_holding_gives_zero_and_is_not_cached(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_generator(monkeypatch, lambda r: 0.01)
    assert _run(start_rate=25.0).ceiling_rate == 0.0

    from orchestrator.control import session
    from orchestrator.plan import load_plan_file

    plan = load_plan_file(Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml")
    monkeypatch.delenv("ORCH_SKIP_CALIBRATION", raising=False)
    assert session.generator_ceiling(plan, tmp_path) is None  # unknown, not "0 req/s"
    assert not list(tmp_path.glob("calibration-*.json"))
    # an older version's cached 0 is read as unknown too (it would refuse every point)
    stale = tmp_path / f"calibration-{session.__version__}-{session.os.cpu_count()}-" \
                       f"{plan.workload.output_tokens}-{plan.workload.api}.json"
    stale.write_text(json.dumps({"at": time.time(), "ceiling_rate": 0.0}))
    assert session.generator_ceiling(plan, tmp_path) is None
