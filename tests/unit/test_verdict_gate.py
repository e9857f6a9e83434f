"""`orch verdict --gate` exit codes: 0 all accepted, 3 a bar rejected, 4 inconclusive, 5 a run
invalid (a block without a valid run of an arm); and from stored values to verdicts: censoring,
0/0, the mean of a re-measured rate, an unbalanced ABBA design."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest

from orchestrator.analysis.stats import judge
from orchestrator.control.verdicts import BarOutcome, gate_exit_code, judge_experiment
from orchestrator.plan import Bar, Design


def _outcome(verdict_ratios: list[float], threshold: float = 1.1) -> BarOutcome:
    j = judge([math.log(r) for r in verdict_ratios], threshold, 0.95)
    bar = Bar.model_validate({"id": "b", "class": "standard", "at_least": threshold})
    return BarOutcome(bar, j, list(range(len(verdict_ratios))), {})


def test_gate_codes_follow_the_verdicts() -> None:
    accept = _outcome([1.5, 1.52, 1.49, 1.51])
    reject = _outcome([0.8, 0.81, 0.79, 0.8])
    inconclusive = _outcome([1.3, 0.9, 1.2, 1.0])
    assert (accept.judgement.verdict, reject.judgement.verdict, inconclusive.judgement.verdict) == (
        "ACCEPT", "REJECT", "INCONCLUSIVE")
    assert gate_exit_code([accept], incomplete=False) == 0
    assert gate_exit_code([accept, reject], incomplete=False) == 3
    assert gate_exit_code([accept, inconclusive], incomplete=False) == 4
    assert gate_exit_code([reject, inconclusive], incomplete=False) == 3
    assert gate_exit_code([accept], incomplete=True) == 5


# --- from stored capacities to verdicts (a store stand-in: the real one is in integration) -----


class _Store:
    def __init__(self, caps: dict[tuple[int, str], dict], points: dict[int, list[dict]] | None = None) -> None:
        self._runs = [SimpleNamespace(id=i, block=b, arm=arm, status="done", valid=True, finished=True)
                      for i, (b, arm) in enumerate(sorted(caps))]
        ids = {(r.block, r.arm): r.id for r in self._runs}
        self._caps = pd.DataFrame([{"run_id": ids[k], "class_name": "standard", **v} for k, v in caps.items()])
        self._points = points or {}

    def runs(self, experiment_id: int):
        return self._runs

    def guard_results(self, run_id: int):
        return []

    def capacities(self, experiment_id: int) -> pd.DataFrame:
        return self._caps

    def points(self, run_id: int) -> pd.DataFrame:
        return pd.DataFrame(self._points.get(run_id, []), columns=["valid", "offered_rate", "per_class"])


def _plan(blocks: int, at_least: float = 1.10, metric: str = "capacity", rate: float | None = None):
    bar = Bar.model_validate({"id": "b", "class": "standard", "at_least": at_least, "metric": metric,
                              **({"rate": rate} if rate else {})})
    return SimpleNamespace(bars=[bar], design=Design(blocks=blocks, order="ABBA", seed=1), arms={"A": None, "B": None},
                           search=SimpleNamespace(precision=0.02), per_block=None,
                           block_arms=lambda: [("A", "B")] * blocks)  # complete blocks


def _caps(a: list[float], b: list[float], **extra) -> dict[tuple[int, str], dict]:
    out = {}
    for blk, (x, y) in enumerate(zip(a, b, strict=True)):
        out[(blk, "A")] = {"capacity": x, **extra}
        out[(blk, "B")] = {"capacity": y, **extra}
    return out


def test_stored_capacities_accept_a_clear_win() -> None:
    (o,) = judge_experiment(_Store(_caps([100.0] * 4, [115.0, 117.0, 116.0, 118.0])), 1, _plan(4))
    assert o.judgement.verdict == "ACCEPT" and o.blocks == [0, 1, 2, 3]
    assert "one-sided 95% bound" in o.judgement.label


def test_both_arms_at_zero_are_no_ratio_not_one() -> None:
    (o,) = judge_experiment(_Store(_caps([0.0] * 4, [0.0] * 4)), 1, _plan(4, at_least=0.97))
    assert o.judgement.verdict == "INCONCLUSIVE"
    assert len(o.judgement.censored) == 4 and "0/0 is not 1" in o.judgement.censored[0]


def test_stored_censoring_makes_a_block_an_interval() -> None:
    caps = _caps([100.0] * 4, [95.0] * 4, censored="above_max", converged=True, upper=math.inf)
    (o,) = judge_experiment(_Store(caps), 1, _plan(4, at_least=0.90))
    assert o.judgement.verdict == "INCONCLUSIVE"
    assert "above the search's highest rate" in o.judgement.censored[0]


def test_an_odd_abba_design_is_flagged_in_the_verdict() -> None:
    (o,) = judge_experiment(_Store(_caps([100.0] * 3, [130.0, 131.0, 129.0])), 1, _plan(3))
    assert "even number of blocks" in o.judgement.note
    (o,) = judge_experiment(_Store(_caps([100.0] * 3, [130.0, 131.0, 129.0])), 1, _plan(4))
    assert "dropped" in o.judgement.note  # block 3 has no runs


def test_a_rate_measured_twice_counts_the_mean() -> None:
    def pts(*att: float) -> list[dict]:
        return [{"valid": True, "offered_rate": 5.0, "per_class": {"standard": {"attainment": x}}} for x in att]

    store = _Store(_caps([1.0] * 4, [1.0] * 4), {i: pts(0.90, 0.90) if i % 2 == 0 else pts(0.90, 1.0) for i in range(8)})
    (o,) = judge_experiment(store, 1, _plan(4, metric="attainment_at", rate=5.0))
    assert all(v == (0.9, pytest.approx(0.95)) for v in o.values.values())  # not the last (1.0)


def test_dropped_and_censored_blocks_say_why() -> None:
    """What `orch verdict` and the report show per bar: the blocks used, each censored block
    and each dropped block with its reason (an invalid run's, a failed back-to-back guard's)."""
    caps = _caps([100.0] * 4, [130.0, 131.0, 129.0, 128.0])
    caps[(2, "B")] = {"capacity": 140.0, "censored": "at_ceiling", "converged": True, "upper": None}
    store = _Store(caps)
    store._runs[7] = SimpleNamespace(id=7, block=3, arm="B", status="failed", valid=False, finished=True,
                                     invalid_reason="guard failed at 4 req/s: generator_lag")
    b2b = SimpleNamespace(name="back_to_back", passed=False, detail="the arms ran 30 h apart", point_id=None)
    store.guard_results = lambda run_id: [b2b] if run_id in (2, 3) else []
    (o,) = judge_experiment(store, 1, _plan(4))
    assert o.blocks == [0, 2]
    assert o.dropped == {1: "back_to_back guard failed (the arms ran 30 h apart)",
                         3: "arm B: no valid run in 1 attempt(s); the last failed: guard failed at 4 req/s: generator_lag"}
    assert list(o.censored) == [2] and o.censored[2].startswith("B at the load generator's ceiling: in [140, inf]")
    ev = o.evidence()
    assert ev["blocks_used"] == [0, 2] and [d["block"] for d in ev["dropped"]] == [1, 3]
    assert ev["censored"] == [{"block": 2, "why": o.censored[2]}]
    assert ev["lower_level"] == 0.95 and ev["method"] == "median_skew"
