"""Measurements and verdicts are append-only (migration 0006; DESIGN section 12; issue 18 item 3),
on SQLite and PostgreSQL: UPDATE and DELETE refused beyond a run's lifecycle, a new verdict is a
new row, deleting an experiment still works through the maintenance escape, and a run's digest
catches records changed after it finished (`orch verdict --verify` exits 6)."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from orchestrator.cli.main import main
from orchestrator.plan import load_plan_file
from orchestrator.records import RequestRecord
from orchestrator.store import Store, StoreConflict
from orchestrator.store.appendonly import maintenance, runtime_grants

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart.yaml"
REFUSED = (sa.exc.IntegrityError, sa.exc.DatabaseError)


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store.open(db_url)
    yield s
    s.close()


def _records(n: int) -> list[RequestRecord]:
    return [
        RequestRecord(
            request_id=i, conversation_id=i // 2, turn=i % 2, phase="measure", scheduled_s=1.7e9 + i / 3,
            sent_s=1.7e9 + i / 3 + 1e-4, first_token_s=1.7e9 + i / 3 + 0.2, last_token_s=1.7e9 + i / 3 + 1.1,
            prompt_tokens=500 + i, output_tokens_asked=128, output_tokens=128, cached_tokens=i % 7, chunks=40,
            max_gap_s=0.05, status="ok", http_status=200, error=None, prompt_hash=f"{i:032x}",
            output_hash=f"{i:016x}",
        )
        for i in range(n)
    ]


def _experiment(store: Store, finish: bool = True) -> tuple[int, int, int]:
    """An experiment with one run of arm A: one point with 20 requests, a guard, a capacity, a
    metric sample and a verdict; the run finished done unless ``finish`` is false. Returns
    (experiment, run, point)."""
    plan = load_plan_file(QUICKSTART)
    reg = store.register_plan(plan)
    exp = store.create_experiment(reg.id)
    run = store.start_run(exp, "A", 0, 0, 0, store.deployment_config(plan, "A"))
    point = store.record_point(run, seq=0, window_start_s=0.0, window_end_s=60.0, offered_rate=2.0)
    store.ingest_requests(point, _records(20))
    store.finish_point(point, achieved_rate=2.0, throughput_tok_s=900.0, per_class={}, percentiles={}, valid=True)
    store.record_guards(run, point, [("generator_lag", True, 0.01, 0.05, "")])
    store.record_metric_samples(run, point, [(1.0, "vllm:num_requests_running", {}, 3.0)])
    store.record_capacity(run, "interactive", 240.0, 2.0, 0.95, 5)
    store.record_verdict(exp, reg.id, plan.bars[0].id, "REJECT", -0.1, -0.2, 0.0, 4)
    if finish:
        store.finish_run(run, "done", valid=True, fingerprint={"backend": "sim"})
    return exp, run, point


def _refused(store: Store, sql: str, **params: object) -> str:
    with pytest.raises(REFUSED) as e, store.engine.begin() as conn:
        conn.execute(sa.text(sql), params)
    assert "append-only" in str(e.value), e.value
    return str(e.value)


def test_a_verdict_cannot_be_edited_or_deleted(store: Store) -> None:
    exp, _, _ = _experiment(store)
    _refused(store, "update bar_verdicts set verdict = 'ACCEPT' where experiment_id = :e", e=exp)
    _refused(store, "delete from bar_verdicts where experiment_id = :e", e=exp)
    assert [v.verdict for v in store.verdicts(exp)] == ["REJECT"]


def test_requests_guards_and_samples_cannot_be_edited_or_deleted(store: Store) -> None:
    _, run, point = _experiment(store)
    _refused(store, "delete from requests where point_id = :p and request_id = 3", p=point)
    _refused(store, "update requests set output_tokens = 1 where point_id = :p", p=point)
    _refused(store, "update guard_results set passed = false where run_id = :r", r=run)
    _refused(store, "delete from metric_samples where run_id = :r", r=run)
    _refused(store, "delete from load_points where id = :p", p=point)
    _refused(store, "delete from capacities where run_id = :r", r=run)
    _refused(store, "delete from runs where id = :r", r=run)
    assert len(store.requests(point)) == 20
    if store.engine.dialect.name == "postgresql":
        _refused(store, "truncate requests")


def test_a_finished_run_cannot_change_and_moves_only_forward(store: Store) -> None:
    exp, run, point = _experiment(store)
    _refused(store, "update runs set status = 'running' where id = :r", r=run)
    _refused(store, "update runs set valid = false, invalid_reason = 'edited' where id = :r", r=run)
    _refused(store, "update load_points set valid = false where id = :p", p=point)
    _refused(store, "update capacities set capacity = 1e6 where run_id = :r", r=run)
    with pytest.raises(StoreConflict, match="append-only"):
        store.finish_run(run, "failed", valid=False, invalid_reason="second thoughts")
    with pytest.raises(StoreConflict, match="append-only"):
        store.record_capacity(run, "interactive", 999.0, 2.0, 0.99, 5)
    info = store.runs(exp)[0]
    assert (info.status, info.valid, info.invalid_reason) == ("done", True, None)


def test_a_running_run_may_replace_its_capacity_and_finish_but_not_change_identity(store: Store) -> None:
    exp, run, _ = _experiment(store, finish=False)
    store.record_capacity(run, "interactive", 260.0, 2.0, 0.93, 6)  # a resumed search
    _refused(store, "update runs set arm = 'B' where id = :r", r=run)
    store.finish_run(run, "aborted", valid=False, invalid_reason="interrupted")
    caps = store.capacities(exp)
    assert caps["capacity"].tolist() == [260.0] and store.runs(exp)[0].status == "aborted"


def test_a_new_verdict_is_a_new_row_and_the_latest_is_read(store: Store) -> None:
    exp, _, _ = _experiment(store)
    reg = store.get_experiment(exp).registration_id
    bar = store.verdicts(exp)[0].bar_id
    store.record_verdict(exp, reg, bar, "ACCEPT", 0.1, 0.05, 0.2, 4, note="judged again")
    assert [(v.verdict, v.note) for v in store.verdicts(exp)] == [("ACCEPT", "judged again")]
    assert [v.verdict for v in store.verdicts(exp, history=True)] == ["REJECT", "ACCEPT"]
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("select count(*) from bar_verdicts")).scalar_one() == 2


def test_deleting_an_experiment_still_works_and_the_escape_does_not_outlive_it(store: Store) -> None:
    gone, _, _ = _experiment(store)
    kept, kept_run, _ = _experiment(store)
    store.delete_experiment(gone)
    with store.engine.connect() as conn:
        counts = {t: conn.execute(sa.text(f"select count(*) from {t}")).scalar_one()  # noqa: S608
                  for t in ("runs", "load_points", "requests", "guard_results", "capacities",
                            "metric_samples", "bar_verdicts", "orch_maintenance")}
    assert counts == {"runs": 1, "load_points": 1, "requests": 20, "guard_results": 1, "capacities": 1,
                      "metric_samples": 1, "bar_verdicts": 1, "orch_maintenance": 0}
    _refused(store, "delete from runs where id = :r", r=kept_run)  # the escape ended with its transaction
    assert [e.id for e in store.list_experiments()] == [kept]


def _tamper(store: Store, point: int) -> None:
    with store.engine.begin() as conn, maintenance(conn):
        conn.execute(sa.text("update requests set output_tokens = 4096 where point_id = :p and request_id = 7"),
                     {"p": point})


def test_the_digest_catches_a_record_changed_after_the_run(store: Store) -> None:
    exp, run, point = _experiment(store)
    unfinished = store.start_run(exp, "B", 0, 1, 0, store.runs(exp)[0].config_id)
    checks = store.verify_digests(exp)
    assert [(c.run_id, c.changed) for c in checks] == [(run, False)]  # a running run is not checked
    assert len(checks[0].stored or "") == 64
    _tamper(store, point)
    assert [(c.run_id, c.changed) for c in store.verify_digests(exp)] == [(run, True)]
    assert unfinished not in {c.run_id for c in store.verify_digests(exp)}


def test_orch_verdict_verify_exits_6_with_one_line_per_changed_run(
    db_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with Store.open(db_url) as store:
        exp, run, point = _experiment(store)
        name = store.get_experiment(exp).name
    monkeypatch.setenv("ORCH_DATABASE_URL", db_url)
    monkeypatch.delenv("ORCH_DEBUG", raising=False)
    capsys.readouterr()

    def orch(*args: str) -> subprocess.CompletedProcess[str]:
        code = main(list(args))
        out = capsys.readouterr()
        return subprocess.CompletedProcess(args, code, out.out, out.err)

    clean = orch("verdict", name, "--verify", "--json")
    assert clean.returncode == 0, clean.stderr
    with Store.open(db_url) as store:
        _tamper(store, point)
    bad = orch("verdict", name, "--verify")
    assert bad.returncode == 6
    lines = bad.stderr.strip().splitlines()
    # one line for the run's digest, one for the hash chain's link that sealed it (issue 30)
    assert len(lines) == 2 and any(ln.startswith(f"run {run} (block 0, arm A, attempt 0): records changed")
                                   for ln in lines), lines
    assert any(ln.startswith(f"run {run} (experiment ") and "changed since it was sealed" in ln for ln in lines)
    assert orch("verdict", name).returncode == 0  # without --verify: not checked


def test_the_runtime_role_records_a_run_with_its_grants_and_cannot_edit_or_escape(pg_url: str) -> None:
    """PostgreSQL: a role given exactly `runtime_grants` (README "What is guaranteed") records a
    whole run, cannot edit, delete or disable a trigger, and the maintenance escape is refused to
    it even where it was granted DELETE (the triggers honour the escape only for the owner)."""
    role = f"orch_rt_{uuid.uuid4().hex[:8]}"
    owner = Store.open(pg_url)
    with owner.engine.begin() as conn:
        conn.execute(sa.text(f"CREATE ROLE {role} LOGIN"))
        for grant in runtime_grants(role):
            conn.execute(sa.text(grant))
    runtime_url = sa.make_url(pg_url).set(username=role, password=None).render_as_string(hide_password=False)
    try:
        with Store.open(runtime_url) as rt:
            exp, run, _ = _experiment(rt)
            rt.set_experiment_status(exp, "running")
            rt.set_experiment_status(exp, "done")
            assert [c.changed for c in rt.verify_digests(exp)] == [False]
            for sql in ("update bar_verdicts set verdict = 'ACCEPT'", "delete from requests",
                        "update runs set valid = false", "alter table requests disable trigger all",
                        "drop trigger runs_forward_only on runs"):
                with pytest.raises(sa.exc.DBAPIError), rt.engine.begin() as conn:
                    conn.execute(sa.text(sql))
            with pytest.raises(sa.exc.DBAPIError):
                rt.delete_experiment(exp)
            with owner.engine.begin() as conn:
                conn.execute(sa.text(f"GRANT DELETE ON bar_verdicts TO {role}"))
            with pytest.raises(sa.exc.DBAPIError, match="append-only"), rt.engine.begin() as conn, maintenance(conn):
                conn.execute(sa.text("delete from bar_verdicts"))
        owner.delete_experiment(exp)  # the owner's escape works
        assert owner.list_experiments() == []
    finally:
        with owner.engine.begin() as conn:
            conn.execute(sa.text(f"DROP OWNED BY {role}"))
            conn.execute(sa.text(f"DROP ROLE {role}"))
        owner.close()


def test_the_readme_grants_are_the_tested_ones() -> None:
    text = (ROOT / "README.md").read_text()
    block = text.split("## What is guaranteed", 1)[1].split("```sql", 1)[1].split("```", 1)[0]
    statements = [" ".join(s.split("--")[0].split()) for s in block.replace("\n", " ").split(";")]
    assert [s for s in statements if s] == runtime_grants("orch_runtime")


def test_0006_down_keeps_the_latest_verdict_and_up_again_restores_the_triggers(db_url: str) -> None:
    from orchestrator.store.database import downgrade, upgrade

    with Store.open(db_url) as store:
        exp, _, _ = _experiment(store)
        reg = store.get_experiment(exp).registration_id
        bar = store.verdicts(exp)[0].bar_id
        store.record_verdict(exp, reg, bar, "ACCEPT", 0.1, 0.05, 0.2, 4)
        downgrade(store.engine, "0005")
        with store.engine.begin() as conn:  # no trigger at 0005
            rows = conn.execute(sa.text("select verdict from bar_verdicts")).scalars().all()
            conn.execute(sa.text("update runs set valid = false"))
        assert rows == ["ACCEPT"]
        upgrade(store.engine)
        _refused(store, "update bar_verdicts set verdict = 'REJECT'")
        _refused(store, "update runs set valid = true")
