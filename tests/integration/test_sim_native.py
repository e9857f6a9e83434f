"""The mypyc build of the virtual-time engine (orchestrator.sim.native): loaded for exactly the
sources it was built from, and the same records as the interpreted engine, bit for bit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.sim import native

pytestmark = pytest.mark.integration

# One 4-replica open-loop point (prefix caching, round robin), its records hashed.
DIGEST = """
import hashlib, json
from orchestrator.loadgen.schedules import open_loop_offsets
from orchestrator.loadgen.workloads import build_requests
from orchestrator.plan import MODELS, EngineConfig, OpenLoop, Workload, gpu
from orchestrator.sim import native
from orchestrator.sim.engine import ClusterSpec, Windows, simulate_open_loop
from orchestrator.sim.model import WorkerModel
wl = Workload.model_validate({"prompts": {"input_tokens": {"mean": 2000}, "conversations": 200},
                              "output_tokens": 128})
w = WorkerModel.from_engine(gpu("H200"), MODELS["qwen3-8b"], 1, EngineConfig())
offsets = open_loop_offsets(OpenLoop(), 40.0, 10.0, 3)
res = simulate_open_loop(ClusterSpec(workers=(w,) * 4, policy="round_robin"), build_requests(wl, len(offsets), 3),
                         offsets, Windows(2.0, 8.0, 0.0), drain_s=20.0, seed=3)
rows = [[repr(getattr(r, f)) for f in r.__slots__] for r in res.records]
print(native.compiled(), hashlib.sha256(json.dumps(rows).encode()).hexdigest(), len(rows), res.steps)
"""


def _digest(compiled: bool) -> tuple[str, str, str, str]:
    env = {**os.environ, "ORCH_SIM_COMPILED": "1" if compiled else "0"}
    out = subprocess.run([sys.executable, "-c", DIGEST], env=env, capture_output=True, text=True,
                         timeout=300, check=True).stdout.split()
    return out[0], out[1], out[2], out[3]


def test_compiled_engine_gives_the_interpreted_engines_records() -> None:
    if not (native.build_dir() / "manifest.json").is_file():
        if os.environ.get("CI") == "true":
            pytest.fail("no compiled simulator engine for these sources: `make install` builds it")
        pytest.skip("no compiled simulator engine built for these sources (make install)")
    fast, slow = _digest(True), _digest(False)
    assert fast[0] == "True" and slow[0] == "False", (fast, slow)
    assert int(fast[2]) > 300, fast  # a real point, not an empty one
    assert fast[1:] == slow[1:]


def test_build_key_follows_every_compiled_source(tmp_path: Path) -> None:
    for m in native.MODULES:
        (tmp_path / f"{m}.py").write_text(f"# {m}\n")
    key = native.build_key(tmp_path)
    assert native.build_key(tmp_path) == key
    for m in native.MODULES:
        (tmp_path / f"{m}.py").write_text(f"# {m}, edited\n")
        assert native.build_key(tmp_path) != key, m  # an edited source never loads a stale build
        key = native.build_key(tmp_path)


def test_no_build_for_these_sources_means_the_interpreted_engine(tmp_path: Path) -> None:
    env = {**os.environ, "ORCH_CACHE_DIR": str(tmp_path)}  # an empty cache: nothing built
    code = "from orchestrator.sim import native; import orchestrator.sim.engine; print(native.compiled())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                         check=True).stdout.strip()
    assert out == "False"
