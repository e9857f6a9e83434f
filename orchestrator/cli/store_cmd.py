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
    layout: str | None = typer.Option(None, "--layout", help="colocated, disaggregated, or external "
                                      "(external arms without a layout label)."),
    service_class: str | None = typer.Option(None, "--class", help="Service class, e.g. interactive."),
    since: float | None = typer.Option(None, "--since", min=0, max=36500,
                                        help="Only runs of the last DAYS days (at most 36500)."),
    kv_cache_dtype: str | None = typer.Option(None, "--kv-cache-dtype", help="auto or fp8."),
    max_num_seqs: int | None = typer.Option(None, "--max-num-seqs", help="Engine max_num_seqs."),
    tp: int | None = typer.Option(None, "--tp", help="Tensor-parallel size (decode TP if disaggregated)."),
    router: str | None = typer.Option(None, "--router", help="Router policy."),
    engine_version: str | None = typer.Option(None, "--engine-version", help="vLLM version."),
    plot: Path | None = typer.Option(None, "--plot", help="Also draw capacity over time per configuration into this PNG file."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Capacity by configuration over history (valid runs only): runs, median, spread, last measured."""
    if layout is not None and layout not in ("colocated", "disaggregated", "external"):
        raise UserError(f"--layout: {layout!r} is not colocated, disaggregated or external")
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

    if plot is not None and plot.suffix.lower() != ".png":
        raise UserError(f"--plot: {plot} must be a .png file")
    with Store.open() as store:
        frame = store.capacity_by_config(**filters)
        drawn = None
        if plot is not None and not frame.empty:
            from orchestrator.report.history import plot_capacity_history

            drawn = plot_capacity_history(store, frame, plot, since_days=since)
    if as_json:
        rows = [{k: _cell(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]
        doc: dict[str, Any] = {"filters": {k: v for k, v in filters.items() if v is not None}, "rows": rows}
        if plot is not None:
            doc["plot"] = str(drawn.resolve()) if drawn else None
        emit_json(doc)
        return
    if frame.empty:
        say("no valid runs match these filters" + ("; no plot drawn" if plot is not None else ""))
        return
    _print_table(frame)
    if drawn is not None:
        say(f"capacity over time: {drawn.resolve()}")


def _print_table(frame: pd.DataFrame) -> None:
    """A rich table: one line per configuration and class, best first within a class. Piped
    output (not a terminal) gets a wide console, so long configuration labels do not wrap."""
    import pandas as pd
    from rich.console import Console, JustifyMethod
    from rich.table import Table

    table = Table(title="capacity by configuration (valid runs; goodput tok/s at >= 90% attainment)",
                  title_justify="left", header_style="bold")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("class", "left"), ("model", "left"), ("configuration", "left"), ("runs", "right"),
        ("median tok/s", "right"), ("p25-p75", "right"), ("spread", "right"), ("last measured", "left"))
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=name != "configuration")
    previous = None
    for r in frame.itertuples(index=False):
        cls = r[frame.columns.get_loc("class")]
        if previous is not None and cls != previous:
            table.add_section()
        previous = cls
        spread = "-" if pd.isna(r.spread) else f"{r.spread:.1%}"
        table.add_row(
            cls, r.model, r.label, str(r.runs), f"{r.median:,.0f}", f"{r.p25:,.0f}-{r.p75:,.0f}",
            spread, pd.Timestamp(r.last_measured).strftime("%Y-%m-%d"),
        )
    console = Console()
    if not console.is_terminal:
        console = Console(width=200, highlight=False)
    console.print(table)
