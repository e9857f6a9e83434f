"""One engine adapter per engine (issue 28): an arm is the same engine and the same router on
every backend. The local backend's GPU command lines and the Kubernetes containers' arguments
of every example arm (and of arms with every engine knob, on vLLM and on SGLang) agree flag for
flag once the values that say where a process runs (host, port, how workers are found) are set
aside; each engine's flag and metric names are written in its adapter only (a flag both engines
spell alike may be in both adapters, nowhere else)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from orchestrator.backends.base import RunKey
from orchestrator.backends.kubernetes import naming
from orchestrator.backends.kubernetes.render import render_arm as k8s_render
from orchestrator.backends.local import Device, LocalSettings, sequential_ports
from orchestrator.backends.local import render_arm as local_render
from orchestrator.engines import ENGINES, engine_for
from orchestrator.errors import EnvironmentProblem, UserError
from orchestrator.plan import GPUS, Plan, load_plan_file, validate_plan
from tests.unit.test_local_commands import _knobs_plan

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.yaml") if load_plan_file(p).backend != "external")
SETTINGS = LocalSettings(python="/opt/vllm/bin/python", router="/opt/orch/bin/vllm-router",
                         sglang_python="/opt/sglang/bin/python")
LAUNCHERS = {"vllm": ("/opt/vllm/bin/python", "-m", "vllm.entrypoints.cli.main", "serve"),
             "sglang": ("/opt/sglang/bin/python", "-m", "sglang.launch_server")}
ROUTERS = {"vllm": ("/opt/orch/bin/vllm-router",), "sglang": ("/opt/sglang/bin/python", "-m", "sglang_router.launch_router")}
# Where a process runs, not what it does: values set aside before comparing (SGLang's prefill
# bootstrap port: one drawn per worker on one host, its default in each pod on a cluster).
PLACE_VALUES = {"--host", "--port", "--prometheus-host", "--prometheus-port", "--disaggregation-bootstrap-port"}
# How the router finds its workers: by URL on one host (a prefill worker's with its bootstrap
# port on SGLang), by label on a cluster.
DISCOVERY = {"--worker-urls": -1, "--prefill": -1, "--decode": 1, "--worker-startup-check-interval": 1,
             "--worker-startup-timeout-secs": 1, "--service-discovery": 0, "--service-discovery-port": 1,
             "--service-discovery-namespace": 1, "--selector": 2, "--prefill-selector": 2,
             "--decode-selector": 2}


def _cases() -> list[tuple[str, Plan, str]]:
    out = [(f"{p.stem}-{arm}", load_plan_file(p), arm) for p in EXAMPLES for arm in load_plan_file(p).arms
           if not load_plan_file(p).arm(arm).external]
    # Every engine knob; its P/D arm on NIXL (the shared-folder connector is one machine's).
    data = _knobs_plan().model_dump(mode="json", by_alias=True)
    data["arms"]["B"]["kv_connector"] = "nixl"
    knobs = validate_plan(data)
    sglang = sglang_knobs_plan()
    return out + [(f"knobs-{arm}", knobs, arm) for arm in knobs.arms] + \
        [(f"sglang-knobs-{arm}", sglang, arm) for arm in sglang.arms]


def sglang_knobs_plan() -> Plan:
    """Every engine knob on SGLang arms: colocated (ngram drafting, every knob off its default),
    P/D on NIXL with EAGLE drafting and the cache-aware router, P/D on Mooncake with MTP."""
    data = _knobs_plan().model_dump(mode="json", by_alias=True)
    data["name"] = "sglang-knobs"
    a, b = data["arms"]["A"], data["arms"]["B"]
    for arm in (a, b):
        arm["engine"]["kind"] = "sglang"
        arm["engine"].pop("version")
    a["engine"]["extra_args"] = ["--disable-cuda-graph"]  # passed through: SGLang's own flag
    b["kv_connector"] = "nixl"
    b["router"] = {"policy": "cache_aware", "cache_threshold": 0.4, "balance_abs_threshold": 16}
    c = {**b, "kv_connector": "mooncake", "router": None,
         "engine": {"kind": "sglang", "speculative": {"method": "mtp", "num_speculative_tokens": 1}}}
    data["arms"]["C"] = c
    data["bars"] = [{**data["bars"][0], "compare": "B/A"}]
    return validate_plan(data)


CASES = _cases()


def _semantic(args: list[str] | tuple[str, ...]) -> list[str]:
    """The arguments with place values blanked and worker discovery removed."""
    out: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in DISCOVERY:
            n = DISCOVERY[a]
            if n < 0:  # every value up to the next flag
                i += 1
                while i < len(args) and not args[i].startswith("--"):
                    i += 1
            else:
                i += 1 + n
            continue
        out.append(a)
        if a in PLACE_VALUES:
            out.append("<place>")
            i += 2
            continue
        i += 1
    return out


def _local(plan: Plan, arm: str, settings: LocalSettings = SETTINGS) -> dict[str, list[str]]:
    kind = plan.arm(arm).engine.kind
    gpu = GPUS[plan.arm(arm).gpu or "H100"].node_labels[0].replace("-", " ")
    layout = local_render(plan, arm, Device(kind="cuda", gpus=64, name=gpu), settings, sequential_ports(8100),
                          Path("/run/orch/x"), "x")
    out: dict[str, list[str]] = {}
    launcher, router = LAUNCHERS[kind], ROUTERS[kind]
    for e in layout.engines:
        assert e.argv[:len(launcher)] == launcher
        out.setdefault(e.role, list(e.argv[len(launcher):]))
    assert layout.router.argv[:len(router)] == router
    out["router"] = list(layout.router.argv[len(router):])
    return out


def _k8s(plan: Plan, arm: str) -> dict[str, list[str]]:
    """Each Deployment's container arguments (after its command: the image's serve command
    for the engine, its router's for the router)."""
    out: dict[str, list[str]] = {}
    for obj in k8s_render(plan, arm, RunKey(plan.name, arm, 0)):
        if obj["kind"] != "Deployment":
            continue
        role = obj["metadata"]["labels"][naming.ROLE_LABEL]
        c = obj["spec"]["template"]["spec"]["containers"][0]
        if role != "router":
            assert tuple(c["command"]) == engine_for(plan.arm(arm)).container.command
        out[role] = list(c["args"])
    return out


@pytest.mark.parametrize(("name", "plan", "arm"), CASES, ids=[c[0] for c in CASES])
def test_local_and_kubernetes_render_the_same_engine_and_router(name: str, plan: Plan, arm: str) -> None:
    local, k8s = _local(plan, arm), _k8s(plan, arm)
    assert set(local) == set(k8s), name
    for role in local:
        assert _semantic(local[role]) == _semantic(k8s[role]), f"{name} {role}"
    # Requests carry the name the engines serve under, on both.
    served = engine_for(plan.arm(arm)).served_name(plan)
    for role in set(local) - {"router"}:
        assert local[role][local[role].index("--served-model-name") + 1] == served
        assert k8s[role][k8s[role].index("--served-model-name") + 1] == served


def test_kubernetes_refuses_the_shared_folder_connector() -> None:
    plan = _knobs_plan()  # arm B: kv_connector example
    with pytest.raises(UserError, match=r"arms\.B\.kv_connector: example"):
        k8s_render(plan, "B", RunKey(plan.name, "B", 0))
    assert "--kv-transfer-config" in " ".join(_local(plan, "B")["prefill"])  # one machine: fine


def test_the_comparison_sees_a_difference() -> None:
    # A negative control: a flag of the engine's own differs, and the comparison says so.
    plan = load_plan_file(EXAMPLES[0])
    arm = next(iter(plan.arms))
    local = _local(plan, arm)
    role = next(r for r in local if r != "router")
    changed = [*local[role][:-1], "--enforce-eager"]
    assert _semantic(changed) != _semantic(_k8s(plan, arm)[role])


# Each engine's own spellings: the flags the project renders for it and its metric namespace
# (SGLang's --device is left out: the project's own probe commands spell one too).
VLLM_FLAG = re.compile(r"--(?:max-num-seqs|max-num-batched-tokens|kv-cache-dtype|(?:no-)?enable-prefix-caching|"
                       r"gpu-memory-utilization|speculative-config|kv-transfer-config|served-model-name|"
                       r"tensor-parallel-size|quantization|max-model-len|disable-retries|disable-circuit-breaker|"
                       r"cache-threshold|balance-abs-threshold|vllm-pd-disaggregation|kv-connector|policy|"
                       r"worker-urls|prefill|decode)")
SGLANG_FLAG = re.compile(r"--(?:model-path|tp-size|max-running-requests|chunked-prefill-size|max-prefill-tokens|"
                         r"kv-cache-dtype|enable-metrics|disable-radix-cache|mem-fraction-static|"
                         r"context-length|quantization|served-model-name|speculative-[a-z-]+|"
                         r"disaggregation-[a-z-]+|pd-disaggregation|disable-retries|disable-circuit-breaker|"
                         r"cache-threshold|balance-abs-threshold|policy|worker-urls|prefill|decode)")
ENGINE_NAMES = {  # engine -> (its flags, its metric names), written in orchestrator/engines/<engine>.py only
    "vllm": (VLLM_FLAG, re.compile(r"vllm:[a-z_]+")),
    "sglang": (SGLANG_FLAG, re.compile(r"sglang:[a-z_]+")),
}


def _engine_names(source: str, engine: str = "vllm") -> set[str]:
    """An engine's flag and metric names written as string literals (docstrings and the
    project's own command-line options, which may share a spelling, are not engine command
    lines)."""
    flag, metric = ENGINE_NAMES[engine]
    tree = ast.parse(source)
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) == "Option":
            skip.update(id(c) for c in ast.walk(node))
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) \
                and isinstance(body[0].value, ast.Constant):
            skip.add(id(body[0].value))  # a docstring
    found: set[str] = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
                and (flag.fullmatch(node.value) or metric.match(node.value))):
            found.add(node.value)
    return found


def test_the_name_check_finds_a_flag_and_a_metric() -> None:
    src = 'def f():\n    """Mentions --max-num-seqs."""\n    return ["--max-num-seqs", f"vllm:num_requests_running{x}"]\n'
    assert _engine_names(src) == {"--max-num-seqs", "vllm:num_requests_running"}
    assert _engine_names('o = typer.Option(1, "--max-num-seqs")\n') == set()
    src = 'ARGS = ["--mem-fraction-static", "--speculative-eagle-topk", "sglang:num_queue_reqs"]\n'
    assert _engine_names(src, "sglang") == {"--mem-fraction-static", "--speculative-eagle-topk",
                                            "sglang:num_queue_reqs"}
    assert _engine_names(src, "vllm") == set()


# The emulated cluster's kubelet reads a vLLM container's command line as `vllm serve` does: an
# independent stand-in for vLLM's own parser, so it spells vLLM's flags itself. Were it to take
# them from the adapter, a flag the adapter misspells would pass the emulator and fail on a real
# cluster. It is the one module outside the adapters that may (and must) write them.
ENGINE_STAND_INS = {"orchestrator/kcluster/containers.py"}


def test_the_stand_in_parser_still_reads_the_adapters_flags() -> None:
    # the exemption is only for a module that really parses engine flags
    for rel in ENGINE_STAND_INS:
        assert _engine_names((ROOT / rel).read_text(), "vllm") >= {"--max-num-seqs", "--kv-cache-dtype"}


@pytest.mark.parametrize("engine", sorted(ENGINE_NAMES))
def test_engine_flags_and_metric_names_are_written_in_the_engine_adapters_only(engine: str) -> None:
    # A flag of this engine may be in its adapter, or in another engine's adapter that has the
    # same flag (--served-model-name is both engines'); in no other module.
    assert set(ENGINE_NAMES) == set(ENGINES)
    offenders = []
    for path in sorted((ROOT / "orchestrator").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        found = _engine_names(path.read_text(), engine)
        if rel == f"orchestrator/engines/{engine}.py" or rel in ENGINE_STAND_INS:
            continue
        other = rel.removeprefix("orchestrator/engines/").removesuffix(".py")
        if rel.startswith("orchestrator/engines/") and other in ENGINE_NAMES:
            found = {n for n in found if not (ENGINE_NAMES[other][0].fullmatch(n) or ENGINE_NAMES[other][1].match(n))}
        if found:
            offenders.append(f"{rel}: {sorted(found)}")
    assert not offenders, "\n".join(offenders)


# -- SGLang arms -------------------------------------------------------------------------------
def test_an_sglang_arm_renders_sglang_on_both_backends() -> None:
    plan = sglang_knobs_plan()
    local, k8s = _local(plan, "A"), _k8s(plan, "A")
    args = local["worker"]
    assert args[:2] == ["--model-path", plan.model.hf_id]
    for flag, value in (("--tp-size", "2"), ("--max-running-requests", "128"), ("--chunked-prefill-size", "4096"),
                        ("--kv-cache-dtype", "fp8_e4m3"), ("--mem-fraction-static", "0.85"),
                        ("--context-length", "8192"), ("--quantization", "fp8"),
                        ("--speculative-algorithm", "NGRAM"), ("--speculative-num-draft-tokens", "3")):
        assert args[args.index(flag) + 1] == value, flag
    assert "--disable-radix-cache" in args and "--enable-metrics" in args and args[-1] == "--disable-cuda-graph"
    assert local["router"][local["router"].index("--policy") + 1] == "power_of_two"
    assert _semantic(local["worker"]) == _semantic(k8s["worker"])
    # P/D: the transfer backend and the roles; each local prefill worker its own bootstrap port,
    # the router told it beside the URL; on a cluster the default port and the pod annotation.
    b = _local(plan, "B")
    assert b["prefill"][b["prefill"].index("--disaggregation-mode") + 1] == "prefill"
    assert b["decode"][b["decode"].index("--disaggregation-transfer-backend") + 1] == "nixl"
    assert "--disaggregation-bootstrap-port" not in b["decode"]
    router = b["router"]
    assert "--pd-disaggregation" in router and router.count("--prefill") == 2
    i = router.index("--prefill")
    assert router[i + 1].startswith("http://127.0.0.1:") and router[i + 2].isdigit()
    objs = k8s_render(plan, "B", RunKey(plan.name, "B", 0))
    pods = {o["metadata"]["labels"][naming.ROLE_LABEL]: o["spec"]["template"] for o in objs if o["kind"] == "Deployment"}
    assert pods["prefill"]["metadata"]["annotations"] == {"sglang.ai/bootstrap-port": "8998"}
    assert "annotations" not in pods["decode"]["metadata"]
    c = pods["prefill"]["spec"]["containers"][0]
    assert c["image"] == "lmsysorg/sglang:v0.5.23"
    assert c["startupProbe"]["httpGet"]["path"] == "/health" == c["readinessProbe"]["httpGet"]["path"]
    assert all(not e["name"].startswith("VLLM_") for e in c["env"])
    r = pods["router"]["spec"]["containers"][0]
    assert r["image"] == "lmsysorg/sglang:v0.5.23" and r["command"] == ["python3", "-m", "sglang_router.launch_router"]
    c = _local(plan, "C")["prefill"]
    assert c[c.index("--disaggregation-transfer-backend") + 1] == "mooncake"
    assert c[c.index("--speculative-algorithm") + 1] == "NEXTN"


def test_an_sglang_arm_without_an_sglang_environment_is_refused_by_name() -> None:
    plan = sglang_knobs_plan()
    bare = SETTINGS.model_copy(update={"sglang_python": None})
    with pytest.raises(EnvironmentProblem, match=r"arms\.A serves sglang.*ORCH_SGLANG_PYTHON"):
        _local(plan, "A", bare)
