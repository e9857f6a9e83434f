"""`orch k8s emulate --detach` and `--stop`: the emulated cluster in the background, as `kind
create cluster` or `minikube start` leave one, so a walkthrough runs in one terminal:

    eval "$(orch k8s emulate --detach)"     # stdout is only `export KUBECONFIG=...`
    ...
    orch k8s emulate --stop

The background process is `orch k8s emulate` itself (its own session, its log next to the
kubeconfig); its PID is kept in ``<kubeconfig>.pid``. `--stop` sends it SIGTERM, which stops
every process the cluster started, and waits for it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from orchestrator.backends.processes import pid_alive
from orchestrator.errors import EnvironmentProblem, UserError

READY_LINE = "running until Ctrl-C or SIGTERM"
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0


def pid_file(kubeconfig: Path) -> Path:
    return kubeconfig.with_name(kubeconfig.name + ".pid")


def _running(kubeconfig: Path) -> int | None:
    """The PID of the background cluster of ``kubeconfig`` while it runs (a stale file is removed)."""
    path = pid_file(kubeconfig)
    try:
        pid = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    if pid_alive(pid) and _is_emulate(pid):
        return pid
    path.unlink(missing_ok=True)  # gone, or its PID now another program's: never signalled
    return None


def _is_emulate(pid: int) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"emulate" in argv and b"k8s" in argv


def detach(nodes: str, kubeconfig: Path, images: list[str]) -> None:
    """Start the cluster in the background; return once it serves. stdout: the export line."""
    if (pid := _running(kubeconfig)) is not None:
        raise UserError(f"an emulated cluster already runs for {kubeconfig} (pid {pid}): `orch k8s emulate "
                        "--stop` first, or give another --kubeconfig")
    kubeconfig.parent.mkdir(parents=True, exist_ok=True)
    log = kubeconfig.with_name(kubeconfig.name + ".log")
    argv = [sys.executable, "-m", "orchestrator.cli.main", "k8s", "emulate", "--nodes", nodes,
            "--kubeconfig", str(kubeconfig), *(a for repo in images for a in ("--image", repo))]
    with log.open("w") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
    pid_file(kubeconfig).write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + START_TIMEOUT_S
    while READY_LINE not in (text := log.read_text(errors="replace")):
        if proc.poll() is not None:
            pid_file(kubeconfig).unlink(missing_ok=True)
            last = " | ".join(text.strip().splitlines()[-3:])
            raise UserError(f"the emulated cluster did not start: {last or f'exit {proc.returncode}'}")
        if time.monotonic() > deadline:
            _terminate(proc.pid)
            pid_file(kubeconfig).unlink(missing_ok=True)
            raise EnvironmentProblem(f"the emulated cluster did not start within {START_TIMEOUT_S:.0f}s (log: {log})")
        time.sleep(0.2)
    for line in text.splitlines():
        if not line.startswith("export ") and line != READY_LINE:
            sys.stderr.write(line + "\n")
    sys.stderr.write(f"running in the background (pid {proc.pid}, log {log}); stop it with "
                     f"`orch k8s emulate --stop`\n")
    sys.stdout.write(f"export KUBECONFIG={kubeconfig}\n")


def stop(kubeconfig: Path) -> None:
    """Stop the background cluster of ``kubeconfig`` and wait until it has exited."""
    pid = _running(kubeconfig)
    if pid is None:
        raise UserError(f"no emulated cluster runs in the background for {kubeconfig} "
                        "(started with `orch k8s emulate --detach`)")
    if not _terminate(pid):
        raise EnvironmentProblem(f"the emulated cluster (pid {pid}) did not stop within {STOP_TIMEOUT_S:.0f}s; "
                                 "it was killed, and processes it started may be left")
    pid_file(kubeconfig).unlink(missing_ok=True)
    sys.stdout.write(f"stopped the emulated cluster (pid {pid}) and every process it started\n")


def _terminate(pid: int) -> bool:
    """SIGTERM to the cluster's process (it stops what it started), then wait; SIGKILL its
    group past the timeout. True when it ended by itself."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while pid_alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
            return False
        time.sleep(0.2)
    return True
