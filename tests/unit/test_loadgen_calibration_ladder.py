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


def test_no_step_holding_gives_zero_read_as_unknown_and_cached_for_an_hour(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _fake_generator(monkeypatch, lambda r: 0.01)
    assert _run(start_rate=25.0).ceiling_rate == 0.0

    from orchestrator.control import session
    from orchestrator.plan import load_plan_file

    plan = load_plan_file(Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml")
    monkeypatch.delenv("ORCH_SKIP_CALIBRATION", raising=False)
    monkeypatch.delenv("ORCH_RECALIBRATE", raising=False)
    monkeypatch.setattr(session, "_load_per_cpu", lambda: 0.1)
    assert session.generator_ceiling(plan, tmp_path) is None  # unknown, not "0 req/s"
    # Issue 32: a busy machine is not measured again on every run: "no rate held" is kept an hour.
    (cached,) = tmp_path.glob("calibration-*.json")
    calls = _fake_generator(monkeypatch, lambda r: 0.0001)  # would hold now: but not asked
    again = session.calibrated(plan, tmp_path)
    assert again is not None and again.rate is None and again.age_s >= 0 and not calls
    assert "ORCH_RECALIBRATE=1 measures again" in again.note()
    doc = json.loads(cached.read_text())
    cached.write_text(json.dumps({**doc, "at": time.time() - 2 * session.NO_CEILING_MAX_AGE_S}))
    fresh = session.calibrated(plan, tmp_path)
    assert fresh is not None and fresh.rate is not None and fresh.age_s == 0 and "old" in fresh.why and calls
    cached.unlink()
    # an older version's cached 0 is read as unknown too (it would refuse every point)
    stale = tmp_path / f"calibration-{session.__version__}-{session.os.cpu_count()}-" \
                       f"{plan.workload.output_tokens}-{plan.workload.api}.json"
    stale.write_text(json.dumps({"at": time.time(), "ceiling_rate": 0.0}))
    assert session.generator_ceiling(plan, tmp_path) is None


def test_a_cached_ceiling_is_reused_with_its_age_unless_the_machine_got_busier(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Issue 32: the ceiling is measured once per machine and version (a day), shown with its
    age, and measured again when the machine is busier than when it was measured, or on
    ORCH_RECALIBRATE=1."""
    from orchestrator.control import session
    from orchestrator.plan import load_plan_file

    plan = load_plan_file(Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml")
    monkeypatch.delenv("ORCH_SKIP_CALIBRATION", raising=False)
    monkeypatch.delenv("ORCH_RECALIBRATE", raising=False)
    load = {"now": 0.2}
    monkeypatch.setattr(session, "_load_per_cpu", lambda: load["now"])
    calls = _fake_generator(monkeypatch, lambda r: 0.0002 if r <= 40 else 0.01)
    first = session.calibrated(plan, tmp_path)
    assert first is not None and first.rate is not None and first.age_s == 0 and first.why == "none cached"
    n = len(calls)
    (cached,) = tmp_path.glob("calibration-*.json")
    doc = json.loads(cached.read_text())
    cached.write_text(json.dumps({**doc, "at": time.time() - 3 * 3600}))
    second = session.calibrated(plan, tmp_path)
    assert second is not None and second.rate == first.rate and len(calls) == n  # reused, not measured
    assert 2.9 * 3600 < second.age_s < 3.1 * 3600 and "calibrated 3.0 h ago" in second.note()
    load["now"] = 0.2 + session.LOAD_SLACK + 0.1
    third = session.calibrated(plan, tmp_path)
    assert third is not None and third.age_s == 0 and "busier" in third.why and len(calls) > n
    load["now"] = 0.2
    n = len(calls)
    monkeypatch.setenv("ORCH_RECALIBRATE", "1")
    fourth = session.calibrated(plan, tmp_path)
    assert fourth is not None and fourth.why == "ORCH_RECALIBRATE=1" and len(calls) > n


def test_the_ladder_stops_at_the_plans_highest_rate_and_a_plan_offering_more_measures_again(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Issue 32 (item 7): a plan that never offers more than R req/s needs only to know R holds;
    the cached ceiling says how far it was measured, and a plan offering more measures again."""
    calls = _fake_generator(monkeypatch, lambda r: 0.0002 if r <= 500 else 0.01)
    capped = _run(start_rate=25.0, max_rate=64.0)
    assert capped.ceiling_rate == 64.0 and capped.capped_at == 64.0 and max(calls) == 64.0
    assert _run(start_rate=25.0).capped_at is None  # the whole ladder: the ceiling itself

    from orchestrator.control import session
    from orchestrator.plan import load_plan_file

    plan = load_plan_file(Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml")
    monkeypatch.delenv("ORCH_SKIP_CALIBRATION", raising=False)
    monkeypatch.delenv("ORCH_RECALIBRATE", raising=False)
    monkeypatch.setattr(session, "_load_per_cpu", lambda: 0.1)
    calls.clear()
    first = session.calibrated(plan, tmp_path)
    assert first is not None and first.rate == plan.search.rate.max and max(calls) == plan.search.rate.max
    n = len(calls)
    assert session.calibrated(plan, tmp_path) is not None and len(calls) == n  # reused
    faster = plan.model_copy(update={"search": plan.search.model_copy(update={"rate": plan.search.rate.model_copy(
        update={"max": 2 * plan.search.rate.max})})})
    again = session.calibrated(faster, tmp_path)
    assert again is not None and "measured only up to" in again.why and max(calls) == 2 * plan.search.rate.max
