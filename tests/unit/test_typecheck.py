"""The type checker `make lint` runs (mypy, configured in pyproject.toml) catches the class of bug
that let `KubernetesBackend.from_environment` go missing: a call to a method a class does not
have, and a backend that does not satisfy the `Backend` protocol.

One mypy run (in process, the project's own configuration) checks a few scratch modules; each
test reads the errors of its own module. It starts from a copy of the project's cache (`make lint`
fills it; without it the run takes about a minute), so the scratch modules never enter it.
"""

from __future__ import annotations

import inspect
import re
import shutil
import textwrap
import uuid
from pathlib import Path

import pytest
from mypy import api as mypy_api

from orchestrator.backends.base import Backend

ROOT = Path(__file__).resolve().parents[2]

MISSING_METHOD = '''
from orchestrator.backends.kubernetes import KubernetesBackend


class Greeter:
    def hello(self) -> str:
        return "hello"


Greeter().goodbye()
KubernetesBackend.from_enviroment(log=print)  # the name misspelt: no such classmethod
'''

# Every backend make_backend can return (orchestrator.control.session) taken as a Backend.
BACKENDS_CONFORM = '''
from orchestrator.backends.base import Backend
from orchestrator.backends.external import ExternalBackend
from orchestrator.backends.kubernetes import KubernetesBackend
from orchestrator.backends.local import LocalBackend
from orchestrator.backends.sim import SimBackend


def every_backend(sim: SimBackend, local: LocalBackend, external: ExternalBackend,
                  kubernetes: KubernetesBackend) -> list[Backend]:
    return [sim, local, external, kubernetes]
'''


def _protocol_copy(name: str, drop: str | None = None) -> str:
    """A plain class with the Backend protocol's own members (its source), less ``drop``."""
    source = textwrap.dedent(inspect.getsource(Backend))
    body = re.split(r"^class Backend\b.*:\n", source, maxsplit=1, flags=re.M)[1]  # after decorators
    if drop is not None:
        body, n = re.subn(rf"\n    def {drop}\(.*?(?=\n    def |\Z)", "\n", body, flags=re.S)
        assert n == 1, f"Backend has no method {drop}"
    return f"class {name}:\n{body}\n"


def _backend_copies() -> str:
    return "\n".join([
        '# mypy: disable-error-code="empty-body"',
        "from __future__ import annotations",
        "from orchestrator.backends.base import Backend, Deployment, RunKey",
        "from orchestrator.plan import Plan",
        "",
        _protocol_copy("Complete"),
        _protocol_copy("NoAlive", drop="alive"),
        "complete: Backend = Complete()",
        "no_alive: Backend = NoAlive()  # line of the expected error",
        "",
    ])


@pytest.fixture(scope="module")
def errors(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[str]]:
    """{scratch module or project file: its error and note lines} from one mypy run."""
    tmp = tmp_path_factory.mktemp("typecheck")
    cache = tmp / "mypy_cache"
    if (ROOT / ".mypy_cache").is_dir():
        shutil.copytree(ROOT / ".mypy_cache", cache)
    run = uuid.uuid4().hex[:8]  # module names no cache has seen
    modules = {
        "missing_method": MISSING_METHOD,
        "backends_conform": BACKENDS_CONFORM,
        "backend_copies": _backend_copies(),
    }
    files = {}
    for name, text in modules.items():
        path = tmp / f"{name}_{run}.py"
        path.write_text(text, encoding="utf-8")
        files[str(path)] = name
    session = ROOT / "orchestrator" / "control" / "session.py"
    files[str(session)] = "session"
    stdout, stderr, status = mypy_api.run([
        "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(cache),
        "--show-error-codes", "--no-error-summary", "--hide-error-context", *files,
    ])
    assert status in (0, 1), f"mypy did not run:\n{stdout}\n{stderr}"
    found: dict[str, list[str]] = {name: [] for name in files.values()}
    for line in stdout.splitlines():
        file = line.split(":", 1)[0]
        for path, name in files.items():
            if Path(file).resolve() == Path(path).resolve() and (": error:" in line or ": note:" in line):
                found[name].append(line)
    return found


def _errors(lines: list[str]) -> list[str]:
    return [e for e in lines if ": error:" in e]


def test_a_call_to_a_missing_method_is_an_error(errors: dict[str, list[str]]) -> None:
    lines = _errors(errors["missing_method"])
    assert any('"Greeter" has no attribute "goodbye"' in e and "[attr-defined]" in e for e in lines), lines
    assert any('"from_enviroment"' in e and "[attr-defined]" in e for e in lines), lines
    assert len(lines) == 2, lines


def test_every_backend_satisfies_the_protocol(errors: dict[str, list[str]]) -> None:
    assert _errors(errors["backends_conform"]) == []
    assert _errors(errors["session"]) == []  # make_backend returns each of them as a Backend


def test_a_backend_missing_alive_does_not_satisfy_the_protocol(errors: dict[str, list[str]]) -> None:
    lines = errors["backend_copies"]
    # The complete copy passes; the one without `alive` is refused where it is taken as a Backend.
    (error,) = _errors(lines)
    assert '"NoAlive"' in error and '"Backend"' in error and "[assignment]" in error, lines
    notes = " ".join(n.split(": note:", 1)[1].strip() for n in lines if ": note:" in n)
    assert re.search(r'"NoAlive" is missing following "Backend" protocol member: alive$', notes), notes
