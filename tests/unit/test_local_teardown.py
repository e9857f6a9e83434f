"""Teardown by process group: a child an engine spawned is stopped even if it ignores SIGTERM."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from orchestrator.backends.base import Deployment, Endpoint, Fingerprint, RunKey
from orchestrator.backends.local import (
    Device,
    LocalBackend,
    LocalSettings,
    group_members,
    stop_group,
)
from orchestrator.backends.processes import ProcessHandles, StateFile, start_process

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
    # Wait until the child has set SIGTERM aside (it prints "up" after that).
    while time.monotonic() < deadline and "up" not in log.read_text():
        time.sleep(0.05)
    assert len(group_members(proc.pid)) == 2, log.read_text()
    return proc


def _backend(tmp_path: Path) -> LocalBackend:
    settings = LocalSettings(python=sys.executable, router="vllm-router", stop_grace_s=1.0)
    return LocalBackend(tmp_path / "state", settings=settings, device=Device(kind="cpu"))


def test_teardown_leaves_no_process_of_the_group(tmp_path: Path) -> None:
    proc = _start(tmp_path, "worker-0")
    key = RunKey("exp", "A", 0)
    dep = Deployment(key=key, endpoint=Endpoint(url="http://127.0.0.1:1", model="m"), fingerprint=Fingerprint("local"),
                     handles=ProcessHandles([proc]))
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


def test_a_group_that_is_not_ours_is_left_alone(tmp_path: Path) -> None:
    # A pid recorded in a stale state file may now belong to someone else's process.
    other = start_process("other", ["sleep", "60"], 0, tmp_path / "other.log")
    try:
        assert not stop_group(other.pid, grace_s=0.5)
        assert group_members(other.pid) == [other.pid]
    finally:
        os.kill(other.pid, 9)
        os.waitpid(other.pid, 0)


def test_a_renamed_engine_is_recognised_as_ours(tmp_path: Path) -> None:
    # vLLM and vllm-router rename their process titles ("vllm::router"); teardown must still
    # stop them. exec -a sets the title the same way for this test.
    proc = start_process("router", ["bash", "-c", "exec -a vllm::router sleep 60"], 0,
                         tmp_path / "router.log")
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "vllm::router" not in Path(f"/proc/{proc.pid}/cmdline").read_text():
        time.sleep(0.05)
    assert stop_group(proc.pid, grace_s=5)
    assert group_members(proc.pid) == []
