"""`orch plan register FILE` (and, through capacity_cmd, `orch capacity`): write a registration, read history.

The store (SQLAlchemy, Alembic, pandas) is imported inside the commands: every `orch` command
loads this module, and most of them never touch the database.
"""

from __future__ import annotations

from pathlib import Path

import typer

from orchestrator.cli.apps import JSON_OPTION, plan_app
from orchestrator.cli.output import emit_json, say
from orchestrator.plan import load_plan_file


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


# `orch capacity` and `orch capacity plan` live in their own module; importing it registers them.
from orchestrator.cli import capacity_cmd  # noqa: E402, F401
