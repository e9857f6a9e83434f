"""`orch controller serve` (what the chart's controller Deployment runs) on a real local Ray
cluster, through Ray Client as in the chart: it creates the detached controller, starts it again
when it is killed, and on SIGTERM exits leaving the controller running. The loop's give-up rule
is checked with stand-ins."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import queue
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import ray.exceptions as rex

from orchestrator.cli.controller_cmd import hold
from orchestrator.errors import EnvironmentProblem
from tests.support.ray_head import free_port as _free_port

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(600)

ACTOR = """
import sys, ray
ray.init(address=sys.argv[1], namespace="orchestrator", log_to_driver=False)
actor = ray.get_actor("orchestrator-controller")
if sys.argv[2] == "kill":
    ray.kill(actor, no_restart=True)
print(sorted(ray.get(actor.pools.remote(), timeout=60)) if sys.argv[2] == "ask" else "killed")
"""


@pytest.fixture
def ray_head(tmp_path: Path) -> Iterator[tuple[str, str, dict[str, str]]]:
    """`ray start --head --block` on loopback with a GPU pool of one H100-PCIe and, where
    ray[client] is installed (the image installs it; the test environment may not), a Ray Client
    server; yields (GCS address, the address serve uses, environment)."""
    port, client_port = _free_port(), _free_port()
    client = importlib.util.find_spec("grpc") is not None  # ray[client]: the image has it
    temp = tempfile.mkdtemp(prefix="orch-ray-", dir="/tmp")  # short: Ray's socket paths are limited
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": secrets.token_hex(16),
           "ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}", "ORCH_STATE_DIR": str(tmp_path / "state")}
    env.pop("RAY_ADDRESS", None)
    log = open(tmp_path / "ray-head.log", "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block", f"--port={port}",
         *([f"--ray-client-server-port={client_port}"] if client else []), "--num-cpus=2", "--node-ip-address=127.0.0.1",
         '--resources={"H100-PCIe": 1}', "--include-dashboard=false", f"--temp-dir={temp}",
         "--disable-usage-stats"],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", client_port if client else port)) == 0:
                    break
            assert proc.poll() is None, (tmp_path / "ray-head.log").read_text()[-3000:]
            time.sleep(0.5)
        time.sleep(2)
        time.sleep(0 if client else 3)  # GCS listens before the raylet registers
        gcs = f"127.0.0.1:{port}"
        yield gcs, f"ray://127.0.0.1:{client_port}" if client else gcs, env
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def _actor(env: dict[str, str], address: str, what: str) -> str:
    r = subprocess.run([sys.executable, "-c", ACTOR, address, what], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip().splitlines()[-1]


class Lines:
    """The process's stdout, line by line, read in a thread (to wait for a line with a deadline)."""

    def __init__(self, proc: subprocess.Popen[str]):
        self.q: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=lambda: [self.q.put(line) for line in proc.stdout], daemon=True).start()

    def wait_for(self, text: str, timeout: float = 120) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.q.get(timeout=1)
            except queue.Empty:
                continue
            self.seen.append(line)
            if text in line:
                return line
        raise AssertionError(f"no line with {text!r} in {timeout} s; got: {''.join(self.seen)[-3000:]}")


def test_serve_holds_the_controller_restarts_it_and_leaves_it_running(ray_head) -> None:
    address, client_address, env = ray_head
    proc = subprocess.Popen(  # RAY_ADDRESS as the chart sets it: Ray Client on the head
        [sys.executable, "-m", "orchestrator.cli.main", "controller", "serve", "--interval", "1"],
        cwd=ROOT, env={**env, "RAY_ADDRESS": client_address}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )
    lines = Lines(proc)
    try:
        ready = lines.wait_for("controller ready", timeout=300)  # Ray Client may need a retry
        assert "H100-PCIe 1/1 free" in ready, ready
        assert _actor(env, address, "ask") == "['H100-PCIe']"

        assert _actor(env, address, "kill") == "killed"
        lines.wait_for("controller actor gone")
        lines.wait_for("controller ready")
        assert _actor(env, address, "ask") == "['H100-PCIe']", "a new controller answers"

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, "".join(lines.seen)
        lines.wait_for("stopped", timeout=10)
        assert _actor(env, address, "ask") == "['H100-PCIe']", "the controller outlives serve"
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def test_hold_remakes_a_dead_controller_and_gives_up_when_ray_stays_silent() -> None:
    made: list[int] = []
    answers = iter([{"H200": {"total": 8.0, "free": 8.0}}, rex.RayActorError(), {}, rex.GetTimeoutError("t"),
                    rex.GetTimeoutError("t"), rex.GetTimeoutError("t")])

    def check(_: object) -> dict:
        a = next(answers)
        if isinstance(a, BaseException):
            raise a
        return a

    with pytest.raises(EnvironmentProblem, match="3 checks in a row"):
        hold(lambda: made.append(1) or len(made), check, 0.01, 3, threading.Event())
    assert len(made) == 2, "made once, made again after it died"

    stop = threading.Event()
    stop.set()
    made.clear()
    hold(lambda: made.append(1), lambda _: {}, 10.0, 3, stop)  # stopped: returns after one check
    assert made == [1]


def test_serve_without_an_address_is_one_line_exit_2(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["ORCH_DATABASE_URL"] = f"sqlite:///{tmp_path / 'orch.sqlite'}"
    env["ORCH_STATE_DIR"] = str(tmp_path / "state")
    r = subprocess.run([sys.executable, "-m", "orchestrator.cli.main", "controller", "serve"], cwd=ROOT,
                       env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "no Ray cluster" in r.stderr and "Traceback" not in r.stderr
