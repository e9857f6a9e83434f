"""Teardown by process group: a child an engine spawned is stopped even if it ignores SIGTERM."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from orchestrator.backends.base import Deployment, Endpoint, RunKey
from orchestrator.backends.local import Device, LocalBackend, LocalSettings, group_members
from orchestrator.backends.processes import StateFile, start_process

# The leader starts a child that ignores SIGTERM (as a busy EngineCore may), then waits.
LEADER = """# orchestrator teardown test
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(120)"])
print(child.pid, flush=True)
time.sleep(120)
"""


def _start(tmp_path: Path, name: str):
    log = tmp_path / f"{name}.log"
    proc = start_process(name, [sys.executable, "-c", LEADER], 0, log, env={"ORCH_RUN": "t"})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(group_members(proc.pid)) < 2:
        time.sleep(0.05)
    assert len(group_members(proc.pid)) == 2, log.read_text()
    return proc


def _backend(tmp_path: Path) -> LocalBackend:
    settings = LocalSettings(python=sys.executable, router="vllm-router")
    return LocalBackend(tmp_path / "state", settings=settings, device=Device(kind="cpu"))


def test_teardown_leaves_no_process_of_the_group(tmp_path: Path) -> None:
    proc = _start(tmp_path, "worker-0")
    key = RunKey("exp", "A", 0)
    dep = Deployment(key=key, endpoint=Endpoint(url="http://127.0.0.1:1", model="m"),
                     handles={"procs": [proc]})
    backend = _backend(tmp_path)
    backend.teardown(dep)
    assert group_members(proc.pid) == []
    backend.teardown(dep)  # idempotent


def test_cleanup_stops_what_a_crashed_controller_left(tmp_path: Path) -> None:
    backend = _backend(tmp_path)
    key = RunKey("exp", "B", 1)
    proc = _start(tmp_path, "decode-0")
    state = StateFile(backend.state_dir / key.experiment / key.slug / "processes.json")
    state.write([proc])
    assert backend.cleanup("other-experiment") == 0
    assert group_members(proc.pid)
    assert backend.cleanup("exp") == 1
    assert group_members(proc.pid) == []
    assert not state.path.exists()


def test_group_members_ignores_processes_not_of_a_run() -> None:
    # This test process is in its own group but carries no ORCH_RUN: never a member.
    assert os.getpid() not in group_members(os.getpgid(0))
