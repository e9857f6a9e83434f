"""Prometheus text parsing and the generator's self-calibration (CLI included)."""

from __future__ import annotations

import json

from orchestrator.cli.main import main as orch
from orchestrator.loadgen.calibrate import calibrate
from orchestrator.loadgen.scrape import parse_metrics

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
