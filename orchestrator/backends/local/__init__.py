"""The local backend: real vLLM engines and the real vllm-router as processes on this machine.

A user with one GPU box and no Kubernetes runs ``backend: local``; on a machine without a GPU
the same code runs vLLM's CPU build (``make vllm``) with the tiny model, so the whole pipeline
is proven against the real engine.

The parts: ``device`` (what the engines run on: nvidia-smi, CPU affinity), ``settings``
(interpreter, router, model folder, CPU sizing), ``commands`` (the pure rendering of an arm to
command lines, golden-tested) and ``backend`` (``LocalBackend``: processes, readiness, scrape).

What an arm becomes (``commands.render_arm``, pure and golden-tested):
- one ``vllm serve`` process per worker. On a GPU box each gets ``CUDA_VISIBLE_DEVICES`` with
  its TP-many GPUs (prefill pool first, then decode); on CPU, ``VLLM_CPU_KVCACHE_SPACE`` sizes
  the KV cache; one core is kept free for the load generator and the engines' process trees
  are pinned to the others (taskset: a saturated engine busy-polls, and a generator sharing its
  cores falls behind its schedule); with two or more engines, ``VLLM_CPU_OMP_THREADS_BIND``
  gives each its own share of those cores (vLLM's "auto" would bind them all to the same ones). The GPU form is the ``vllm`` console entry point's module
  (``python -m vllm.entrypoints.cli.main serve``), exactly ``vllm serve``; the CPU packaging
  (``vllm-cpu``) breaks the console command, so there the OpenAI server module runs directly.
- disaggregated arms: ``--kv-transfer-config`` with NixlConnector on GPUs; on CPU, where NIXL
  has no transport, ExampleConnector (the shared-storage connector): the producer writes each
  prompt's KV to a folder of the run, the consumer reads it back (``external_prefix_cache_hits``).
- ``vllm-router`` in front: the plan's policy over the workers, or its P/D mode
  (``--vllm-pd-disaggregation``: prefill with max_tokens 1, then decode). Retries and the
  circuit breaker are off: a retried request would hide a failure the guards must count.

Every process runs in its own process group (teardown stops the whole group, so EngineCore
and worker children go too), logs to a file in the run's folder (commands.txt beside them),
carries ``ORCH_RUN=<slug>`` in its environment, and is listed in a state file so ``cleanup``
finds the leftovers of a crashed controller.
"""

import shutil  # noqa: F401  # tests patch `local.shutil.which` (the module the backend asks for taskset)

from orchestrator.backends.local.backend import LocalBackend, free_ports
from orchestrator.backends.local.commands import (
    HOST,
    ArmLayout,
    CpuShare,
    ProcessSpec,
    cpu_shares,
    engine_argv,
    model_source,
    render_arm,
    router_argv,
    sequential_ports,
    served_name,
)
from orchestrator.backends.local.device import Device
from orchestrator.backends.local.settings import LocalSettings
from orchestrator.backends.processes import group_members, stop_group

__all__ = [
    "HOST", "ArmLayout", "Device", "LocalBackend", "LocalSettings", "ProcessSpec", "CpuShare",
    "cpu_shares", "engine_argv",
    "free_ports", "group_members", "model_source", "render_arm", "router_argv",
    "sequential_ports", "served_name", "stop_group",
]
