"""Entry point of `orch`: registers the command modules and maps errors to exit codes.

Exit codes (DESIGN section 11): 0 done; 1 the user's input is wrong (one line per problem, no
traceback unless ORCH_DEBUG=1); 2 an environment problem; `verdict --gate` adds 3, 4, 5.
"""

from __future__ import annotations

import importlib
import os
import sys

import typer

try:  # typer >= 0.25 vendors click; older releases use the click package
    from typer._click import ClickException
except ImportError:  # pragma: no cover
    from click import ClickException  # type: ignore[assignment]  # typer < 0.25: its click's class, another type to mypy

from orchestrator.cli.apps import app
from orchestrator.errors import OrchestratorError, UserError, stop_on_signals, terminated_by
from orchestrator.secrets import scrub

# Each module attaches its commands to the apps in `apps`; listed here so `orch --help` is
# complete and stable.
COMMAND_MODULES = (
    "plan_cmd",
    "db_cmd",
    "store_cmd",
    "sim_cmd",
    "loadgen_cmd",
    "run_cmd",
    "report_cmd",
    "k8s_cmd",
    "controller_cmd",
    "device_cmd",
)


# Which modules a top-level command needs: `orch sim serve` must not pay for importing the
# store, Ray or Kubernetes (sim workers start by the dozen). Unknown or help: all of them.
COMMAND_HOMES = {
    "plan": ("plan_cmd", "store_cmd", "sim_cmd"),
    "sim": ("sim_cmd",),
    "loadgen": ("loadgen_cmd",),
    "k8s": ("k8s_cmd",),
    "db": ("db_cmd",),
    "capacity": ("store_cmd",),
    "run": ("run_cmd",),
    "demo": ("run_cmd",),
    "verdict": ("run_cmd",),
    "verify": ("run_cmd",),
    "status": ("run_cmd",),
    "submit": ("run_cmd",),
    "cancel": ("run_cmd",),
    "report": ("report_cmd",),
    "export": ("report_cmd",),
    "controller": ("controller_cmd",),
    "device": ("device_cmd",),
}


def _register(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    first = next((a for a in args if not a.startswith("-")), None)
    names = COMMAND_HOMES.get(first or "", COMMAND_MODULES)
    if "--help" in args or "-h" in args:
        names = COMMAND_MODULES if first is None else names
    for name in names:
        importlib.import_module(f"orchestrator.cli.{name}")


def database_problem(e: BaseException) -> str | None:
    """One line for a database driver's error as SQLAlchemy raises it (None: not one): the
    environment's problem (exit 2), never a traceback."""
    if not type(e).__module__.startswith("sqlalchemy"):
        return None
    text = (str(getattr(e, "orig", None) or e).strip().splitlines() or [type(e).__name__])[0]
    if "database is locked" in text:
        return ("the SQLite database is locked: another process held a write longer than the wait "
                "(10 s); retry when it is done, or use PostgreSQL (ORCH_DATABASE_URL) for concurrent use")
    return f"the database refused the command: {text}"


def main(argv: list[str] | None = None) -> int:
    """Run `orch`; returns (and exits with) the exit code."""
    debug = os.environ.get("ORCH_DEBUG") == "1"
    _register(argv)
    if argv is None:  # the `orch` process itself (not a caller's process running it in-process)
        stop_on_signals()  # SIGTERM and SIGHUP stop every command as Ctrl-C does
    try:
        # Without standalone mode click returns an Exit's code instead of raising it.
        returned = app(args=argv, prog_name="orch", standalone_mode=False)
        code = returned if isinstance(returned, int) else 0
    except typer.Exit as e:
        code = e.exit_code
    except typer.Abort:
        sys.stderr.write("aborted\n")
        code = 130
    except ClickException as e:  # bad flags or arguments: the user's input is wrong
        e.show()
        code = 1
    except UserError as e:
        if debug:
            raise
        for line in e.problems:
            sys.stderr.write(f"{scrub(line)}\n")
        code = e.exit_code
    except OrchestratorError as e:
        if debug:
            raise
        sys.stderr.write(f"error: {scrub(str(e))}\n")
        code = e.exit_code
    except OSError as e:  # a path the user gave (--out under a file, /proc) or a broken pipe
        if debug:
            raise
        where = f"{e.filename}: " if getattr(e, "filename", None) else ""
        sys.stderr.write(f"error: {where}{e.strerror or e}\n")
        # A connection that fails is the environment's problem; a path that cannot be written, the user's.
        code = 2 if isinstance(e, ConnectionError | TimeoutError) else 1
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        code = 130
    except Exception as e:  # a database error no layer turned into one of ours: one line
        said = database_problem(e)
        if debug or said is None:
            raise
        sys.stderr.write(f"error: {scrub(said)}\n")
        code = 2
    if (stopped := terminated_by()) is not None:  # typer returns 130 for any KeyboardInterrupt
        sys.stderr.write(f"terminated ({stopped.signame}): stopped what this command started; "
                         "`orch run` of the same plan resumes an experiment\n")
        code = 128 + stopped.signum
    if argv is None:
        sys.exit(code)
    return code


if __name__ == "__main__":
    main()
