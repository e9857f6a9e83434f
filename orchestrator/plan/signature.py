"""A workload's signature: what makes two capacities comparable on the traffic side (DESIGN
section 7: "capacities are comparable only under the same ... workload signature").

The signature is the sha256 of the workload's **whole effective model dump** (every field with
its default filled in, sorted keys, no whitespace; keys whose value is null left out), so a
field added to the workload language later is covered without touching this module, and an
optional one (default None) does not change the signature of workloads that do not use it. Beside it, a few readable values for people and
for range filters (``orch capacity --input-tokens 2000:4000``), read from the dump defensively:
a workload kind without prompts or a fixed reply length gets ``None`` there, never an error.

Pure: no I/O, no database. Migration 0007 keeps a frozen copy of ``summary_values`` (a
revision must keep meaning what it meant when it was released).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import Field

from orchestrator.plan.base import StrictModel
from orchestrator.plan.workload import Workload, kind_of_doc


class WorkloadSignature(StrictModel):
    """A workload's hash and the readable values shown beside it."""

    sha256: str = Field(description="sha256 of the workload's canonical effective JSON.")
    summary: str = Field(description='Readable, e.g. "in 3000±900 / out 64 / prefix 0.2 / poisson".')
    input_mean: float | None = Field(default=None, description="Mean first-turn prompt tokens.")
    input_sd: float | None = Field(default=None, description="Approximate spread of prompt tokens (±).")
    output_tokens: float | None = Field(default=None, description="Reply tokens per request.")
    shared_prefix: float | None = Field(default=None, description="Share of prompt tokens common to all.")
    arrival: str = Field(default="", description="poisson, gamma(0.5), constant, closed(32 users), ...")
    doc: dict[str, Any] = Field(description="The effective workload, as hashed.")

    @property
    def short(self) -> str:
        """The first 12 hex digits (what `orch capacity --workload` accepts, and more)."""
        return self.sha256[:12]


def _without_nulls(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _without_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_without_nulls(x) for x in v]
    return v


def canonical_workload(doc: dict[str, Any]) -> str:
    """The canonical JSON hashed: sorted keys, no whitespace, UTF-8 as is, and no key whose value
    is null (an optional section left out): so a workload registered before an optional field
    (default None) was added to the language keeps its signature after it."""
    return json.dumps(_without_nulls(doc), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _dict(v: Any) -> dict[str, Any]:
    return v if isinstance(v, dict) else {}


def _g(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def summary_values(doc: dict[str, Any]) -> dict[str, Any]:
    """The readable values of a workload dump (a plain dict, as stored in a registration)."""
    prompts = _dict(doc.get("prompts"))
    inp = _dict(prompts.get("input_tokens"))
    mean = _num(inp.get("mean"))
    sigma = _num(inp.get("sigma")) or 0.0
    dist = inp.get("dist", "fixed")
    sd: float | None = None
    if mean is not None:
        sd = {"lognormal": mean * sigma, "uniform": mean * sigma, "normal": sigma}.get(str(dist), 0.0)
    out = _num(doc.get("output_tokens"))
    prefix = _num(prompts.get("shared_prefix"))
    turns = _num(prompts.get("turns"))
    wkind = kind_of_doc(doc)
    arrival_doc = _dict(doc.get("arrival"))
    if wkind == "closed":
        arrival = f"closed({_dict(doc.get('closed')).get('users')} users)"
    else:
        arrival = str(arrival_doc.get("process", "poisson"))
        burst = _num(arrival_doc.get("burstiness"))
        if arrival == "gamma" and burst is not None:
            arrival = f"gamma({_g(burst)})"
    parts = []
    if mean is not None:
        parts.append(f"in {_g(mean)}" + (f"±{_g(sd)}" if sd else ""))
    if out is not None:
        odist = _dict(doc.get("output_dist"))
        osd = {"lognormal": out * (_num(odist.get("sigma")) or 0.0), "uniform": out * (_num(odist.get("sigma")) or 0.0),
               "normal": _num(odist.get("sigma")) or 0.0}.get(str(odist.get("dist", "fixed")), 0.0)
        parts.append(f"out {_g(out)}" + (f"±{_g(osd)}" if osd else ""))
    if prefix:
        parts.append(f"prefix {_g(prefix)}")
    if turns and turns > 1:
        parts.append(f"{_g(turns)} turns")
    parts.append(arrival + (" sessions" if wkind == "sessions" else ""))
    kind = doc.get("kind")
    if isinstance(kind, str) and kind:
        parts.insert(0, kind)
    source = _dict(doc.get("source"))
    if source:
        tag = str(source.get("sha256") or "")[:8] or str(source.get("path", "")).rsplit("/", 1)[-1]
        parts.insert(0, f"{source.get('kind', 'data')} {tag}".strip())
    return {"summary": " / ".join(parts)[:200], "input_mean": mean, "input_sd": sd, "output_tokens": out,
            "shared_prefix": prefix, "arrival": arrival[:40]}


def rate_unit_of_summary(summary: str) -> str:
    """What a stored point's rate counts, from its workload's summary (``summary_values``: a
    live-sessions workload's arrival part ends in " sessions")."""
    return "sessions/s" if any(p.endswith(" sessions") for p in summary.split(" / ")) else "req/s"


def signature_of_doc(doc: dict[str, Any]) -> WorkloadSignature:
    """The signature of a workload dump (as ``Workload.model_dump(mode="json", by_alias=True)`` gives it,
    and as a registration's canonical JSON holds it)."""
    sha = hashlib.sha256(canonical_workload(doc).encode()).hexdigest()
    return WorkloadSignature(sha256=sha, doc=doc, **summary_values(doc))


def workload_signature(workload: Workload) -> WorkloadSignature:
    """The signature of a workload: its whole effective dump, hashed."""
    return signature_of_doc(workload.model_dump(mode="json", by_alias=True))
