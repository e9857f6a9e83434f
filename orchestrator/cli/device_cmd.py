"""`orch device probe | fit`: measure a device with plain PyTorch and fit the simulator's
profile of it (issue 21); `orch plan simulate --profile FILE` then uses the profile.
`orch device probe --kubernetes --gpu H200` runs the same probe as a Job on the cluster's pool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from orchestrator.cli.apps import JSON_OPTION, device_app
from orchestrator.cli.output import emit_json, say
from orchestrator.errors import UserError

# probe_job's (not imported here: it loads the kubernetes client; a test pins them equal).
DEFAULT_TIMEOUT_S = 1200
PROBE_IMAGE = "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime"
# The probe is a standalone script (stdlib + torch): it runs under any Python that has torch,
# which the orchestrator's own environment need not have.
PROBE_SCRIPT = Path(__file__).resolve().parents[1] / "sim" / "device_probe.py"


@device_app.command("probe")
def probe(
    tiny: bool = typer.Option(False, "--tiny", help="The test tier's tiny model shape and a small grid (seconds on a CPU)."),
    python: str = typer.Option(sys.executable, "--python", help="A Python that has torch (default: this one)."),
    device: str = typer.Option(None, "--device", help="cuda or cpu (default: cuda if available)."),
    repeats: int = typer.Option(None, "--repeats", min=1, max=10_000, help="Timed repeats per figure."),
    out: Path = typer.Option(Path("device-probe.json"), "--out", help="Probe file to write."),
    kubernetes: bool = typer.Option(False, "--kubernetes", help="Run the probe as a Job on one GPU of the "
                                    "cluster's pool of --gpu (the pool an arm of that GPU runs on)."),
    gpu: str = typer.Option(None, "--gpu", help="With --kubernetes: the catalog GPU whose pool to probe (e.g. H200)."),
    namespace: str = typer.Option(None, "--namespace", help="With --kubernetes: namespace of the Job "
                                  "(default: --plan's, else the kubeconfig context's, else default)."),
    image: str = typer.Option(None, "--image", help="With --kubernetes: a PyTorch image (python with torch "
                              "on PATH) the nodes can pull (default: " + PROBE_IMAGE + ")."),
    plan: Path = typer.Option(None, "--plan", help="With --kubernetes: a plan whose kubernetes settings say how "
                              "this cluster names GPUs, its tolerations, node selector and pull secrets."),
    kubeconfig: str = typer.Option(None, "--kubeconfig", help="With --kubernetes: kubeconfig file "
                                   "(default: in-cluster, else KUBECONFIG or ~/.kube/config)."),
    context: str = typer.Option(None, "--context", help="With --kubernetes: kubeconfig context (default: current)."),
    timeout: int = typer.Option(DEFAULT_TIMEOUT_S, "--timeout", min=1, max=24 * 3600, help="With --kubernetes: "
                                "the Job's deadline, s (scheduling, image pull and the probe)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Measure this machine's accelerator for a model shape (plain PyTorch, no vLLM): weights
    stream, KV read by batch, GEMM rate by tokens, per-step overhead, whole steps. With
    --kubernetes, measure one GPU of a cluster's pool instead (a Job; the result comes back in
    its log)."""
    from orchestrator.sim.profiles import read_probe

    k8s_only = {"--gpu": gpu, "--namespace": namespace, "--image": image, "--plan": plan,
                "--kubeconfig": kubeconfig, "--context": context}
    if kubernetes:
        if not gpu:
            raise UserError("--kubernetes needs --gpu: the GPU type whose node pool to probe (e.g. H200)")
        doc = _probe_on_kubernetes(tiny=tiny, device=device, repeats=repeats, gpu=gpu, namespace=namespace,
                                   image=image, plan=plan, kubeconfig=kubeconfig, context=context,
                                   timeout=timeout, progress=sys.stderr.write if as_json else None)
        out.write_text(json.dumps(doc, indent=1) + "\n")
    else:
        given = [flag for flag, value in k8s_only.items() if value is not None]
        if given or timeout != DEFAULT_TIMEOUT_S:
            raise UserError(f"{', '.join(given or ['--timeout'])}: only with --kubernetes")
        _probe_here(python, tiny, device, repeats, out)
    p = read_probe(out)
    if as_json:
        emit_json(p.model_dump(mode="json"))
        return
    say(f"{p.device.name} ({p.device.type}, torch {p.device.torch}), {p.shape.name} shape, "
        f"{p.elapsed_s:.1f} s -> {out}")
    say(f"  weights stream {p.weights_stream_bytes_s / 1e9:.3g} GB/s, step overhead {p.step_overhead_s * 1e3:.3g} ms")
    say("  KV read: " + ", ".join(f"B={k.batch}/ctx {k.context}: {k.bytes_s / 1e9:.3g} GB/s" for k in p.kv_read))
    say("  GEMM: " + ", ".join(f"{g.tokens} tok: {g.flops_s / 1e12:.3g} TFLOP/s" for g in p.gemm))


def _probe_here(python: str, tiny: bool, device: str | None, repeats: int | None, out: Path) -> None:
    cmd = [python, str(PROBE_SCRIPT), "--out", str(out)]
    cmd += ["--tiny"] if tiny else []
    cmd += ["--device", device] if device else []
    cmd += ["--repeats", str(repeats)] if repeats else []
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as e:
        raise UserError(f"--python {python}: {e.strerror or e}") from None
    if r.returncode != 0:
        if "No module named 'torch'" in r.stderr:
            raise UserError(f"{python} has no torch: give --python with one that has "
                            f"(or run {PROBE_SCRIPT} with it directly)")
        last = (r.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise UserError(f"the probe failed (exit {r.returncode}): {last}")


def _probe_on_kubernetes(*, tiny: bool, device: str | None, repeats: int | None, gpu: str, namespace: str | None,
                         image: str | None, plan: Path | None, kubeconfig: str | None, context: str | None,
                         timeout: int, progress: Callable[[str], Any] | None) -> dict[str, Any]:
    """The probe document from a Job on the cluster (``backends/kubernetes/probe_job.py``)."""
    from orchestrator.backends.kubernetes.api import KubeApi
    from orchestrator.backends.kubernetes.probe_job import (
        ProbeJobRunner,
        ProbeJobSpec,
        api_client,
        default_namespace,
    )
    from orchestrator.plan import load_plan_file
    from orchestrator.plan.catalog import canonical_gpu
    from orchestrator.plan.kubernetes import KubernetesSettings

    try:
        gpu = canonical_gpu(gpu)
    except ValueError as e:
        raise UserError(f"--gpu: {e}") from None
    settings = load_plan_file(plan).kubernetes if plan else KubernetesSettings()
    ns = namespace or settings.namespace or os.environ.get("ORCH_K8S_NAMESPACE") or default_namespace(kubeconfig, context)
    spec = ProbeJobSpec(gpu=gpu, namespace=ns, image=image or PROBE_IMAGE, timeout_s=timeout, tiny=tiny,
                        device=device, repeats=repeats, settings=settings)
    api = KubeApi(api_client(kubeconfig, context))
    log = (lambda line: progress(line + "\n")) if progress else say
    runner = ProbeJobRunner(api, poll_s=float(os.environ.get("ORCH_K8S_POLL_S") or 2.0), log=log)
    return runner.run(spec)


@device_app.command("fit")
def fit(
    probe_file: Path = typer.Argument(None, help="A probe file (`orch device probe`); or give --experiment."),
    experiment: str = typer.Option(None, "--experiment", help="Fit from vLLM's own metrics of this experiment's "
                                   "valid runs of one arm instead (the store keeps them per load point)."),
    arm: str = typer.Option(None, "--arm", help="With --experiment: the arm (default: the plan's first)."),
    out: Path = typer.Option(None, "--out", help="Profile file to write (default: PROBE's name with .profile.json; "
                             "with --experiment, EXPERIMENT-ARM.profile.json)."),
    gpu: str = typer.Option(None, "--gpu", help="Catalog GPU it describes (default: from the probed device's name; "
                            "with --experiment, the runs' GPU)."),
    name: str = typer.Option(None, "--name", help="Name of the profile."),
    kv_cache_bytes: float = typer.Option(None, "--kv-cache-bytes", min=1, help="KV cache of one engine "
                                         "(default: from GPU memory; a CPU probe: 1 GiB, the local backend's)."),
    install: bool = typer.Option(False, "--install", help="Write it to the installed profiles (ORCH_PROFILES_DIR "
                                 "or the user's data directory), which plan simulate, the pre-run power check "
                                 "and the search priors of kubernetes runs use for arms of its GPU."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Turn a probe file, or the vLLM metrics a real run stored (--experiment), into a device
    profile for `orch plan simulate --profile`."""
    from orchestrator.control.dryrun import profiles_dir
    from orchestrator.sim.profiles import fit_profile, read_probe, write_profile

    if (probe_file is None) == (experiment is None):
        raise UserError("give a probe file or --experiment NAME, one of them")
    if arm is not None and experiment is None:
        raise UserError("--arm: only with --experiment")
    if install and out is not None:
        raise UserError("give --out or --install, not both")
    fitted = None
    if experiment is not None:
        from orchestrator.cli.device_metrics import fit_experiment

        fitted = fit_experiment(experiment, arm, gpu=gpu, name=name, kv_cache_bytes=kv_cache_bytes)
        profile = fitted.profile
    else:
        profile = fit_profile(read_probe(probe_file), name=name, gpu=gpu, kv_cache_bytes=kv_cache_bytes)
    if install:
        if profile.gpu is None:
            raise UserError("an installed profile names its GPU: give --gpu (the measured device matches none)")
        out = profiles_dir() / f"{profile.gpu}.json"
    if out is None:
        out = probe_file.with_suffix(".profile.json") if fitted is None else Path(
            f"{fitted.experiment}-{fitted.arm}.profile.json")
    write_profile(profile, out)
    if as_json:
        doc = {"profile": str(out), **profile.model_dump(mode="json")}
        if fitted is not None:
            doc["fit"] = fitted.to_dict()
        emit_json(doc)
        return
    if fitted is not None:
        for line in fitted.lines():
            say(line)
    say(f"profile {profile.name} (GPU {profile.gpu or 'any'}) -> {out}")
    say(f"  weights {profile.bandwidth_bytes_s / 1e9:.3g} GB/s, GEMM up to {profile.flops / 1e12:.3g} TFLOP/s, "
        f"t0 {profile.step_overhead_s * 1e3:.3f} ms")
