"""Error types that carry their meaning: what the caller should do about them.

- ``UserError``: the input is wrong (a plan, a flag). Exit 1; the message says what to fix.
- ``EnvironmentProblem``: something around us is missing or down (database, cluster, Ray).
  Exit 2; the message names the thing and the remedy.
- ``TransientError``: worth retrying after ``delay`` seconds (a 5xx, a timeout, a 409).
- ``PermanentError``: retrying will not help (a 403, a missing GPU type in the cluster).
"""

from __future__ import annotations

from dataclasses import dataclass


class OrchestratorError(Exception):
    """Base of every error this package raises on purpose."""

    exit_code = 1


class UserError(OrchestratorError):
    """The user's input is wrong; the message (and ``problems``) say what to fix."""

    exit_code = 1

    def __init__(self, message: str, problems: list[str] | None = None):
        super().__init__(message)
        self.problems = problems or [message]


class EnvironmentProblem(OrchestratorError):
    """A service we depend on is missing or unreachable (database, cluster, Ray)."""

    exit_code = 2


class TransientError(OrchestratorError):
    """A failure worth retrying after ``delay`` seconds."""

    exit_code = 2

    def __init__(self, message: str, delay: float = 1.0):
        super().__init__(message)
        self.delay = delay


class PermanentError(OrchestratorError):
    """A failure that retrying will not fix; the message names what must change."""

    exit_code = 2


@dataclass(frozen=True)
class Problem:
    """One thing wrong with an input, located by its field path (and YAML line if known)."""

    path: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = self.path or "(plan)"
        at = f" (line {self.line})" if self.line else ""
        return f"{where}: {self.message}{at}"


class PlanError(UserError):
    """A plan failed validation; ``problems`` has one entry per problem, each with its path."""

    def __init__(self, problems: list[Problem]):
        self.plan_problems = list(problems)
        lines = [str(p) for p in self.plan_problems]
        super().__init__(
            f"plan is invalid ({len(lines)} problem{'s' if len(lines) != 1 else ''})", lines
        )


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP (what ``timeout``, systemd, Kubernetes and a closed terminal send),
    raised where the process is, so it stops as Ctrl-C does: the running run is aborted with
    this reason, every process the command started is stopped, and ``orch`` exits 128 + the
    signal's number."""

    def __init__(self, signum: int):
        import signal

        self.signum = signum
        self.signame = signal.Signals(signum).name
        super().__init__(self.signame)


_RECEIVED: list[Terminated] = []  # what stop_on_signals' handler raised, first first


def terminated_by() -> Terminated | None:
    """The SIGTERM or SIGHUP that stopped this process, if one did (a framework in between,
    e.g. typer, may turn the raised exception into an exit code)."""
    return _RECEIVED[0] if _RECEIVED else None


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP raise :class:`Terminated` in the main thread (again after a library,
    e.g. ``ray.init``, installed handlers of its own)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return

    def handler(signum: int, frame: object) -> None:
        e = Terminated(signum)
        _RECEIVED.append(e)
        raise e

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, handler)
