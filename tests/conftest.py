"""Test tiers, the private PostgreSQL and database fixtures, and CI's required-tier rule."""

from __future__ import annotations

import os
import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.support import postgres

if TYPE_CHECKING:
    from orchestrator.store import Store

TIERS = ("unit", "integration", "e2e", "vllm", "sglang")
# `make test` builds the vLLM environment (`make vllm`) and the SGLang parser environment
# (`make sglang`) first, so under CI a skipped real-engine or SGLang-parser test means a build is
# broken, not absent.
REQUIRED_TIERS = ("unit", "integration", "e2e", "vllm", "sglang")
ROOT = Path(__file__).resolve().parent.parent
# Modules that start a Ray head: under pytest-xdist they share one worker (two Ray clusters at
# once on a 2-core machine starve each other's tests).
RAY_MODULES = {"test_controller.py", "test_controller_serve.py", "test_loadgen_shards.py", "test_k8s_submit.py",
               "test_workload_shards.py"}
_outcomes: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))


# tryfirst: pytest-xdist's worker reads xdist_group marks in its own collection hook, so ours
# must have added them before it runs.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        rel = Path(str(item.fspath)).resolve().relative_to(ROOT / "tests")
        tier = rel.parts[0] if rel.parts else ""
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
        if rel.name in RAY_MODULES:
            item.add_marker(pytest.mark.xdist_group("ray"))


@pytest.hookimpl(trylast=True)
def pytest_collection_finish(session: pytest.Session) -> None:
    """Under `--dist loadgroup` every grouped test must carry its group in its node id (that is
    how xdist keeps a group on one worker). pytest 9 ignores the attribute xdist 3.8 sets, and then
    two Ray heads run at once and shared fixtures are built once per worker: fail loudly instead."""
    if not session.config.getoption("loadgroup", default=False):
        return
    lost = [i.nodeid for i in session.items if i.get_closest_marker("xdist_group") and "@" not in i.nodeid]
    if lost:
        raise pytest.UsageError(f"pytest-xdist did not apply xdist_group to {len(lost)} test(s), e.g. {lost[0]}: "
                                "check the pytest / pytest-xdist versions (pyproject.toml pins pytest < 9)")


def _tier_of(item_keywords: object) -> str | None:
    for tier in TIERS:
        if tier in item_keywords:  # type: ignore[operator]
            return tier
    return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    tier = _tier_of(report.keywords)
    if tier is None:
        return
    if report.when == "call" or report.outcome == "skipped" or (report.when == "setup" and report.failed):
        _outcomes[tier][report.outcome] += 1


def _full_run(config: pytest.Config) -> bool:
    return not config.option.markexpr and not config.option.keyword and not config.option.lf


def _required_tiers(config: pytest.Config) -> tuple[str, ...]:
    """The tiers this session must pass: ORCH_REQUIRED_TIERS when `make test` splits the run
    (unit, integration and e2e on TEST_WORKERS workers; then sglang alone; then vllm alone), else
    all on a full run."""
    named = os.environ.get("ORCH_REQUIRED_TIERS")
    if named:
        return tuple(named.split())
    return REQUIRED_TIERS if _full_run(config) else ()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    # Under pytest-xdist each worker sees only its share; the controller sees every report.
    if os.environ.get("CI") != "true" or hasattr(session.config, "workerinput"):
        return
    problems = []
    for tier in _required_tiers(session.config):
        got = _outcomes.get(tier, {})
        if got.get("passed", 0) == 0:
            problems.append(f"required tier {tier!r} ran no passing test")
        if got.get("skipped", 0):
            problems.append(f"required tier {tier!r} skipped {got['skipped']} test(s) under CI=true")
    if problems:
        tr = session.config.pluginmanager.get_plugin("terminalreporter")
        for p in problems:
            if tr:
                tr.write_line(f"CI tier check: {p}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session")
def private_postgres() -> Iterator[postgres.PrivatePostgres | str]:
    """The session's PostgreSQL: ORCH_TEST_DATABASE_URL's server, or a private cluster."""
    external = os.environ.get("ORCH_TEST_DATABASE_URL")
    if external:
        yield external
        return
    bindir = postgres.find_bindir()
    if bindir is None:
        msg = "PostgreSQL server binaries not found (install postgresql or set ORCH_TEST_DATABASE_URL)"
        if os.environ.get("CI") == "true":
            pytest.fail(msg)
        pytest.skip(msg)
    pg = postgres.start(bindir)
    try:
        yield pg
    finally:
        pg.stop()


@pytest.fixture
def pg_url(private_postgres: postgres.PrivatePostgres | str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test."""
    if isinstance(private_postgres, str):
        yield private_postgres
        return
    name = private_postgres.create_database()
    try:
        yield private_postgres.url(name)
    finally:
        private_postgres.drop_database(name)


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A fresh SQLite file for one test."""
    return f"sqlite:///{tmp_path / f'orch-{uuid.uuid4().hex[:8]}.sqlite'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest) -> str:
    """Both databases the store supports, one test each."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("pg_url")


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """A Store on SQLite at tmp_path/orch.sqlite (where a test's subprocess can find it too), closed
    after the test. Modules that test both databases define their own `store` over `db_url`."""
    from orchestrator.store import (
        Store,  # here, so the unit tier's collection imports no SQLAlchemy
    )

    s = Store.open(f"sqlite:///{tmp_path / 'orch.sqlite'}")
    try:
        yield s
    finally:
        s.close()


class SocketOpened(AssertionError):
    """A virtual-time test opened a network socket or started a process."""


@pytest.fixture
def no_sockets(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Fails the test if it connects or binds a socket, or starts a process: the control-logic
    tests run in virtual time, with no server, router, load generator, Ray or subprocess. (The
    store's database is SQLite here; libpq's own sockets would not be seen.) Yields the refused
    attempts, which must stay empty."""
    import socket
    import subprocess

    refused: list[str] = []

    def refuse(what: str) -> None:
        refused.append(what)
        raise SocketOpened(f"a virtual-time test tried to {what}")

    def connect(self: socket.socket, address: object) -> None:
        refuse(f"connect a socket to {address!r}")

    def connect_ex(self: socket.socket, address: object) -> int:
        refuse(f"connect a socket to {address!r}")
        return 1

    def bind(self: socket.socket, address: object) -> None:
        refuse(f"bind a socket to {address!r}")

    def popen(*args: object, **kwargs: object) -> None:
        refuse(f"start a process {args[1] if len(args) > 1 else kwargs.get('args')!r}")

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket.socket, "bind", bind)
    monkeypatch.setattr(subprocess.Popen, "__init__", popen)
    yield refused
    assert not refused, f"a virtual-time test opened sockets or processes: {refused}"
