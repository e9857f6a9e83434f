"""One engine adapter (issue 28): an arm is the same engine and the same router on every
backend. The local backend's GPU command lines and the Kubernetes containers' arguments of
every example arm (and of an arm with every engine knob) agree flag for flag once the values
that say where a process runs (host, port, how workers are found) are set aside; vLLM's flag
and metric names are written in the vLLM adapter only."""

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
from orchestrator.engines import engine_for
from orchestrator.errors import UserError
from orchestrator.plan import GPUS, Plan, load_plan_file, validate_plan
from tests.unit.test_local_commands import _knobs_plan

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.yaml") if load_plan_file(p).backend != "external")
SETTINGS = LocalSettings(python="/opt/vllm/bin/python", router="/opt/orch/bin/vllm-router")
LAUNCHER = ("/opt/vllm/bin/python", "-m", "vllm.entrypoints.cli.main", "serve")
# Where a process runs, not what it does: values set aside before comparing.
PLACE_VALUES = {"--host", "--port", "--prometheus-host", "--prometheus-port"}
# How the router finds its workers: by URL on one host, by label on a cluster.
DISCOVERY = {"--worker-urls": -1, "--prefill": 1, "--decode": 1, "--worker-startup-check-interval": 1,
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
    return out + [(f"knobs-{arm}", knobs, arm) for arm in knobs.arms]


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


def _local(plan: Plan, arm: str) -> dict[str, list[str]]:
    gpu = GPUS[plan.arm(arm).gpu or "H100"].node_labels[0].replace("-", " ")
    layout = local_render(plan, arm, Device(kind="cuda", gpus=64, name=gpu), SETTINGS, sequential_ports(8100),
                          Path("/run/orch/x"), "x")
    out: dict[str, list[str]] = {}
    for e in layout.engines:
        assert e.argv[:4] == LAUNCHER
        out.setdefault(e.role, list(e.argv[4:]))
    out["router"] = list(layout.router.argv[1:])
    return out


def _k8s(plan: Plan, arm: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for obj in k8s_render(plan, arm, RunKey(plan.name, arm, 0)):
        if obj["kind"] != "Deployment":
            continue
        role = obj["metadata"]["labels"][naming.ROLE_LABEL]
        out[role] = list(obj["spec"]["template"]["spec"]["containers"][0]["args"])
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


# vLLM's own spellings: the flags the project renders, and its metric namespace.
VLLM_FLAG = re.compile(r"--(?:max-num-seqs|max-num-batched-tokens|kv-cache-dtype|(?:no-)?enable-prefix-caching|"
                       r"gpu-memory-utilization|speculative-config|kv-transfer-config|served-model-name|"
                       r"tensor-parallel-size|quantization|max-model-len|disable-retries|disable-circuit-breaker|"
                       r"cache-threshold|balance-abs-threshold|vllm-pd-disaggregation|kv-connector|policy|"
                       r"worker-urls|prefill|decode)")
VLLM_METRIC = re.compile(r"vllm:[a-z_]+")
def _vllm_names(source: str) -> set[str]:
    """vLLM flag and metric names written as string literals (docstrings and the project's own
    command-line options, which may share a spelling, are not engine command lines)."""
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
                and (VLLM_FLAG.fullmatch(node.value) or VLLM_METRIC.match(node.value))):
            found.add(node.value)
    return found


def test_the_name_check_finds_a_flag_and_a_metric() -> None:
    src = 'def f():\n    """Mentions --max-num-seqs."""\n    return ["--max-num-seqs", f"vllm:num_requests_running{x}"]\n'
    assert _vllm_names(src) == {"--max-num-seqs", "vllm:num_requests_running"}
    assert _vllm_names('o = typer.Option(1, "--max-num-seqs")\n') == set()


def test_vllm_flags_and_metric_names_are_written_in_the_vllm_adapter_only() -> None:
    offenders = []
    for path in sorted((ROOT / "orchestrator").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "orchestrator/engines/vllm.py":
            continue
        found = _vllm_names(path.read_text())
        if found:
            offenders.append(f"{rel}: {sorted(found)}")
    assert not offenders, "\n".join(offenders)
