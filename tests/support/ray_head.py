"""A real local Ray head for tests: `ray start --head --block` in its own process group, on
loopback, with GPU pools declared as Ray custom resources and a per-head auth token; stopped by
its process group (never `ray stop`, which would stop every Ray of the machine).

    with ray_head(tmp_path, {"H200": 8}, env) as (address, env):
        subprocess.run(["orch", "submit", plan, "--address", address], env=env)

The returned ``env`` is the one the head (and so every Ray worker) runs with: pass it to every
client (`orch submit`, `orch controller serve`, a driver) so that they carry the auth token.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_group(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM the process group ``proc`` leads, SIGKILL it after ``grace_s``."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


@contextlib.contextmanager
def ray_head(tmp_path: Path, resources: Mapping[str, float], env: Mapping[str, str] | None = None,
             num_cpus: int = 4) -> Iterator[tuple[str, dict[str, str]]]:
    """Start a Ray head whose processes (and so every worker: actors, experiment tasks) see
    ``env``; yields (address, env with the auth token). The log is ``tmp_path/ray-head.log``."""
    port = free_port()
    temp = tempfile.mkdtemp(prefix="orch-ray-", dir="/tmp")  # short: Ray's socket paths are limited
    # Ray >= 2.52 authenticates every control-plane call with a static token: one per head,
    # given to the head and to every client through the environment.
    full = {**os.environ, **(env or {}), "RAY_USAGE_STATS_ENABLED": "0",
            "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    ray_bin = str(Path(sys.executable).parent / "ray")
    log_path = tmp_path / "ray-head.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed in finally
    proc = subprocess.Popen(
        [ray_bin, "start", "--head", "--block", f"--port={port}", f"--num-cpus={num_cpus}",
         "--node-ip-address=127.0.0.1",  # loopback only
         f"--resources={json.dumps(dict(resources))}", "--include-dashboard=false", f"--temp-dir={temp}",
         "--disable-usage-stats"],
        stdout=log, stderr=subprocess.STDOUT, env=full, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            assert proc.poll() is None, log_path.read_text()[-3000:]
            time.sleep(0.5)
        time.sleep(3)  # GCS listens before the raylet registers
        yield f"127.0.0.1:{port}", full
    finally:
        stop_group(proc)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)
