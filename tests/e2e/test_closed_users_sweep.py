"""A closed-loop concurrency sweep (issue 32, item 10: `closed.users: [2, 8]`) in virtual time:
every run measures one point at each users level, in order, each stored with its users; a bar
names its level and is judged from that level's points only."""

from __future__ import annotations

import pytest

from orchestrator.control.verdicts import bar_values, valid_runs
from orchestrator.errors import PlanError
from tests.e2e.helpers import run_virtual, small_plan

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("no_sockets")]

WORKLOAD = {"closed": {"users": [2, 8]}, "output_tokens": 16,
            "prompts": {"input_tokens": {"mean": 600}, "conversations": 100000}}
SEARCH = {"rate": {"min": 0.5, "max": 8}, "point_s": 2, "warmup_s": 0.5, "cooldown_s": 0}


def test_every_run_measures_each_users_level_and_a_bar_is_judged_at_its_own(store, state) -> None:
    bars = [{"id": f"goodput-at-{n}", "metric": "goodput_at", "class": "standard", "users": n, "at_least": 1.0}
            for n in (2, 8)]
    plan = small_plan(name="closed-users-sweep", workload=WORKLOAD, search=SEARCH, bars=bars,
                      design={"blocks": 2, "order": "ABBA", "seed": 5})
    out = run_virtual(store, plan, state)
    runs = store.runs(out.experiment_id)
    assert len(runs) == 4 and all(r.valid for r in runs), [r.invalid_reason for r in runs]
    goodput: dict[tuple[int, str, int], float] = {}
    for r in runs:
        pts = store.points(r.id)
        assert list(pts.users) == [2, 8] and list(pts.seq) == [0, 1]  # each level once, in order
        assert pts.offered_rate.isna().all()  # a closed loop's pace is the server's, not a rate
        for _, pt in pts.iterrows():
            goodput[(r.block, r.arm, int(pt.users))] = pt.per_class["standard"]["goodput_tok_s"]
    # More users, more goodput on these servers: the levels are distinct points.
    assert all(goodput[(b, a, 8)] > goodput[(b, a, 2)] for b in range(2) for a in "AB")
    counted = valid_runs(store, out.experiment_id)
    for bar in plan.bars:  # each bar's block values are its own level's points
        values = bar_values(store, out.experiment_id, bar, counted)
        assert bar.users is not None
        assert values == {b: (goodput[(b, "A", bar.users)], goodput[(b, "B", bar.users)]) for b in range(2)}


def test_a_bar_of_a_users_sweep_names_one_of_its_levels() -> None:
    for bar, problem in (
        ({"id": "g", "metric": "goodput_at", "class": "standard", "at_least": 1.0},
         "bars.0.users: the workload sweeps users (2, 8): name the level the bar is judged at, e.g. `users: 8`"),
        ({"id": "g", "metric": "goodput_at", "class": "standard", "users": 4, "at_least": 1.0},
         "bars.0.users: 4 is not a level of workload.closed.users (2, 8)"),
    ):
        with pytest.raises(PlanError) as e:
            small_plan(workload=WORKLOAD, search=SEARCH, bars=[bar])
        assert [str(p) for p in e.value.plan_problems] == [problem]
    with pytest.raises(PlanError) as e:
        small_plan(workload={**WORKLOAD, "closed": {"users": [2, 2]}}, search=SEARCH)
    assert [str(p) for p in e.value.plan_problems] == ["workload.closed.users: a users level is given twice"]


def test_an_open_loop_bar_takes_no_users_level() -> None:
    bar = {"id": "g", "metric": "goodput_at", "class": "standard", "rate": 2, "users": 8, "at_least": 1.0}
    with pytest.raises(PlanError) as e:
        small_plan(bars=[bar])
    assert [str(p) for p in e.value.plan_problems] == [
        "bars.0.users: an open-loop plan is judged at a rate; `users` names a level of a closed loop's users "
        "(workload.closed.users)"]
