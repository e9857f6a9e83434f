"""e2e fixtures: a fresh state directory per test (the fresh SQLite `store` is tests/conftest.py's),
nothing shared."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def state(tmp_path: Path) -> Path:
    path = tmp_path / "state"
    path.mkdir()
    return path
