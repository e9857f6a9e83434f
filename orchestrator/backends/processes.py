"""Local child processes for backends: started in their own process group, logged to files,
remembered in a state file so a crashed controller's leftovers can be found and stopped."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

# A pid is only ours if its command line still mentions one of these (pids get reused).
OWN_MARKERS = ("orchestrator", "vllm-router", "vllm.entrypoints", "vllm_router")


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
        return _alive(self.pid)


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


def _alive(pid: int) -> bool:
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


def _ours(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return False
    return any(m in cmdline for m in OWN_MARKERS)


def stop_process(pid: int, grace_s: float = 5.0) -> bool:
    """SIGTERM the process group, then SIGKILL after ``grace_s``; True if something was stopped."""
    if not _alive(pid) or not _ours(pid):
        return False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    for _ in range(40):
        if not _alive(pid):
            break
        time.sleep(0.05)
    return True


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
