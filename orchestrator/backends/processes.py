"""Local child processes for backends: started in their own process group, logged to files,
remembered in a state file so a crashed controller's leftovers can be found and stopped; and
``ProcessBackend``, what the sim and local backends share (state files, alive, teardown,
cleanup, log tails)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from orchestrator import logs
from orchestrator.backends.base import QUICK_START_BUDGET_S, Deployment, RunKey
from orchestrator.errors import PermanentError

_log = logs.get_logger(__name__)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on ``host`` right now."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class ChildProcess:
    """One started process: its role, pid (= process group id), port and log file."""

    role: str
    pid: int
    port: int
    log: str
    argv: list[str]

    def alive(self) -> bool:
        return pid_alive(self.pid)


def start_process(
    role: str, argv: list[str], port: int, log: Path, env: dict[str, str] | None = None
) -> ChildProcess:
    """Start ``argv`` in a new session (its own process group), output to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, env={**os.environ, **(env or {})},
        )
    return ChildProcess(role=role, pid=proc.pid, port=port, log=str(log), argv=argv)


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie child of this process is reaped, and is not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); reap it if it is ours.
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


# vLLM and vllm-router rename themselves (setproctitle: "VLLM::EngineCore", "vllm::router"),
# which also overwrites /proc/PID/environ; so ownership is read from the command line, and
# only of group leaders we started (pgid == pid) and their group.
OWN_MARKERS = ("vllm::", "vllm.entrypoints", "vllm-router", "vllm_router", "orchestrator")


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _ours(pid: int) -> bool:
    cmd = _cmdline(pid).lower()
    return any(m in cmd for m in OWN_MARKERS)


def group_members(pgid: int) -> list[int]:
    """Live pids whose process group is ``pgid``: the leader and what it spawned (EngineCore,
    workers), which may outlive their leader."""
    out: list[int] = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # Fields after the command: state, ppid, pgrp, ...; zombies are already dead.
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] != "Z":
            out.append(int(stat.parent.name))
    return out


def stop_group(pgid: int, grace_s: float = 15.0) -> bool:
    """SIGTERM the process group of a leader we started, SIGKILL what is left after
    ``grace_s``; True if something was stopped. A group none of whose members is ours (a
    reused pid) is left alone."""
    members = group_members(pgid)
    if not members or not any(_ours(pid) for pid in members):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and group_members(pgid):
        _reap(pgid)
        time.sleep(0.1)
    if group_members(pgid):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        for _ in range(100):
            _reap(pgid)
            if not group_members(pgid):
                break
            time.sleep(0.05)
    _reap(pgid)
    return True


def _reap(pid: int) -> None:
    """Collect the exit status of a child of ours, so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


class StateFile:
    """JSON file listing the processes of one run attempt (for idempotent teardown and cleanup)."""

    def __init__(self, path: Path):
        self.path = path

    def write(self, procs: list[ChildProcess]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps([asdict(p) for p in procs]))
        tmp.replace(self.path)

    def read(self) -> list[ChildProcess]:
        try:
            return [ChildProcess(**d) for d in json.loads(self.path.read_text())]
        except (OSError, ValueError):
            return []

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def log_tail(path: str | Path, lines: int = 20) -> str:
    """The last ``lines`` lines of a log file (for error messages)."""
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


@dataclass
class ProcessHandles:
    """What a process backend keeps of a deployment: its processes in start order (router
    last) and the engine they serve."""

    procs: list[ChildProcess]
    engine: str = "vllm"


class ProcessBackend:
    """Arms as local processes: one state file per run attempt lists them (so teardown is
    idempotent and ``cleanup`` finds a crashed controller's leftovers); the deployment's
    ``ProcessHandles`` hold the ``ChildProcess`` list in start order (router last)."""

    name = "process"
    stop_grace_s = 5.0

    def __init__(self, state_dir: Path):
        self.state_dir = Path(state_dir)

    def _run_dir(self, key: RunKey) -> Path:
        return self.state_dir / key.experiment / key.slug

    def _state(self, key: RunKey) -> StateFile:
        return StateFile(self._run_dir(key) / "processes.json")

    def sends_load_here(self, plan: Any) -> bool:
        return True

    def startup_budget_s(self, plan: Any, arm: str) -> float:
        return QUICK_START_BUDGET_S

    def _start_all(self, key: RunKey, specs: list[tuple[str, list[str], int, dict[str, str] | None]],
                   what: str) -> list[ChildProcess]:
        """Start ``(role, argv, port, env)`` in order, recording each in the run's state file;
        if one cannot start, stop those started and raise PermanentError."""
        run_dir = self._run_dir(key)
        state = self._state(key)
        procs: list[ChildProcess] = []
        try:
            for role, argv, port, env in specs:
                procs.append(start_process(role, argv, port, run_dir / f"{role}.log", env=env))
                state.write(procs)
                _log.debug("started %s: pid %d, port %d, log %s: %s", role, procs[-1].pid, port,
                           procs[-1].log, shlex.join(argv))
        except OSError as e:
            for p in reversed(procs):
                stop_group(p.pid, self.stop_grace_s)
            state.remove()
            raise PermanentError(f"cannot start {what}: {e}") from e
        return procs

    def exited_check(self, deployment: Deployment) -> None:
        """Raise PermanentError naming the first process of the deployment that exited."""
        for p in deployment.handles_as(ProcessHandles).procs:
            if not p.alive():
                raise PermanentError(f"{p.role} exited during start-up (log {p.log}); log tail:\n{log_tail(p.log)}")

    def alive(self, deployment: Deployment) -> bool:
        """Whether every process of the deployment still runs."""
        return all(p.alive() for p in deployment.handles_as(ProcessHandles).procs)

    def _after_stop(self, run_dir: Path) -> None:
        """What a backend removes besides its processes (a KV folder); none by default."""

    def teardown(self, deployment: Deployment) -> None:
        held = deployment.handles
        procs = (held.procs if isinstance(held, ProcessHandles) else []) or self._state(deployment.key).read()
        for p in reversed(procs):  # router first, then workers
            stop_group(p.pid, self.stop_grace_s)
            _log.debug("stopped %s (pid %d)", p.role, p.pid)
        self._after_stop(self._run_dir(deployment.key))
        self._state(deployment.key).remove()

    def cleanup(self, experiment: str, final: bool = False) -> int:
        removed = 0
        for state_path in (self.state_dir / experiment).glob("*/processes.json"):
            for p in reversed(StateFile(state_path).read()):
                removed += int(stop_group(p.pid, self.stop_grace_s))
            self._after_stop(state_path.parent)
            StateFile(state_path).remove()
        return removed
