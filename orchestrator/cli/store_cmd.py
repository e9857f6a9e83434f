"""`orch plan register FILE` and `orch capacity`: write a registration, read history.

The store (SQLAlchemy, Alembic, pandas) is imported inside the commands: every `orch` command
loads this module, and most of them never touch the database.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from orchestrator.cli.apps import JSON_OPTION, app, plan_app
from orchestrator.cli.output import emit_json, say
from orchestrator.errors import UserError
from orchestrator.plan import canonical_gpu, load_plan_file

if TYPE_CHECKING:
    import pandas as pd


@plan_app.command("register")
def register(
    file: Path = typer.Argument(..., help="Plan file (YAML)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Store a plan before its first run; prints its id and sha256 (the same plan: the same id)."""
    from orchestrator.store import Store

    plan = load_plan_file(file)
    with Store.open() as store:
        reg = store.register_plan(plan)
    if as_json:
        emit_json({
            "id": reg.id, "sha256": reg.sha256, "name": reg.name,
            "registered_at": reg.registered_at.isoformat(), "created": reg.created,
        })
        return
    state = "registered" if reg.created else "already registered"
    say(f"{plan.name}: {state} as id {reg.id}, sha256 {reg.sha256} ({reg.registered_at:%Y-%m-%d %H:%M} UTC)")


def _cell(v: Any) -> Any:
    if hasattr(v, "isoformat"):
        return v.isoformat()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if hasattr(v, "item"):
        return v.item()
    return v


@app.command("capacity")
def capacity(
    model: str | None = typer.Option(None, "--model", help="Model name, e.g. qwen3-8b."),
    gpu: str | None = typer.Option(None, "--gpu", help="GPU type (H100-PCIe, H100-SXM/H100, H200)."),
    layout: str | None = typer.Option(None, "--layout", help="colocated or disaggregated."),
    service_class: str | None = typer.Option(None, "--class", help="Service class, e.g. interactive."),
    since: float | None = typer.Option(None, "--since", min=0, help="Only runs of the last DAYS days."),
    kv_cache_dtype: str | None = typer.Option(None, "--kv-cache-dtype", help="auto or fp8."),
    max_num_seqs: int | None = typer.Option(None, "--max-num-seqs", help="Engine max_num_seqs."),
    tp: int | None = typer.Option(None, "--tp", help="Tensor-parallel size (decode TP if disaggregated)."),
    router: str | None = typer.Option(None, "--router", help="Router policy."),
    engine_version: str | None = typer.Option(None, "--engine-version", help="vLLM version."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Capacity by configuration over history (valid runs only): runs, median, spread, last measured."""
    if layout is not None and layout not in ("colocated", "disaggregated"):
        raise UserError(f"--layout: {layout!r} is not colocated or disaggregated")
    if gpu is not None:
        try:
            gpu = canonical_gpu(gpu)
        except ValueError as e:
            raise UserError(f"--gpu: {e}") from None
    filters = {
        "model": model, "gpu": gpu, "layout": layout, "service_class": service_class,
        "since_days": since, "kv_cache_dtype": kv_cache_dtype, "max_num_seqs": max_num_seqs,
        "tp": tp, "router_policy": router, "engine_version": engine_version,
    }
    from orchestrator.store import Store

    with Store.open() as store:
        frame = store.capacity_by_config(**filters)
    if as_json:
        rows = [{k: _cell(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]
        emit_json({"filters": {k: v for k, v in filters.items() if v is not None}, "rows": rows})
        return
    if frame.empty:
        say("no valid runs match these filters")
        return
    say(_table(frame))


def _table(frame: pd.DataFrame) -> str:
    """Fixed-width table: one line per configuration and class, best first within a class."""
    import pandas as pd

    header = ("class", "model", "configuration", "runs", "median tok/s", "p25-p75", "spread", "last measured")
    lines = []
    for r in frame.itertuples(index=False):
        spread = "-" if pd.isna(r.spread) else f"{r.spread:.1%}"
        lines.append((
            r[frame.columns.get_loc("class")], r.model, r.label, str(r.runs), f"{r.median:,.0f}",
            f"{r.p25:,.0f}-{r.p75:,.0f}", spread, pd.Timestamp(r.last_measured).strftime("%Y-%m-%d"),
        ))
    widths = [max(len(h), *(len(line[i]) for line in lines)) for i, h in enumerate(header)]
    right = {3, 4, 5, 6}

    def fmt(cells: tuple[str, ...]) -> str:
        padded = (c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True)))
        return "  ".join(padded).rstrip()

    return "\n".join([fmt(header), fmt(tuple("-" * w for w in widths)), *(fmt(line) for line in lines)])
