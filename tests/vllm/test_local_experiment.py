"""One short experiment through the executor on real vLLM (backend local, CPU build, tiny model).

A: one engine with max_num_seqs 1 (requests one at a time); B: the same engine with
max_num_seqs 8 (continuous batching); 128-token replies, so decoding dominates. The smallest
design that exercises the whole path: one block (A then B: two vLLM starts; one retry of a run
that fails a guard), a narrow capacity search of one class with short windows.
One block never ACCEPTs (DESIGN section 9, guard 10): the bar's verdict is INCONCLUSIVE, its
estimate the block's B/A capacity ratio. Everything is asserted from the store afterwards.

Real time with the plan's default guard bounds: whether a run is valid depends on the machine's
load (a guard failing on a loaded machine is right to), so the tests assert what load cannot
change, and what needs a valid run (capacities, the estimate) only where the store has one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.backends.local import LocalBackend
from orchestrator.control.executor import Executor, ExecutorConfig, ExperimentOutcome
from orchestrator.control.progress import PlainProgress
from orchestrator.plan import Plan, validate_plan
from orchestrator.store import Store
from tests.vllm.conftest import READY_DEADLINE_S, tiny_plan

CLASS = "standard"  # TTFT 1 s, TPOT 50 ms: what the tiny model on 2 CPU cores can promise


def experiment_plan() -> Plan:
    # Stream every 16 tokens: a chunk per token costs the engine's API server (on the engine's
    # core) and the generator more CPU than the tiny model's steps themselves. TTFT and TPOT
    # are still measured exactly (the first chunk leaves at the first token; TPOT spans the
    # first and last chunks over the usage tokens).
    stream = ["--stream-interval", "16"]
    base = tiny_plan({
        "A": {"layout": "colocated", "replicas": 1, "engine": {"max_num_seqs": 1, "extra_args": stream}},
        "B": {"layout": "colocated", "replicas": 1, "engine": {"max_num_seqs": 8, "extra_args": stream}},
    })
    data = base.model_dump(mode="json", by_alias=True, exclude_none=True)
    data["workload"]["output_tokens"] = 128
    data["workload"]["prompts"]["conversations"] = 100000
    data.update(
        name="vllm-experiment",
        backend="local",
        classes=[CLASS],
        # Rates in requests/s. The engine gets one core (the other is the generator's): at
        # max_num_seqs 1 it serves a 300-token prompt and its 128-token reply in ~0.4 s
        # (~3 ms a token), so it saturates near 2.5-3 req/s; batching 8 decodes them together
        # at a few ms a step. Three points from the geometric middle (4 req/s) bracket A's knee
        # (2-4) and take B to 11 req/s.
        search={"rate": {"min": 1, "max": 16}, "precision": 0.25, "point_s": 4, "warmup_s": 1,
                "cooldown_s": 0.5, "max_points": 3, "use_prior": False},
        design={"blocks": 1, "order": "ABBA", "seed": 3, "max_retries": 1},
        bars=[{"id": "batching-capacity", "metric": "capacity", "class": CLASS, "at_least": 1.5,
               "confidence": 0.95}],
    )
    return validate_plan(data)


@pytest.fixture(scope="module")
def experiment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Store, ExperimentOutcome, Plan]]:
    root: Path = tmp_path_factory.mktemp("vllm-experiment")
    plan = experiment_plan()
    store = Store.open(f"sqlite:///{root / 'orch.sqlite'}")
    backend = LocalBackend(root / "local")
    config = ExecutorConfig(state_dir=root, ready_deadline_s=READY_DEADLINE_S)
    try:
        outcome = Executor(store, backend, config, PlainProgress()).run(plan)
        yield store, outcome, plan
    finally:
        backend.cleanup(plan.name)
        store.close()


def _runs(store: Store, outcome: ExperimentOutcome):
    return store.runs(outcome.experiment_id)


def test_both_arms_ran_and_were_judged_on_the_real_engine(experiment) -> None:
    store, outcome, _ = experiment
    runs = _runs(store, outcome)
    last = {arm: max((r for r in runs if r.arm == arm), key=lambda r: r.attempt) for arm in ("A", "B")}
    retried = {r.arm: r.invalid_reason for r in runs if r not in last.values()}
    if retried:  # allowed once per arm (design.max_retries); the stored reason says why
        print(f"retried runs and their stored reasons: {retried}")
    assert all(r.block == 0 and r.status in ("done", "failed") and r.valid is not None for r in runs)
    for arm in "AB":
        mine = sorted((r for r in runs if r.arm == arm), key=lambda r: r.attempt)
        # Retried once at most (design.max_retries 1), and only while invalid.
        assert [r.attempt for r in mine] == list(range(len(mine))) and len(mine) <= 2, mine
        assert not any(r.valid for r in mine[:-1]) and (mine[-1].valid or len(mine) == 2), mine
    assert outcome.complete == all(r.valid for r in last.values())
    for r in runs:
        assert store.guard_results(r.id), f"run {r.id}: no guard stored"
        if r.valid or "guard failed" in (r.invalid_reason or ""):
            fp = r.fingerprint or {}
            assert fp["backend"] == "local" and fp["details"]["device"] == "cpu" and fp["engine_version"] == "0.32.0"
    if outcome.complete:
        for r in last.values():
            # The block's pairing guard was judged and stored against both valid runs.
            (b2b,) = [g for g in store.guard_results(r.id) if g.name == "back_to_back"]
            assert b2b.passed, b2b.detail


def test_every_point_stores_a_record_per_scheduled_request(experiment) -> None:
    store, outcome, _ = experiment
    for r in _runs(store, outcome):
        points = store.points(r.id)
        # A valid run's search measured its points; an invalid one stopped at the first failing.
        assert len(points) >= (2 if r.valid else 1), f"arm {r.arm}: the search measured {len(points)} point(s)"
        for _, p in points.iterrows():
            records = store.requests(int(p.id))
            assert len(records) == int(p.n_scheduled)
            assert {rec.phase for rec in records} <= {"warmup", "measure", "cooldown"}


def test_output_limit_and_censoring_guards_pass_and_replies_have_exactly_max_tokens(experiment) -> None:
    store, outcome, plan = experiment
    ok_total = 0
    for r in _runs(store, outcome):
        points = store.points(r.id)
        guards = [g for g in store.guard_results(r.id) if g.point_id is not None]
        for _, p in points.iterrows():
            mine = {g.name: g for g in guards if g.point_id == int(p.id)}
            for name in ("output_limit", "censored_tails"):
                assert name in mine, f"point {p.id}: guard {name} not stored"
                assert mine[name].passed, f"point {p.id}: {name} failed: {mine[name].detail}"
            for rec in store.requests(int(p.id)):
                if rec.status == "ok":
                    ok_total += 1
                    # ignore_eos honoured: exactly the asked tokens, counted from usage.
                    assert rec.output_tokens == rec.output_tokens_asked == plan.workload.output_tokens
    assert ok_total > 0


def test_a_capacity_per_run_and_class_and_batching_raises_it(experiment) -> None:
    store, outcome, _ = experiment
    caps = store.capacities(outcome.experiment_id)
    valid_arms = sorted(r.arm for r in _runs(store, outcome) if r.valid)
    caps = caps[caps.valid.fillna(False).astype(bool)]
    assert sorted(caps.arm) == valid_arms and set(caps.class_name) <= {CLASS}
    by_arm = {row.arm: float(row.capacity) for row in caps.itertuples()}
    if "A" in by_arm:
        assert by_arm["A"] > 0, "max_num_seqs 1 passed no point: lower search.rate.min"
    if len(by_arm) == 2:
        # Continuous batching serves more than one request at a time: visibly more capacity.
        assert by_arm["B"] > by_arm["A"], by_arm


def test_the_bar_verdict_is_stored_against_the_registration(experiment) -> None:
    store, outcome, _ = experiment
    (v,) = store.verdicts(outcome.experiment_id)
    assert v.registration_id == outcome.registration_id
    assert store.get_registration(v.registration_id).sha256 == outcome.sha256
    assert v.bar_id == "batching-capacity" and v.blocks == (1 if outcome.complete else 0)
    # One block is never enough to accept (no decision from one bench); the estimate is the
    # block's B/A capacity ratio.
    assert v.verdict == "INCONCLUSIVE"
    assert store.get_experiment(outcome.experiment_id).status == "done"
    if not outcome.complete:  # no block with a valid run of each arm: nothing to estimate from
        return
    caps = store.capacities(outcome.experiment_id)
    caps = caps[caps.valid.fillna(False).astype(bool)].set_index("arm")
    points = all(caps.converged.astype(bool)) and caps.censored.isna().all()
    if points:  # both searches converged: the estimate is the block's ratio
        assert v.estimate == pytest.approx(caps.capacity["B"] / caps.capacity["A"], rel=1e-6)
    else:  # a bound (a search that ran out of points): judged as an interval, said in the note
        assert "censored or unconverged" in (v.note or "") or v.estimate is None, v
    assert store.get_experiment(outcome.experiment_id).status == "done"
