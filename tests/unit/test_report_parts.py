"""Pure parts of the report: server series from scraped samples, llm-d aggregates and schema
strictness, the page's escaping."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from pydantic import ValidationError

from orchestrator.records import RequestRecord
from orchestrator.report import html
from orchestrator.report import llmd_schema as br
from orchestrator.report.data import server_series
from orchestrator.report.llmd import accelerator_name, request_performance


def _sample(run: int, t: float, name: str, value: float, engine: str = "0") -> dict:
    return {"run_id": run, "t": t, "name": name, "labels": {"engine": engine}, "value": value,
            "point_id": 1}


def test_server_series_groups_one_scrape_and_takes_counter_increases() -> None:
    rows = []
    # Two scrapes of two engines; samples of one scrape are stamped microseconds apart.
    for i, (t, running, hits, queries) in enumerate([(100.0, (3, 4), (10, 0), (100, 100)),
                                                     (105.0, (1, 0), (70, 20), (200, 200))]):
        for e in range(2):
            dt = 1e-5 * (4 * e + i)
            rows += [
                _sample(1, t + dt, "vllm:num_requests_running", running[e], str(e)),
                _sample(1, t + dt, "vllm:num_requests_waiting", 2 * e, str(e)),
                _sample(1, t + dt, "vllm:kv_cache_usage_perc", 0.2 + 0.4 * e, str(e)),
                _sample(1, t + dt, "vllm:prefix_cache_hits_total", hits[e], str(e)),
                _sample(1, t + dt, "vllm:prefix_cache_queries_total", queries[e], str(e)),
                _sample(1, t + dt, "vllm:time_to_first_token_seconds_count", 5, str(e)),
            ]
    s = server_series(pd.DataFrame(rows))
    assert list(s.t.round(3)) == [100.0, 105.0]
    assert list(s.running) == [7, 1] and list(s.waiting) == [2, 2]
    assert list(s.kv_usage.round(6)) == [0.4, 0.4]
    # First scrape: counters since the servers started; second: the increase since the first.
    assert s.prefix_hit_rate.iloc[0] == pytest.approx(10 / 200)
    assert s.prefix_hit_rate.iloc[1] == pytest.approx((70 + 20 - 10) / 200)


def test_server_series_keeps_runs_apart_and_no_queries_is_not_a_zero_hit_rate() -> None:
    rows = [_sample(run, 50.0, name, 0.0) for run in (1, 2)
            for name in ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total")]
    s = server_series(pd.DataFrame(rows))
    assert list(s.run_id) == [1, 2]
    assert s.prefix_hit_rate.isna().all()
    assert server_series(pd.DataFrame(columns=["t", "name", "labels", "value", "point_id", "run_id"])).empty


def _rec(i: int, status: str = "ok", first: float | None = 0.5, last: float | None = 1.5,
         out: int | None = 11, phase: str = "measure") -> RequestRecord:
    return RequestRecord(request_id=i, conversation_id=i, turn=0, phase=phase, scheduled_s=float(i),
                         sent_s=float(i), first_token_s=None if first is None else i + first,
                         last_token_s=None if last is None else i + last, prompt_tokens=100,
                         output_tokens_asked=11, output_tokens=out, status=status)


def test_llmd_aggregates_count_failures_and_incomplete_and_judge_only_finished() -> None:
    records = [_rec(0), _rec(1, first=0.25, last=1.25), _rec(2, status="http_error", first=None, last=None, out=None),
               _rec(3, status="timeout", first=0.1, last=None, out=None), _rec(4, status="unsent", first=None, last=None, out=None),
               _rec(5, phase="warmup", first=9.0, last=19.0)]
    perf = request_performance(records, n_scheduled=6, window_s=2.0)
    req = perf.aggregate.requests
    # 6 scheduled in the window (one never recorded), 2 failed (http_error, timeout), 2 finished.
    assert (req.total, req.failures, req.incomplete) == (6, 2, 2)
    lat = perf.aggregate.latency
    assert lat.time_to_first_token.mean == pytest.approx(0.375)  # the warm-up record is not judged
    assert lat.time_to_first_token.max == pytest.approx(0.5)
    assert lat.time_per_output_token.mean == pytest.approx(0.1)  # 1 s over 10 tokens
    assert perf.aggregate.throughput.output_token_rate.mean == pytest.approx(22 / 2.0)
    assert perf.aggregate.throughput.requests_rate.units == "queries/s"


def test_llmd_aggregates_of_a_point_where_nothing_finished() -> None:
    perf = request_performance([_rec(0, status="timeout", first=None, last=None, out=None)], 1, 3.0)
    assert perf.aggregate.latency.time_to_first_token is None
    assert perf.aggregate.requests.incomplete == 0 and perf.aggregate.requests.failures == 1
    assert perf.aggregate.throughput.output_token_rate.mean == 0.0


def test_llmd_schema_is_strict_about_fields_units_and_concurrency() -> None:
    with pytest.raises(ValidationError, match="units"):
        br.AggregateLatency(time_to_first_token=br.Statistics(units="tokens/s", mean=1.0))
    with pytest.raises(ValidationError, match="extra"):
        br.Run.model_validate({"uid": "x", "colour": "red"})
    seq = br.SequenceLength(distribution="fixed", value=10)
    with pytest.raises(ValidationError, match="concurrency"):
        br.LoadStandardized(tool="t", tool_version="1", source="random", input_seq_len=seq, concurrency=2.5)
    ok = br.LoadStandardized(tool="t", tool_version="1", source="random", input_seq_len=seq, concurrency=math.inf)
    assert ok.concurrency == math.inf
    with pytest.raises(ValidationError, match="does not match kind"):
        br.Component(metadata=br.ComponentMetadata(kind="inference_engine", label="x", cfg_id="y"),
                     standardized=br.Generic(tool="r", tool_version="1"), native=br.ComponentNative())


def test_accelerator_names_follow_gpu_feature_discovery() -> None:
    assert accelerator_name("H200") == "NVIDIA-H200-141GB-HBM3e"
    assert accelerator_name("H100-SXM") == "NVIDIA-H100-80GB-HBM3"
    assert accelerator_name(None) == "unknown"


def test_page_escapes_stored_text() -> None:
    doc = {
        "experiment": {"id": 1, "name": "x<y>", "status": "done", "created_at": None, "started_at": None,
                       "finished_at": None,
                       "plan": {"name": "p", "registration_id": 1, "sha256": "ab" * 32, "registered_at": "t",
                                "hypothesis": "<script>alert(1)</script>"}},
        "verdicts": [], "capacities": [], "guards": [], "fingerprints": [],
        "runs": [{"run_id": 1, "block": 0, "arm": "A", "attempt": 0, "status": "failed", "valid": False,
                  "reason": "<b>bad</b>", "points": 0, "guards_checked": 1,
                  "guards_failed": [{"guard": "stalls", "value": 0.25, "threshold": 0.01, "detail": "a<b",
                                     "offered_rate": 2.0, "point_id": 3}]}],
    }
    page = html.render(doc, {"verdicts": None, "server": None, "curves": {}, "latency": {}}, {"name": "p"}, [])
    assert "<script>" not in page and "&lt;script&gt;" in page and "&lt;b&gt;bad" in page
    assert "stalls: 0.25 vs 0.01 at 2 req/s" in page
    assert "The plan registered no bars" in page


def test_latency_plot_with_a_capacity_point_that_holds_no_record(tmp_path, monkeypatch) -> None:
    """A run whose capacity point holds no finished request draws nothing and restyles nothing:
    the other run's curve keeps its own line style, and no empty legend is asked for (a warning,
    an error under this suite's filters)."""
    from datetime import UTC, datetime

    from orchestrator.report.data import ExperimentData
    from orchestrator.report.plots import latency_at_capacity
    from orchestrator.store.rows import RunInfo
    from tests.e2e.helpers import small_plan

    plan = small_plan()
    now = datetime.now(UTC)
    runs = [RunInfo(id=i, experiment_id=1, config_id=1, arm=arm, block=block, position=0, attempt=0,
                    status="done", valid=True, invalid_reason=None, fingerprint=None, started_at=now,
                    finished_at=now) for i, arm, block in ((1, "A", 0), (2, "B", 1))]
    caps = pd.DataFrame({"run_id": [1, 2], "class_name": ["standard"] * 2, "valid": [True, True],
                         "at_rate": [2.0, 2.0], "capacity": [1.9, 1.9]})
    points = pd.DataFrame({"id": [10, 20], "run_id": [1, 2], "offered_rate": [2.0, 2.0]})
    by_point = {10: [_rec(i) for i in range(8)], 20: []}  # run 2's point: nothing recorded

    class Requests:
        def requests(self, point_id: int) -> list[RequestRecord]:
            return by_point[point_id]

    data = ExperimentData(experiment=None, registration=None, plan=plan, runs=runs, points=points,
                          capacities=caps, verdicts=[], guards={}, metrics=pd.DataFrame(), _store=Requests())
    from orchestrator.report import plots

    seen = []
    real_save = plots._save

    def keep(fig, path):
        seen.append([(line.get_label(), line.get_linestyle()) for ax in fig.axes for line in ax.lines
                     if not line.get_label().startswith("_")])
        return real_save(fig, path)

    monkeypatch.setattr(plots, "_save", keep)
    out = latency_at_capacity(data, "standard", tmp_path / "latency.png")
    assert out is not None and out.exists()
    # Run 1's TTFT and TPOT curves, solid (the old code restyled the last drawn line as run 2's).
    assert seen == [[("A b0", "-"), ("A b0", "-")]]
