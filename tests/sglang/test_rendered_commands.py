"""SGLang's own parsers judge every SGLang command line the project renders (parse, never serve).

Engine command lines: every SGLang arm of every example plan and the SGLang knob arms of
tests/unit/test_engine_adapter.py (every knob, both P/D roles, NIXL and Mooncake, every
drafting method the plan maps), as the local backend (GPU box) and Kubernetes render them. Each
runs, in the SGLang interpreter (ORCH_SGLANG_PYTHON, else the parser-only environment of
``make sglang``; all of the module's commands in one run of it, which imports torch), through
``ServerArgs.add_cli_args`` on a parser that refuses abbreviations, then
``ServerArgs.from_cli_args``; the launcher module (``sglang.launch_server``) must be installed
there. Router command lines (local static URLs,
Kubernetes service discovery, the sim backend's) go through ``RouterArgs.add_cli_args``,
``RouterArgs.from_cli_args`` and ``_validate_router_args``, and the Rust ``Router`` is built
from them (``Router.from_args``, not started). Negative controls prove each checker refuses
what it should.

What installing SGLang here found (2 cores, Python 3.11, torch 2.13.0 CPU from a local wheel):
``pip install sglang==0.5.23`` asks for torch==2.14.1 and CUDA-only wheels (flashinfer cu13,
sglang-kernel, nvidia-cutlass-dsl, ...), so the full install is not a CPU one; ``pip install
--no-deps sglang==0.5.23 sglang-router==0.3.2`` plus the few pure-Python packages its argument
parser imports (numpy, orjson, psutil, pybase64, requests, triton, packaging, pillow, starlette,
msgspec, pydantic, pyzmq, tqdm, IPython, aiohttp; setproctitle, uvicorn, fastapi for the router)
gives an environment where both parsers import and run (2.3 GB with torch: torch and triton are
three quarters of it, and sglang's utilities import both). A server cannot start in it (no CPU
kernels), so this tier parses only. orchestrator/backends/sglang_env.py builds exactly that
environment, pinned (``make sglang``).
"""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from orchestrator.backends.base import RunKey
from orchestrator.backends.kubernetes import naming
from orchestrator.backends.kubernetes.render import render_arm as k8s_render
from orchestrator.backends.local import Device, LocalSettings, sequential_ports
from orchestrator.backends.local import render_arm as local_render
from orchestrator.backends.sim import SimBackend
from orchestrator.engines import engine_for
from orchestrator.plan import GPUS, Plan, load_plan_file
from tests.sglang.conftest import sglang_python
from tests.unit.test_engine_adapter import sglang_knobs_plan

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.yaml") if load_plan_file(p).backend != "external")
PY = "/opt/sglang/bin/python"
SETTINGS = LocalSettings(python="/opt/vllm/bin/python", router="/opt/orch/bin/vllm-router", sglang_python=PY)
LAUNCHER = (PY, "-m", "sglang.launch_server")
ROUTER = (PY, "-m", "sglang_router.launch_router")

CHECK = textwrap.dedent(
    r'''
    import argparse, contextlib, importlib.util, io, json, sys
    from sglang.srt.server_args import ServerArgs
    from sglang_router.router import Router
    from sglang_router.router_args import RouterArgs

    cmds = json.loads(open(sys.argv[1]).read())
    out = {}

    def parse(add, argv):
        p = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
        add(p)
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                return p.parse_args(argv), None
            except (SystemExit, argparse.ArgumentError) as e:
                return None, (err.getvalue().strip().splitlines() or [str(e)])[-1]

    for name, (kind, module, argv) in cmds.items():
        try:
            if importlib.util.find_spec(module) is None:
                out[name] = f"no module {module}"
                continue
            if kind == "engine":
                ns, err = parse(ServerArgs.add_cli_args, argv)
                if err:
                    out[name] = err
                    continue
                sa = ServerArgs.from_cli_args(ns)
                out[name] = {"ok": True, "model_path": sa.model_path, "tp_size": sa.tp_size,
                             "disaggregation_mode": sa.disaggregation_mode}
            else:
                ns, err = parse(lambda p: RouterArgs.add_cli_args(p, use_router_prefix=False), argv)
                if err:
                    out[name] = err
                    continue
                ra = RouterArgs.from_cli_args(ns, use_router_prefix=False)
                ra._validate_router_args()
                Router.from_args(ra)
                out[name] = {"ok": True, "policy": ns.policy, "pd": bool(ra.pd_disaggregation)}
        except Exception as e:  # reported per command
            out[name] = f"{type(e).__name__}: {e}"
    print(json.dumps(out, default=str))
    '''
)


def _sglang_arms() -> list[tuple[str, Plan, str]]:
    out = [(f"{p.stem}-{a}", load_plan_file(p), a) for p in EXAMPLES for a in load_plan_file(p).arms
           if load_plan_file(p).arm(a).engine.kind == "sglang"]
    knobs = sglang_knobs_plan()
    return out + [(f"sglang-knobs-{a}", knobs, a) for a in knobs.arms]


def _commands() -> dict[str, tuple[str, str, list[str]]]:
    """name -> (engine | router, the module it runs, its arguments)."""
    cmds: dict[str, tuple[str, str, list[str]]] = {}
    sim = SimBackend(Path("/run/orch/sim"), use_router=False, log=lambda _m: None)
    for name, plan, arm in _sglang_arms():
        gpu = GPUS[plan.arm(arm).gpu or "H100"].node_labels[0].replace("-", " ")
        layout = local_render(plan, arm, Device(kind="cuda", gpus=64, name=gpu), SETTINGS, sequential_ports(8100),
                              Path("/run/orch/x"), "x")
        for e in layout.engines:
            assert e.argv[:3] == LAUNCHER
            cmds[f"local-{name}-{e.name}"] = ("engine", "sglang.launch_server", list(e.argv[3:]))
        assert layout.router.argv[:3] == ROUTER
        cmds[f"local-{name}-router"] = ("router", "sglang_router.launch_router", list(layout.router.argv[3:]))
        for obj in k8s_render(plan, arm, RunKey(plan.name, arm, 0)):
            if obj["kind"] != "Deployment":
                continue
            role = obj["metadata"]["labels"][naming.ROLE_LABEL]
            c = obj["spec"]["template"]["spec"]["containers"][0]
            module = c["command"][2]  # python3 -m MODULE
            cmds[f"k8s-{name}-{role}"] = ("engine" if role != "router" else "router", module, list(c["args"]))
        workers = {role: [f"http://127.0.0.1:{9000 + i}" for i in range(pool.replicas)]
                   for role, pool in plan.arm(arm).pools().items()}
        argv = sim._router_argv(plan, arm, workers, 8000, 8001)
        cmds[f"sim-{name}-router"] = ("router", "sglang_router.launch_router", argv[3:])
    return cmds


def _check(cmds: dict[str, tuple[str, str, list[str]]], tmp_path: Path) -> dict[str, object]:
    python, _ = sglang_python()
    assert python is not None
    f = tmp_path / "cmds.json"
    f.write_text(json.dumps(cmds))
    script = tmp_path / "check.py"
    script.write_text(CHECK)
    r = subprocess.run([python, str(script), str(f)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    result: dict[str, object] = json.loads(r.stdout.strip().splitlines()[-1])
    return result


OK_ENGINE = ["--model-path", "m", "--tp-size", "1"]
# Negative controls: each checker must refuse these.
REFUSED: dict[str, tuple[str, str, list[str]]] = {
    "misspelled": ("engine", "sglang.launch_server", [*OK_ENGINE, "--max-running-request", "8"]),
    "vllm-flag": ("engine", "sglang.launch_server", [*OK_ENGINE, "--max-num-seqs", "8"]),
    "bad-choice": ("engine", "sglang.launch_server", [*OK_ENGINE, "--kv-cache-dtype", "fp8"]),
    "no-module": ("engine", "sglang.no_such_launcher", OK_ENGINE),
    "router-vllm-pd": ("router", "sglang_router.launch_router", ["--vllm-pd-disaggregation"]),
    "router-policy": ("router", "sglang_router.launch_router",
                      ["--worker-urls", "http://127.0.0.1:1", "--policy", "consistent_hash"]),
}
POLICIES = ["round_robin", "cache_aware", "power_of_two", "random"]


def _policy_router(policy: str) -> tuple[str, str, list[str]]:
    from orchestrator.plan import validate_plan

    data = sglang_knobs_plan().model_dump(mode="json", by_alias=True)
    data["arms"]["A"]["router"] = {"policy": policy}
    plan = validate_plan(data)
    layout = local_render(plan, "A", Device(kind="cuda", gpus=64, name="NVIDIA H100 80GB HBM3"), SETTINGS,
                          sequential_ports(8100), Path("/run/orch/x"), "x")
    return ("router", "sglang_router.launch_router", list(layout.router.argv[3:]))


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Every command of this module judged in one run of the SGLang interpreter (each run
    imports torch and sglang: seconds), keyed rendered/NAME, refused/NAME, control, policy/P."""
    cmds = {f"rendered/{n}": c for n, c in _commands().items()}
    cmds |= {f"refused/{n}": c for n, c in REFUSED.items()}
    cmds["control"] = ("engine", "sglang.launch_server", OK_ENGINE)
    cmds |= {f"policy/{p}": _policy_router(p) for p in POLICIES}
    return _check(cmds, tmp_path_factory.mktemp("sglang"))


def test_sglang_parses_every_rendered_sglang_command(verdicts: dict[str, object]) -> None:
    got = {n.removeprefix("rendered/"): v for n, v in verdicts.items() if n.startswith("rendered/")}
    assert any(n.startswith("k8s-vllm-vs-sglang-B") for n in got), "the example's SGLang arm"
    bad = {n: v for n, v in got.items() if not (isinstance(v, dict) and v.get("ok"))}
    assert not bad, json.dumps(bad, indent=1)
    # The values arrive where the adapter meant them.
    plan = sglang_knobs_plan()
    assert got["local-sglang-knobs-A-worker-0"] == {"ok": True, "model_path": plan.model.hf_id, "tp_size": 2,
                                                   "disaggregation_mode": "null"}
    assert got["k8s-sglang-knobs-B-prefill"]["disaggregation_mode"] == "prefill"  # type: ignore[index]
    assert got["local-sglang-knobs-B-router"]["pd"] is True  # type: ignore[index]
    assert got["k8s-sglang-knobs-B-router"]["policy"] == "cache_aware"  # type: ignore[index]
    assert engine_for(plan.arm("A")).kind == "sglang"


def test_the_checkers_refuse_what_sglang_refuses(verdicts: dict[str, object]) -> None:
    assert verdicts["control"] == {"ok": True, "model_path": "m", "tp_size": 1, "disaggregation_mode": "null"}
    got = {n: verdicts[f"refused/{n}"] for n in REFUSED}
    assert all(isinstance(v, str) for v in got.values()), got


@pytest.mark.parametrize("policy", POLICIES)
def test_every_router_policy_an_sglang_arm_may_name_parses(policy: str, verdicts: dict[str, object]) -> None:
    assert verdicts[f"policy/{policy}"] == {"ok": True, "policy": policy, "pd": False}
