"""Watches of the emulated API server (apiserver.py): the stream of events a WATCH request
reads, from a resourceVersion or as a streaming list (client-go's WatchListClient) where the
emulated release's WatchList gate serves one, with the real 410 and 422 refusals."""

from __future__ import annotations

import asyncio
import collections
import copy
import json
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import aiohttp.web
import kmock

from orchestrator.kcluster.discovery import parse_version
from orchestrator.kcluster.objects import ApiError, Key, Obj, Route, watch_event
from orchestrator.kcluster.selectors import parse_field_selector, parse_label_selector


@dataclass
class Watcher:
    queue: asyncio.Queue[Obj | None]
    plural: str
    namespace: str | None
    accept: Callable[[Obj], bool]


@dataclass
class Store:
    """Objects by (plural, namespace, name), a resourceVersion counter and the event log."""

    objects: dict[Key, Obj] = field(default_factory=dict)
    rv: int = 0
    log: collections.deque[tuple[int, str, str, Obj, Obj | None]] = field(
        default_factory=lambda: collections.deque(maxlen=20000))
    watchers: list[Watcher] = field(default_factory=list)


async def serve_watch(store: Store, version: str, request: kmock.Request, route: Route,
                      params: dict[str, str]) -> aiohttp.web.StreamResponse:
    """A WATCH (``?watch=true``) of ``route``'s resource: the initial events (the state for a
    version of 0 or none, the log since a given version, 410 Expired before the log, or a
    streaming list where the release serves it), then every change that ``accept``s, until
    ``timeoutSeconds`` or the server closes its watches."""
    try:
        lab = parse_label_selector(params.get("labelSelector") or "")
        fld = parse_field_selector(params.get("fieldSelector") or "")
    except ValueError as e:
        raise ApiError(400, "BadRequest", f"unable to parse requirement: {e}") from e

    def accept(o: Obj) -> bool:
        return lab((o.get("metadata") or {}).get("labels") or {}) and fld(o)

    queue: asyncio.Queue[Obj | None] = asyncio.Queue()
    w = Watcher(queue, route.res.plural, route.namespace, accept)
    rv_param = params.get("resourceVersion") or ""
    initial: list[Obj] = []
    streaming = watch_list_request(params, parse_version(version)[1])
    if streaming:  # the current state as ADDED events, then the bookmark that ends it
        initial = [{"type": "ADDED", "object": copy.deepcopy(o)}
                   for (p, ns, _), o in sorted(store.objects.items(), key=lambda kv: kv[0])
                   if p == w.plural and (w.namespace is None or ns == w.namespace) and accept(o)]
        initial.append({"type": "BOOKMARK", "object": {
            "kind": route.res.kind, "apiVersion": route.res.api_version,
            "metadata": {"resourceVersion": str(store.rv),
                         "annotations": {"k8s.io/initial-events-end": "true"}}}})
    elif rv_param in ("", "0"):
        initial = [{"type": "ADDED", "object": copy.deepcopy(o)}
                   for (p, ns, _), o in store.objects.items()
                   if p == w.plural and (w.namespace is None or ns == w.namespace) and accept(o)]
    else:
        try:
            since = int(rv_param)
        except ValueError:
            since = -1
        oldest = store.log[0][0] if store.log else store.rv + 1
        if since < oldest - 1 and since < store.rv:
            initial = [{"type": "ERROR", "object": ApiError(
                410, "Expired", f"too old resource version: {rv_param} ({oldest - 1})").status()}]
        else:
            for rv, plural, etype, obj, old in store.log:
                if rv <= since or plural != w.plural:
                    continue
                if w.namespace is not None and (obj.get("metadata") or {}).get("namespace") != w.namespace:
                    continue
                ev = watch_event(etype, obj, old, accept)
                if ev is not None:
                    initial.append(ev)
    store.watchers.append(w)
    raw = request._raw_request
    assert raw is not None  # kmock keeps the aiohttp request of every HTTP call
    resp = aiohttp.web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
    resp.enable_chunked_encoding()
    timeout = float(params.get("timeoutSeconds") or 1800)
    deadline = asyncio.get_running_loop().time() + timeout
    try:
        await resp.prepare(raw)
        for ev in initial:
            await resp.write(json.dumps(ev).encode() + b"\n")
        if initial and initial[-1]["type"] == "ERROR":
            return resp
        while True:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                break
            try:
                ev = await asyncio.wait_for(queue.get(), timeout=left)
            except TimeoutError:
                break
            if ev is None:
                break
            await resp.write(json.dumps(ev).encode() + b"\n")
        await resp.write_eof()
    except (ConnectionError, aiohttp.ClientConnectionError, RuntimeError):
        pass
    finally:
        if w in store.watchers:
            store.watchers.remove(w)
    return resp


# The WatchList feature gate (KEP-3157, streaming lists) of kube-apiserver: alpha (off) until 1.31,
# beta and on in 1.32, off again in 1.33, on from 1.34.
def watch_list_enabled(minor: int) -> bool:
    return minor == 32 or minor >= 34


def watch_list_request(params: dict[str, str], minor: int) -> bool:
    """Whether a watch asks for a streaming list (``sendInitialEvents=true``) that this release
    serves; ApiError 422 with the real ListOptions validation when it does not (client-go's
    reflector, e.g. behind ``kubectl delete`` and ``kubectl wait``, then falls back to LIST and
    WATCH, as against a real server without the feature)."""
    send = params.get("sendInitialEvents")
    match = params.get("resourceVersionMatch") or ""
    enabled = watch_list_enabled(minor)
    causes: list[tuple[str, str, str]] = []  # (field, reason, message)
    if send is not None:
        if match != "NotOlderThan":
            causes.append(("resourceVersionMatch", "FieldValueForbidden",
                           "Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan"))
        if not enabled:
            causes.append(("sendInitialEvents", "FieldValueForbidden", "Forbidden: sendInitialEvents is "
                           "forbidden for watch unless the WatchList feature gate is enabled"))
    if match:
        if send is None:
            causes.append(("resourceVersionMatch", "FieldValueForbidden",
                           "Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided"))
        if match != "NotOlderThan":
            causes.append(("resourceVersionMatch", "FieldValueNotSupported",
                           f'Unsupported value: "{match}": supported values: "NotOlderThan"'))
    if causes:
        text = ", ".join(f"{f}: {m}" for f, _, m in causes)
        if len(causes) > 1:
            text = f"[{text}]"
        raise ApiError(422, "Invalid", f'ListOptions.meta.k8s.io "" is invalid: {text}', {
            "group": "meta.k8s.io", "kind": "ListOptions",
            "causes": [{"reason": r, "message": m, "field": f} for f, r, m in causes]})
    return send in ("true", "1")
