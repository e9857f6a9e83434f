"""The in-cluster load generator's encodings (loadgen.wire): what a controller and an agent of
the same version exchange reads back as it was; a record of an older agent (fewer trailing
fields) reads with the defaults; a malformed message is a WireError, never a wrong record."""

from __future__ import annotations

import json
import math

import pytest

from orchestrator.loadgen.runner import summarize
from orchestrator.loadgen.wire import (
    RECORD_FIELDS,
    WireError,
    record_rows,
    records_from,
    spec_rows,
    specs_from,
    summary_doc,
    summary_from,
)
from orchestrator.loadgen.workloads import RequestSpec
from orchestrator.records import RequestRecord

pytestmark = pytest.mark.unit


def _record(i: int) -> RequestRecord:
    return RequestRecord(request_id=i, conversation_id=i // 2, turn=i % 2, phase="measure", scheduled_s=100.0 + i,
                         sent_s=100.001 + i, first_token_s=100.2 + i, last_token_s=100.5 + i, prompt_tokens=30,
                         output_tokens_asked=8, output_tokens=8, cached_tokens=16, chunks=8, max_gap_s=0.05,
                         status="ok", http_status=200, prompt_hash=f"p{i}", output_hash=f"o{i}",
                         server_prompt_tokens=31)


def test_records_specs_and_summaries_read_back_as_they_were() -> None:
    records = [_record(i) for i in range(5)] + [RequestRecord(9, 9, 0, "cooldown", 200.0, error="unsent")]
    assert records_from(json.loads(json.dumps(record_rows(records)))) == records
    specs = [RequestSpec(1, 1, 0, "a b", 2, 0, 8, "h1"),
             RequestSpec(2, 1, 1, "sys a b", 3, 1, 8, "h2", messages=(("system", "sys"), ("user", "a b")),
                         history_tokens=2)]
    assert specs_from(json.loads(json.dumps(spec_rows(specs)))) == specs
    summary = summarize(records, 100.0, "aiohttp")
    back = summary_from(json.loads(json.dumps(summary_doc(summary))), records)
    assert back.records == records and back.by_status == summary.by_status and back.scheduled == 6
    for name in ("send_lag_p99_s", "achieved_rate", "duration_s"):
        a, b = getattr(back, name), getattr(summary, name)
        assert a == b or (math.isnan(a) and math.isnan(b)), name


def test_an_older_agents_records_read_with_defaults_and_bad_ones_are_refused() -> None:
    row = record_rows([_record(1)])[0]
    older = row[:RECORD_FIELDS.index("server_prompt_tokens")]
    (r,) = records_from([older])
    assert r.server_prompt_tokens is None and r.output_hash == "o1"
    with pytest.raises(WireError):
        records_from([row[:3]])
    with pytest.raises(WireError):
        records_from([[*row, "extra"]])
    with pytest.raises(WireError):
        specs_from([["too", "short"]])
    with pytest.raises(WireError, match="without"):
        summary_from({"scheduled": 1}, None)
