"""The Typer apps every command module attaches to (so modules never import each other)."""

from __future__ import annotations

import typer

from orchestrator import logs
from orchestrator.errors import UserError

app = typer.Typer(
    name="orch",
    help="Registered A/B experiments for LLM serving: plan, run, judge, query history.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
plan_app = typer.Typer(help="Validate, register, simulate plans; print the plan schema.", no_args_is_help=True)
sim_app = typer.Typer(help="The simulated engine.", no_args_is_help=True)
loadgen_app = typer.Typer(help="The load generator.", no_args_is_help=True)
k8s_app = typer.Typer(help="Kubernetes manifests of an arm.", no_args_is_help=True)
db_app = typer.Typer(help="The results database.", no_args_is_help=True)
device_app = typer.Typer(help="Probe a device and fit the simulator's profile of it.", no_args_is_help=True)


@app.callback()
def _global_options(
    log_level: str | None = typer.Option(
        None, "--log-level", envvar=logs.ENV, show_default="INFO",
        help=f"{', '.join(logs.LEVELS)}. DEBUG adds time, level, logger and the run's "
        "experiment, block, arm and attempt to every line.",
    ),
) -> None:
    """Registered A/B experiments for LLM serving: plan, run, judge, query history."""
    try:
        logs.configure(log_level)
    except ValueError as e:
        raise UserError(f"--log-level: {e}") from None


app.add_typer(plan_app, name="plan")
app.add_typer(sim_app, name="sim")
app.add_typer(loadgen_app, name="loadgen")
app.add_typer(k8s_app, name="k8s")
app.add_typer(db_app, name="db")
app.add_typer(device_app, name="device")

JSON_OPTION = typer.Option(False, "--json", help="Print one JSON document on stdout.")
WIDE_OPTION = typer.Option(False, "--wide", help="Every column, unfolded (a terminal's table otherwise fits its "
                           "width: columns of low priority leave, long text folds).")
