"""`orch demo`: the quickstart plan on embedded defaults."""

from __future__ import annotations

from pathlib import Path

from orchestrator.cli.apps import app
from orchestrator.cli.output import say
from orchestrator.errors import UserError
from orchestrator.plan import load_plan_file, plan_hash, plan_warnings

QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart.yaml"


@app.command("demo")
def demo() -> None:
    """Run the quickstart plan (examples/quickstart.yaml) on embedded defaults."""
    if not QUICKSTART.exists():
        raise UserError(f"{QUICKSTART} not found: run `orch demo` from a checkout of the repository")
    plan = load_plan_file(QUICKSTART)
    say(f"plan {plan.name}: valid, sha256 {plan_hash(plan)}")
    for w in plan_warnings(plan):
        say(f"warning: {w}")
    say(
        "note: the experiment executor is not built yet, so `orch demo` only validates the "
        "quickstart plan; it will run it end to end once control lands."
    )
