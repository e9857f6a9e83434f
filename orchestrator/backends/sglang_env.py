"""The SGLang parser environment of the sglang test tier: built by the project, once per machine.

``python -m orchestrator.backends.sglang_env build`` (the ``make sglang`` target) creates, in the
per-user cache keyed by the SGLang version (``~/.cache/orchestrator/sglang-parsers-0.5.23``;
``ORCH_CACHE_DIR`` overrides), ``venv/``: a virtual environment in which SGLang's and
sglang_router's own argument parsers (``sglang.srt.server_args.ServerArgs``,
``sglang_router.router_args.RouterArgs``, the Rust ``Router`` built from them) import and run.
tests/sglang/ runs every SGLang command line the project renders through them.

It is a PARSER-ONLY environment, never a server: ``pip install sglang`` asks for torch 2.14.1
and CUDA-only wheels (flashinfer, sglang-kernel, nvidia-cutlass-dsl, ...), so SGLang has no CPU
install. Here sglang and sglang-router are installed with ``--no-deps`` on the CPU build of torch
(the same local wheel as the vLLM tier's), plus the pure-Python packages the parsers import,
pinned (``PARSER_DEPS``). ``launch_server`` is installed but cannot serve (no CPU kernels), so
this interpreter is no ``ORCH_SGLANG_PYTHON`` for the local backend.

The build is redone when its recipe changes and reused otherwise: a marker file holding the
recipe is written last, so an interrupted build is redone; a lock file keeps two builds on one
machine from running at once. ``status`` prints where it is and whether it is complete; ``path``
prints its interpreter (exit 1 when not built).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from orchestrator.backends.vllm_env import (  # the local CPU wheel, as pip finds it
    TORCH_VERSION,
    BuildError,
    run_step,
)
from orchestrator.paths import cache_root
from orchestrator.plan.catalog import SGLANG_VERSION  # the tested version, one place for all

SGLANG_ROUTER_VERSION = "0.3.2"  # the sglang_router whose flags orchestrator/engines/sglang.py uses
# What `import sglang.srt.server_args, sglang_router.router_args, sglang_router.router` needs
# beyond torch (found by blocking each import), pinned to versions tested together. setproctitle,
# uvicorn and fastapi are for `import sglang_router.launch_router`, which the parsers do not need.
PARSER_DEPS = (
    "aiohttp==3.14.5", "fastapi==0.165.0", "ipython==9.18.1", "msgspec==0.23.0", "numpy==2.4.6",
    "orjson==3.13.0", "packaging==26.4", "pillow==13.0.0", "psutil==7.2.2", "pybase64==1.5.1",
    "pydantic==2.14.4", "pyzmq==27.3.0", "requests==2.34.2", "setproctitle==1.3.8",
    "starlette==1.10.0", "tqdm==4.70.1", "triton==3.9.0", "uvicorn==0.55.0",
)
READY_MARKER = ".complete"
# Run in the new venv before the marker is written: the parsers import, the launchers exist and
# torch is the CPU build (a CUDA torch here would mean pip did not take the local wheel).
_PROBE = (
    "import importlib.util, json, torch, sglang, sglang.srt.server_args, sglang_router.router_args, "
    "sglang_router.router\n"
    "assert torch.version.cuda is None, f'torch {torch.__version__} is a CUDA build'\n"
    "for m in ('sglang.launch_server', 'sglang_router.launch_router'):\n"
    "    assert importlib.util.find_spec(m), f'no module {m}'\n"
    "print(json.dumps({'sglang': sglang.__version__, 'torch': torch.__version__}))"
)


def recipe() -> dict[str, object]:
    """What a build installs; a build with another recipe is redone."""
    return {"sglang": SGLANG_VERSION, "sglang_router": SGLANG_ROUTER_VERSION, "torch": TORCH_VERSION,
            "deps": list(PARSER_DEPS)}


def recipe_hash() -> str:
    return hashlib.sha256(json.dumps(recipe(), sort_keys=True).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class SglangEnv:
    """Where the SGLang parser environment lives."""

    root: Path

    @classmethod
    def default(cls) -> SglangEnv:
        return cls(cache_root() / f"sglang-parsers-{SGLANG_VERSION}")

    @property
    def venv(self) -> Path:
        return self.root / "venv"

    @property
    def python(self) -> Path:
        return self.venv / "bin" / "python"

    def ready(self) -> bool:
        """Built completely, with today's recipe."""
        try:
            marker = json.loads((self.venv / READY_MARKER).read_text())
        except (OSError, ValueError):
            return False
        return isinstance(marker, dict) and marker.get("recipe") == recipe_hash() and self.python.exists()

    def describe(self) -> dict[str, object]:
        return {"root": str(self.root), "python": str(self.python), "ready": self.ready(),
                "sglang_version": SGLANG_VERSION, "sglang_router_version": SGLANG_ROUTER_VERSION}


def build(env: SglangEnv, python: str = sys.executable) -> None:
    """Create the parser environment unless a complete one with today's recipe is there."""
    if env.ready():
        print(f"SGLang parser environment present: {env.venv}")
        return
    env.root.mkdir(parents=True, exist_ok=True)
    with open(env.root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another build on this machine: wait for it
        if env.ready():
            print(f"SGLang parser environment present: {env.venv}")
            return
        if env.venv.exists():
            shutil.rmtree(env.venv)  # interrupted, or an older recipe: start again
        run_step([python, "-m", "venv", str(env.venv)])
        pip = [str(env.python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
        # pip (not uv): the machine's pip configuration points at the local CPU torch wheel.
        run_step([*pip, f"torch=={TORCH_VERSION}", *PARSER_DEPS])
        # --no-deps: their declared dependencies are the CUDA-only server stack.
        run_step([*pip, "--no-deps", f"sglang=={SGLANG_VERSION}", f"sglang-router=={SGLANG_ROUTER_VERSION}"])
        run_step([str(env.python), "-c", _PROBE])
        marker = {**recipe(), "recipe": recipe_hash()}
        (env.venv / READY_MARKER).write_text(json.dumps(marker) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m orchestrator.backends.sglang_env")
    parser.add_argument("action", choices=("build", "status", "path"),
                        help="build (reuse what exists), status, or path (the interpreter, when built)")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the new venv")
    args = parser.parse_args(argv)
    env = SglangEnv.default()
    if args.action == "status":
        print(json.dumps(env.describe(), indent=2))
        return 0 if env.ready() else 1
    if args.action == "path":
        if not env.ready():
            print(f"no SGLang parser environment at {env.venv}: make sglang", file=sys.stderr)
            return 1
        print(env.python)
        return 0
    try:
        build(env, python=args.python)
    except (BuildError, OSError) as e:
        print(f"building the SGLang parser environment in {env.venv} failed: {e} (its output is above); "
              "rerun `make sglang` (network, disk, or a pinned version gone from the index)", file=sys.stderr)
        return 1
    print(json.dumps(env.describe(), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
