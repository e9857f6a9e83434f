"""`orch plan validate | schema`."""

from __future__ import annotations

from pathlib import Path

import typer

from orchestrator.cli.apps import JSON_OPTION, plan_app
from orchestrator.cli.output import emit_json, say, warn
from orchestrator.errors import PlanError, UserError
from orchestrator.plan import json_schema, load_plan_file, plan_hash, plan_warnings


@plan_app.command("validate")
def validate(
    files: list[Path] = typer.Argument(..., help="Plan files (YAML)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Check plans: every problem is named by its field path (and line); exit 1 if any."""
    results = []
    problems: list[str] = []
    from orchestrator.control.design import carryover_warnings, design_warnings
    from orchestrator.plan.experiment import ARM_NAMES
    from orchestrator.plan.sweep import arm_names, describe

    for f in files:
        try:
            plan = load_plan_file(f)
        except PlanError as e:
            lines = [f"{f}: {p}" for p in e.problems] if len(files) > 1 else list(e.problems)
            problems.extend(lines)
            results.append({"file": str(f), "valid": False, "problems": list(e.problems)})
            continue
        warnings = (plan_warnings(plan) + design_warnings(plan.design, tuple(plan.arms), plan.per_block)
                    + carryover_warnings(plan))
        names = {} if plan.sweep is None else arm_names(plan.sweep, ARM_NAMES)
        swept = {} if plan.sweep is None else {"sweep": {"design": describe(plan.sweep), "arms": names}}
        results.append(
            {"file": str(f), "valid": True, "name": plan.name, "sha256": plan_hash(plan), "warnings": warnings}
            | swept
        )
        if not as_json:
            for w in warnings:
                warn(w)
            say(f"{f}: valid ({plan.name}, sha256 {plan_hash(plan)[:16]})")
            if plan.sweep is not None:  # the letters a bar compares
                say(f"  sweep: {describe(plan.sweep)}: " + ", ".join(f"{k} {n}" for k, n in names.items()))
    if as_json:
        emit_json({"plans": results})
    if problems:
        raise UserError(f"{len(problems)} problem(s)", problems if not as_json else [])


@plan_app.command("schema")
def schema() -> None:
    """Print the JSON Schema of the plan language."""
    emit_json(json_schema())
