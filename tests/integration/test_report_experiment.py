"""The report, exports and history views of one finished experiment, built in virtual time.

One small experiment (two blocks, 1 vs 2 simulated replicas) is run once on the virtual backend
(the real executor, point runner, guards, store and verdicts; the simulated engine on its own
clock), and every test reads it. A failed attempt with a failed guard is added through the
Store, as the executor stores one, so the page must show it.

Virtual time is deterministic, so the fixture asserts what this plan gives (every run of every
block and arm valid, with a converged, uncensored capacity) and the tests assert that the report,
exports and history say what the store holds: every run listed with its validity and failed
guards, the latency figure, a history row for each configuration. What is about real time (HTTP,
the router, send lag) is the real-time tier's, not this file's. The virtual servers export the
requests running and waiting and the prefix-cache counters, not vllm:kv_cache_usage_perc: the
server-metrics figure is drawn with its KV-cache panel empty."""

from __future__ import annotations

import html.parser
import json
import math
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import yaml

from orchestrator.report import llmd_schema as br
from orchestrator.report import render_report, write_report
from orchestrator.report.data import load_experiment, server_series
from orchestrator.store import Store
from tests.e2e.helpers import BASE, orch_here, run_virtual, small_plan

# One worker builds the module's experiment once (under pytest-xdist a module split over two
# workers would build it twice). The fixture is session-scoped: xdist may interleave other
# modules' tests on that worker, and a module-scoped fixture is rebuilt after each interleaving.
pytestmark = pytest.mark.xdist_group("report-experiment")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FAILED_GUARD = ("generator_lag", False, 87.5, 50.0, "p99 send lag 87.5 ms over the 50 ms bound")


@dataclass(frozen=True)
class Finished:
    url: str
    experiment: str
    experiment_id: int
    failed_run_id: int
    tmp: Path


@pytest.fixture(scope="session")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Finished]:
    tmp = tmp_path_factory.mktemp("report")
    url = f"sqlite:///{tmp / 'orch.sqlite'}"
    arms = {
        "A": {"gpu": "H100-PCIe", "layout": "colocated", "replicas": 1,
              "engine": {"max_num_seqs": 32, "max_num_batched_tokens": 2048}},
        "B": {"gpu": "H100-PCIe", "layout": "colocated", "replicas": 2,
              "engine": {"max_num_seqs": 32, "max_num_batched_tokens": 2048}},
    }
    plan = small_plan(
        name="report-e2e", arms=arms, hypothesis="two replicas beat one <by far> & more",
        design={"blocks": 2, "order": "ABBA", "seed": 4, "max_retries": 1},
        # Enough points for the searches to converge: history counts point estimates only.
        search={**BASE["search"], "max_points": 8},
        bars=[{"id": "standard-capacity", "metric": "capacity", "class": "standard",
               "at_least": 1.3, "confidence": 0.9}],
    )
    state = tmp / "state"
    state.mkdir()
    with Store.open(url) as store:
        out = run_virtual(store, plan, state)
        # What this plan gives in virtual time (the same every run): each block ran each arm
        # once, valid, and each search converged on an uncensored capacity.
        runs = store.runs(out.experiment_id)
        assert sorted((r.block, r.arm) for r in runs) == [(b, a) for b in range(2) for a in "AB"], runs
        assert all(r.valid and r.status == "done" for r in runs), runs
        caps = store.capacities(out.experiment_id)
        assert len(caps) == len(runs) and caps.converged.all() and caps.censored.isna().all(), caps
        # A failed attempt as the executor records one: its guard failed at a point.
        config_id = store.deployment_config(plan, "A")
        run_id = store.start_run(out.experiment_id, "A", 0, 0, 7, config_id)
        point_id = store.record_point(run_id, seq=0, window_start_s=1, window_end_s=4, offered_rate=3.0,
                                      n_scheduled=0, valid=False, search_class="standard")
        store.record_guards(run_id, point_id, [FAILED_GUARD])
        store.finish_run(run_id, "failed", False, "guard failed at 3 req/s: generator_lag",
                         {"backend": "virtual", "gpu_type": "H100-PCIe"})
    yield Finished(url, out.experiment_name, out.experiment_id, run_id, tmp)


def orch(*args: str, url: str, monkeypatch: pytest.MonkeyPatch,
         capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`orch ARGS` against the experiment's store, in this process: (exit code, stdout, stderr)."""
    monkeypatch.delenv("ORCH_DEBUG", raising=False)
    return orch_here(*args, env={"ORCH_DATABASE_URL": url}, monkeypatch=monkeypatch, capsys=capsys)


class Page(html.parser.HTMLParser):
    """What a browser would fetch (img src, link href, script src) and the tables by id."""

    def __init__(self) -> None:
        super().__init__()
        self.fetched: list[str] = []
        self.tables: dict[str, list[list[str]]] = {}
        self._table: str | None = None
        self._cell: list[str] | None = None
        self._row: list[str] | None = None
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "img" or tag == "script":
            self.fetched.append(a.get("src") or "")
        if tag == "link":
            self.fetched.append(a.get("href") or "")
        if tag == "table" and a.get("id"):
            self._table = a["id"]
            self.tables[self._table] = []
        if tag == "tr" and self._table:
            self._row = []
        if tag in ("td", "th") and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._row is not None:
            self._row.append(" ".join("".join(self._cell).split()))
            self._cell = None
        elif tag == "tr" and self._row is not None and self._table:
            self.tables[self._table].append(self._row)
            self._row = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell.append(data)


def parse(path: Path) -> Page:
    page = Page()
    page.feed(path.read_text(encoding="utf-8"))
    page.close()
    return page


def test_report_renders_with_every_section_and_existing_images(finished: Finished, tmp_path: Path) -> None:
    with Store.open(finished.url) as store:
        index = write_report(store, finished.experiment, tmp_path / "rep")
        verdicts = store.verdicts(finished.experiment_id)
        runs = store.runs(finished.experiment_id)
        reg = store.get_registration(store.get_experiment(finished.experiment_id).registration_id)
        n_capacities = len(store.capacities(finished.experiment_id))
        at_capacity = load_experiment(store, finished.experiment_id).capacity_points("standard")
        failed_guards = {r.id: {g.name for g in store.guard_results(r.id) if not g.passed} for r in runs}
    assert index == tmp_path / "rep" / "index.html"
    page = parse(index)
    # Self-contained: every fetched resource is a relative file beside the page, and it is a PNG:
    # the verdicts, load curves and server metrics always; latency at capacity when a valid run
    # reached one (here every run did).
    names = {Path(src).name for src in page.fetched}
    assert names >= {"verdicts.png", "load-standard.png", "server-metrics.png"}, names
    assert at_capacity and ("latency-standard.png" in names) == bool(at_capacity), (names, at_capacity)
    for src in page.fetched:
        assert "://" not in src and not src.startswith("/"), src
        f = index.parent / src
        assert f.is_file() and f.stat().st_size > 1000, src
        assert f.read_bytes()[:8] == PNG_MAGIC, src
    text = " ".join(page.text)
    assert reg.sha256 in text
    assert "two replicas beat one <by far> & more" in text  # escaped in the page, intact as text
    # The verdict table: one row per bar, as stored.
    header, *rows = page.tables["verdicts"]
    assert header[0] == "bar" and len(rows) == len(verdicts) == 1
    assert rows[0][0] == "standard-capacity" and rows[0][4] == verdicts[0].verdict
    assert rows[0][5] == ("-" if verdicts[0].estimate is None else f"{verdicts[0].estimate:.3g}")
    # The interval says exactly what it is (issue 17), and the blocks it rests on are listed.
    assert verdicts[0].label and rows[0][6] == " ".join(verdicts[0].label.split()) and "one-sided" in rows[0][6]
    assert rows[0][9].startswith("used: ") and verdicts[0].evidence["blocks_used"] is not None
    # Validity: every run listed (each block ran each arm); the failed attempt shows its failed
    # guard's value vs threshold; a valid run shows none, an invalid one each guard it failed.
    _, *run_rows = page.tables["runs"]
    assert len(run_rows) == len(runs)
    assert {(x.block, x.arm) for x in runs} == {(b, a) for b in range(2) for a in "AB"}
    failed = next(r for r in run_rows if r[0] == str(finished.failed_run_id))
    assert "INVALID" in failed[5]
    assert "generator_lag: 87.5 vs 50 at 3 req/s" in failed[8]
    by_id = {str(x.id): x for x in runs}
    assert sum(1 for x in runs if x.valid) == len(runs) - 1  # all but the failed attempt
    for r in run_rows:
        run = by_id[r[0]]
        if run.valid:
            assert r[5].startswith("valid") and r[8] == "none", r
        else:
            assert r[5].startswith("INVALID"), r
            assert all(f"{g}: " in r[8] for g in failed_guards[run.id]), (r, failed_guards[run.id])
    # Fingerprints of every run; capacities of every run and class.
    assert len(page.tables["fingerprints"]) - 1 == len(runs)
    assert any("H100-PCIe" in r[1] for r in page.tables["fingerprints"][1:])
    assert len(page.tables["capacities"]) - 1 == n_capacities


def test_server_metrics_have_a_scrape_of_every_executed_run(finished: Finished) -> None:
    """The server-metrics figure's data: requests running and waiting for each run the executor
    ran (the virtual servers export no KV-cache use: that panel is empty, NaN)."""
    with Store.open(finished.url) as store:
        data = load_experiment(store, finished.experiment_id)
        ran = {r.id for r in store.runs(finished.experiment_id)} - {finished.failed_run_id}
    series = server_series(data.metrics)
    assert set(series.run_id) == ran, (set(series.run_id), ran)
    assert not series.running.isna().any() and not series.waiting.isna().any()
    assert all(math.isnan(v) or 0 <= v <= 1 for v in series.prefix_hit_rate)


def test_report_command_prints_the_document_and_figure_paths(finished: Finished, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, stderr = orch("report", finished.experiment, "--out", str(tmp_path / "r"), "--json",
                                url=finished.url, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, stderr[-2000:]
    doc = json.loads(stdout)
    assert Path(doc["index"]).is_file()
    with Store.open(finished.url) as store:
        at_capacity = load_experiment(store, finished.experiment_id).capacity_points("standard")
    figures = {Path(f).name for f in doc["figures"]}
    assert figures >= {"verdicts.png", "load-standard.png", "server-metrics.png"}, figures
    assert at_capacity and ("latency-standard.png" in figures) == bool(at_capacity), (figures, at_capacity)
    assert all(Path(f).stat().st_size > 0 for f in doc["figures"])
    assert [v["bar"] for v in doc["verdicts"]] == ["standard-capacity"]
    assert "one-sided" in doc["verdicts"][0]["label"] and isinstance(doc["verdicts"][0]["blocks_used"], list)
    assert all("censoring" in c for c in doc["capacities"])
    failed = next(x for x in doc["runs"] if x["run_id"] == finished.failed_run_id)
    assert failed["guards_failed"][0]["value"] == 87.5 and failed["guards_failed"][0]["threshold"] == 50.0
    # An unknown experiment: exit 1 and one line (an exception out of main would be the traceback).
    code, _, stderr = orch("report", "no-such-experiment", "--out", str(tmp_path / "x"), url=finished.url,
                           monkeypatch=monkeypatch, capsys=capsys)
    assert code == 1 and "Traceback" not in stderr
    assert len(stderr.strip().splitlines()) == 1


# -- headless Chromium -------------------------------------------------------------------------


def _chromium() -> str:
    """Debian's chromium: installed here if missing and we are root; else skipped locally
    (under CI=true a missing browser fails the test instead)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None and hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, timeout=600)
        subprocess.run(["apt-get", "install", "-y", "-q", "chromium"], env=env, capture_output=True,
                       timeout=900)
        found = shutil.which("chromium")
    if found is None:
        msg = "chromium is not installed (apt-get install -y chromium, as root)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    return found


def test_headless_chromium_loads_the_page_and_finds_the_verdict_table(finished: Finished, tmp_path: Path) -> None:
    chromium = _chromium()
    with Store.open(finished.url) as store:
        index = write_report(store, finished.experiment, tmp_path / "rep")
        (verdict,) = store.verdicts(finished.experiment_id)
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        r = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", "--disable-dev-shm-usage", f"--user-data-dir={profile}",
             "--dump-dom", index.resolve().as_uri()],
            capture_output=True, text=True, timeout=180,
        )
    assert r.returncode == 0, r.stderr[-2000:]
    dom = Page()
    dom.feed(r.stdout)
    assert "verdicts" in dom.tables, r.stdout[:2000]
    header, *rows = dom.tables["verdicts"]
    assert header[:5] == ["bar", "metric", "class", "bar (ratio)", "verdict"]
    assert rows and rows[0][0] == "standard-capacity" and rows[0][4] == verdict.verdict


# -- exports -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_export_round_trips_row_counts(finished: Finished, tmp_path: Path, fmt: str,
                                       monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, stderr = orch("export", finished.experiment, "--format", fmt, "--out", str(tmp_path), "--json",
                                url=finished.url, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, stderr[-2000:]
    doc = json.loads(stdout)
    read = pd.read_parquet if fmt == "parquet" else pd.read_csv
    points, requests = read(tmp_path / f"points.{fmt}"), read(tmp_path / f"requests.{fmt}")
    with Store.open(finished.url) as store:
        stored_points = {int(p.id): r.id for r in store.runs(finished.experiment_id)
                         for p in store.points(r.id).itertuples()}
        per_point = {pid: len(store.requests(pid)) for pid in stored_points}
    assert doc["rows"] == {"points": len(points), "requests": len(requests)}
    assert len(points) == len(stored_points) and set(points.point_id) == set(stored_points)
    assert dict(zip(points.point_id, points.run_id, strict=True)) == stored_points
    assert len(requests) == sum(per_point.values()) > 0
    assert requests.groupby("point_id").size().to_dict() == {k: v for k, v in per_point.items() if v}
    assert "standard.attainment" in points.columns and "ttft_s.p99" in points.columns
    # A request without a first token has no TTFT: NaN, never a fast number.
    no_token = requests[requests.first_token_s.isna()]
    assert no_token.ttft_s.isna().all()
    ok = requests[requests.status == "ok"]
    assert (ok.ttft_s - (ok.first_token_s - ok.scheduled_s)).abs().max() < 1e-9


def test_llmd_export_writes_one_valid_v0_2_report_per_point(finished: Finished, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    code, stdout, stderr = orch("export", finished.experiment, "--format", "llmd", "--out", str(tmp_path), "--json",
                                url=finished.url, monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, stderr[-2000:]
    files = [Path(f) for f in json.loads(stdout)["files"]["reports"]]
    with Store.open(finished.url) as store:
        runs = {x.id: x for x in store.runs(finished.experiment_id)}
        points = {int(p.id): p for rid in runs for p in store.points(rid).itertuples()}
        assert len(files) == len(points)
        for f in files:
            doc = yaml.safe_load(f.read_text())
            report = br.BenchmarkReport.model_validate(doc)  # strict: the format's fields only
            assert report.version == "0.2"
            meta = doc["results"]["observability"]["orchestrator"]
            point, run = points[meta["point_id"]], runs[meta["run_id"]]
            engines = [c for c in doc["scenario"]["stack"] if c["metadata"]["kind"] == "inference_engine"]
            assert len(engines) == (1 if run.arm == "A" else 2)
            assert {c["standardized"]["role"] for c in engines} == {"replica"}
            assert all(c["standardized"]["accelerator"]["model"] == "NVIDIA-H100-PCIe" for c in engines)
            load = doc["scenario"]["load"]["standardized"]
            assert load["rate_qps"] == pytest.approx(point.offered_rate)
            assert load["concurrency"] == float("inf")
            measured = [x for x in store.requests(point.id) if x.phase == "measure"]
            agg = doc["results"]["request_performance"]["aggregate"]
            assert agg["requests"]["total"] == len(measured)
            finished_n = sum(1 for x in measured if x.finished)
            assert agg["requests"]["total"] - agg["requests"]["failures"] - agg["requests"]["incomplete"] == finished_n
            if finished_n:
                assert agg["latency"]["time_to_first_token"]["units"] == "s"
                assert agg["requests"]["output_length"]["mean"] == pytest.approx(32.0)


# -- history ----------------------------------------------------------------------------------


def test_capacity_table_and_plot(finished: Finished, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    with Store.open(finished.url) as store:
        caps = store.capacities(finished.experiment_id)
    # What history counts: valid finished runs' converged, uncensored capacities.
    counted = caps[caps.valid.fillna(False).astype(bool) & (caps.status == "done") & caps.censored.isna()
                   & caps.converged.fillna(False).astype(bool)]
    arms = set(counted.arm)
    png = tmp_path / "history" / "capacity.png"
    assert arms == {"A", "B"}, counted  # every run of this plan counts (the fixture's check)
    code, stdout, stderr = orch("capacity", "--model", "qwen3-8b", "--plot", str(png), url=finished.url,
                                monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0, stderr[-2000:]
    # One line per configuration measured: 1 replica (arm A), 2 replicas (arm B).
    assert ("1x TP1" in stdout) == ("A" in arms) and ("2x TP1" in stdout) == ("B" in arms), (stdout, arms)
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 5000
    # Filters that match no run: said so, and no plot drawn.
    empty = tmp_path / "history" / "none.png"
    code, stdout, stderr = orch("capacity", "--model", "no-such-model", "--plot", str(empty), url=finished.url,
                                monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0 and not empty.exists() and "no valid runs match these filters" in stdout + stderr
    code, _, stderr = orch("capacity", "--plot", str(tmp_path / "c.svg"), url=finished.url,
                           monkeypatch=monkeypatch, capsys=capsys)
    assert code == 1 and "--plot" in stderr


def test_render_report_refuses_a_file_as_out_dir(finished: Finished, tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x")
    from orchestrator.errors import UserError

    with Store.open(finished.url) as store, pytest.raises(UserError, match="not a directory"):
        render_report(store, finished.experiment, target)
