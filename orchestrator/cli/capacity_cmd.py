"""`orch capacity` (history by comparable group) and `orch capacity plan` (sizing from history).

Imported by store_cmd (so `orch capacity` finds it). The store, pandas and the report are
imported inside the commands: every `orch` command may load this module.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from orchestrator.cli.apps import JSON_OPTION, WIDE_OPTION, app
from orchestrator.cli.output import emit_json, say, warn
from orchestrator.cli.tables import Column, print_table
from orchestrator.errors import UserError
from orchestrator.plan import (
    RATE_UNITS,
    SERVICE_CLASSES,
    canonical_gpu,
    kind_of_doc,
    load_plan_file,
)
from orchestrator.plan.signature import rate_unit_of_summary

if TYPE_CHECKING:
    import pandas as pd

capacity_app = typer.Typer(
    help="Capacity history by comparable group; `orch capacity plan` sizes a deployment from it.",
    invoke_without_command=True,
)
app.add_typer(capacity_app, name="capacity")

PRICES_ENV = "ORCH_GPU_PRICES"

# At 80 columns each table keeps what answers its question (the configuration, its capacity or
# cost, and what it was measured on); the rest leaves first (priority: higher leaves sooner).
HISTORY_COLUMNS = (
    Column("class", 0, fold=True, min_width=11), Column("limits ttft/tpot", 4), Column("model", 2, fold=True),
    Column("configuration", 0, fold=True, min_width=16), Column("workload", 1, fold=True, min_width=11),
    Column("source", 1, fold=True, min_width=9), Column("runs", 0, "right", fold=True, min_width=4),
    Column("median tok/s", 0, "right", fold=True, min_width=6), Column("median interval", 2, "right"),
    Column("p25-p75", 3, "right"),
    Column("spread", 5, "right"), Column("last measured", 3))
PARETO_COLUMNS = (
    Column("#", 0), Column("model", 2, fold=True), Column("workload", 1, fold=True, min_width=12),
    Column("source", 1, fold=True, min_width=9), Column("configuration", 0, fold=True, min_width=16),
    Column("rate", 0, "right"), Column("tok/s per user", 0, "right"), Column("TPOT p50 ms", 3, "right"),
    Column("tok/s per GPU", 0, "right"))
SIZING_COLUMNS = (
    Column("#", 0), Column("configuration", 0, fold=True, min_width=16), Column("source", 1, fold=True, min_width=9),
    Column("runs", 2, fold=True, min_width=4), Column("tok/s per copy (p25-p75)", 2, fold=True, min_width=8),
    Column("deploy", 0, fold=True, min_width=10), Column("GPUs", 1), Column("GPU-h/day", 3, fold=True, min_width=6),
    Column("USD/day (range)", 0, fold=True, min_width=8), Column("USD per 1M out tok", 2),
    Column("thin evidence", 2, fold=True, min_width=12))


def _cell(v: Any) -> Any:
    if hasattr(v, "isoformat"):
        return v.isoformat()
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if hasattr(v, "item"):
        return v.item()
    return v


def parse_range(option: str, text: str | None) -> tuple[float | None, float | None] | None:
    """``LO:HI``, ``LO:``, ``:HI`` or ``N`` (exactly N) -> (lo, hi); finite, non-negative."""
    if text is None:
        return None
    lo_s, sep, hi_s = text.partition(":")
    if not sep:
        hi_s = lo_s

    def num(s: str) -> float | None:
        if not s.strip():
            return None
        try:
            v = float(s)
        except ValueError:
            raise UserError(f"{option}: {text!r} is not LO:HI, LO:, :HI or a number") from None
        if not math.isfinite(v) or v < 0:
            raise UserError(f"{option}: {s!r} must be a finite number >= 0")
        return v

    lo, hi = num(lo_s), num(hi_s)
    if lo is not None and hi is not None and hi < lo:
        raise UserError(f"{option}: {text!r}: the upper end is below the lower")
    return lo, hi


def _signature_prefix(text: str | None) -> str | None:
    if text is None:
        return None
    s = text.strip().lower()
    if len(s) < 6 or any(c not in "0123456789abcdef" for c in s):
        raise UserError(f"--workload: {text!r}: give at least 6 hex digits of a workload signature "
                        "(`orch capacity` shows them)")
    return s


def _source(simulated: bool, measured: bool) -> bool | None:
    if simulated and measured:
        raise UserError("--simulated and --measured exclude each other (give neither for both)")
    return True if simulated else (False if measured else None)


@capacity_app.callback()
def capacity(
    ctx: typer.Context,
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
    engine_version: str | None = typer.Option(None, "--engine-version", help="vLLM version (registered)."),
    workload: str | None = typer.Option(None, "--workload", help="Workload signature (6+ hex digits of it)."),
    input_tokens: str | None = typer.Option(None, "--input-tokens",
                                            help="Mean prompt tokens of the workload: LO:HI, LO:, :HI or N."),
    output_tokens: str | None = typer.Option(None, "--output-tokens",
                                             help="Reply tokens of the workload: LO:HI, LO:, :HI or N."),
    simulated: bool = typer.Option(False, "--simulated", help="Only simulated capacities."),
    measured: bool = typer.Option(False, "--measured", help="Only measured capacities (no simulator)."),
    backend: str | None = typer.Option(None, "--backend", help="The plans' backend: sim, local, kubernetes, external."),
    observed_gpu: str | None = typer.Option(None, "--observed-gpu",
                                            help="Runs whose fingerprint saw this GPU product (substring)."),
    observed_engine: str | None = typer.Option(None, "--observed-engine",
                                               help="Runs whose fingerprint saw this engine version."),
    plot: Path | None = typer.Option(None, "--plot", help="Also draw into this PNG file: capacity over time per "
                                     "group, or with --pareto every stored point and the front per model and workload."),
    pareto: bool = typer.Option(False, "--pareto", help="Instead: the Pareto front of stored load points per model "
                                "and workload (throughput per GPU against per-user speed); --plot draws it."),
    wide: bool = WIDE_OPTION,
    slo_met: bool = typer.Option(False, "--slo-met", help="With --pareto: one front per class, of the points that "
                                 "met that class's SLO (attainment at least what the point's plan required)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Capacity over history (valid runs only), one row per comparable group: configuration,
    class and its limits, workload, backend, simulated or measured (never pooled)."""
    if ctx.invoked_subcommand is not None:
        return
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
        "workload": _signature_prefix(workload), "input_tokens": parse_range("--input-tokens", input_tokens),
        "output_tokens": parse_range("--output-tokens", output_tokens),
        "simulated": _source(simulated, measured), "backend": backend,
        "observed_gpu": observed_gpu, "observed_engine": observed_engine,
    }
    from orchestrator.store import Store

    if plot is not None and plot.suffix.lower() != ".png":
        raise UserError(f"--plot: {plot} must be a .png file")
    if slo_met and not pareto:
        raise UserError("--slo-met filters the Pareto front: give it with --pareto")
    if slo_met and plot is not None:
        raise UserError("--slo-met prints one front per class; --plot draws the unfiltered front: give one of them")
    if pareto:
        if any(filters[k] is not None for k in ("input_tokens", "output_tokens", "backend",
                                                "observed_gpu", "observed_engine")):
            raise UserError("--pareto takes the configuration filters, --since, --workload, "
                            "--simulated/--measured and --plot (not token ranges, --backend or --observed-*)")
        _print_pareto(filters, as_json, plot, wide, slo_met)
        return
    from orchestrator.report.capacity_history import capacity_history

    with Store.open() as store:
        frame = capacity_history(store, **filters)  # every valid run, censored ones too
        drawn = None
        if plot is not None and not frame.empty:
            from orchestrator.report.history import plot_capacity_history

            drawn = plot_capacity_history(store, frame, plot, since_days=since)
    if as_json:
        rows = [{k: _cell(v) for k, v in row.items()} for row in frame.to_dict(orient="records")]
        doc: dict[str, Any] = {"filters": {k: v for k, v in filters.items() if v is not None}, "rows": rows}
        if plot is not None:
            doc["plot"] = str(drawn.path.resolve()) if drawn else None
            doc["plotted_runs"] = drawn.runs if drawn else {}
        emit_json(doc)
        return
    if frame.empty:
        say("no valid runs match these filters" + ("; no plot drawn" if plot is not None else ""))
        return
    _print_table(frame, wide)
    if drawn is not None:
        say(f"capacity over time ({drawn.describe()}; dashed: each group's median of every run): "
            f"{drawn.path.resolve()}")


def _print_pareto(filters: dict[str, Any], as_json: bool, plot: Path | None = None, wide: bool = False,
                  slo_met: bool = False) -> None:
    from orchestrator.report.history import (
        pareto_front,
        pareto_front_per_class,
        points_runs,
        points_runs_text,
    )
    from orchestrator.store import Store

    keep = ("model", "gpu", "layout", "since_days", "kv_cache_dtype", "max_num_seqs", "tp", "router_policy",
            "engine_version", "workload", "simulated")
    chosen = {k: filters[k] for k in keep if filters.get(k) is not None}
    with Store.open() as store:
        points = store.load_points(**chosen)
        censored = store.censored_runs([int(r) for r in points["run_id"]]) if not points.empty else set()
        met = store.point_attainment(points["point_id"].tolist()) if slo_met else None
    front = pareto_front(points) if met is None else pareto_front_per_class(points, met)
    counts = points_runs(points, censored)
    drawn = None
    if plot is not None and not points.empty:
        from orchestrator.report.pareto import pareto_figure

        try:
            drawn = pareto_figure(points, plot)
        except OSError as e:
            raise UserError(f"--plot: cannot write {plot}: {e.strerror or e}") from None
    if drawn is not None and drawn.left_out:
        warn(f"{drawn.left_out} more model/workload group(s) not drawn (at most {len(drawn.panels)} panels): "
             "narrow with --model or --workload")
    if as_json:
        doc: dict[str, Any] = {"filters": chosen | ({"slo_met": True} if slo_met else {}), **counts,
                               "rows": [{**{k: _cell(v) for k, v in r.items()}, "run_censored": int(r["run_id"]) in censored}
                                        for r in front.to_dict("records")]}
        if plot is not None:
            doc["plot"] = str(drawn.path.resolve()) if drawn else None
            doc["plotted_points"] = drawn.points if drawn else 0
        emit_json(doc)
        return
    if front.empty:
        say(("no valid open-loop load point met a class's SLO under these filters" if slo_met else
             "no valid open-loop load points match these filters") + ("; no plot drawn" if plot is not None else ""))
        return
    title = ("Pareto front per class, of the points that met its SLO, per model and workload"
             if slo_met else "Pareto front per model and workload: no stored point is faster per user AND higher per GPU")
    columns = (PARETO_COLUMNS[0], *((Column("class", 0, fold=True, min_width=8),) if slo_met else ()), *PARETO_COLUMNS[1:])
    # "#": the number beside the point in the plot's panel of its model and workload
    group = [*(["class_name"] if slo_met else []), "model", "workload_sha256"]
    numbers = front.groupby(group, sort=False).cumcount() + 1
    rows: list[list[str] | None] = []
    previous = None
    for n, r in zip(numbers, front.to_dict("records"), strict=True):
        key = (r.get("class_name"), r["model"], r["workload_sha256"], r["simulated"])
        if previous is not None and key != previous:
            rows.append(None)
        previous = key
        rows.append([str(n), *((str(r["class_name"]),) if slo_met else ()), r["model"],
                     f"{r['workload']} [{str(r['workload_sha256'])[:8]}]",
                     "SIMULATED" if r["simulated"] else "measured", r["label"],
                     f"{r['offered_rate']:.3g} {rate_unit_of_summary(str(r['workload']))}",
                     f"{r['per_user_tok_s']:,.1f}", f"{r['tpot_p50_ms']:.2f}", f"{r['tok_s_per_gpu']:,.0f}"])
    print_table(title, columns, rows, wide=wide, console=_console())
    say(points_runs_text(counts))
    if drawn is not None:
        say(f"Pareto front: {drawn.points} point(s) ({drawn.simulated_points} simulated, hollow), "
            f"{len(drawn.front)} on the front, numbered: {drawn.path.resolve()}")


def _limits(r: Any) -> str:
    ttft, tpot = getattr(r, "ttft_ms", 0) or 0, getattr(r, "tpot_ms", 0) or 0
    return f"{ttft:g}/{tpot:g} ms" if ttft and tpot else "?"


def _console() -> Any:
    """Where tables go: stdout (fitted when it is a terminal, see tables.print_table)."""
    from rich.console import Console

    return Console(highlight=False)


def _print_table(frame: pd.DataFrame, wide: bool = False) -> None:
    """One line per comparable group, best first within a class (a rule between classes), fitted
    to the terminal (``tables.print_table``)."""
    import pandas as pd

    from orchestrator.report.capacity_history import (
        interval_cell,
        median_text,
        quartiles_cell,
        runs_text,
    )

    rows: list[list[str] | None] = []
    previous = None
    for r in frame.itertuples(index=False):
        cls = r[frame.columns.get_loc("class")]
        if previous is not None and cls != previous:
            rows.append(None)
        previous = cls
        spread = "-" if pd.isna(r.spread) else f"{r.spread:.1%}"
        wl = f"{r.workload} [{r.workload_sha256[:8]}]" if r.workload_sha256 else "unknown"
        source = ("SIMULATED" if r.simulated else "measured") + (f" ({r.backend})" if r.backend else "")
        row = r._asdict()
        rows.append([cls, _limits(r), r.model, r.label, wl, source, runs_text(row), median_text(row),
                     interval_cell(row), quartiles_cell(row), spread,
                     pd.Timestamp(r.last_measured).strftime("%Y-%m-%d")])
    print_table("capacity by configuration and workload (valid runs; goodput tok/s at >= 90% attainment; "
                "simulated and measured never pooled; median of every run, censored ones too, with its "
                "interval; quartiles of the points)", HISTORY_COLUMNS, rows, wide=wide, console=_console())


# -- orch capacity plan -----------------------------------------------------------------------


def load_prices(path: Path | None) -> tuple[dict[str, float], str]:
    """The GPU price table (USD per GPU-hour): the defaults, overridden by a YAML or JSON file of
    ``{GPU type: price}`` (``--prices``, else ORCH_GPU_PRICES). Returns it and where it is from."""
    from orchestrator.report.history import DEFAULT_GPU_PRICES, PRICE_SOURCE

    prices = dict(DEFAULT_GPU_PRICES)
    if path is None and os.environ.get(PRICES_ENV):
        path = Path(os.environ[PRICES_ENV])
    if path is None:
        return prices, f"default prices: {PRICE_SOURCE}"
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"--prices: cannot read {path}: {e}") from None
    try:
        doc = yaml.safe_load(text) if len(text) < 100_000 else None
    except yaml.YAMLError as e:
        raise UserError(f"--prices: {path} is not YAML/JSON: {str(e).splitlines()[0]}") from None
    if not isinstance(doc, dict) or not doc:
        raise UserError(f"--prices: {path} must map GPU types to USD per GPU-hour, e.g. `H200: 3.5`")
    for name, value in doc.items():
        try:
            gpu_name = canonical_gpu(str(name))
        except ValueError as e:
            raise UserError(f"--prices: {path}: {e}") from None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise UserError(f"--prices: {path}: {name}: {value!r} is not a finite price >= 0")
        prices[gpu_name] = float(value)
    return prices, f"prices from {path} (defaults for GPUs it does not list)"


@capacity_app.command("plan")
def capacity_plan(
    rate: float = typer.Option(..., "--rate", help="Target load, requests/s (sessions/s for a live-sessions workload)."),
    service_class: str = typer.Option(..., "--class", help="Service class to serve it at."),
    model: str | None = typer.Option(None, "--model", help="Model name (default: the plan file's)."),
    plan_file: Path | None = typer.Option(None, "--plan", help="Take the workload (and classes, model) from this plan file."),
    workload: str | None = typer.Option(None, "--workload", help="A stored workload signature (6+ hex digits)."),
    simulated: bool = typer.Option(False, "--simulated", help="Also rank the simulator's predictions (marked)."),
    engine_version: str | None = typer.Option(None, "--engine-version",
                                              help="The engine version you will run (default: the newest in history)."),
    headroom: float = typer.Option(0.0, "--headroom", min=0, max=10, help="Extra load to size for, e.g. 0.2 = 20%."),
    prices_file: Path | None = typer.Option(None, "--prices", help=f"YAML/JSON {{GPU: USD per GPU-hour}} (or ${PRICES_ENV})."),
    top: int = typer.Option(10, "--top", min=1, max=1000, help="Show this many configurations."),
    write_plan: Path | None = typer.Option(None, "--write-plan", help="Write the plan of the experiment that would settle it here."),
    backend: str = typer.Option("kubernetes", "--backend", help="Backend of the written plan."),
    wide: bool = WIDE_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Rank the configurations history says can serve RATE requests/s of a workload at a class:
    copies (replicas or P/D counts) needed, GPUs, GPU-hours and cost per day, cost per million
    output tokens, the range from the runs' spread, and where the evidence is thin."""
    if not math.isfinite(rate) or rate <= 0 or rate > 1e6:
        raise UserError(f"--rate: {rate} must be a finite number of requests/s in (0, 1000000]")
    if (plan_file is None) == (workload is None):
        raise UserError("give the workload as exactly one of --plan FILE or --workload SIGNATURE")
    prices, price_note = load_prices(prices_file)
    limits: tuple[float, float] | None = None
    if plan_file is not None:
        from orchestrator.plan.signature import workload_signature

        plan = load_plan_file(plan_file)
        sig = workload_signature(plan.workload)
        model = model or plan.model.name
        try:
            cls = plan.service_class(service_class)
        except KeyError:
            raise UserError(f"--class: {service_class!r} is not a class of {plan_file} "
                            f"({', '.join(c.name for c in plan.classes)})") from None
        limits = (cls.ttft_ms, cls.tpot_ms)
        sig_sha, sig_summary, out_tokens = sig.sha256, sig.summary, sig.output_tokens
        workload_doc = sig.doc
    elif service_class in SERVICE_CLASSES:
        c = SERVICE_CLASSES[service_class]
        limits = (c.ttft_ms, c.tpot_ms)
    if model is None:
        raise UserError("--model: give the model (or a --plan file that names it)")
    from orchestrator.store import Store

    with Store.open() as store:
        if workload is not None:
            found = store.workload_signatures(_signature_prefix(workload))
            if not found:
                raise UserError(f"--workload: no stored workload signature starts with {workload!r}")
            if len(found) > 1:
                raise UserError(f"--workload: {workload!r} matches {len(found)} signatures; give more digits")
            sig_sha, sig_summary, out_tokens = found[0]["sha256"], found[0]["summary"], found[0]["output_tokens"]
            workload_doc = found[0]["doc"]
        if not out_tokens:
            raise UserError(f"workload {sig_sha[:12]} has no fixed reply length: cannot turn a rate into tokens")
        # live sessions: the rate (as the search's) is sessions/s, each of `turns` requests
        prompts: dict[str, Any] = workload_doc.get("prompts") or {}
        wkind = kind_of_doc(workload_doc)
        per_unit = float(prompts.get("turns") or 1) if wkind == "sessions" else 1.0
        unit = RATE_UNITS[wkind]
        out_tokens = float(out_tokens) * per_unit
        filters: dict[str, Any] = {"model": model, "service_class": service_class, "workload": sig_sha}
        if limits is not None:
            filters.update(ttft_ms=limits[0], tpot_ms=limits[1])
        if not simulated:
            filters["simulated"] = False
        from orchestrator.report.capacity_history import capacity_history

        frame = capacity_history(store, **filters)  # every valid run, censored ones too
        frame = frame[frame["layout"] != "external"] if not frame.empty else frame
        details = store.config_details([int(i) for i in frame["config_id"]]) if not frame.empty else {}
        others = store.capacity_runs(model=model, service_class=service_class)[0] if frame.empty else None
    from orchestrator.report.history import size_configurations

    ranked = size_configurations(frame, details, rate=rate, output_tokens=float(out_tokens), prices=prices,
                                 headroom=headroom, engine_version=engine_version)
    shown = ranked.head(top)
    thin_reasons = _thin_overall(ranked)
    written = None
    if write_plan is not None:
        written = _write_settle_plan(write_plan, model, service_class, limits, sig_sha, workload_doc, ranked,
                                     details, backend, rate, float(out_tokens))
    if as_json:
        emit_json({
            "model": model, "class": service_class, "limits_ms": list(limits) if limits else None,
            "workload": {"sha256": sig_sha, "summary": sig_summary, "output_tokens": out_tokens},
            "rate": rate, "rate_unit": unit, "headroom": headroom, "output_tok_s": rate * out_tokens * (1 + headroom),
            "prices": prices, "price_source": price_note,
            "rows": [{k: _cell(v) for k, v in row.items()} for row in shown.to_dict(orient="records")],
            "thin_evidence": thin_reasons, "plan_written": str(written) if written else None,
        })
        return
    say(f"serve {rate:g} {unit} of {model} at {service_class}"
        + (f" ({limits[0]:g}/{limits[1]:g} ms)" if limits else "")
        + f"; workload {sig_summary} [{sig_sha[:8]}]: {rate * out_tokens * (1 + headroom):,.0f} output tok/s"
        + (f" with {headroom:.0%} headroom" if headroom else ""))
    if ranked.empty:
        say("no valid " + ("" if simulated else "measured ") + "history for this model, class and workload")
        if others is not None and not others.empty:
            say(f"history holds {others['workload_sha256'].nunique()} other workload(s) of {model} at "
                f"{service_class}: `orch capacity --model {model} --class {service_class}` lists them")
    else:
        _print_sizing(shown, wide)
        say(price_note)
        say("copies scale the measured deployment linearly behind a router (an assumption); "
            "the median counts every valid run (censored ones too); the range is from the points' quartiles, "
            "widened to the median")
    if thin_reasons:
        say("evidence is thin: " + "; ".join(thin_reasons))
        if write_plan is None and not ranked.empty:
            say("--write-plan FILE writes the plan of the experiment that would settle it")
    if written is not None:
        say(f"the experiment that would settle it (the top two, back to back): {written} "
            "(`orch plan simulate` / `orch run` it)")


def _thin_overall(ranked: pd.DataFrame) -> list[str]:
    if ranked.empty:
        return ["no history for this model, class and workload"]
    best = ranked.iloc[0]
    out = [f"the best ({best['label']}): {', '.join(best['thin'])}"] if best["thin"] else []
    if len(ranked) > 1 and ranked.iloc[1]["cost_day"] is not None and best["cost_day"] is not None:
        second = ranked.iloc[1]
        if second["cost_day_low"] is not None and best["cost_day_high"] is not None \
                and second["cost_day_low"] < best["cost_day_high"]:
            out.append(f"ranks 1 and 2 overlap within their runs' spread ({best['label']} vs {second['label']})")
    return out


def _write_settle_plan(path: Path, model: str, service_class: str, limits: tuple[float, float] | None, sig: str,
                       workload_doc: dict[str, Any], ranked: pd.DataFrame, details: dict[int, dict[str, Any]],
                       backend: str, rate: float, out_tokens: float) -> Path | None:
    import yaml

    from orchestrator.errors import PlanError
    from orchestrator.plan import validate_plan
    from orchestrator.report.history import settle_plan

    arms, model_doc = [], None
    for cid in list(dict.fromkeys(int(c) for c in ranked["config_id"]))[:2]:  # distinct configurations
        cfg = details[int(cid)]["config"]
        arm = dict(cfg["arm"])
        if cfg.get("router") is not None:
            arm["router"] = cfg["router"]
        arms.append(arm)
        model_doc = model_doc or cfg.get("model")
    if not arms:
        warn("no configuration in history to compare: no plan written (write one with this workload by hand)")
        return None
    cls = {"name": service_class, "ttft_ms": limits[0], "tpot_ms": limits[1]} if limits else None
    if cls is None:
        warn(f"the limits of class {service_class!r} are unknown here (give --plan): no plan written")
        return None
    best = ranked.iloc[0]
    data = settle_plan(f"settle-{model}-{service_class}-{sig[:8]}", model_doc or model, arms, workload_doc, cls,
                       rate_at_capacity=float(best["median"]) / out_tokens, backend=backend)
    try:
        validate_plan(data)
    except PlanError as e:
        warn(f"the settling plan does not validate ({e}); not written")
        return None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    except OSError as e:
        raise UserError(f"--write-plan: cannot write {path}: {e}") from None
    return path


def _print_sizing(frame: pd.DataFrame, wide: bool = False) -> None:
    from orchestrator.report.capacity_history import median_text, runs_text

    rows: list[list[str] | None] = []
    for r in frame.to_dict(orient="records"):
        cost = "no price" if r["cost_day"] is None else (
            f"{r['cost_day']:,.0f} ({r['cost_day_low']:,.0f}-{r['cost_day_high']:,.0f})")
        per_m = "-" if r["usd_per_m_output_tokens"] is None else f"{r['usd_per_m_output_tokens']:.2f}"
        rows.append([
            str(r["rank"]), r["label"], "SIMULATED" if r["simulated"] else "measured", runs_text(r),
            f"{median_text(r)} ({r['p25']:,.0f}-{r['p75']:,.0f})",
            f"{r['copies']}x = {r['shape']}" + (f" ({r['copies_low']}-{r['copies_high']}x)"
                                              if r["copies_low"] != r["copies_high"] else ""),
            str(r["gpus"]), f"{r['gpu_hours_day']:,.0f}", cost, per_m, "; ".join(r["thin"]) or "-",
        ])
    print_table("configurations that can serve it, cheapest first", SIZING_COLUMNS, rows, wide=wide, console=_console())
