"""The SGLang parser tier: SGLang's and sglang_router's own argument parsers judge every SGLang
command line the project renders (parse, never serve).

Every test in this folder is marked `sglang` (run alone with `pytest -m sglang`) and skips,
with the remedy as its reason, when no SGLang environment is given: ORCH_SGLANG_PYTHON, the
interpreter of an environment with sglang and sglang-router installed (the local backend's
setting for SGLang arms). It is no required tier (tests/conftest.py counts unit, integration,
e2e and vllm): the project does not build an SGLang environment, whose GPU wheels do not run
here. What was found installing SGLang's CPU side on a 2-core box is in
tests/sglang/test_rendered_commands.py.
"""

from __future__ import annotations

import os
import subprocess
from functools import cache
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@cache
def sglang_python() -> tuple[str | None, str]:
    """(the SGLang interpreter, why there is none)."""
    python = os.environ.get("ORCH_SGLANG_PYTHON")
    if not python:
        return None, "no SGLang environment: set ORCH_SGLANG_PYTHON to an interpreter with sglang and sglang-router"
    if not Path(python).exists():
        return None, f"ORCH_SGLANG_PYTHON={python} does not exist"
    probe = "import sglang.srt.server_args, sglang_router.router_args"
    r = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        return None, f"{python} cannot import sglang's and sglang_router's parsers: {r.stderr.strip()[-300:]}"
    return python, ""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    mine = [i for i in items if HERE in Path(str(i.fspath)).resolve().parents]
    if not mine:
        return
    python, reason = sglang_python()
    for item in mine:
        item.add_marker(pytest.mark.sglang)
        if python is None:
            item.add_marker(pytest.mark.skip(reason=reason))
