"""The backend registry (``control.session``): one factory per backend name the plan language
knows, each importing its backend only when called; an unknown name is the user's error."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

import pytest

from orchestrator.control.session import BACKEND_FACTORIES, BACKENDS, make_backend
from orchestrator.errors import UserError
from orchestrator.plan.experiment import Backend


def test_every_backend_a_plan_may_name_has_a_factory() -> None:
    assert BACKENDS == tuple(BACKEND_FACTORIES) == get_args(Backend)


def test_an_unknown_backend_is_the_users_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"unknown backend 'nope': sim, virtual, local, kubernetes, external$"):
        make_backend("nope", tmp_path)


def test_make_backend_builds_the_named_one(tmp_path: Path) -> None:
    from orchestrator.backends.virtual import VirtualBackend

    assert isinstance(make_backend("virtual", tmp_path), VirtualBackend)


def test_the_registry_imports_no_backend_until_asked() -> None:
    """Only the factories import a backend (``orch --help`` loads none): no module-level import
    of one in control.session."""
    import orchestrator.control.session as session

    tree = ast.parse(Path(session.__file__).read_text())
    top = {n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
    assert {m for m in top if m.startswith("orchestrator.backends")} == {"orchestrator.backends.base"}
