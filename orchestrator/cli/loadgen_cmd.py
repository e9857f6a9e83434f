"""`orch loadgen calibrate`: the load generator's own ceiling against a null server."""

from __future__ import annotations

from typing import cast

import typer

from orchestrator.cli.apps import JSON_OPTION, loadgen_app
from orchestrator.cli.output import emit_json, say
from orchestrator.errors import UserError


@loadgen_app.command("calibrate")
def calibrate_cmd(
    output_tokens: int = typer.Option(256, "--output-tokens", min=1, max=1_000_000, help="Streamed reply length."),
    prompt_tokens: int = typer.Option(128, "--prompt-tokens", min=1, max=1_000_000, help="Prompt length (words)."),
    tokens_per_chunk: int = typer.Option(1, "--tokens-per-chunk", min=1, max=100_000, help="Words per SSE chunk."),
    api: str = typer.Option("completions", "--api", help="completions or chat."),
    client: str = typer.Option("aiohttp", "--client", help="aiohttp or httpx."),
    step_s: float = typer.Option(3.0, "--step-s", min=0.5, max=3600, help="Seconds per rate step."),
    start_rate: float = typer.Option(25.0, "--start-rate", min=0.1, max=1_000_000, help="First rate tried (req/s)."),
    max_lag_ms: float = typer.Option(1.0, "--max-lag-ms", min=0.0001, max=60_000, help="p99 send-lag bound."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Drive a null server on loopback (started here) and report the highest request rate and
    streamed chunks/s with p99 send lag under the bound and achieved rate within 1%."""
    if api not in ("completions", "chat"):
        raise UserError(f"--api must be completions or chat (got {api!r})")
    if client not in ("aiohttp", "httpx"):
        raise UserError(f"--client must be aiohttp or httpx (got {client!r})")
    from orchestrator.loadgen.calibrate import calibrate
    from orchestrator.loadgen.client import Api, ClientKind

    result = calibrate(
        output_tokens=output_tokens, prompt_tokens=prompt_tokens, tokens_per_chunk=tokens_per_chunk,
        api=cast(Api, api), client=cast(ClientKind, client),  # both checked above
        step_s=step_s, start_rate=start_rate, max_lag_p99_s=max_lag_ms / 1000,
    )
    if as_json:
        emit_json(result.to_dict())
        return
    for s in result.steps:
        mark = "pass" if s.passed else "FAIL"
        say(f"  {s.rate:9.1f} req/s  achieved x{s.achieved_ratio:.4f}  p99 lag {s.send_lag_p99_s * 1e3:7.3f} ms"
            f"  {s.chunks_per_s:10.0f} chunks/s  {mark}")
    say(f"ceiling: {result.ceiling_rate:.1f} req/s, {result.ceiling_chunks_per_s:.0f} chunks/s "
        f"({result.client}, {result.output_tokens}-token replies, {result.cpus} CPUs)")


@loadgen_app.command("agent")
def agent_cmd(
    host: str = typer.Option("0.0.0.0", "--host", help="Address to serve on (a pod's own)."),  # noqa: S104
    port: int = typer.Option(8000, "--port", min=0, max=65535, help="Port to serve on (0: any free one, printed)."),
) -> None:
    """The in-cluster load generator: sends each point's load when the controller asks and
    streams its records back (what `orch run --backend kubernetes` from a workstation deploys
    next to each arm's router). Runs until SIGTERM."""
    from orchestrator.loadgen.agent import serve

    serve(host, port)
