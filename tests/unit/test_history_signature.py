"""The workload signature (plan/signature.py): the hash covers the whole effective workload, the
summary reads as people write it, and unknown shapes never raise."""

from __future__ import annotations

import hashlib
import json

from orchestrator.plan import Workload
from orchestrator.plan.signature import signature_of_doc, summary_values, workload_signature


def _workload(**changes: object) -> Workload:
    doc: dict[str, object] = {"prompts": {"input_tokens": {"mean": 3000, "dist": "lognormal", "sigma": 0.3},
                                          "shared_prefix": 0.2}, "output_tokens": 64}
    doc.update(changes)
    return Workload.model_validate(doc)


def test_hash_is_the_sha256_of_the_whole_effective_dump() -> None:
    w = _workload()
    sig = workload_signature(w)
    dump = w.model_dump(mode="json", by_alias=True)
    assert sig.doc == dump and "api" in dump  # defaults are part of it (every effective value)

    def strip(v: object) -> object:  # null keys (optional sections and values) left out, at every depth
        return {k: strip(x) for k, x in v.items() if x is not None} if isinstance(v, dict) else v

    hashed = strip(dump)
    canonical = json.dumps(hashed, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert sig.sha256 == hashlib.sha256(canonical.encode()).hexdigest()
    assert workload_signature(_workload(api="chat")).sha256 != sig.sha256  # any field, not only lengths
    assert workload_signature(_workload(arrival={"process": "poisson"})).sha256 == sig.sha256  # the default, written


def test_an_optional_field_added_later_keeps_old_signatures() -> None:
    """A registration stored before an optional field (default None) existed hashes as today's
    dump of the same workload (the migration back-fills from stored JSON, runs key by today's)."""
    dump = _workload().model_dump(mode="json", by_alias=True)
    optional = [k for k, v in dump.items() if v is None]
    older = {k: v for k, v in dump.items() if k not in optional}
    assert signature_of_doc(older).sha256 == workload_signature(_workload()).sha256
    assert signature_of_doc({**dump, "future_field": {"on": True}}).sha256 != signature_of_doc(dump).sha256


def test_summary_reads_like_the_issue_example() -> None:
    assert workload_signature(_workload()).summary == "in 3000±900 / out 64 / prefix 0.2 / poisson"
    closed = _workload(closed={"users": 32}, prompts={"input_tokens": {"mean": 500}, "turns": 4})
    assert workload_signature(closed).summary == "in 500 / out 64 / 4 turns / closed(32 users)"
    bursty = _workload(arrival={"process": "gamma", "burstiness": 0.5})
    assert workload_signature(bursty).summary.endswith("/ gamma(0.5)")
    varied = signature_of_doc({**_workload().model_dump(mode="json"), "output_dist": {"mean": 64, "dist": "lognormal", "sigma": 0.5},
                               "sessions": {"think": {"mean_s": 2}}, "source": {"kind": "trace", "path": "a/b.jsonl"}})
    assert varied.summary == "trace b.jsonl / in 3000±900 / out 64±32 / prefix 0.2 / poisson sessions"


def test_an_unknown_workload_shape_gets_no_values_and_no_error() -> None:
    sig = signature_of_doc({"kind": "trace", "file": "x.jsonl"})
    assert (sig.summary, sig.input_mean, sig.output_tokens) == ("trace / poisson", None, None)
    assert summary_values({})["summary"] == "poisson"
