"""The Store's write side on both databases: registration, experiments, runs, points, guards,
capacities, verdicts, metric samples; immutability and integrity."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import sqlalchemy as sa
import yaml
from sqlalchemy.exc import DBAPIError, IntegrityError

from orchestrator.plan import load_plan_file, plan_hash, validate_plan
from orchestrator.records import RequestRecord
from orchestrator.store import ImmutableRegistration, NotFound, Store, StoreConflict, same_plan
from orchestrator.store.models import PlanRegistration

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"


@pytest.fixture
def store(db_url: str):
    s = Store.open(db_url)
    yield s
    s.close()


def _variant(**arm_a_engine: object):
    data = yaml.safe_load(QUICKSTART.read_text())
    data["arms"]["A"]["engine"].update(arm_a_engine)
    return validate_plan(data)


def test_registering_the_same_plan_twice_returns_the_same_registration(store: Store) -> None:
    plan = load_plan_file(QUICKSTART)
    first = store.register_plan(plan)
    again = store.register_plan(load_plan_file(QUICKSTART))
    assert first.created and not again.created
    assert (again.id, again.sha256, again.registered_at) == (first.id, first.sha256, first.registered_at)
    assert first.sha256 == plan_hash(plan)
    other = store.register_plan(_variant(max_num_seqs=32))
    assert other.created and other.id != first.id
    assert store.get_registration(first.sha256[:12]).id == first.id
    assert store.get_registration(first.id).sha256 == first.sha256
    assert store.plan_of(first) == plan


def _register_as_an_older_version_would(store: Store, plan) -> int:
    """The plan's canonical JSON as a plan language without the `kubernetes` section (added
    later, all defaults) wrote it: a different text, so a different hash."""
    import hashlib
    import json

    from orchestrator.plan import canonical_json
    from orchestrator.store.types import utcnow

    body = json.loads(canonical_json(plan))
    del body["plan"]["kubernetes"]
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    with store.engine.begin() as conn:
        return conn.execute(sa.insert(PlanRegistration).values(
            sha256=hashlib.sha256(text.encode()).hexdigest(), name=plan.name, canonical_json=text,
            registered_at=utcnow()).returning(PlanRegistration.id)).scalar_one()


def test_a_plan_registered_by_an_earlier_plan_language_is_the_same_plan(store: Store) -> None:
    plan = load_plan_file(QUICKSTART)
    old_id = _register_as_an_older_version_would(store, plan)
    again = store.register_plan(plan)  # today's hash differs; the meaning does not
    assert again.id == old_id and not again.created and again.sha256 != plan_hash(plan)
    assert same_plan(again.canonical_json, plan)
    edited = _variant(max_num_seqs=32)  # same name, really edited: a registration of its own
    assert store.register_plan(edited).created
    assert not same_plan(again.canonical_json, edited)


def test_sql_update_or_delete_of_a_registration_is_refused_by_the_database(store: Store) -> None:
    reg = store.register_plan(load_plan_file(QUICKSTART))
    for sql in (
        "UPDATE plan_registrations SET canonical_json = '{}' WHERE id = :id",
        "UPDATE plan_registrations SET name = 'edited' WHERE id = :id",
        "DELETE FROM plan_registrations WHERE id = :id",
    ):
        with pytest.raises((IntegrityError, DBAPIError), match="immutable"), store.engine.begin() as conn:
            conn.execute(sa.text(sql), {"id": reg.id})
    assert store.get_registration(reg.id).canonical_json == reg.canonical_json


def test_truncate_of_registrations_is_refused_on_postgresql(pg_url: str) -> None:
    with Store.open(pg_url) as store:
        store.register_plan(load_plan_file(QUICKSTART))
        with pytest.raises(DBAPIError, match="immutable"), store.engine.begin() as conn:
            conn.execute(sa.text("TRUNCATE plan_registrations CASCADE"))


def test_the_repository_layer_refuses_changes_through_the_orm(store: Store) -> None:
    reg = store.register_plan(load_plan_file(QUICKSTART))
    with pytest.raises(ImmutableRegistration), store._sessions.begin() as s:
        s.get(PlanRegistration, reg.id).name = "edited"
    with pytest.raises(ImmutableRegistration), store._sessions.begin() as s:
        s.delete(s.get(PlanRegistration, reg.id))
    assert store.get_registration(reg.id).name == reg.name


def test_experiments_have_unique_names_and_track_status(store: Store) -> None:
    reg = store.register_plan(load_plan_file(QUICKSTART))
    e1 = store.create_experiment(reg.id)
    e2 = store.create_experiment(reg.id, controller_id="ctl-1")
    names = [store.get_experiment(e).name for e in (e1, e2)]
    assert names == [f"{reg.name}-1", f"{reg.name}-2"]
    with pytest.raises(Exception, match="taken"):
        store.create_experiment(reg.id, name=names[0])
    with pytest.raises(NotFound):
        store.create_experiment(reg.id + 99)
    store.set_experiment_status(e1, "running")
    started = store.get_experiment(names[0])
    assert started.status == "running" and started.started_at is not None and started.finished_at is None
    store.set_experiment_status(e1, "done")
    done = store.get_experiment(e1)
    assert done.finished_at is not None and done.started_at == started.started_at
    assert [e.id for e in store.list_experiments()] == [e2, e1]
    with pytest.raises(ValueError):
        store.set_experiment_status(e1, "finished")


def test_deployment_configs_are_one_row_per_distinct_arm(store: Store) -> None:
    plan = load_plan_file(QUICKSTART)
    a, b = store.deployment_config(plan, "A"), store.deployment_config(plan, "B")
    assert a != b
    assert store.deployment_config(load_plan_file(QUICKSTART), "A") == a
    fp8 = _variant(kv_cache_dtype="fp8")
    assert store.deployment_config(fp8, "A") != a
    assert store.deployment_config(fp8, "B") == b  # arm B did not change
    with store.engine.connect() as conn:
        row = conn.execute(sa.text(
            "select layout, prefill_replicas, decode_tp, gpus, kv_cache_dtype, router_policy "
            "from deployment_configs where id = :id"), {"id": b}).one()
    assert tuple(row) == ("disaggregated", 1, 1, 2, "auto", "round_robin")


def _experiment_with_everything(store: Store, finish: bool = True) -> tuple[int, int, int, int]:
    plan = load_plan_file(QUICKSTART)
    reg = store.register_plan(plan)
    exp = store.create_experiment(reg.id)
    cfg = store.deployment_config(plan, "A")
    run = store.start_run(exp, "A", block=0, position=0, attempt=0, config_id=cfg)
    point = store.record_point(run, seq=0, window_start_s=1.0, window_end_s=7.0, offered_rate=4.0,
                               achieved_rate=3.9, throughput_tok_s=250.0, n_scheduled=24,
                               per_class={"interactive": {"attainment": 0.95, "goodput_tok_s": 240.0}},
                               percentiles={"ttft_p50": 0.1, "ttft_p99": math.inf}, valid=True)
    store.ingest_requests(point, [RequestRecord(i, i, 0, "measure", float(i)) for i in range(24)])
    store.record_guards(run, point, [("generator_lag", True, 0.001, 0.005, "p99 lag 1 ms")])
    store.record_guards(run, None, [("output_limit", False, 0.1, 0.0, "3 of 24 wrong")])
    store.record_capacity(run, "interactive", 240.0, 4.0, 0.95, 5)
    store.record_metric_samples(run, point, [(1.5, "vllm:num_requests_running", {"pod": "w0"}, 7.0)])
    if finish:
        store.finish_run(run, "done", valid=False, invalid_reason="output_limit",
                         fingerprint={"engine_version": "v0.11.0", "image_digest": "sha256:ab", "gpu_type": "H200",
                                      "nodes": ["node-a"], "driver": "550.90", "extra": {"x": 1}})
    store.record_verdict(exp, reg.id, "interactive-capacity", "INCONCLUSIVE", 1.02, 0.9, 1.2, 1)
    return reg.id, exp, run, point


def test_every_record_reads_back(store: Store) -> None:
    reg, exp, run, point = _experiment_with_everything(store)
    (info,) = store.runs(exp)
    assert (info.arm, info.block, info.status, info.valid, info.invalid_reason) == ("A", 0, "done", False, "output_limit")
    assert info.fingerprint["extra"] == {"x": 1} and info.finished_at is not None
    with store.engine.connect() as conn:
        cols = conn.execute(sa.text("select engine_version, image_digest, gpu_type, driver from runs")).one()
    assert tuple(cols) == ("v0.11.0", "sha256:ab", "H200", "550.90")
    pts = store.points(run)
    assert len(pts) == 1 and pts.loc[0, "percentiles"]["ttft_p99"] == math.inf
    assert pts.loc[0, "per_class"]["interactive"]["attainment"] == 0.95
    guards = store.guard_results(run)
    assert [(g.name, g.passed, g.point_id) for g in guards] == [("generator_lag", True, point), ("output_limit", False, None)]
    caps = store.capacities(exp)
    assert caps[["arm", "class_name", "capacity", "valid"]].values.tolist() == [["A", "interactive", 240.0, False]]
    with pytest.raises(StoreConflict, match="append-only"):  # a finished run's capacity stays (0006)
        store.record_capacity(run, "interactive", 260.0, 4.0, 0.93, 6)
    assert store.capacities(exp)["capacity"].tolist() == [240.0]
    (verdict,) = store.verdicts(exp)
    assert (verdict.bar_id, verdict.verdict, verdict.registration_id) == ("interactive-capacity", "INCONCLUSIVE", reg)
    samples = store.metric_samples(run)
    assert samples[["name", "value"]].values.tolist() == [["vllm:num_requests_running", 7.0]]
    assert samples.loc[0, "labels"] == {"pod": "w0"}


def test_a_capacity_keeps_its_censoring_and_a_point_its_context(store: Store) -> None:
    """Issue 17: a capacity at the generator's ceiling is a bound (censored, upper unbounded);
    issue 16: a point's context is its own column, not a key of its percentiles."""
    reg, exp, run, point = _experiment_with_everything(store, finish=False)  # re-recorded while running
    caps = store.capacities(exp)
    assert caps[["censored", "converged", "upper"]].values.tolist() == [[None, True, None]]
    store.record_capacity(run, "interactive", 250.0, 8.0, 0.97, 4, censored="at_ceiling", converged=True,
                          upper=math.inf)
    store.record_capacity(run, "standard", 900.0, 8.0, 0.95, 7, converged=False, upper=990.0)
    def plain(x: object) -> object:  # pandas reads SQL NULL as None or NaN, by column
        return None if x is None or (isinstance(x, float) and math.isnan(x)) else x

    caps = {r["class_name"]: {k: plain(v) for k, v in r.items()} for r in store.capacities(exp).to_dict("records")}
    assert [caps["interactive"][k] for k in ("capacity", "censored", "converged", "upper")] == [
        250.0, "at_ceiling", True, None]
    assert [caps["standard"][k] for k in ("censored", "converged", "upper")] == [None, False, 990.0]
    with pytest.raises(ValueError):
        store.record_capacity(run, "interactive", 1.0, 1.0, 1.0, 1, censored="sideways")
    with pytest.raises(IntegrityError), store.engine.begin() as conn:  # and the database agrees
        conn.execute(sa.text("update capacities set censored = 'sideways'"))

    later = store.record_point(run, seq=1, window_start_s=1.0, window_end_s=7.0, offered_rate=5.0,
                               context={"server_prefix_hit_rate": 0.5, "send_lag_p99_s": math.inf})
    store.finish_point(later, achieved_rate=5.0, throughput_tok_s=1.0, per_class={},
                       percentiles={"ttft_s": {"99": 0.2}}, valid=True,
                       context={"server_prefix_hit_rate": 0.6, "seed": 3})
    pts = store.points(run).set_index("id")
    assert pts.loc[later, "context"] == {"server_prefix_hit_rate": 0.6, "seed": 3}
    assert pts.loc[later, "percentiles"] == {"ttft_s": {"99": 0.2}}
    assert pts.loc[point, "context"] is None

    evidence = {"blocks_used": [0, 1], "censored": ["block 1: A at the load generator's ceiling"],
                "dropped": [{"block": 2, "why": "arm B: no valid run"}], "upper_level": 0.95}
    store.record_verdict(exp, reg, "interactive-capacity", "INCONCLUSIVE", 1.1, 0.9, math.inf, 2,
                         label="B/A 0.9..inf: each end a one-sided 95% bound", note="1 block(s) censored",
                         evidence=evidence)
    (v,) = store.verdicts(exp)
    assert (v.label, v.note, v.evidence) == ("B/A 0.9..inf: each end a one-sided 95% bound", "1 block(s) censored",
                                             evidence)


def test_a_run_is_started_once_per_attempt(store: Store) -> None:
    _, exp, run, _ = _experiment_with_everything(store)
    cfg = store.runs(exp)[0].config_id
    with pytest.raises(StoreConflict):
        store.start_run(exp, "A", block=0, position=0, attempt=0, config_id=cfg)
    retry = store.start_run(exp, "A", block=0, position=0, attempt=1, config_id=cfg)
    b = store.start_run(exp, "B", block=0, position=1, attempt=0, config_id=cfg)
    assert [r.id for r in store.runs(exp)] == [run, retry, b]
    assert [r.finished for r in store.runs(exp)] == [True, False, False]


def test_a_verdict_must_reference_its_experiments_registration(store: Store) -> None:
    reg, exp, _, _ = _experiment_with_everything(store)
    other = store.register_plan(_variant(max_num_seqs=16)).id
    with pytest.raises(StoreConflict):
        store.record_verdict(exp, other, "interactive-capacity", "ACCEPT", 1.3, 1.2, 1.4, 3)
    with pytest.raises(IntegrityError), store.engine.begin() as conn:  # and the database agrees
        conn.execute(sa.text(
            "insert into bar_verdicts (experiment_id, registration_id, bar_id, verdict, blocks, judged_at) "
            "values (:e, :r, 'x', 'ACCEPT', 1, CURRENT_TIMESTAMP)"), {"e": exp, "r": other})
    assert store.verdicts(exp)[0].registration_id == reg


def test_deleting_an_experiment_leaves_no_orphans(store: Store) -> None:
    reg, exp, _, _ = _experiment_with_everything(store)
    keep = store.create_experiment(reg)
    store.delete_experiment(exp)
    with store.engine.connect() as conn:
        counts = {t: conn.execute(sa.text(f"select count(*) from {t}")).scalar_one()
                  for t in ("runs", "load_points", "requests", "guard_results", "capacities",
                            "bar_verdicts", "metric_samples", "experiments", "plan_registrations")}
    assert counts == {"runs": 0, "load_points": 0, "requests": 0, "guard_results": 0, "capacities": 0,
                      "bar_verdicts": 0, "metric_samples": 0, "experiments": 1, "plan_registrations": 1}
    assert store.get_experiment(keep).registration_id == reg


def test_unreachable_database_is_an_environment_problem() -> None:
    from orchestrator.errors import EnvironmentProblem

    with pytest.raises(EnvironmentProblem, match="unreachable.*ORCH_DATABASE_URL"):
        Store.open("postgresql://nobody@127.0.0.1:1/none")
