"""The virtual-time engine compiled with mypyc: the same sources, about twice as fast.

The engine's hot modules (worker, chains, cache, routing, virtual) are plain typed Python and
stay the reference: ``python -m orchestrator.sim.native build`` (run by ``make install``)
compiles them with mypyc into the per-user cache, under a key of their exact source bytes and
the interpreter, and ``orchestrator.sim.engine`` loads that build when its key matches the
sources on disk. An edited source therefore never runs stale compiled code: its key changes,
and the interpreted module runs until the next build. ``ORCH_SIM_COMPILED=0`` forces the
interpreted engine (profiling, debugging); the records are the same bit for bit either way
(tests/integration/test_sim_native.py checks it).

Why compiled: every control-logic test and dry run drives this engine in virtual time, and
per-request Python overhead (attribute access, calls) is most of its cost.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
import sysconfig
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

from orchestrator.paths import cache_root

PACKAGE = "orchestrator.sim.engine"
MODULES = ("cache", "chains", "routing", "worker", "virtual")
RECIPE = "1"  # bump when the build's recipe changes (flags, module set)
_ENGINE_DIR = Path(__file__).resolve().parent / "engine"
_EXT = str(sysconfig.get_config_var("EXT_SUFFIX") or ".so")


def build_key(engine_dir: Path = _ENGINE_DIR) -> str:
    """Key of a build: the recipe, the interpreter and the exact bytes of each compiled source."""
    h = hashlib.sha256(f"{RECIPE}\n{sys.version}\n{_EXT}\n".encode())
    for name in MODULES:
        h.update(name.encode() + b"\0" + (engine_dir / f"{name}.py").read_bytes() + b"\0")
    return h.hexdigest()[:20]


def build_dir(key: str | None = None) -> Path:
    return cache_root() / f"sim-native-{key or build_key()}"


class _Finder(MetaPathFinder):
    """Serves the engine's modules (and mypyc's shared library) from one build directory."""

    def __init__(self, where: Path, group: str):
        self.where, self.group = where, group
        self.files = {f"{PACKAGE}.{m}": where / f"{m}{_EXT}" for m in MODULES}
        self.files[group] = where / f"{group}{_EXT}"

    def find_spec(self, fullname: str, path: Sequence[str] | None = None,
                  target: ModuleType | None = None) -> ModuleSpec | None:
        f = self.files.get(fullname)
        return None if f is None else importlib.util.spec_from_file_location(fullname, f)


def install() -> bool:
    """Load the compiled engine for these sources if it was built; False: the interpreted one."""
    if os.environ.get("ORCH_SIM_COMPILED", "1") == "0":
        return False
    if any(isinstance(f, _Finder) for f in sys.meta_path):
        return True
    try:
        where = build_dir()
        group = str(json.loads((where / "manifest.json").read_text())["group"])
    except (OSError, ValueError, KeyError, TypeError):
        return False  # no build, or a damaged one: the interpreted engine
    finder = _Finder(where, group)
    if not all(f.is_file() for f in finder.files.values()):
        return False
    sys.meta_path.insert(0, finder)
    return True


def compiled() -> bool:
    """Whether the engine now imported is the compiled one."""
    from orchestrator.sim.engine import worker

    return not str(worker.__file__).endswith(".py")


def build(force: bool = False) -> Path:
    """Compile the engine's modules into the cache (a no-op when this key is built)."""
    import shutil
    import subprocess
    import tempfile

    key = build_key()
    out = build_dir(key)
    if (out / "manifest.json").is_file() and not force:
        return out
    package_root = _ENGINE_DIR.parent.parent  # the orchestrator package
    with tempfile.TemporaryDirectory(prefix="orch-sim-native-") as tmp:
        work = Path(tmp)
        shutil.copytree(package_root, work / "orchestrator",
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"))
        sources = [f"orchestrator/sim/engine/{m}.py" for m in MODULES]
        proc = subprocess.run([sys.executable, "-m", "mypyc", *sources], cwd=work,
                              capture_output=True, text=True, env={**os.environ, "MYPYC_OPT_LEVEL": "3"})
        if proc.returncode != 0:
            raise RuntimeError(f"mypyc failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
        groups = list(work.glob(f"*__mypyc{_EXT}"))
        if len(groups) != 1:
            raise RuntimeError(f"mypyc built {len(groups)} shared libraries, expected 1")
        out.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))
        for m in MODULES:
            shutil.copy2(work / "orchestrator" / "sim" / "engine" / f"{m}{_EXT}", staged / f"{m}{_EXT}")
        group = groups[0].name.removesuffix(_EXT)
        shutil.copy2(groups[0], staged / groups[0].name)
        (staged / "manifest.json").write_text(json.dumps({"group": group, "modules": list(MODULES),
                                                          "python": sys.version}))
        try:
            staged.rename(out)  # atomic: a concurrent reader sees no build or a whole one
        except OSError:
            shutil.rmtree(staged, ignore_errors=True)  # another process built it first
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m orchestrator.sim.native build [--force] [--optional]``: --optional (make
    install) warns and succeeds when the build fails (no C compiler): the engine then runs
    interpreted, slower but the same."""
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] != "build":
        print("usage: python -m orchestrator.sim.native build [--force] [--optional]", file=sys.stderr)
        return 2
    try:
        out = build(force="--force" in args)
    except (RuntimeError, OSError) as e:
        print(f"compiled simulator engine not built ({str(e).splitlines()[0]}); "
              "the interpreted engine runs instead", file=sys.stderr)
        return 0 if "--optional" in args else 1
    print(f"compiled simulator engine: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
