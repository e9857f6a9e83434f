"""e2e fixtures: a fresh state directory per test (the fresh SQLite `store` is tests/conftest.py's),
nothing shared."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from tests.e2e.helpers import orch_here


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir()
    return path


@pytest.fixture
def orch(tmp_path, monkeypatch, capsys):
    """`orch` as a user runs it, in this process, on a fresh SQLite store, state and cache:
    ``orch("run", ...)`` -> returncode, stdout, stderr and the env it ran with (local fixtures
    of the same name take precedence)."""
    env = {"ORCH_DATABASE_URL": f"sqlite:///{tmp_path / 'orch.sqlite'}", "ORCH_STATE_DIR": str(tmp_path / "state"),
           "ORCH_CACHE_DIR": str(tmp_path / "cache")}

    def run(*args: str) -> SimpleNamespace:
        code, out, err = orch_here(*args, env=env, monkeypatch=monkeypatch, capsys=capsys)
        return SimpleNamespace(returncode=code, stdout=out, stderr=err, env=env)
    return run
