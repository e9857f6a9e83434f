"""The local backend's package: the rendering is pure (asks the machine nothing), detection
and settings live apart, and the package exports what ``orchestrator.backends.local`` did."""

from __future__ import annotations

import ast
from pathlib import Path

import orchestrator.backends.local as local
from orchestrator.backends.local import commands

# Modules through which code asks the machine: processes, files, sockets, the environment.
MACHINE = {"os", "subprocess", "shutil", "socket", "sys", "platform", "psutil"}


def test_rendering_imports_nothing_that_asks_the_machine() -> None:
    tree = ast.parse(Path(commands.__file__).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {(n.module or "").split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not imported & MACHINE, imported & MACHINE


def test_the_package_exports_what_the_module_did() -> None:
    for name in ("HOST", "ArmLayout", "Device", "LocalBackend", "LocalSettings", "ProcessSpec",
                 "CpuShare", "cpu_shares", "engine_argv", "free_ports", "group_members",
                 "model_source", "render_arm", "router_argv", "sequential_ports", "served_name",
                 "stop_group"):
        assert hasattr(local, name), name
    assert local.Device.__module__ == "orchestrator.backends.local.device"
    assert local.LocalSettings.__module__ == "orchestrator.backends.local.settings"
