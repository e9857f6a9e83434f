"""The SGLang parser tier: SGLang's and sglang_router's own argument parsers judge every SGLang
command line the project renders (parse, never serve).

Every test in this folder is marked `sglang` (run alone with `pytest -m sglang`, or
`make test-sglang`). Its interpreter is ORCH_SGLANG_PYTHON where set (any environment with sglang
and sglang-router installed; the local backend's setting for SGLang arms), else the parser-only
environment `make sglang` builds in the per-user cache (orchestrator/backends/sglang_env.py).
Without either, each test skips with the remedy as its reason; `make test` builds the cached one
first and requires the tier (tests/conftest.py), so under CI a skip fails the run. Parser-only:
SGLang's server needs CUDA-only wheels (what installing it here found is in
tests/sglang/test_rendered_commands.py).
"""

from __future__ import annotations

import os
import subprocess
from functools import cache
from pathlib import Path

import pytest

from orchestrator.backends.sglang_env import SglangEnv

HERE = Path(__file__).resolve().parent


@cache
def sglang_python() -> tuple[str | None, str]:
    """(the SGLang interpreter, why there is none)."""
    python = os.environ.get("ORCH_SGLANG_PYTHON")
    if not python:
        env = SglangEnv.default()
        if env.ready():  # its build already ran the import probe below
            return str(env.python), ""
        return None, (f"no SGLang environment: `make sglang` builds one in {env.root}, or set ORCH_SGLANG_PYTHON to "
                      "an interpreter with sglang and sglang-router")
    if not Path(python).exists():
        return None, f"ORCH_SGLANG_PYTHON={python} does not exist"
    probe = "import sglang.srt.server_args, sglang_router.router_args"
    r = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return None, f"{python} cannot import sglang's and sglang_router's parsers: {r.stderr.strip()[-300:]}"
    return python, ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.sglang)


@pytest.fixture(scope="session", autouse=True)
def sglang_interpreter() -> str:
    """The tier's interpreter, looked for only when one of its tests runs (the probe of an
    ORCH_SGLANG_PYTHON imports torch: seconds no other session should pay)."""
    python, reason = sglang_python()
    if python is None:
        pytest.skip(reason)
    return python
