"""Which process opened a loopback TCP connection (Linux /proc): how the emulated kube-proxy
keeps Service cluster IPs inside the cluster network. On a real cluster a clusterIP routes only
from nodes and pods; here every address is loopback, so the proxy asks who is connecting and
refuses a process that is none of the cluster's pods (a workstation's `orch`, a test)."""

from __future__ import annotations

import contextlib
import ipaddress
import os
from collections.abc import Iterable


def _hex_address(ip: str, port: int) -> str:
    """/proc/net/tcp's form of an IPv4 address and port (little-endian address, hex)."""
    packed = ipaddress.IPv4Address(ip).packed
    return f"{int.from_bytes(packed, 'little'):08X}:{port:04X}"


def connection_inode(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The socket inode of the TCP connection from ``local`` to ``remote`` (None: not found)."""
    want_l, want_r = _hex_address(*local), _hex_address(*remote)
    try:
        with open("/proc/net/tcp") as f:
            next(f, None)
            for line in f:
                parts = line.split()
                if len(parts) > 9 and parts[1] == want_l and parts[2] == want_r:
                    return int(parts[9])
    except OSError:
        return None
    return None


def owned_by(inode: int, pids: Iterable[int]) -> bool:
    """Whether one of ``pids`` holds the socket ``inode`` open."""
    target = f"socket:[{inode}]"
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") == target:
                        return True
    return False
