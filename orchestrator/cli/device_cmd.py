"""`orch device probe | fit`: measure a device with plain PyTorch and fit the simulator's
profile of it (issue 21); `orch plan simulate --profile FILE` then uses the profile."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import typer

from orchestrator.cli.apps import JSON_OPTION, device_app
from orchestrator.cli.output import emit_json, say
from orchestrator.errors import UserError

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
    as_json: bool = JSON_OPTION,
) -> None:
    """Measure this machine's accelerator for a model shape (plain PyTorch, no vLLM): weights
    stream, KV read by batch, GEMM rate by tokens, per-step overhead, whole steps."""
    from orchestrator.sim.profiles import read_probe

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
    p = read_probe(out)
    if as_json:
        emit_json(p.model_dump(mode="json"))
        return
    say(f"{p.device.name} ({p.device.type}, torch {p.device.torch}), {p.shape.name} shape, "
        f"{p.elapsed_s:.1f} s -> {out}")
    say(f"  weights stream {p.weights_stream_bytes_s / 1e9:.3g} GB/s, step overhead {p.step_overhead_s * 1e3:.3g} ms")
    say("  KV read: " + ", ".join(f"B={k.batch}/ctx {k.context}: {k.bytes_s / 1e9:.3g} GB/s" for k in p.kv_read))
    say("  GEMM: " + ", ".join(f"{g.tokens} tok: {g.flops_s / 1e12:.3g} TFLOP/s" for g in p.gemm))


@device_app.command("fit")
def fit(
    probe_file: Path = typer.Argument(..., help="A probe file (`orch device probe`)."),
    out: Path = typer.Option(None, "--out", help="Profile file to write (default: PROBE's name with .profile.json)."),
    gpu: str = typer.Option(None, "--gpu", help="Catalog GPU it describes (default: from the probed device's name)."),
    name: str = typer.Option(None, "--name", help="Name of the profile."),
    kv_cache_bytes: float = typer.Option(None, "--kv-cache-bytes", min=1, help="KV cache of one engine "
                                         "(default: from GPU memory; a CPU probe: 1 GiB, the local backend's)."),
    install: bool = typer.Option(False, "--install", help="Write it to the installed profiles (ORCH_PROFILES_DIR "
                                 "or the user's data directory), which plan simulate, the pre-run power check "
                                 "and the search priors of kubernetes runs use for arms of its GPU."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Turn a probe file into a device profile for `orch plan simulate --profile`."""
    from orchestrator.control.dryrun import profiles_dir
    from orchestrator.sim.profiles import fit_profile, read_probe, write_profile

    profile = fit_profile(read_probe(probe_file), name=name, gpu=gpu, kv_cache_bytes=kv_cache_bytes)
    if install:
        if out is not None:
            raise UserError("give --out or --install, not both")
        if profile.gpu is None:
            raise UserError("an installed profile names its GPU: give --gpu (the probed device matches none)")
        out = profiles_dir() / f"{profile.gpu}.json"
    out = out or probe_file.with_suffix(".profile.json")
    write_profile(profile, out)
    if as_json:
        emit_json({"profile": str(out), **profile.model_dump(mode="json")})
        return
    say(f"profile {profile.name} (GPU {profile.gpu or 'any'}) -> {out}")
    say(f"  weights {profile.bandwidth_bytes_s / 1e9:.3g} GB/s, GEMM up to {profile.flops / 1e12:.3g} TFLOP/s, "
        f"t0 {profile.step_overhead_s * 1e3:.3g} ms")
