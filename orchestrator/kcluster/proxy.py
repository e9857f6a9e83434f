"""kube-proxy: every non-headless Service's clusterIP:port relays TCP to a ready pod of its
selector (round robin per connection), on the targetPort (a number, or a container port's
name looked up in the chosen pod). No ready endpoint: the connection is refused (closed at once).
Headless Services (``clusterIP: None``) get nothing, as on a real cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.kcluster.controllers import deleting, is_ready
from orchestrator.kcluster.netowner import connection_inode, owned_by

if TYPE_CHECKING:
    from orchestrator.kcluster.apiserver import ApiServer

Obj = dict[str, Any]


@dataclass
class ServiceRelay:
    ip: str
    ports: dict[int, Any] = field(default_factory=dict)  # service port -> targetPort
    servers: dict[int, asyncio.Server] = field(default_factory=dict)
    counter: itertools.count[int] = field(default_factory=itertools.count)


class KubeProxy:
    """``pod_pids``, when given, keeps cluster IPs inside the cluster network: a connection
    from a process that is none of them (nor of their process groups) is refused
    (``netowner``), as a clusterIP does not route from a workstation."""

    def __init__(self, api: ApiServer, pod_pids: Callable[[], set[int]] | None = None):
        self.api = api
        self.pod_pids = pod_pids
        self.relays: dict[tuple[str, str], ServiceRelay] = {}
        self.connections: dict[asyncio.Task[Any], list[asyncio.StreamWriter]] = {}
        self.relayed = 0  # connections relayed to a pod, all services
        self.refused_outside = 0  # connections from outside the cluster network (pod_pids)
        self.errors: list[str] = []  # listeners that could not bind

    async def sync(self) -> None:
        want: dict[tuple[str, str], Obj] = {}
        for svc in self.api.obj_list("services"):
            ip = (svc.get("spec") or {}).get("clusterIP")
            if ip and ip != "None" and not deleting(svc):
                want[(svc["metadata"]["namespace"], svc["metadata"]["name"])] = svc
        for key in list(self.relays):
            if key not in want or want[key]["spec"]["clusterIP"] != self.relays[key].ip:
                await self._close(self.relays.pop(key))
        for key, svc in want.items():
            relay = self.relays.setdefault(key, ServiceRelay(svc["spec"]["clusterIP"]))
            ports = {int(p["port"]): p.get("targetPort", p["port"]) for p in svc["spec"].get("ports") or []
                     if p.get("protocol", "TCP") == "TCP"}
            relay.ports = ports
            for port in list(relay.servers):
                if port not in ports:
                    server = relay.servers.pop(port)
                    server.close()
            for port in ports:
                if port not in relay.servers:
                    try:
                        relay.servers[port] = await asyncio.start_server(
                            functools.partial(self._accept, key, port), relay.ip, port)
                    except OSError as e:  # retried at the next pass
                        self.errors.append(f"{key[0]}/{key[1]} {relay.ip}:{port}: {e}")

    def _endpoint(self, key: tuple[str, str], port: int) -> tuple[str, int] | None:
        svc = self.api.obj_get("services", key[0], key[1])
        relay = self.relays.get(key)
        if svc is None or relay is None:
            return None
        selector = (svc.get("spec") or {}).get("selector") or {}
        if not selector:
            return None
        pods = [p for p in self.api.obj_list("pods", key[0])
                if all(((p["metadata"].get("labels") or {}).get(k) == v) for k, v in selector.items())
                and is_ready(p) and not deleting(p) and (p.get("status") or {}).get("podIP")]
        if not pods:
            return None
        pods.sort(key=lambda p: p["metadata"]["name"])
        pod = pods[next(relay.counter) % len(pods)]
        target = relay.ports.get(port, port)
        if isinstance(target, str) and not target.isdigit():
            found = next((cp["containerPort"] for c in pod["spec"].get("containers") or []
                          for cp in c.get("ports") or [] if cp.get("name") == target), None)
            if found is None:
                return None
            target = found
        return pod["status"]["podIP"], int(target)

    async def _accept(self, key: tuple[str, str], port: int, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        writers = [writer]
        if task is not None:
            self.connections[task] = writers
        try:
            if self.pod_pids is not None and not await self._from_a_pod(writer):
                self.refused_outside += 1
                return
            ep = self._endpoint(key, port)
            if ep is None:
                return
            try:
                up_r, up_w = await asyncio.open_connection(*ep)
            except OSError:
                return
            writers.append(up_w)
            self.relayed += 1
            await asyncio.gather(_pump(reader, up_w), _pump(up_r, writer))
        finally:
            for w in writers:
                with contextlib.suppress(Exception):
                    w.close()
            if task is not None:
                self.connections.pop(task, None)

    async def _from_a_pod(self, writer: asyncio.StreamWriter) -> bool:
        """Whether the connecting process is one of the cluster's pods' (see the class)."""
        assert self.pod_pids is not None
        peer, here = writer.get_extra_info("peername"), writer.get_extra_info("sockname")
        if not peer or not here:
            return False
        pids = self.pod_pids()

        def look() -> bool:
            inode = connection_inode((peer[0], peer[1]), (here[0], here[1]))
            return inode is not None and owned_by(inode, pids)

        return await asyncio.to_thread(look)

    async def _close(self, relay: ServiceRelay) -> None:
        for server in relay.servers.values():
            server.close()
        for server in relay.servers.values():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)
        relay.servers.clear()

    async def shutdown(self) -> None:
        for relay in list(self.relays.values()):
            for server in relay.servers.values():
                server.close()
        for writers in list(self.connections.values()):  # closing ends the pumps
            for w in writers:
                with contextlib.suppress(Exception):
                    w.close()
        if self.connections:
            await asyncio.wait(list(self.connections), timeout=2.0)
        for relay in list(self.relays.values()):
            await self._close(relay)
        self.relays.clear()


async def _pump(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while chunk := await src.read(65536):
            dst.write(chunk)
            await dst.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            if dst.can_write_eof():
                dst.write_eof()
