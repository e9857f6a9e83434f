"""`orch controller serve`: the long-lived process that keeps the cluster's controller up.

The controller itself is a detached, named Ray actor (orchestrator/control/controller.py); it
lives as long as the Ray cluster, not as long as whoever created it. This command is what a
cluster runs to own it (the Helm chart's controller Deployment): it joins Ray (RAY_ADDRESS or
--address; `ray://HEAD:10001` from a pod that is not a Ray node), creates the actor if it does
not exist (a new actor resumes the store's queued and running experiments), then checks it
every --interval seconds and starts it again when it is gone (a restarted Ray head loses its
actors). It never stops the actor: SIGTERM or Ctrl-C ends this process and the queue keeps
running. When Ray cannot be reached for --max-failures checks in a row it exits 2, and its
supervisor (Kubernetes) starts it again.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import typer

from orchestrator.cli.apps import app
from orchestrator.cli.output import say
from orchestrator.errors import EnvironmentProblem

controller_app = typer.Typer(help="The Ray controller of a cluster.", no_args_is_help=True)
app.add_typer(controller_app, name="controller")


def log(line: str) -> None:
    """A timestamped line on stdout, flushed (this process runs for days under a log collector)."""
    say(f"{datetime.now(UTC).isoformat(timespec='seconds')} {line}")
    sys.stdout.flush()


def _pools_line(pools: dict[str, dict[str, float]]) -> str:
    if not pools:
        return "none (orch submit refuses every plan: declare GPU pools as Ray resources)"
    return ", ".join(f"{k} {v['free']:g}/{v['total']:g} free" for k, v in sorted(pools.items()))


def connect_with_retry(address: str | None, timeout_s: float, stop: threading.Event,
                       connect: Callable[[str | None], None]) -> bool:
    """Join Ray, retrying while the head starts; False when stopped first. A missing address
    is an error at once; an unreachable one after ``timeout_s``."""
    import ray

    if not (address or os.environ.get("RAY_ADDRESS")):
        connect(None)  # raises the one-line "no Ray cluster" problem
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            connect(address)
            return True
        except EnvironmentProblem as e:
            ray.shutdown()
            if time.monotonic() >= deadline:
                raise
            log(f"waiting for Ray: {e}")
        if stop.wait(5.0):
            return False


def hold(make: Callable[[], Any], check: Callable[[Any], dict[str, dict[str, float]]],
         interval_s: float, max_failures: int, stop: threading.Event) -> None:
    """Keep the controller actor alive until ``stop``: ``make()`` gets or creates it,
    ``check(actor)`` asks it for its GPU pools (raises when it or Ray is gone). Returns when
    stopped; raises EnvironmentProblem after ``max_failures`` failed checks in a row."""
    import ray.exceptions as rex

    actor, ready, failures = None, False, 0
    while True:
        try:
            if actor is None:
                actor = make()
            pools = check(actor)
            if not ready:
                log(f"controller ready; GPU pools: {_pools_line(pools)}")
            ready, failures = True, 0
        except rex.ActorUnavailableError as e:  # restarting or briefly unreachable: ask again
            failures += 1
            log(f"controller unavailable ({failures}/{max_failures}): {_first_line(e)}")
        except rex.RayActorError as e:  # died (or its constructor failed): start a new one
            failures += 1
            log(f"controller actor gone ({failures}/{max_failures}): {_first_line(e)}; starting it "
                "again (a new controller resumes queued and running experiments)")
            actor, ready = None, False
        except (rex.GetTimeoutError, rex.RaySystemError, ConnectionError) as e:
            failures += 1
            log(f"Ray did not answer ({failures}/{max_failures}): {_first_line(e)}")
        if failures >= max_failures:
            raise EnvironmentProblem(f"the controller failed {failures} checks in a row; exiting so "
                                     "that the supervisor starts this process again")
        if stop.wait(interval_s):
            return


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


@controller_app.command("serve")
def serve(
    address: str | None = typer.Option(
        None, "--address", help="Ray address (default: RAY_ADDRESS); ray://HOST:10001 from outside Ray's pods."),
    interval_s: float = typer.Option(10.0, "--interval", min=0.1, help="Seconds between checks of the controller."),
    connect_timeout_s: float = typer.Option(
        600.0, "--connect-timeout", min=0.0, help="How long to wait for Ray to come up at start, s."),
    max_failures: int = typer.Option(6, "--max-failures", min=1, help="Failed checks in a row before exiting 2."),
) -> None:
    """Create (or find) the cluster's controller and keep it alive; blocks until SIGTERM."""
    import ray

    from orchestrator.control.controller import NAME, NAMESPACE, connect, controller
    from orchestrator.control.session import state_dir
    from orchestrator.store.database import default_url

    stop = threading.Event()

    def stop_on_signals() -> None:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda *_: stop.set())

    stop_on_signals()
    db_url, root = default_url(), str(state_dir())
    if not connect_with_retry(address, connect_timeout_s, stop, connect):
        return
    stop_on_signals()  # again: ray.init installs its own SIGTERM handler (it exits at once)
    timeout = max(30.0, interval_s)
    try:
        log(f"connected to Ray; holding actor {NAMESPACE}/{NAME}")
        hold(lambda: controller(db_url, root), lambda a: ray.get(a.pools.remote(), timeout=timeout),
             interval_s, max_failures, stop)
    finally:
        ray.shutdown()  # disconnects; the detached actor and its experiments keep running
    log("stopped (the controller actor keeps running)")
