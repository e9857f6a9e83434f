"""`orch sim serve`: a real-time simulated vLLM worker (or a whole arm) on loopback;
`orch plan simulate`: the virtual-time dry run of a plan."""

from __future__ import annotations

import asyncio
import signal
import sys
from pathlib import Path

import typer

from orchestrator.cli.apps import JSON_OPTION, plan_app, sim_app
from orchestrator.cli.output import emit_json, say, warn
from orchestrator.errors import UserError
from orchestrator.plan import MODELS, EngineConfig, RouterConfig, gpu, load_plan_file
from orchestrator.sim.engine import ClusterSpec, cluster_for_arm
from orchestrator.sim.model import WorkerModel
from orchestrator.sim.server import Faults, ServeConfig, SimServer


def _cluster_from_plan(plan_file: Path, arm: str, role: str, whole_arm: bool) -> tuple[ClusterSpec, str, int, str]:
    """The arm's simulated cluster (or one worker of it), its served name, the plan's seed and
    the arm's engine (which names and endpoints the server speaks)."""
    plan = load_plan_file(plan_file)
    if arm not in plan.arms:
        raise UserError(f"--arm must be an arm of the plan ({', '.join(plan.arms)}), not {arm!r}")
    spec = plan.arm(arm)
    cluster = cluster_for_arm(plan.model, spec, plan.router_for(arm), plan.sim)
    name = plan.model.hf_id or plan.model.name
    kind = spec.engine.kind
    if whole_arm:
        return cluster, name, plan.design.seed, kind
    pools = {"both": cluster.workers, "prefill": cluster.prefill, "decode": cluster.decode}
    if role == "both" and spec.layout == "disaggregated":
        raise UserError(f"arm {arm} is disaggregated: give --role prefill or --role decode (or --whole-arm)")
    if role != "both" and spec.layout == "colocated":
        raise UserError(f"arm {arm} is colocated: --role {role} applies to disaggregated arms")
    one = pools[role][:1]
    return ClusterSpec(workers=one, link_bytes_s=cluster.link_bytes_s,
                       stall_every_steps=cluster.stall_every_steps, stall_s=cluster.stall_s), name, plan.design.seed, kind


@sim_app.command("serve")
def serve(
    model: str = typer.Option(None, "--model", help="Catalog model (e.g. qwen3-8b)."),
    gpu_name: str = typer.Option(None, "--gpu", help="GPU type: H100-PCIe, H100-SXM, H200."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel size."),
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port; 0 picks a free one."),
    host: str = typer.Option("127.0.0.1", "--host", help="Address to listen on."),
    role: str = typer.Option("both", "--role", help="both | prefill | decode."),
    max_num_seqs: int = typer.Option(256, "--max-num-seqs", min=1, max=65536),
    max_num_batched_tokens: int = typer.Option(8192, "--max-num-batched-tokens", min=16, max=4_194_304),
    kv_cache_dtype: str = typer.Option("auto", "--kv-cache-dtype", help="auto | fp8."),
    no_prefix_caching: bool = typer.Option(False, "--no-prefix-caching"),
    served_model_name: str = typer.Option(None, "--served-model-name", help="Default: the model's hf_id."),
    seed: int = typer.Option(0, "--seed"),
    plan_file: Path = typer.Option(None, "--plan", help="Configure from a plan's arm instead."),
    arm: str = typer.Option(None, "--arm", help="An arm of the plan: A, B, ... (with --plan)."),
    whole_arm: bool = typer.Option(False, "--whole-arm", help="Serve the whole arm in one process."),
    fault_ignore_max_tokens: bool = typer.Option(False, "--fault-ignore-max-tokens"),
    fault_ignore_max_tokens_streaming: bool = typer.Option(
        False, "--fault-ignore-max-tokens-streaming", help="Only on streamed requests."),
    fault_stall_every: int = typer.Option(0, "--fault-stall-every", help="Stall every N steps."),
    fault_stall_ms: float = typer.Option(0.0, "--fault-stall-ms"),
    fault_die_after: int = typer.Option(0, "--fault-die-after", help="Exit after N requests."),
    fault_frozen_output: bool = typer.Option(False, "--fault-frozen-output"),
    spin_ms: float = typer.Option(0.0, "--spin-ms", help="Yield-wait the last N ms of each step "
                                  "for sub-ms step ends (costs CPU; 2 is enough)."),
) -> None:
    """Serve a simulated engine worker (OpenAI API, /metrics; the arm's engine's names and
    endpoints with --plan, vLLM's otherwise) until SIGTERM or SIGINT."""
    if role not in ("both", "prefill", "decode"):
        raise UserError(f"--role must be both, prefill or decode, not {role!r}")
    if plan_file is not None:
        if arm is None:
            raise UserError("--plan needs --arm A or --arm B")
        cluster, name, plan_seed, engine_kind = _cluster_from_plan(plan_file, arm, role, whole_arm)
        seed = seed or plan_seed
    else:
        if model is None or gpu_name is None:
            raise UserError("give --model and --gpu (or --plan FILE --arm A)")
        if model not in MODELS:
            raise UserError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
        try:
            g = gpu(gpu_name)
        except ValueError as e:
            raise UserError(str(e)) from e
        if kv_cache_dtype not in ("auto", "fp8"):
            raise UserError("--kv-cache-dtype must be auto or fp8")
        engine = EngineConfig(kv_cache_dtype=kv_cache_dtype, max_num_seqs=max_num_seqs,
                              max_num_batched_tokens=max_num_batched_tokens,
                              prefix_caching=not no_prefix_caching)
        spec = MODELS[model]
        cluster = ClusterSpec(workers=(WorkerModel.from_engine(g, spec, tp, engine),),
                              policy=RouterConfig().policy)
        name = spec.hf_id or spec.name
        engine_kind = "vllm"
    if fault_stall_every:
        cluster = ClusterSpec(**{**cluster.__dict__, "stall_every_steps": fault_stall_every,
                                 "stall_s": fault_stall_ms / 1000.0})
    faults = Faults(ignore_max_tokens=fault_ignore_max_tokens,
                    ignore_max_tokens_streaming=fault_ignore_max_tokens_streaming, stall_every=fault_stall_every,
                    stall_ms=fault_stall_ms, die_after=fault_die_after, frozen_output=fault_frozen_output)
    config = ServeConfig(cluster=cluster, served_model_name=served_model_name or name,
                         role=role, seed=seed, faults=faults, spin_ms=max(0.0, spin_ms), engine=engine_kind)
    asyncio.run(_serve(config, host, port))


async def _serve(config: ServeConfig, host: str, port: int) -> None:
    from aiohttp import web

    server = SimServer(config)
    runner = web.AppRunner(server.app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    bound = runner.addresses[0][1]  # the one site's first socket: (host, port, ...)
    sys.stderr.write(f"ready on http://{host}:{bound}\n")
    sys.stderr.flush()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


@plan_app.command("simulate")
def simulate(
    plan_file: Path = typer.Argument(..., help="Plan file (YAML)."),
    as_json: bool = JSON_OPTION,
    replications: int = typer.Option(200, "--replications", min=1, max=100_000, help="Simulated designs for the power."),
    seed: int = typer.Option(None, "--seed", help="Seed of the dry run (default: the plan's design seed)."),
    profile: list[Path] = typer.Option([], "--profile", help="Device profile file (`orch device fit`): arms "
                                       "of its GPU (every arm if it names none) run at its measured rates."),
    profiles_dir: Path = typer.Option(None, "--profiles", help="Directory of device profiles; each arm "
                                      "takes the one of its GPU (matched by the probed device's fingerprint). "
                                      "Default: the installed ones (`orch device fit --install`)."),
) -> None:
    """Dry run in virtual time: predicted capacity per arm and class, verdicts, power, GPU-hours."""
    from orchestrator.control.dryrun import installed_profiles, simulate_plan
    from orchestrator.sim.profiles import profiles_in, read_profile

    plan = load_plan_file(plan_file)
    if not plan.workload.open_loop:
        raise UserError("plan simulate searches capacity, which comes from open-loop runs only; "
                        "this workload is closed loop (workload.closed)")
    measured = [read_profile(p) for p in profile] + (profiles_in(profiles_dir) if profiles_dir else [])
    if not profile and profiles_dir is None:
        measured = installed_profiles()  # `orch device fit --install`
    result = simulate_plan(plan, replications=replications, seed=seed, profiles=measured)
    if as_json:
        emit_json(result.to_dict())
        return
    for note in result.notes:
        warn(note)
    say(f"{result.plan}: dry run in virtual time (seed {result.seed}, {result.elapsed_s:.1f} s)")
    for name, arm in result.arms.items():
        say(f"arm {name} ({arm.layout}, {arm.gpus} GPU): {arm.points_per_run} points per run")
        for cls, p in arm.classes.items():
            rate = f"{p.at_rate:.3g} {plan.workload.rate_unit}" if p.at_rate is not None else "no passing rate"
            say(f"  {cls:<12} capacity {p.capacity_tok_s:9.0f} tok/s at {rate}"
                + (f" (censored {p.censored})" if p.censored is not None else ""))
    for b in result.bars:
        j = b.judgement
        say(f"bar {b.id}: predicted {j.verdict}, {b.compare} {j.estimate:.3f} [{j.lower:.3f}, {j.upper:.3f}] over "
            f"{j.n} blocks ({b.direction} {b.threshold:g}); power {b.power:.0%}"
            + (f"; {b.blocks_for_power} blocks for 80% power" if b.blocks_for_power else ""))
    if result.sweep is not None:
        sw = result.sweep
        size = (f" x {sw.blocks} blocks" if sw.per_block is None  # incomplete: fewer runs than arms x blocks
                else f"; {sw.blocks} blocks, {sum(sw.runs.values())} runs")
        say(f"sweep: {sw.design}{size}: {sw.gpu_hours:.2f} GPU-hours before it runs ("
            + ", ".join(f"{k} {n}" for k, n in sw.arms.items()) + ")")
    say(f"GPU-hours: {result.gpu_hours:.2f} ("
        + ", ".join(f"{k} {v:.2f}" for k, v in result.gpu_hours_per_arm.items())
        + f"), wall {result.wall_hours:.2f} h")
    if plan.design.sequential is not None and result.bars:
        mean = result.bars[0].mean_blocks
        blocks = plan.design.blocks
        saved = result.gpu_hours * (1 - mean / blocks)
        say(f"sequential design ({plan.design.sequential.spending}): {mean:.2f} of {blocks} blocks run on average "
            f"over {result.replications} replications; expected GPU-hours {result.gpu_hours - saved:.2f} "
            f"(saves {saved:.2f})")
