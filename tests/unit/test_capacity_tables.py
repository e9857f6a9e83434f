"""Capacity tables print stored values as text (issue 32): a workload signature such as
``[ab2c8965]`` is a style tag to rich's markup, so two workloads once printed alike."""

from __future__ import annotations

import io

import pandas as pd
import pytest
from rich.console import Console

from orchestrator.cli import capacity_cmd

pytestmark = pytest.mark.unit


def _capture(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    out = io.StringIO()
    monkeypatch.setattr(capacity_cmd, "_console", lambda: Console(file=out, width=300, highlight=False))
    return out


def _history(*shas: str) -> pd.DataFrame:
    return pd.DataFrame([{
        "class": "interactive", "ttft_ms": 500, "tpot_ms": 50, "model": "qwen3-8b",
        "label": "H200 1x tp1 [colocated]", "workload": "in 512 out 128 poisson", "workload_sha256": sha,
        "simulated": True, "backend": "sim", "runs": 3, "median": 1000.0, "p25": 900.0, "p75": 1100.0,
        "spread": 0.05, "last_measured": "2026-12-01",
    } for sha in shas])


def test_signatures_that_look_like_style_tags_are_printed(monkeypatch: pytest.MonkeyPatch) -> None:
    out = _capture(monkeypatch)
    capacity_cmd._print_table(_history("ab2c8965" + "0" * 56, "bead1234" + "0" * 56))
    text = out.getvalue()
    assert "[ab2c8965]" in text and "[bead1234]" in text
    assert "[colocated]" in text  # a configuration label's brackets too


def test_sizing_rows_are_text(monkeypatch: pytest.MonkeyPatch) -> None:
    out = _capture(monkeypatch)
    frame = pd.DataFrame([{
        "rank": 1, "label": "H200 2x tp1 [bold]", "simulated": False, "runs": 2, "median": 1000.0,
        "p25": 900.0, "p75": 1100.0, "copies": 3, "copies_low": 3, "copies_high": 3, "shape": "H200 2x",
        "gpus": 6, "gpu_hours_day": 144.0, "cost_day": None, "cost_day_low": None, "cost_day_high": None,
        "usd_per_m_output_tokens": None, "thin": ["[dim]2 runs"],
    }])
    capacity_cmd._print_sizing(frame)
    text = out.getvalue()
    assert "[bold]" in text and "[dim]2 runs" in text
