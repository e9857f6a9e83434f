"""Golden tests of the local backend's command lines: what `vllm serve` and vllm-router get.

The expected files live in tests/fixtures/local/. ORCH_REGENERATE_GOLDEN=1 rewrites them and
still fails, so a stale file never passes silently.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
import yaml

from orchestrator.backends.base import RunKey
from orchestrator.backends.local import (
    CpuShare,
    Device,
    LocalBackend,
    LocalSettings,
    cpu_shares,
    model_source,
    render_arm,
    sequential_ports,
)
from orchestrator.backends.vllm_env import TINY_MODEL_ID
from orchestrator.errors import PermanentError
from orchestrator.plan import GPUS, Plan, load_plan_file, validate_plan

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "fixtures" / "local"
# Examples whose arms are provisioned (an external arm runs elsewhere: nothing to render).
EXAMPLES = sorted(p for p in (ROOT / "examples").glob("*.yaml") if load_plan_file(p).backend != "external")
EXTERNAL = ROOT / "examples" / "external-ab.yaml"
SETTINGS = LocalSettings(python="/opt/vllm/bin/python", router="/opt/orch/bin/vllm-router",
                         tiny_model_dir="/cache/tiny-llama", sglang_python="/opt/sglang/bin/python")
RUN_DIR = Path("/run/orch/exp/exp-a-b0-t0")


def _gpu_box(plan: Plan, arm: str, gpus: int = 8) -> Device:
    # nvidia-smi's name for the arm's GPU type: the node label with spaces.
    return Device(kind="cuda", gpus=gpus, name=GPUS[plan.arm(arm).gpu].node_labels[0].replace("-", " "))


def _render(plan: Plan, arm: str, device: Device) -> str:
    layout = render_arm(plan, arm, device, SETTINGS, sequential_ports(8100), RUN_DIR, "exp-a-b0-t0")
    return layout.describe()


def _check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("ORCH_REGENERATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        pytest.fail(f"regenerated {path.relative_to(ROOT)}; unset ORCH_REGENERATE_GOLDEN and re-run")
    assert path.exists(), f"missing golden file {path}; run with ORCH_REGENERATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from the expected command lines"


def _knobs_plan() -> Plan:
    """Every engine knob the command line carries, on both layouts."""
    data = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    data["name"] = "knobs"
    data["arms"] = {
        "A": {"gpu": "H100", "layout": "colocated", "replicas": 2, "tp": 2,
              "engine": {"kv_cache_dtype": "fp8", "quantization": "fp8", "max_num_seqs": 128,
                         "max_num_batched_tokens": 4096, "prefix_caching": False,
                         "gpu_memory_utilization": 0.85, "max_model_len": 8192,
                         "speculative": {"method": "ngram", "num_speculative_tokens": 3},
                         "extra_args": ["--enforce-eager"]},
              "router": {"policy": "power_of_two"}},
        "B": {"gpu": "H100", "layout": "disaggregated", "prefill": {"replicas": 2, "tp": 1},
              "decode": {"replicas": 1, "tp": 2}, "kv_connector": "example",
              "engine": {"speculative": {"method": "eagle", "num_speculative_tokens": 2,
                                         "draft_model": "yuhuili/EAGLE-LLaMA3-Instruct-8B"}}},
    }
    return validate_plan(data)


def _tiny_plan(version: str = "0.32.0") -> Plan:
    data = yaml.safe_load((ROOT / "examples" / "quickstart.yaml").read_text())
    data["model"] = {"name": "tiny-llama", "hf_id": TINY_MODEL_ID, "params": 5.0e5, "layers": 2,
                     "kv_heads": 4, "head_dim": 32, "hidden_size": 128, "max_context": 2048}
    for arm in data["arms"].values():
        arm["engine"]["version"] = version
    return validate_plan(data)


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
@pytest.mark.parametrize("arm", ["A", "B"])
def test_example_arms_on_a_gpu_box(example: Path, arm: str) -> None:
    plan = load_plan_file(example)
    _check_golden(f"{example.stem}-{arm}.gpu.txt", _render(plan, arm, _gpu_box(plan, arm)))


@pytest.mark.parametrize("arm", ["A", "B"])
def test_every_engine_knob_reaches_the_command_line(arm: str) -> None:
    plan = _knobs_plan()
    _check_golden(f"knobs-{arm}.gpu.txt", _render(plan, arm, _gpu_box(plan, arm)))


@pytest.mark.parametrize("arm", ["A", "B", "C"])
def test_every_engine_knob_reaches_the_sglang_command_line(arm: str) -> None:
    # SGLang arms (tests/unit/test_engine_adapter.py): every knob, P/D on NIXL and Mooncake.
    from tests.unit.test_engine_adapter import sglang_knobs_plan

    plan = sglang_knobs_plan()
    _check_golden(f"sglang-knobs-{arm}.gpu.txt", _render(plan, arm, _gpu_box(plan, arm)))


@pytest.mark.parametrize("arm", ["A", "B"])
def test_cpu_arms_use_the_server_module_and_the_shared_storage_connector(arm: str) -> None:
    plan = _tiny_plan()
    text = _render(plan, arm, Device(kind="cpu", name="test cpu", cpus=(0, 1, 2, 3)))
    _check_golden(f"tiny-{arm}.cpu.txt", text)
    # Two engines on one CPU box: each its own share of the cores but the generator's (3), not
    # vLLM's "auto" (which binds every engine to the same first cores).
    assert "VLLM_CPU_OMP_THREADS_BIND=0-1" in text and "VLLM_CPU_OMP_THREADS_BIND=2" in text
    assert "taskset -c 0-1 /opt/vllm/bin/python" in text and "taskset -c 2 /opt/vllm/bin/python" in text
    assert "CUDA_VISIBLE_DEVICES" not in text
    assert "--gpu-memory-utilization" not in text
    if arm == "B":
        assert '"kv_role":"kv_producer"' in text and '"kv_role":"kv_consumer"' in text
        assert "NixlConnector" not in text  # no NIXL transport on CPU


@pytest.mark.parametrize(("cpus", "tps", "want"), [
    # One engine: pinned to all cores but the generator's, vLLM's own OpenMP binding inside.
    ((0, 1), [1], [("0", None)]),
    ((0, 1, 2, 3), [1], [("0-2", None)]),
    ((0,), [1], [(None, None)]),  # nothing to reserve
    ((), [1, 1], [(None, None), (None, None)]),  # CPUs unknown
    # Two or more: disjoint shares of the engines' cores, OpenMP bound to each.
    ((0, 1, 2), [1, 1], [("0", "0"), ("1", "1")]),
    ((0, 1, 2, 3), [1, 1], [("0-1", "0-1"), ("2", "2")]),
    ((0, 2, 4, 5, 6, 7, 9), [1, 1], [("0,2,4", "0,2,4"), ("5-7", "5-7")]),
    ((0, 1, 2, 3, 4), [2, 1], [("0-2", "0-1|2"), ("3", "3")]),  # a TP-2 engine: one list per rank
    ((0, 1), [1, 1], [("0", "0"), ("0", "0")]),  # more engines than cores: shared round robin
    ((0, 1, 2), [2, 1], [("0-1", "0|1"), ("0", "0")]),
])
def test_cpu_engines_split_the_cores_and_leave_one_to_the_generator(
    cpus: tuple[int, ...], tps: list[int], want: list[tuple[str | None, str | None]]
) -> None:
    assert cpu_shares(cpus, tps, reserved=1) == [CpuShare(a, b) for a, b in want]


def test_no_reserved_core_means_no_pinning() -> None:
    assert cpu_shares((0, 1), [1], reserved=0) == [CpuShare(None, None)]
    assert cpu_shares((0, 1), [1, 1], reserved=0) == [CpuShare(None, "0"), CpuShare(None, "1")]


def test_cpu_engines_are_pinned_with_taskset_and_the_router_is_not() -> None:
    layout = render_arm(_tiny_plan(), "A", Device(kind="cpu", cpus=(0, 1)), SETTINGS, sequential_ports(1),
                        RUN_DIR, "x")
    for e in layout.engines:
        assert e.argv[:3] == ("taskset", "-c", "0") and e.argv[3] == SETTINGS.python
    assert layout.router.argv[0] == SETTINGS.router


def test_one_cpu_engine_and_gpu_engines_get_no_thread_binding() -> None:
    plan = _tiny_plan()
    arms = {k: v.model_dump() for k, v in plan.arms.items()}
    arms["A"]["replicas"] = 1
    one = plan.model_copy(update={"arms": {k: type(plan.arm("A")).model_validate(v) for k, v in arms.items()}})
    cpu = render_arm(one, "A", Device(kind="cpu", cpus=(0, 1)), SETTINGS, sequential_ports(1), RUN_DIR, "x")
    assert all("VLLM_CPU_OMP_THREADS_BIND" not in dict(e.env) for e in cpu.engines)
    qs = load_plan_file(ROOT / "examples" / "quickstart.yaml")
    gpu = render_arm(qs, "A", _gpu_box(qs, "A"), SETTINGS, sequential_ports(1), RUN_DIR, "x")
    assert all("VLLM_CPU_OMP_THREADS_BIND" not in dict(e.env) for e in gpu.engines)
    assert all(e.argv[0] == SETTINGS.python for e in gpu.engines)  # no taskset on a GPU box


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_each_worker_gets_its_own_tp_many_gpus(example: Path) -> None:
    plan = load_plan_file(example)
    for arm in ("A", "B"):
        layout = render_arm(plan, arm, _gpu_box(plan, arm), SETTINGS, sequential_ports(9000),
                            RUN_DIR, "x")
        seen: list[int] = []
        for e in layout.engines:
            gpus = [int(g) for g in dict(e.env)["CUDA_VISIBLE_DEVICES"].split(",")]
            flag = "--tp-size" if plan.arm(arm).engine.kind == "sglang" else "--tensor-parallel-size"
            tp = int(e.argv[e.argv.index(flag) + 1])
            assert len(gpus) == tp
            seen += gpus
        assert sorted(seen) == list(range(plan.arm(arm).gpus))  # disjoint, no gaps
        ports = [e.port for e in layout.engines] + [layout.router.port, layout.router_metrics_port]
        assert len(set(ports)) == len(ports)


def test_an_arm_larger_than_the_box_is_refused() -> None:
    plan = load_plan_file(ROOT / "examples" / "disagg-vs-colocated-h200.yaml")
    with pytest.raises(PermanentError, match="needs 4 GPUs; this machine has 2"):
        render_arm(plan, "A", _gpu_box(plan, "A", gpus=2), SETTINGS, sequential_ports(1), RUN_DIR, "x")


def test_an_arm_on_the_wrong_gpu_type_is_refused() -> None:
    plan = load_plan_file(ROOT / "examples" / "disagg-vs-colocated-h200.yaml")
    box = Device(kind="cuda", gpus=8, name="NVIDIA H100 80GB HBM3")
    with pytest.raises(PermanentError, match="asks for H200"):
        render_arm(plan, "A", box, SETTINGS, sequential_ports(1), RUN_DIR, "x")


def test_lmcache_is_refused_on_cpu() -> None:
    plan = _knobs_plan()
    arms = {k: v.model_dump() for k, v in plan.arms.items()}
    arms["B"]["kv_connector"] = "lmcache"
    plan = plan.model_copy(update={"arms": {k: type(plan.arm("B")).model_validate(v) for k, v in arms.items()}})
    with pytest.raises(PermanentError, match="lmcache does not run on CPU"):
        render_arm(plan, "B", Device(kind="cpu"), SETTINGS, sequential_ports(1), RUN_DIR, "x")


def test_the_tiny_model_id_resolves_to_the_local_folder() -> None:
    assert model_source(_tiny_plan(), SETTINGS) == "/cache/tiny-llama"
    assert model_source(_tiny_plan(), SETTINGS.model_copy(update={"model_path": "/w"})) == "/w"
    plan = load_plan_file(ROOT / "examples" / "quickstart.yaml")
    assert model_source(plan, SETTINGS) == "Qwen/Qwen3-8B"


def _fake_engine_python(tmp_path: Path, vllm: str) -> str:
    """Stands in for the vLLM environment's interpreter: answers the version probe only."""
    exe = tmp_path / "python"
    exe.write_text(f"#!/bin/sh\necho '{{\"vllm\": \"{vllm}\", \"torch\": \"2.13.0\"}}'\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return str(exe)


def test_deploy_refuses_an_engine_version_other_than_the_installed_one(tmp_path: Path) -> None:
    settings = SETTINGS.model_copy(update={"python": _fake_engine_python(tmp_path, "0.32.0")})
    backend = LocalBackend(tmp_path / "state", settings=settings, device=Device(kind="cpu"))
    key = RunKey("exp", "A", 0)
    with pytest.raises(PermanentError, match=r"engine.version is 0.11.0 .* local vLLM is 0.32.0"):
        backend.deploy(_tiny_plan(version="0.11.0"), "A", key)
    assert not (tmp_path / "state" / "exp").exists()  # nothing started


def test_a_missing_vllm_environment_names_the_remedy(tmp_path: Path) -> None:
    settings = SETTINGS.model_copy(update={"python": str(tmp_path / "nope" / "python")})
    backend = LocalBackend(tmp_path, settings=settings, device=Device(kind="cpu"))
    with pytest.raises(PermanentError, match="make vllm"):
        backend.deploy(_tiny_plan(), "A", RunKey("exp", "A", 0))


def test_fingerprint_names_engine_torch_and_device(tmp_path: Path) -> None:
    settings = SETTINGS.model_copy(update={"python": _fake_engine_python(tmp_path, "0.32.0")})
    backend = LocalBackend(tmp_path, settings=settings, device=Device(kind="cpu", name="Xeon"))
    plan = _tiny_plan()
    layout = backend.render(plan, "B", RunKey("exp", "B", 0), sequential_ports(7000))
    fp = backend.fingerprint(plan.arm("B"), layout)
    assert fp.engine_version == "0.32.0" and fp.details["torch_version"] == "2.13.0"
    assert fp.details["device"] == "cpu" and fp.gpu_products == ("Xeon",) and fp.gpu_type == "cpu"
    assert fp.kv_transport == "ExampleConnector" and fp.topology.endswith("P/D")


def test_local_backend_implements_the_backend_protocol(tmp_path: Path) -> None:
    from orchestrator.backends.base import Backend

    assert isinstance(LocalBackend(tmp_path, settings=SETTINGS, device=Device(kind="cpu")), Backend)


def test_deploy_names_the_remedy_when_taskset_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import orchestrator.backends.local as local

    settings = SETTINGS.model_copy(update={"python": _fake_engine_python(tmp_path, "0.32.0")})
    backend = LocalBackend(tmp_path / "state", settings=settings, device=Device(kind="cpu", cpus=(0, 1)))
    real_which = local.shutil.which
    monkeypatch.setattr(local.shutil, "which", lambda name: None if name == "taskset" else real_which(name))
    with pytest.raises(PermanentError, match="install util-linux, or set LocalSettings.cpu_reserved to 0"):
        backend.deploy(_tiny_plan(), "A", RunKey("exp", "A", 0))
    assert not (tmp_path / "state" / "exp").exists()  # nothing started


def test_a_plan_with_an_sglang_arm_and_no_sglang_environment_deploys_nothing(tmp_path: Path) -> None:
    # Arm A is vLLM (installed), arm B SGLang with no ORCH_SGLANG_PYTHON: the first deploy, of
    # arm A, already refuses with the remedy, before any process or folder exists.
    from orchestrator.errors import EnvironmentProblem

    settings = SETTINGS.model_copy(update={"python": _fake_engine_python(tmp_path, "0.32.0"),
                                           "sglang_python": None})
    data = _tiny_plan().model_dump(mode="json", by_alias=True)
    data["arms"]["B"] = {**data["arms"]["A"], "engine": {**data["arms"]["A"]["engine"], "kind": "sglang"}}
    plan = validate_plan(data)
    backend = LocalBackend(tmp_path / "state", settings=settings, device=Device(kind="cpu"))
    with pytest.raises(EnvironmentProblem, match=r"no sglang environment.*ORCH_SGLANG_PYTHON"):
        backend.deploy(plan, "A", RunKey("exp", "A", 0))
    assert not (tmp_path / "state" / "exp").exists()
