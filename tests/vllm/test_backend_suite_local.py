"""The backend conformance suite (tests/integration/backend_suite.py) applied to the local backend:
real vLLM (CPU build, tiny model) and the real vllm-router as processes. One deployment, reused
by every check; a second deploy (the crashed attempt) is stopped before vLLM finishes starting.

Not applied here: the wrong-token-count check. A real vLLM honours max_tokens with ignore_eos,
and nothing makes it miscount; the meaning is checked against sim and external, and the local
backend's ready is the same one readiness check (orchestrator/backends/readiness.py)."""

from __future__ import annotations

import pytest

from orchestrator.backends.local import LocalBackend
from tests.integration.backend_suite import (
    BackendCase,
    BackendSuite,
    kill_first_process,
    process_leftovers,
)
from tests.vllm.conftest import tiny_plan


class TestLocalBackend(BackendSuite):
    test_wrong_token_count_is_permanent = None  # see the module docstring

    @pytest.fixture(scope="class")
    def case(self, backend: LocalBackend) -> BackendCase:
        state = backend.state_dir  # the tier's state: its session fixture cleans up at the end
        plan = tiny_plan({"A": {"layout": "colocated", "replicas": 1},
                          "B": {"layout": "colocated", "replicas": 1}})
        return BackendCase(
            name="local", make=lambda: LocalBackend(state), plan=plan, arm="A", experiment="vllm-suite",
            runs_servers=True, kill=kill_first_process, leftovers=process_leftovers,
            short_deadline_s=0.5, settle_s=5.0, request_timeout_s=300.0,
        )
