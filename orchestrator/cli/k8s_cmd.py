"""`orch k8s render FILE --arm A --out DIR`: the objects an arm would apply, as YAML files;
`orch k8s emulate`: an emulated cluster on loopback (orchestrator.kcluster) for kubectl and
`orch run --backend kubernetes`, until Ctrl-C or SIGTERM."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from orchestrator.backends.base import RunKey
from orchestrator.backends.kubernetes.render import render_arm, write_objects
from orchestrator.cli.apps import JSON_OPTION, k8s_app
from orchestrator.cli.output import emit_json, say
from orchestrator.errors import UserError
from orchestrator.plan import load_plan_file


@k8s_app.command("render")
def render(
    file: Path = typer.Argument(..., help="Plan file (YAML)."),
    arm: str = typer.Option(..., "--arm", help="Arm to render (A, B, ...)."),
    out: Path = typer.Option(..., "--out", help="Folder to write the YAML files into."),
    block: int = typer.Option(0, "--block", min=0, help="Block number the run would have."),
    attempt: int = typer.Option(0, "--attempt", min=0, help="Attempt number the run would have."),
    namespace: str | None = typer.Option(
        None, "--namespace", help="Namespace to render into (default: the plan's, else orch-<experiment>)."
    ),
    as_json: bool = JSON_OPTION,
) -> None:
    """Write one YAML file per object, in apply order (01-namespace-..., 02-configmap-...)."""
    plan = load_plan_file(file)
    name = arm.upper()
    if name not in plan.arms:
        raise UserError(f"--arm: no arm {arm!r} in {file}; arms are {', '.join(plan.arms)}")
    objs = render_arm(plan, name, RunKey(plan.name, name, block, attempt), namespace=namespace)
    try:
        paths = write_objects(objs, out)
    except OSError as e:
        raise UserError(f"--out: cannot write to {out}: {e.strerror or e}") from e
    if as_json:
        emit_json({"arm": name, "out": str(out), "files": [str(p) for p in paths]})
        return
    for p in paths:
        say(str(p), whole=True)


DEFAULT_NODES = "H200=2,cpu=1"


def _default_kubeconfig() -> Path:
    from orchestrator.paths import cache_root

    return cache_root() / "k8s-emulate" / "kubeconfig"


@k8s_app.command("emulate")
def emulate(
    nodes: str = typer.Option(
        DEFAULT_NODES, "--nodes",
        help="Nodes by GPU type (the GPU catalog's names: H200, H100-SXM, H100-PCIe; 8 GPUs each) and "
        "cpu=N CPU nodes (one unless given), e.g. H200=2,H100-SXM=1.",
    ),
    kubeconfig: Path = typer.Option(
        None, "--kubeconfig", help="Where to write the cluster's kubeconfig (default: in the user cache)."
    ),
    image: list[str] = typer.Option(
        [], "--image", help="A repository whose images exist besides the project's (e.g. ghcr.io/org/*); repeatable."
    ),
    detach: bool = typer.Option(
        False, "--detach", help="Start it in the background and return once it serves; stdout is only "
        '`export KUBECONFIG=...`, so `eval "$(orch k8s emulate --detach)"` points kubectl and orch at it.'),
    stop_it: bool = typer.Option(False, "--stop", help="Stop the cluster started with --detach (same --kubeconfig)."),
) -> None:
    """Run an emulated Kubernetes cluster on loopback until Ctrl-C or SIGTERM: its API server
    (kubectl and `orch run --backend kubernetes` work against it), scheduler, controllers, and a
    kubelet that runs the simulated engine for vLLM pods, the real vllm-router, and the
    orchestrator's own image (the in-cluster load generator) as this checkout's orch."""
    import signal
    import threading

    from orchestrator.cli import k8s_detach
    from orchestrator.kcluster import EmulatedCluster, parse_nodes

    try:
        specs = parse_nodes(nodes)
    except ValueError as e:
        raise UserError(f"--nodes: {e}") from None
    path = kubeconfig or _default_kubeconfig()
    if path.is_dir():
        raise UserError(f"--kubeconfig: {path} is a folder; give a file path")
    if detach and stop_it:
        raise UserError("--detach and --stop: give one")
    if stop_it:
        k8s_detach.stop(path)
        return
    if detach:
        k8s_detach.detach(nodes, path, list(image))
        return
    stop = threading.Event()

    def handler(signum: int, frame: object) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    # Strict: Service cluster IPs route only from the cluster's pods, as on a real cluster.
    cluster = EmulatedCluster(nodes=specs, cluster_network=True)
    written_path: Path | None = None
    try:
        cluster.start()
        for repo in image:
            cluster.add_image(repo)
        try:
            written = cluster.kubeconfig_for(None, path=path)
            written_path = Path(written)
        except OSError as e:
            raise UserError(f"--kubeconfig: cannot write {path}: {e.strerror or e}") from None
        say(f"api server: {cluster.url}")
        say(f"kubeconfig: {written}", whole=True)
        say(f"export KUBECONFIG={written}", whole=True)
        for spec in specs:
            gpus = f"{spec.gpus}x {spec.labels['nvidia.com/gpu.product']}" if spec.gpus else "no GPU"
            say(f"node {spec.name}: {gpus}, cpu {spec.cpu}, memory {spec.memory}")
        say("running until Ctrl-C or SIGTERM")
        sys.stdout.flush()
        while not stop.wait(0.5):
            pass
    finally:
        cluster.stop()
        for sig, old in previous.items():
            signal.signal(sig, old)
        if written_path is not None:
            written_path.unlink(missing_ok=True)  # it names a server that is gone
    left = cluster.live_processes()
    if left:
        raise UserError(f"processes the cluster started are still running: {left}")
    say("stopped: every process the cluster started has exited; the kubeconfig is removed")
