"""The device probe (issue 21): what one engine step costs on this machine's accelerator, in
plain PyTorch (no vLLM), for a model shape. Writes one JSON file that ``orch device fit`` turns
into a ``DeviceProfile``.

Self-contained on purpose: it imports only the standard library and torch, so it runs under
any Python that has torch (a GPU node, a Kubernetes Job, the vLLM venv) without installing the
orchestrator: ``python device_probe.py [--tiny] --out probe.json`` or ``orch device probe
--python PATH``. Nothing in the orchestrator imports it (the simulator stays free of torch).

What it measures, with random weights of the shape (a Qwen3-8B-shaped stack by default; the
test tier's tiny Llama with ``--tiny``), decode steps replayed from CUDA graphs on a GPU:
- weights stream: bytes of the linear layers over the time of the linear layers at 1 token;
- KV read by batch: bytes of K and V over the time of decode attention, per (batch, context);
- GEMM rate by tokens: FLOPs of the linear layers over their time, per tokens in the step;
- per-step overhead: a whole decode step at batch 1 and a tiny context, less the two above;
- whole steps (decode at (batch, context), prefill at tokens): what the fitted model is
  compared against (``benchmarks/sim_vs_gpu.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

KIND = "orchestrator-device-probe"
# --log-line: the result as one line of stdout starting with this (a Kubernetes Job's pod log
# carries it back to `orch device probe --kubernetes`; one line survives stderr interleaving).
LOG_PREFIX = "ORCH-DEVICE-PROBE-RESULT "
WARMUP_S = 0.1
VERSION = 1
# torch's types, as Any: torch is imported inside the functions (the probe must load without
# it) and need not be installed where the orchestrator is type-checked.
Tensor = Any  # a torch.Tensor
Device = Any  # a torch.device
DType = Any  # a torch.dtype
# Qwen3-8B's config.json (the shape of issue 21's H200 table) and the tiny Llama of `make vllm`.
SHAPES = {
    "qwen3-8b": {"hidden": 4096, "layers": 36, "heads": 32, "kv_heads": 8, "head_dim": 128,
                 "intermediate": 12288, "vocab": 151936, "tied": False},
    "tiny-llama": {"hidden": 128, "layers": 2, "heads": 4, "kv_heads": 4, "head_dim": 32,
                   "intermediate": 256, "vocab": 2027, "tied": True},
}
# The grid of issue 21's table on a GPU; a small one for --tiny (seconds on a CPU).
GRID: dict[str, dict[str, Any]] = {
    "full": {"decode": [(1, 16), (1, 1024), (1, 4096), (8, 4096), (32, 4096), (128, 4096), (256, 1024),
                        (256, 4096)],
             "prefill": [512, 2048, 8192], "gemm": [16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]},
    "tiny": {"decode": [(1, 16), (1, 256), (8, 256), (32, 256), (32, 512)],
             "prefill": [128, 512], "gemm": [16, 64, 256, 512, 1024]},
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tiny", action="store_true", help="the tiny model's shape and a small grid")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per figure (median)")
    ap.add_argument("--out", default="-", help="file to write (default: stdout)")
    ap.add_argument("--log-line", action="store_true",
                    help=f"print the result as one line starting with {LOG_PREFIX.strip()!r} on stdout "
                    "(with --out -: instead of the indented JSON)")
    args = ap.parse_args(argv)
    doc = probe(args.tiny, args.device, args.repeats)
    text = json.dumps(doc, indent=1)
    if args.log_line:
        sys.stdout.write(LOG_PREFIX + json.dumps(doc, separators=(",", ":")) + "\n")
        sys.stdout.flush()
    if args.out == "-":
        if not args.log_line:
            sys.stdout.write(text + "\n")
    else:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


def probe(tiny: bool, device: str | None, repeats: int | None) -> dict:
    import torch  # type: ignore[import-not-found]

    started = time.perf_counter()
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(0)
    name = "tiny-llama" if tiny else "qwen3-8b"
    shape = SHAPES[name]
    grid = GRID["tiny" if tiny else "full"]
    dtype = torch.bfloat16
    reps = repeats or (9 if tiny else 20)
    stack = Stack(shape, dev, dtype, max_batch=max(b for b, _ in grid["decode"]),
                  max_context=max(c for _, c in grid["decode"]))
    clock = Clock(dev, reps)
    eb = 2  # bytes per bf16 element
    linear_bytes = stack.linear_params * eb
    clock.time(lambda: stack.decode(1, 16), warmup_s=0.5)  # the process's first kernels: not timed
    stream_s = clock.time(lambda: stack.linears(stack.x(1)))
    kv_read = []
    for b, c in grid["decode"]:
        t = clock.time(lambda b=b, c=c: stack.attention_only(b, c))
        nbytes = 2 * shape["layers"] * b * c * shape["kv_heads"] * shape["head_dim"] * eb
        kv_read.append({"batch": b, "context": c, "seconds": t, "bytes_s": nbytes / t})
    gemm = []
    for m in grid["gemm"]:
        t = clock.time(lambda m=m: stack.linears(stack.x(m)))
        gemm.append({"tokens": m, "seconds": t, "flops_s": 2.0 * stack.linear_params * m / t})
    steps = []
    for b, c in grid["decode"]:
        steps.append({"kind": "decode", "batch": b, "context": c, "seconds": clock.step(stack, b, c)})
    for n in grid["prefill"]:
        steps.append({"kind": "prefill", "tokens": n, "seconds": clock.time(lambda n=n: stack.prefill(n))})
    small = next(s for s in steps if s["kind"] == "decode" and s["batch"] == 1)
    kv_small = next(k for k in kv_read if k["batch"] == 1)
    overhead = max(0.0, small["seconds"] - stream_s - kv_small["seconds"])
    if dev.type == "cuda":
        props = torch.cuda.get_device_properties(dev)
        dname, memory = props.name, int(props.total_memory)
    else:
        dname = platform.processor() or platform.machine()
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "kind": KIND, "version": VERSION,
        "device": {"type": dev.type, "name": dname, "fingerprint": f"{dname}|{memory}", "memory_bytes": memory,
                   "torch": torch.__version__, "cuda_graphs": clock.graphs, "threads": torch.get_num_threads()},
        "shape": {"name": name, **shape}, "dtype": "bf16",
        "weights_stream_bytes_s": linear_bytes / stream_s,
        "kv_read": kv_read, "gemm": gemm, "step_overhead_s": overhead, "steps": steps,
        "elapsed_s": time.perf_counter() - started,
    }


class Clock:
    """Median wall time of a callable (CUDA: synchronized; decode steps replayed from a graph)."""

    def __init__(self, dev: Device, reps: int) -> None:
        import torch

        self.torch = torch
        self.cuda = dev.type == "cuda"
        self.reps = reps
        self.graphs = False

    def _sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def time(self, fn: Callable[..., object], warmup_s: float = WARMUP_S) -> float:
        # fn is called with no arguments (Callable[...]: the loops' lambdas bind theirs as defaults).
        with self.torch.inference_mode():
            # Warm-up (allocations, kernel selection, a CPU's JIT and thread pool): 3 calls
            # and at least WARMUP_S.
            t0 = time.perf_counter()
            for i in range(1000):
                fn()
                self._sync()
                if i >= 2 and time.perf_counter() - t0 >= warmup_s:
                    break
            out = []
            for _ in range(self.reps):
                t = time.perf_counter()
                fn()
                self._sync()
                out.append(time.perf_counter() - t)
        # A GPU is the probe's alone: the median. A CPU is shared with the OS and whoever else
        # runs (preemptions of tens of ms on a busy machine): its cost is the fastest repeat.
        return statistics.median(out) if self.cuda else min(out)

    def step(self, stack: Stack, b: int, c: int) -> float:
        """One decode step; on a GPU captured in a CUDA graph as vLLM does (eager if that fails)."""
        if not self.cuda:
            return self.time(lambda: stack.decode(b, c))
        torch = self.torch
        try:
            with torch.inference_mode():
                s = torch.cuda.Stream()
                s.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(s):
                    stack.decode(b, c)
                torch.cuda.current_stream().wait_stream(s)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    stack.decode(b, c)
            self.graphs = True
            return self.time(graph.replay)
        except RuntimeError:
            return self.time(lambda: stack.decode(b, c))


class Stack:
    """A decoder stack of the shape with random weights and one layer's dense KV cache (read by
    every layer: the bytes moved are the same, the memory is one layer's)."""

    def __init__(self, shape: dict[str, Any], dev: Device, dtype: DType, max_batch: int,
                 max_context: int) -> None:
        import torch

        self.torch = torch
        self.F = torch.nn.functional
        self.s, self.dev, self.dtype = shape, dev, dtype
        h, hd, nh, kvh, inter = shape["hidden"], shape["head_dim"], shape["heads"], shape["kv_heads"], shape["intermediate"]

        def w(i: int, o: int) -> Tensor:
            return torch.randn(i, o, device=dev, dtype=dtype) * (i ** -0.5)

        self.layers = [(w(h, (nh + 2 * kvh) * hd), w(nh * hd, h), w(h, 2 * inter), w(inter, h))
                       for _ in range(shape["layers"])]
        self.head = w(h, shape["vocab"])
        self.linear_params = shape["layers"] * (h * (nh + 2 * kvh) * hd + nh * hd * h + 3 * h * inter)
        self.k = torch.randn(max_batch, kvh, max_context, hd, device=dev, dtype=dtype)
        self.v = torch.randn(max_batch, kvh, max_context, hd, device=dev, dtype=dtype)

    def x(self, m: int) -> Tensor:
        return self.torch.randn(m, self.s["hidden"], device=self.dev, dtype=self.dtype)

    def _norm(self, x: Tensor) -> Tensor:
        return x * self.torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype)

    def _mlp(self, x: Tensor, w_gu: Tensor, w_down: Tensor) -> Tensor:
        g, u = (x @ w_gu).chunk(2, dim=-1)
        return (self.F.silu(g) * u) @ w_down

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, causal: bool) -> Tensor:
        try:
            return self.F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
        except TypeError:  # torch < 2.5: no enable_gqa
            rep = q.shape[1] // k.shape[1]
            return self.F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                                       is_causal=causal)

    def linears(self, x: Tensor) -> Tensor:
        """The linear layers alone (no attention): weights stream at 1 token, GEMMs at many."""
        for wqkv, wo, w_gu, w_down in self.layers:
            y = x @ wqkv
            x = x + y[:, : wo.shape[0]] @ wo
            x = x + self._mlp(x, w_gu, w_down)
        return x

    def attention_only(self, b: int, c: int) -> Tensor:
        q = self.torch.randn(b, self.s["heads"], 1, self.s["head_dim"], device=self.dev, dtype=self.dtype)
        for _ in self.layers:
            q = self._attend(q, self.k[:b, :, :c], self.v[:b, :, :c], causal=False)
        return q

    def decode(self, b: int, c: int) -> Tensor:
        s = self.s
        x = self.x(b)
        for wqkv, wo, w_gu, w_down in self.layers:
            y = self._norm(x) @ wqkv
            q = y[:, : s["heads"] * s["head_dim"]].reshape(b, s["heads"], 1, s["head_dim"])
            a = self._attend(q, self.k[:b, :, :c], self.v[:b, :, :c], causal=False)
            x = x + a.reshape(b, -1) @ wo
            x = x + self._mlp(self._norm(x), w_gu, w_down)
        return self._norm(x) @ self.head  # every decode position is sampled

    def prefill(self, n: int) -> Tensor:
        s = self.s
        nh, kvh, hd = s["heads"], s["kv_heads"], s["head_dim"]
        x = self.x(n)
        for wqkv, wo, w_gu, w_down in self.layers:
            y = self._norm(x) @ wqkv
            q = y[:, : nh * hd].reshape(n, nh, hd).transpose(0, 1).unsqueeze(0)
            k = y[:, nh * hd: (nh + kvh) * hd].reshape(n, kvh, hd).transpose(0, 1).unsqueeze(0)
            v = y[:, (nh + kvh) * hd:].reshape(n, kvh, hd).transpose(0, 1).unsqueeze(0)
            a = self._attend(q, k, v, causal=True)
            x = x + a.squeeze(0).transpose(0, 1).reshape(n, -1) @ wo
            x = x + self._mlp(self._norm(x), w_gu, w_down)
        return self._norm(x[-1:]) @ self.head  # the sampled position only


if __name__ == "__main__":
    sys.exit(main())
