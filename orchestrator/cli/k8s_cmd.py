"""`orch k8s render FILE --arm A --out DIR`: the objects an arm would apply, as YAML files."""

from __future__ import annotations

from pathlib import Path

import typer

from orchestrator.backends.base import RunKey
from orchestrator.backends.kubernetes.render import render_arm, write_objects
from orchestrator.cli.apps import JSON_OPTION, k8s_app
from orchestrator.cli.output import emit_json, say
from orchestrator.errors import UserError
from orchestrator.plan import load_plan_file


@k8s_app.command("render")
def render(
    file: Path = typer.Argument(..., help="Plan file (YAML)."),
    arm: str = typer.Option(..., "--arm", help="Arm to render (A, B, ...)."),
    out: Path = typer.Option(..., "--out", help="Folder to write the YAML files into."),
    block: int = typer.Option(0, "--block", min=0, help="Block number the run would have."),
    attempt: int = typer.Option(0, "--attempt", min=0, help="Attempt number the run would have."),
    namespace: str | None = typer.Option(
        None, "--namespace", help="Namespace to render into (default: the plan's, else orch-<experiment>)."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Write one YAML file per object, in apply order (01-namespace-..., 02-configmap-...)."""
    plan = load_plan_file(file)
    name = arm.upper()
    if name not in plan.arms:
        raise UserError(f"--arm: no arm {arm!r} in {file}; arms are {', '.join(plan.arms)}")
    objs = render_arm(plan, name, RunKey(plan.name, name, block, attempt), namespace=namespace)
    try:
        paths = write_objects(objs, out)
    except OSError as e:
        raise UserError(f"--out: cannot write to {out}: {e.strerror or e}") from e
    if as_json:
        emit_json({"arm": name, "out": str(out), "files": [str(p) for p in paths]})
        return
    for p in paths:
        say(str(p))
