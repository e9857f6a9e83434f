"""An endpoint that echoes the API key in its error bodies (issue 30): the key is stored
nowhere and printed nowhere: not in a request's error, a run's reason, a guard's detail, a
verdict's evidence, the log, nor anywhere in the database file's bytes."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from orchestrator.backends.external import ExternalBackend
from orchestrator.control.executor import Executor, ExecutorConfig
from orchestrator.control.progress import PlainProgress
from orchestrator.plan import validate_plan
from orchestrator.secrets import REDACTED, scrub
from tests.support.fault_server import external_plan, start_fault_server

pytestmark = pytest.mark.timeout(180)

# Not shaped like a token: only its registration when the header is resolved can scrub it.
KEY = "plain-words-key-4711"


def test_an_echoed_key_is_stored_and_printed_nowhere(store, state, tmp_path: Path,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    with start_fault_server(api_key=KEY, echo_auth=True) as bad, start_fault_server(api_key=KEY) as good:
        data = external_plan(bad.url, good.url, name="ext-echo-key")
        for arm in data["arms"].values():
            arm["endpoint"]["headers"] = {"Authorization": {"env": "ECHO_TEST_KEY", "scheme": "Bearer"}}
        backend = ExternalBackend(env={"ECHO_TEST_KEY": KEY})
        with caplog.at_level(logging.DEBUG, logger="orchestrator"):
            out = Executor(store, backend, ExecutorConfig(state_dir=state, ready_deadline_s=20),
                           PlainProgress()).run(validate_plan(data))
        assert bad.received > 0
    runs = {r.arm: r for r in store.runs(out.experiment_id)}
    a = runs["A"]  # every streamed request failed (misses: capacity 0), whatever its guards said
    errors = [r.error for _, p in store.points(a.id).iterrows() for r in store.requests(int(p.id)) if r.error]
    assert errors and all(KEY not in e for e in errors) and any(REDACTED in e for e in errors), errors[:3]
    texts = [r.invalid_reason or "" for r in runs.values()]
    texts += [g.detail for r in runs.values() for g in store.guard_results(r.id)]
    texts += [str(v.evidence) + (v.note or "") for v in store.verdicts(out.experiment_id, history=True)]
    assert not [t for t in texts if KEY in t]
    assert KEY not in caplog.text
    store.close()
    db = tmp_path / "orch.sqlite"
    assert KEY.encode() not in b"".join(p.read_bytes() for p in tmp_path.glob("orch.sqlite*")), db


def test_token_shaped_values_are_scrubbed_unregistered() -> None:
    assert scrub("401: bad header Authorization: Bearer abcdefghijklmnop1234") == \
        f"401: bad header Authorization: Bearer {REDACTED}"
    assert scrub('{"api_key": "zyxwvutsrqponm9876"}') == f'{{"api_key": "{REDACTED}"}}'
    assert scrub("key sk-proj-ABCDEFGHIJKLMNOP rejected") == f"key {REDACTED} rejected"
    assert scrub("an ordinary sentence about tokens") == "an ordinary sentence about tokens"
