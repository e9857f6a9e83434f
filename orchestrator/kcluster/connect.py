"""The API server's connect subresources: a pod's log (``pods/NAME/log``), the pod and Service
proxy (``pods/[scheme:]NAME[:PORT]/proxy/PATH``, forwarded for real to the pod's IP or the
Service's clusterIP) and ``pods/NAME/portforward``, the websocket stream of ``kubectl
port-forward`` (v4.channel.k8s.io)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

import aiohttp
import aiohttp.web
import kmock

from orchestrator.kcluster.objects import (
    ApiError,
    Route,
    first_container_port,
    named_port,
    not_found,
)

if TYPE_CHECKING:
    from orchestrator.kcluster.apiserver import ApiServer


def pod_log(server: ApiServer, route: Route, params: dict[str, str]) -> aiohttp.web.Response:
    pod = server.obj_get("pods", route.namespace, route.name or "")
    if pod is None:
        raise not_found(route.res, route.name or "")
    text = server.read_log(route.namespace or "", route.name or "", params.get("container"),
                         params.get("previous") in ("true", "1"))
    if text is None:
        raise ApiError(400, "BadRequest", f'container "{params.get("container") or "?"}" in pod '
                       f'"{route.name}" is waiting to start: ContainerCreating')
    tail = params.get("tailLines")
    if tail:
        text = "".join(text.splitlines(keepends=True)[-int(tail):])
    return aiohttp.web.Response(text=text, content_type="text/plain")


async def proxy(server: ApiServer, request: kmock.Request, route: Route) -> aiohttp.web.StreamResponse:
    """``pods/[scheme:]NAME[:PORT]/proxy/PATH`` forwarded to the pod's IP (services: clusterIP)."""
    parts = (route.name or "").split(":")
    if len(parts) == 3:
        _, name, port = parts
    elif len(parts) == 2:
        name, port = parts
    else:
        name, port = parts[0], ""
    sub = route.sub or ""
    path = sub[len("proxy"):] if sub.startswith("proxy") else "/" + sub
    obj = server.obj_get(route.res.plural, route.namespace, name)
    if obj is None:
        raise not_found(route.res, name)
    if route.res.plural == "pods":
        ip = (obj.get("status") or {}).get("podIP")
        if not ip:
            raise ApiError(503, "ServiceUnavailable", f'pod "{name}" has no IP address yet')
        port = port or str(first_container_port(obj))
        port = str(named_port(obj, port))
    else:
        ip = (obj.get("spec") or {}).get("clusterIP")
        if not ip or ip == "None":
            raise ApiError(503, "ServiceUnavailable", f'no endpoints available for service "{name}"')
        port = port or str(((obj.get("spec") or {}).get("ports") or [{}])[0].get("port", 80))
    url = f"http://{ip}:{port}{path or '/'}"
    if server.http is None:
        server.http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30))
    try:
        async with server.http.request(request.method.value, url, params=dict(request.params or {}),
                                      data=request.body or None) as r:
            body = await r.read()
            headers = {k: v for k, v in r.headers.items() if k.lower() == "content-type"}
            return aiohttp.web.Response(body=body, status=r.status, headers=headers)
    except (aiohttp.ClientError, OSError, TimeoutError) as e:
        raise ApiError(503, "ServiceUnavailable", f"error trying to reach service: dial tcp {ip}:{port}: "
                       f"connect: {getattr(e, 'strerror', None) or 'connection refused'}") from e


async def portforward(server: ApiServer, request: kmock.Request, route: Route) -> aiohttp.web.StreamResponse:
    """``kubectl port-forward``'s stream (the official client's ``portforward``): a websocket
    (v4.channel.k8s.io) whose channel 2i carries port i's bytes and 2i+1 its errors; each
    channel's first frame is the port number (2 bytes, little endian)."""
    pod = server.obj_get("pods", route.namespace, route.name or "")
    if pod is None:
        raise not_found(route.res, route.name or "")
    ip = (pod.get("status") or {}).get("podIP")
    raw = request._raw_request
    assert raw is not None  # kmock keeps the aiohttp request of every HTTP call
    ports = [int(p) for v in raw.query.getall("ports", []) for p in v.split(",") if p.strip()]
    if not ports or not ip:
        raise ApiError(400, "BadRequest", "query parameter \"port\" is required" if not ports
                       else f'pod "{route.name}" has no IP address yet')
    ws = aiohttp.web.WebSocketResponse(protocols=("v4.channel.k8s.io", "channel.k8s.io"))
    await ws.prepare(raw)
    writers: dict[int, asyncio.StreamWriter] = {}
    pumps = []

    async def pump(i: int, reader: asyncio.StreamReader) -> None:
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            while chunk := await reader.read(65536):
                await ws.send_bytes(bytes((2 * i,)) + chunk)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await ws.close()

    for i, port in enumerate(ports):
        head = port.to_bytes(2, "little")
        await ws.send_bytes(bytes((2 * i,)) + head)
        await ws.send_bytes(bytes((2 * i + 1,)) + head)
        try:
            reader, writers[i] = await asyncio.open_connection(ip, port)
        except OSError as e:
            await ws.send_bytes(bytes((2 * i + 1,)) + (
                f"error forwarding port {port} to pod {route.name}, uid : failed to connect to "
                f"localhost:{port} inside namespace: {e.strerror or e}").encode())
            continue
        pumps.append(asyncio.get_running_loop().create_task(pump(i, reader)))
    try:
        async for msg in ws:
            if msg.type != aiohttp.WSMsgType.BINARY or not msg.data:
                continue
            w = writers.get(msg.data[0] // 2)
            if w is not None and msg.data[0] % 2 == 0:
                w.write(msg.data[1:])
                await w.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        for w in writers.values():
            with contextlib.suppress(Exception):
                w.close()
        for t in pumps:
            t.cancel()
        await asyncio.gather(*pumps, return_exceptions=True)
    return ws
