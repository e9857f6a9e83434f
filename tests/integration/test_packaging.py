"""The wheel carries what an installed orchestrator needs beyond its modules: the migrations
(the store creates its schema from them), the Kubernetes manifest bases, and ``py.typed`` (the
package is type-checked; a checker of an importing project reads its annotations)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    uv = shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([uv, "build", "--wheel", "-q", "-o", str(out), str(ROOT)], check=True, timeout=600)
    return next(out.glob("orchestrator-*.whl"))


def test_the_wheel_ships_migrations_and_manifests(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for rev in (ROOT / "migrations" / "versions").glob("*.py"):
        assert f"orchestrator/_data/migrations/versions/{rev.name}" in names
    assert "orchestrator/_data/migrations/env.py" in names
    for base in (ROOT / "manifests").glob("*.yaml"):
        assert f"orchestrator/_data/manifests/{base.name}" in names
    assert "orchestrator/py.typed" in names
    # subpackages are found, not listed: the local backend's package ships whole
    for part in ("__init__", "backend", "commands", "device", "settings"):
        assert f"orchestrator/backends/local/{part}.py" in names


def test_an_installed_wheel_migrates_a_new_database_and_renders_manifests(wheel: Path, tmp_path: Path) -> None:
    unpacked = tmp_path / "site"
    zipfile.ZipFile(wheel).extractall(unpacked)
    # -S: no site hooks, so the checkout's editable install cannot shadow the unpacked wheel;
    # third-party packages come from this interpreter's site-packages.
    code = (
        "import orchestrator, sys\n"
        f"assert orchestrator.__file__.startswith({str(unpacked)!r}), orchestrator.__file__\n"
        "from orchestrator.store import Store\n"
        f"s = Store.open('sqlite:///{tmp_path / 'x.db'}')\n"
        "from orchestrator.store.database import current_revision, head_revision\n"
        "assert current_revision(s.engine) == head_revision(), current_revision(s.engine)\n"
        "from orchestrator.backends.kubernetes.render import manifests_dir\n"
        f"assert str(manifests_dir()).startswith({str(unpacked)!r})\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(unpacked), sysconfig.get_paths()["purelib"]])}
    env.pop("ORCH_MANIFESTS_DIR", None)
    out = subprocess.run([sys.executable, "-S", "-c", code], env=env, cwd=tmp_path, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "ok"
