"""PostgreSQL stopped mid-point (DESIGN 12): store calls retry within the budget, records are
spooled to an fsynced file and written back; an outage longer than the budget aborts the run
(exit 2 through an EnvironmentProblem) and the rerun replays the spool. Either way the count of
request rows equals the count the generator sent (n_scheduled of every point).

The arms run on the virtual backend (virtual time): the outage is real (this test's own
PostgreSQL, stopped and started with pg_ctl), and it starts at a fixed moment, as the first
point's first batch of records is handed to the store, so the same records meet it every time."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from orchestrator.backends.virtual import VirtualBackend
from orchestrator.control.executor import Executor, ExecutorConfig
from orchestrator.control.progress import PlainProgress
from orchestrator.errors import EnvironmentProblem
from orchestrator.store import Store
from orchestrator.store.retry import DatabaseOutage
from tests.e2e.helpers import small_plan
from tests.support import postgres

pytestmark = pytest.mark.timeout(240)


@pytest.fixture
def own_pg(monkeypatch: pytest.MonkeyPatch) -> Iterator[postgres.PrivatePostgres]:
    """A private cluster of this test's own, so it can be stopped and started."""
    bindir = postgres.find_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL server binaries not found")
    pg = postgres.start(bindir)
    try:
        yield pg
    finally:
        pg.stop()


def _pg_ctl(pg: postgres.PrivatePostgres, action: str) -> None:
    data = str(pg.root / "data")
    if action == "stop":
        pg._run(str(pg.bindir / "pg_ctl"), "-D", data, "-m", "fast", "-w", "stop")
    else:
        opts = (f"-p {pg.port} -k {pg.root} -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        pg._run(str(pg.bindir / "pg_ctl"), "-D", data, "-o", opts, "-l", str(pg.root / "log"),
                "-w", "-t", "60", "start")


def _plan() -> Any:
    return small_plan(name="outage", search={"rate": {"min": 1, "max": 32}, "precision": 0.25, "point_s": 6,
                                             "warmup_s": 1, "cooldown_s": 0.5, "max_points": 2,
                                             "use_prior": False})


def _executor(store: Store, state: Path, budget: float) -> Executor:
    cfg = ExecutorConfig(state_dir=state, db_retry_budget_s=budget)
    return Executor(store, VirtualBackend(), cfg, PlainProgress())


class _StopsAtFirstBatch(Store):
    """Stops the test's PostgreSQL as the first batch of request records arrives (so that batch
    and the point's later writes meet the outage), and starts it again ``restart_after_s``
    later (None: the test starts it)."""

    pg: postgres.PrivatePostgres
    restart_after_s: float | None = None
    stopped = False

    def ingest_requests(self, point_id: int, records: Any) -> int:
        if not type(self).stopped:
            type(self).stopped = True
            _pg_ctl(self.pg, "stop")
            if self.restart_after_s is not None:
                threading.Timer(self.restart_after_s, _pg_ctl, (self.pg, "start")).start()
        return super().ingest_requests(point_id, records)


def _outage_store(pg: postgres.PrivatePostgres, url: str, restart_after_s: float | None) -> _StopsAtFirstBatch:
    with Store.open(url):
        pass  # migrated
    _StopsAtFirstBatch.pg, _StopsAtFirstBatch.restart_after_s = pg, restart_after_s
    _StopsAtFirstBatch.stopped = False
    return _StopsAtFirstBatch(Store.open(url).engine)


def _counts(store: Store) -> tuple[int, int]:
    with store.engine.connect() as c:
        sent = c.execute(sa.text("select coalesce(sum(n_scheduled), 0) from load_points")).scalar()
        stored = c.execute(sa.text("select count(*) from requests")).scalar()
    return int(sent or 0), int(stored or 0)


def test_outage_within_budget_rides_through(own_pg: postgres.PrivatePostgres, tmp_path: Path) -> None:
    url = own_pg.url(own_pg.create_database())
    store = _outage_store(own_pg, url, restart_after_s=8.0)
    try:
        out = _executor(store, tmp_path / "state", budget=40.0).run(_plan())
        assert _StopsAtFirstBatch.stopped
        assert out.complete
        runs = store.runs(out.experiment_id)
        assert all(r.status == "done" and r.valid for r in runs)
        assert store.get_experiment(out.experiment_id).status == "done"
        sent, stored = _counts(store)
        assert sent > 0 and stored == sent
        assert not list((tmp_path / "state" / "spool").glob("point-*.jsonl"))
    finally:
        store.close()


def test_outage_past_budget_aborts_then_rerun_replays(own_pg: postgres.PrivatePostgres, tmp_path: Path) -> None:
    url = own_pg.url(own_pg.create_database())
    plan = _plan()
    state = tmp_path / "state"
    store = _outage_store(own_pg, url, restart_after_s=None)
    try:
        with pytest.raises(DatabaseOutage) as caught:
            _executor(store, state, budget=3.0).run(plan)
        err = caught.value
        assert isinstance(err, EnvironmentProblem), repr(err)
        assert err.exit_code == 2 and "\n" not in str(err) and "did not answer for 3 s" in str(err)
        assert list((state / "spool").glob("point-*.jsonl")), "records taken during the outage are spooled"
        _pg_ctl(own_pg, "start")
        out = _executor(store, state, budget=30.0).run(plan)
        assert out.complete and out.resumed
        runs = store.runs(out.experiment_id)
        assert [r.status for r in runs].count("aborted") == 1
        assert sorted((r.block, r.arm) for r in runs if r.status == "done" and r.valid) == [(0, "A"), (0, "B")]
        sent, stored = _counts(store)
        assert sent > 0 and stored == sent
        assert not list((state / "spool").glob("point-*.jsonl"))
    finally:
        store.close()


class _Down:
    """``store``, whose every ingest fails as an unreachable database does (the point was
    read before it went down: whose it is, is known)."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def point_owner(self, point_id: int) -> Any:
        return self.store.point_owner(point_id)

    def ingest_requests(self, point_id: int, records: Any) -> int:
        raise sa.exc.OperationalError("INSERT", {}, Exception("connection refused"))


def _records(n: int) -> list[Any]:
    from orchestrator.records import RequestRecord

    return [RequestRecord(request_id=i, conversation_id=i, turn=0, phase="measure", scheduled_s=float(i))
            for i in range(n)]


def test_replay_writes_this_experiments_spool_only(sqlite_url: str, tmp_path: Path) -> None:
    """What a dead process spooled (fsynced, one line per batch) is written back by the resume
    of its experiment, and only of its experiment."""
    from orchestrator.control.spool import SpoolingSink, replay, spooled_points

    plan = small_plan(name="spool-scope")
    spool = tmp_path / "spool"
    with Store.open(sqlite_url) as store:
        reg = store.register_plan(plan)
        config = store.deployment_config(plan, "A")
        points = []
        for _ in range(2):
            exp = store.create_experiment(reg.id)
            run = store.start_run(exp, "A", 0, 0, 0, config)
            points.append(store.record_point(run, seq=0, window_start_s=0, window_end_s=1, n_scheduled=5))
        for pid in points:
            sink = SpoolingSink(_Down(store), pid, spool)
            sink(_records(3))
            sink(_records(5)[3:])
            assert sink.spooled_batches == 2 and sink.pending
        assert spooled_points(spool, store.identity()) == sorted(points)
        assert replay(store, spool, {points[0]}) == 5
        assert len(store.requests(points[0])) == 5 and store.requests(points[1]) == []
        assert spooled_points(spool, store.identity()) == [points[1]]
        assert replay(store, spool, {points[0], points[1]}) == 5
        assert spooled_points(spool, store.identity()) == []


def test_retrying_rides_through_then_gives_up() -> None:
    from orchestrator.store.retry import retrying

    calls = {"n": 0}

    def flaky() -> str:
        calls["n"] += 1
        if calls["n"] < 3:
            raise sa.exc.OperationalError("SELECT 1", {}, Exception("server closed the connection"))
        return "ok"

    assert retrying(flaky, "test", budget=5.0, sleep=lambda s: None) == "ok" and calls["n"] == 3

    def down() -> None:
        raise sa.exc.OperationalError("SELECT 1", {}, Exception("connection refused\nDETAIL: more"))

    with pytest.raises(DatabaseOutage, match=r"did not answer for 0 s \(finish_point: OperationalError: "
                                             r"connection refused\)") as e:
        retrying(down, "finish_point", budget=0.0)
    assert "\n" not in str(e.value) and e.value.exit_code == 2

    def bug() -> None:
        raise ValueError("not an outage")

    with pytest.raises(ValueError):
        retrying(bug, "x", budget=60.0)


class _BackAtTheEnd(Store):
    """The database is 'down' for request batches until the point's finish is first tried, and
    the finish itself fails until the budget is spent: the database is back just as the run
    is aborted."""

    down = True

    def ingest_requests(self, point_id: int, records: Any) -> int:
        if _BackAtTheEnd.down:
            raise sa.exc.OperationalError("COPY", {}, Exception("connection refused"))
        return super().ingest_requests(point_id, records)

    def finish_point(self, point_id: int, **kwargs: Any) -> None:
        _BackAtTheEnd.down = False
        raise sa.exc.OperationalError("UPDATE", {}, Exception("connection refused"))


def test_abort_writes_the_runs_spool_before_storing_the_abort(sqlite_url: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """When the database answers again just as the budget runs out, the run's spooled records
    are written before the run is stored aborted (its digest then covers all of them)."""
    _BackAtTheEnd.down = True
    state = tmp_path / "state"
    with Store.open(sqlite_url):
        pass  # migrated
    store = _BackAtTheEnd(Store.open(sqlite_url).engine)
    try:
        with pytest.raises(DatabaseOutage):
            _executor(store, state, budget=0.3).run(_plan())
        runs = store.runs(store.list_experiments()[0].id)
        assert len(runs) == 1 and runs[0].status == "aborted"
        assert "database outage" in (runs[0].invalid_reason or "")
        sent, stored = _counts(store)
        assert sent > 0 and stored == sent
        assert not list((state / "spool").glob("point-*.jsonl"))
    finally:
        store.close()


class _AnswerLost(Store):
    """Each write commits, then its first answer is lost (the connection drops after COMMIT)."""

    lost: set[str] = set()

    def _drop_once(self, name: str, result: Any) -> Any:
        if name not in self.lost:
            self.lost.add(name)
            raise sa.exc.OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))
        return result

    def start_run(self, *a: Any, **k: Any) -> int:
        return self._drop_once("start_run", super().start_run(*a, **k))

    def record_point(self, *a: Any, **k: Any) -> int:
        return self._drop_once("record_point", super().record_point(*a, **k))

    def record_guards(self, *a: Any, **k: Any) -> None:
        return self._drop_once("record_guards", super().record_guards(*a, **k))

    def record_metric_samples(self, *a: Any, **k: Any) -> int:
        return self._drop_once("record_metric_samples", super().record_metric_samples(*a, **k))

    def finish_run(self, *a: Any, **k: Any) -> None:
        return self._drop_once("finish_run", super().finish_run(*a, **k))

    def record_verdict(self, *a: Any, **k: Any) -> None:
        return self._drop_once("record_verdict", super().record_verdict(*a, **k))


def test_a_write_whose_answer_was_lost_is_not_written_twice(db_url: str) -> None:
    """A retry after a commit whose answer was lost finds the first try's row: one run, one
    point, one set of guards and samples, one verdict; the run's finish is not refused as an
    edit of a finished run."""
    from orchestrator.store.retry import ResilientStore

    with Store.open(db_url) as plain:
        plan = small_plan(name="lost-answer")
        reg = plain.register_plan(plan)
        exp = plain.create_experiment(reg.id)
        config = plain.deployment_config(plan, "A")
        store = ResilientStore(_AnswerLost(plain.engine), budget=30.0)
        _AnswerLost.lost = set()
        run = store.start_run(exp, "A", 0, 0, 0, config)
        point = store.record_point(run, seq=0, window_start_s=0.0, window_end_s=1.0)
        store.record_guards(run, point, [("repeat", True, 0.0, 0.0, "")])
        assert store.record_metric_samples(run, point, [(1.0, "vllm:x", {}, 2.0), (2.0, "vllm:x", {}, 3.0)]) == 2
        store.finish_run(run, "done", True, None, {})
        store.record_verdict(exp, reg.id, "bar", "ACCEPT", 1.2, 1.1, 1.3, 2)
        assert _AnswerLost.lost == {"start_run", "record_point", "record_guards", "record_metric_samples",
                                    "finish_run", "record_verdict"}
        assert [(r.id, r.status) for r in plain.runs(exp)] == [(run, "done")]
        assert list(plain.points(run)["id"]) == [point]
        assert len(plain.guard_results(run)) == 1
        assert len(plain.metric_samples(run)) == 2
        assert len(plain.verdicts(exp, history=True)) == 1
