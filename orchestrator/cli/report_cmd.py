"""`orch report EXPERIMENT --out DIR` and `orch export EXPERIMENT --format F --out DIR`.

The report package (pandas, matplotlib) and the store are imported inside the commands: every
`orch` invocation may load this module, and most never draw a figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import typer

from orchestrator.cli.apps import JSON_OPTION, app
from orchestrator.cli.output import emit_json, say
from orchestrator.errors import UserError

EXPORT_FORMATS = ("parquet", "csv", "llmd")


@app.command("report")
def report(
    experiment: str = typer.Argument(..., help="Experiment name or id (`orch status` lists them)."),
    out: Path = typer.Option(..., "--out", help="Directory for index.html and its figures."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Write a self-contained HTML report (index.html + PNG figures): verdicts, curves, guards."""
    from orchestrator.report import render_report
    from orchestrator.report.writer import figure_paths
    from orchestrator.store import Store

    with Store.open() as store:
        written = render_report(store, experiment, out)
    if as_json:
        emit_json({"index": str(written.index.resolve()),
                   "figures": [str((written.index.parent / p).resolve()) for p in figure_paths(written.images)],
                   **written.document})
        return
    doc = written.document
    for v in doc["verdicts"]:
        say(f"{v['bar']}: {v['verdict']}")
    invalid = sum(1 for r in doc["runs"] if not r["valid"])
    say(f"{len(doc['runs'])} run(s), {invalid} invalid; report written to {written.index.resolve()}")


@app.command("export")
def export(
    experiment: str = typer.Argument(..., help="Experiment name or id."),
    fmt: str = typer.Option("parquet", "--format", help="parquet | csv (points and request records) "
                            "| llmd (llm-d-benchmark report v0.2, one per load point)."),
    out: Path = typer.Option(..., "--out", help="Directory to write into."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Export an experiment's points and request records (parquet, CSV) or llm-d-benchmark reports."""
    if fmt not in EXPORT_FORMATS:
        raise UserError(f"--format: {fmt!r} is not one of {', '.join(EXPORT_FORMATS)}")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out: {out} exists and is not a directory")
    from orchestrator.report.data import load_experiment
    from orchestrator.store import Store

    with Store.open() as store:
        data = load_experiment(store, experiment)
        if fmt == "llmd":
            from orchestrator.report.llmd import export_llmd

            files: dict[str, str | list[str]] = {"reports": [str(p) for p in export_llmd(data, out)]}
            counts = {"reports": len(files["reports"])}
        else:
            from orchestrator.report.export import TableFormat, write_tables

            # The rest of EXPORT_FORMATS (checked above); write_tables checks again.
            written = write_tables(data, out, cast(TableFormat, fmt))
            files = {k: str(path) for k, (path, _) in written.items()}
            counts = {k: n for k, (_, n) in written.items()}
    if as_json:
        emit_json({"experiment": data.experiment.name, "format": fmt, "files": files, "rows": counts})
        return
    for name, n in counts.items():
        say(f"{name}: {n}")
    say(f"written to {out.resolve()}")
