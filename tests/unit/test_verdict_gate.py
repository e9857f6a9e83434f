"""`orch verdict --gate` exit codes: 0 all accepted, 3 a bar rejected, 4 inconclusive, 5 a run
invalid (a block without a valid run of an arm)."""

from __future__ import annotations

from orchestrator.analysis.stats import judge
from orchestrator.control.verdicts import BarOutcome, gate_exit_code
from orchestrator.plan import Bar


def _outcome(verdict_ratios: list[float], threshold: float = 1.1) -> BarOutcome:
    import math

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
