"""Prometheus scraping of the target and the generator's self-calibration (CLI included)."""

from __future__ import annotations

import asyncio
import json

import numpy as np

from orchestrator.cli.main import main as orch
from orchestrator.loadgen.calibrate import calibrate
from orchestrator.loadgen.null_server import NullServerProcess
from orchestrator.loadgen.runner import run_point
from orchestrator.loadgen.scrape import PeriodicScraper, parse_metrics
from orchestrator.loadgen.workloads import build_requests
from orchestrator.plan import Workload

TEXT = """# HELP vllm:num_requests_running Number of requests.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{model_name="m"} 3.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 2.0
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 5.0
vllm:time_to_first_token_seconds_sum{model_name="m"} 1.5
vllm:time_to_first_token_seconds_count{model_name="m"} 5.0
"""


def test_parse_metrics_gives_samples_with_labels():
    samples = parse_metrics(TEXT)
    byname = {(s.name, s.labels.get("le")): s for s in samples}
    assert byname[("vllm:num_requests_running", None)].value == 3.0
    assert byname[("vllm:num_requests_running", None)].labels == {"model_name": "m"}
    assert byname[("vllm:time_to_first_token_seconds_bucket", "+Inf")].value == 5.0
    assert byname[("vllm:time_to_first_token_seconds_count", None)].value == 5.0


def test_periodic_scraper_brackets_the_point():
    wl = Workload.model_validate({"prompts": {"input_tokens": {"mean": 20}}, "output_tokens": 8})
    reqs = build_requests(wl, 40, seed=1)

    async def go(url):
        async with PeriodicScraper(url, every_s=0.2) as s:
            await run_point(url, "null", reqs, np.arange(40) * 0.02, ["measure"] * 40)
        return s

    with NullServerProcess() as url:
        s = asyncio.run(go(url))
    whens = [x.when for x in s.snapshots]
    assert whens[0] == "before" and whens[-1] == "after" and "during" in whens
    value = {x.when: {y.name: y.value for y in x.samples} for x in s.snapshots}
    assert value["before"]["vllm:request_success_total"] == 0
    assert value["after"]["vllm:request_success_total"] == 40
    assert value["after"]["vllm:generation_tokens_total"] == 320


def test_scraper_keeps_a_failed_scrape_as_evidence():
    async def go():
        async with PeriodicScraper("http://127.0.0.1:9", every_s=0, timeout_s=1) as s:
            pass
        return s

    s = asyncio.run(go())
    assert [x.when for x in s.snapshots] == ["before", "after"]
    assert all(x.error and not x.samples for x in s.snapshots)


def test_calibration_reports_steps_and_a_ceiling_consistent_with_them():
    # a generous lag bound so the ladder passes at least once on a busy machine
    c = calibrate(output_tokens=16, step_s=0.5, min_requests=20, start_rate=20, max_rate=80,
                  bisections=1, max_lag_p99_s=0.5)
    assert c.steps and c.steps[0].rate == 20
    passed = [s.rate for s in c.steps if s.passed]
    assert c.ceiling_rate == (max(passed) if passed else 0.0)
    assert c.ceiling_chunks_per_s == c.ceiling_rate * 16
    for s in c.steps:
        assert s.passed == (s.failures == 0 and s.send_lag_p99_s < 0.5 and abs(s.achieved_ratio - 1) <= 0.01)


def test_cli_calibrate_json_prints_the_ceiling(capsys):
    code = orch(["loadgen", "calibrate", "--json", "--output-tokens", "8", "--step-s", "0.5",
                 "--start-rate", "400", "--max-lag-ms", "0.0001"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) >= {"ceiling_rate", "ceiling_chunks_per_s", "steps", "client", "cpus"}
    # a 0.1 microsecond p99 bound cannot be met: the first step fails and the ceiling is 0
    assert doc["ceiling_rate"] == 0.0 and doc["steps"][0]["passed"] is False


def test_cli_calibrate_rejects_a_bad_flag(capsys):
    assert orch(["loadgen", "calibrate", "--api", "grpc"]) == 1
    assert "--api must be" in capsys.readouterr().err
