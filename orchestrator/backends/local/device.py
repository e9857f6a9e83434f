"""What the local engines run on: the GPUs nvidia-smi lists, else this process's CPUs.

``Device`` is the description the pure rendering (``commands``) reads; ``Device.detect`` is the
one place that asks the machine (nvidia-smi, CPU affinity, /proc/cpuinfo).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Literal


@dataclass(frozen=True)
class Device:
    """What the engines run on: ``cuda`` with ``gpus`` GPUs named ``name``, or ``cpu``.

    ``cpus``: the logical CPUs this process may use (CPU arms split them between engines;
    empty: unknown, vLLM binds on its own)."""

    kind: Literal["cuda", "cpu"]
    gpus: int = 0
    name: str = ""
    cpus: tuple[int, ...] = ()

    @classmethod
    def detect(cls) -> Device:
        """GPUs as nvidia-smi lists them (respecting CUDA_VISIBLE_DEVICES), else the CPU."""
        smi = shutil.which("nvidia-smi")
        if smi:
            try:
                out = subprocess.run(
                    [smi, "--query-gpu=name", "--format=csv,noheader"],
                    capture_output=True, text=True, timeout=20, check=True,
                ).stdout
                names = [n.strip() for n in out.splitlines() if n.strip()]
                visible = os.environ.get("CUDA_VISIBLE_DEVICES")
                if visible is not None:
                    keep = [int(i) for i in visible.split(",") if i.strip().isdigit()]
                    names = [names[i] for i in keep if i < len(names)]
                if names:
                    return cls(kind="cuda", gpus=len(names), name=names[0])
            except (OSError, subprocess.SubprocessError, ValueError):
                pass
        return cls(kind="cpu", gpus=0, name=_cpu_name(), cpus=_allowed_cpus())


def _allowed_cpus() -> tuple[int, ...]:
    with contextlib.suppress(AttributeError, OSError):
        return tuple(sorted(os.sched_getaffinity(0)))
    return tuple(range(os.cpu_count() or 1))


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "cpu"
