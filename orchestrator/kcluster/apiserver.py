"""The API server of the emulated cluster: kmock (HTTP, request log, error rendering) with an
object store that behaves like a real API server where the backend and vllm-router look.

What it does as a real server does:
- create (POST), server-side apply (PATCH application/apply-patch+yaml: creates when absent,
  keeps server-owned fields and ``status``), merge / strategic-merge / JSON patch, replace (PUT,
  with resourceVersion conflicts), the ``status`` subresource;
- GET one (404 with the real message, e.g. ``persistentvolumeclaims "x" not found``), LIST with
  label selectors (``=``, ``!=``, ``in``, ``notin``, exists) and field selectors, and WATCH
  (``?watch=true``, watches.py) from a resourceVersion, with label-selector transitions (an object that
  stops matching is sent as DELETED), ``timeoutSeconds``, 410 Expired for a too-old version;
  a streaming list (``sendInitialEvents=true``, client-go's WatchListClient, on in kubectl 1.37)
  as the release's WatchList gate has it: 1.31 (the default) refuses it with the real 422, and
  the client falls back to LIST and WATCH; 1.32 and 1.34+ stream the state and end it with the
  ``k8s.io/initial-events-end`` bookmark;
- uids, resourceVersions, generation, creationTimestamp; namespaced objects need their
  namespace (404 when missing, 403 while it terminates);
- DELETE: pods and namespaces terminate gracefully (deletionTimestamp, then the kubelet or the
  namespace controller finishes); ``propagationPolicy`` Background (the garbage collector in
  the controller deletes dependents whose owners are all gone), Foreground and Orphan;
- the pod proxy ``/api/v1/namespaces/NS/pods/NAME:PORT/proxy/PATH`` (and the Service proxy)
  forwards for real to the pod's IP; ``pods/NAME/log`` reads the container's log;
  ``pods/NAME/portforward`` is the websocket stream of ``kubectl port-forward`` (v4.channel.k8s.io);
- injected faults: N-shot HTTP statuses (403, 409, 429, 500, ...) with real-looking Status bodies.

Approximations: server-side apply has no managedFields (the applier owns what it sends; labels
are replaced, annotations merged); strategic merge patch is a JSON merge patch; no admission
(RBAC, quotas, Pod Security) unless injected through the cluster; no Endpoints objects.
Everything runs on the server's event loop; other threads go through ``EmulatedCluster``.
"""

from __future__ import annotations

import collections
import contextlib
import copy
import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import aiohttp
import aiohttp.web
import attrs
import jsonpatch
import kmock

from orchestrator.kcluster import connect, discovery, tables
from orchestrator.kcluster.defaults import apply_defaults
from orchestrator.kcluster.discovery import DEFAULT_VERSION, parse_version
from orchestrator.kcluster.objects import (
    GENERATION_KINDS,
    KIND_TO_PLURAL,
    RESOURCES,
    ApiError,
    Fault,
    Key,
    Obj,
    Res,
    Route,
    body_of,
    conflict,
    fault_error,
    merge_patch,
    not_found,
    now,
    parse_route,
    watch_event,
)
from orchestrator.kcluster.rbac import (
    Attrs,
    Authorizer,
    Identities,
    User,
    checks_for,
    forbidden,
    request_attrs,
    unauthorized,
)
from orchestrator.kcluster.selectors import parse_field_selector, parse_label_selector
from orchestrator.kcluster.watches import Store, serve_watch

MAX_EVENTS = 1000  # per namespace


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    """kmock with a real API server's object semantics (module docstring)."""

    store: Store = attrs.field(factory=Store)
    faults: list[Fault] = attrs.field(factory=list)
    enforce_namespaces: bool = True
    # Hooks the cluster sets: a Service's clusterIP on creation, a container's log, a wake-up.
    allocate_cluster_ip: Callable[[Obj], str | None] = lambda svc: None
    read_log: Callable[[str, str, str | None, bool], str | None] = lambda ns, pod, c, prev: None
    on_change: Callable[[], None] = lambda: None
    identities: Identities = attrs.field(factory=Identities)
    version: str = DEFAULT_VERSION  # the Kubernetes release it reports (and whose checks it makes)
    audit: collections.deque[tuple[str, str, str, str, bool]] = attrs.field(
        factory=lambda: collections.deque(maxlen=20000))  # (user, verb, resource or path, namespace, allowed)
    http: aiohttp.ClientSession | None = attrs.field(default=None, init=False)
    _acting: User | None = attrs.field(default=None, init=False)  # the writer of an HTTP request's write
    _events: dict[str, collections.OrderedDict[tuple[Any, str, str], str]] = attrs.field(factory=dict, init=False)

    # -- the store, for the controllers (same event loop) ----------------------------------------

    def obj_get(self, plural: str, namespace: str | None, name: str) -> Obj | None:
        return self.store.objects.get((plural, namespace if RESOURCES[plural].namespaced else None, name))

    def obj_list(self, plural: str, namespace: str | None = None, labels: str | None = None) -> list[Obj]:
        pred = parse_label_selector(labels or "")
        return [o for (p, ns, _), o in sorted(self.store.objects.items(), key=lambda kv: kv[0][1:3].__repr__())
                if p == plural and (namespace is None or ns == namespace)
                and pred((o.get("metadata") or {}).get("labels") or {})]

    def obj_create(self, obj: Obj, plural: str | None = None) -> Obj:
        """Create ``obj`` with server defaults (uid, resourceVersion, ...); ApiError if it exists."""
        plural = plural or KIND_TO_PLURAL[obj["kind"]]
        res = RESOURCES[plural]
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        ns = meta.get("namespace") if res.namespaced else None
        if res.namespaced and not ns:
            ns = meta["namespace"] = "default"
        key = (plural, ns, meta["name"])
        if key in self.store.objects:
            raise ApiError(409, "AlreadyExists", f'{res.qualified} "{meta["name"]}" already exists',
                           {"name": meta["name"], "kind": plural})
        self._check_namespace(res, ns)
        obj["apiVersion"], obj["kind"] = res.api_version, res.kind
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", now())
        if plural in GENERATION_KINDS:
            meta["generation"] = 1
        if self._acting is not None:
            self.authz.check_escalation(self._acting, plural, obj)
        apply_defaults(plural, obj, self.allocate_cluster_ip)
        self._commit(key, obj, "ADDED")
        return obj

    def obj_put(self, obj: Obj, plural: str | None = None) -> Obj:
        """Store ``obj`` as it is (controllers' writes: status and the like)."""
        plural = plural or KIND_TO_PLURAL[obj["kind"]]
        meta = obj["metadata"]
        key = (plural, meta.get("namespace") if RESOURCES[plural].namespaced else None, meta["name"])
        if key not in self.store.objects:
            return self.obj_create(obj, plural)
        if self._acting is not None:
            self.authz.check_escalation(self._acting, plural, obj)
        self._commit(key, obj, "MODIFIED")
        return obj

    def obj_remove(self, plural: str, namespace: str | None, name: str) -> Obj | None:
        """Take the object out of the store now (the end of a deletion)."""
        key = (plural, namespace if RESOURCES[plural].namespaced else None, name)
        old = self.store.objects.get(key)
        if old is not None:
            self._commit(key, None, "DELETED")
        return old

    def obj_delete(self, plural: str, namespace: str | None, name: str, policy: str | None = None,
               grace_s: int | None = None) -> Obj:
        """A DELETE as the API server takes it (graceful for pods and namespaces)."""
        res = RESOURCES[plural]
        obj = self.obj_get(plural, namespace, name)
        if obj is None:
            raise not_found(res, name)
        meta = obj["metadata"]
        policy = policy or "Background"
        if meta.get("deletionTimestamp"):
            return obj
        if policy == "Orphan":
            uid = meta.get("uid")
            for key, dep in list(self.store.objects.items()):
                refs = (dep.get("metadata") or {}).get("ownerReferences") or []
                if any(r.get("uid") == uid for r in refs):
                    dep = copy.deepcopy(dep)
                    dep["metadata"]["ownerReferences"] = [r for r in refs if r.get("uid") != uid]
                    self._commit(key, dep, "MODIFIED")
        graceful = (
            (plural == "pods" and (obj.get("spec") or {}).get("nodeName"))
            or plural == "namespaces" or meta.get("finalizers") or policy == "Foreground"
        )
        if not graceful:
            self.obj_remove(plural, namespace, name)
            return obj
        obj = copy.deepcopy(obj)
        meta = obj["metadata"]
        meta["deletionTimestamp"] = now()
        if plural == "pods":
            spec_grace = (obj.get("spec") or {}).get("terminationGracePeriodSeconds", 30)
            meta["deletionGracePeriodSeconds"] = spec_grace if grace_s is None else grace_s
        if plural == "namespaces":
            obj.setdefault("status", {})["phase"] = "Terminating"
        if policy == "Foreground":
            meta["finalizers"] = [*(meta.get("finalizers") or []), "foregroundDeletion"]
        self.obj_put(obj, plural)
        return obj

    def record_event(self, involved: Obj, reason: str, message: str, type_: str = "Normal",
                     component: str = "kubelet", host: str | None = None) -> Obj | None:
        """An Event about ``involved`` (aggregated: the same reason and message count up; at most
        ``MAX_EVENTS`` per namespace are kept, the oldest go first, as the API server's TTL does);
        None when the namespace refuses it (it is being terminated)."""
        meta = involved["metadata"]
        ns = meta.get("namespace") or "default"
        index = self._events.setdefault(ns, collections.OrderedDict())
        ident = (meta.get("uid"), reason, message)
        name = index.get(ident)
        ev = self.obj_get("events", ns, name) if name else None
        if ev is not None:
            ev = copy.deepcopy(ev)
            ev["count"] = ev.get("count", 1) + 1
            ev["lastTimestamp"] = now()
            return self.obj_put(ev, "events")
        stamp = now()
        ev = {
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().int % (1 << 64):x}", "namespace": ns},
            "involvedObject": {"kind": involved.get("kind"), "namespace": ns, "name": meta["name"],
                               "uid": meta.get("uid"), "apiVersion": involved.get("apiVersion"),
                               "resourceVersion": meta.get("resourceVersion")},
            "reason": reason, "message": message, "type": type_,
            "source": {"component": component, **({"host": host} if host else {})},
            "firstTimestamp": stamp, "lastTimestamp": stamp, "count": 1,
            "reportingComponent": component, "reportingInstance": host or "",
        }
        try:
            created = self.obj_create(ev, "events")
        except ApiError:  # a namespace that is terminating (or gone) refuses it; the recorder drops it
            return None
        index[ident] = ev["metadata"]["name"]
        while len(index) > MAX_EVENTS:
            _, old = index.popitem(last=False)
            self.obj_remove("events", ns, old)
        return created

    # -- internals --------------------------------------------------------------------------------

    def terminating(self, namespace: str) -> bool:
        nso = self.store.objects.get(("namespaces", None, namespace))
        return bool(nso is not None and (nso.get("metadata") or {}).get("deletionTimestamp"))

    def _check_namespace(self, res: Res, ns: str | None) -> None:
        if not res.namespaced or not self.enforce_namespaces:
            return
        nso = self.store.objects.get(("namespaces", None, ns or ""))
        if nso is None:
            raise ApiError(404, "NotFound", f'namespaces "{ns}" not found', {"name": ns, "kind": "namespaces"})
        if (nso.get("metadata") or {}).get("deletionTimestamp"):
            raise ApiError(403, "Forbidden", f"{res.plural} is forbidden: unable to create new content in "
                           f"namespace {ns} because it is being terminated")

    def _commit(self, key: Key, obj: Obj | None, etype: str) -> None:
        st = self.store
        st.rv += 1
        old = st.objects.get(key)
        if obj is None:
            st.objects.pop(key, None)
            payload = copy.deepcopy(old or {})
            payload.setdefault("metadata", {})["resourceVersion"] = str(st.rv)
        else:
            obj.setdefault("metadata", {})["resourceVersion"] = str(st.rv)
            st.objects[key] = obj
            payload = copy.deepcopy(obj)
        st.log.append((st.rv, key[0], etype, payload, copy.deepcopy(old) if old is not None else None))
        for w in list(st.watchers):
            if w.plural != key[0] or (w.namespace is not None and w.namespace != key[1]):
                continue
            ev = watch_event(etype, payload, old, w.accept)
            if ev is not None:
                w.queue.put_nowait(ev)
        self.on_change()

    # -- HTTP ------------------------------------------------------------------------------------

    @property
    def authz(self) -> Authorizer:
        return Authorizer(self._rbac_objects, self.obj_get)

    def _rbac_objects(self, plural: str, namespace: str | None) -> list[Obj]:
        return [o for (p, ns, _), o in self.store.objects.items() if p == plural and ns == namespace]

    def _authorize(self, user: User, checks: list[Attrs]) -> None:
        """Each check, in order, logged in ``audit``; the 403 of the first refused."""
        authz = self.authz
        for check in checks:
            allowed = authz.allows(user, check)
            what = check.full_resource if check.resource_request else check.path
            self.audit.append((user.name, check.verb, what, check.namespace, allowed))
            if not allowed:
                raise forbidden(user, check)

    @contextlib.contextmanager
    def _writing_as(self, user: User) -> Iterator[None]:
        """Writes of this request are ``user``'s (escalation prevention on RBAC objects)."""
        self._acting = user
        try:
            yield
        finally:
            self._acting = None

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        parts = raw_request.path.strip("/").split("/")
        if parts != ["api", "v1", "namespaces"]:
            return await super().__call__(raw_request)
        # kmock cannot parse a path that ends at the namespaces collection (`kubectl get ns`).
        body = await raw_request.read()
        try:
            data = json.loads(body) if body.strip() else None
        except ValueError:
            data = None
        request = kmock.Request(
            id=len(self._requests), raw_request=raw_request, url=raw_request.url, method=raw_request.method,
            params=dict(raw_request.query), headers=dict(raw_request.headers), cookies=dict(raw_request.cookies),
            data=data, body=body, text=body.decode(errors="replace"), action=None, resource=None,
            namespace=None, name=None, subresource=None)
        self._requests.append(request)
        return await self._handle(request)

    async def _handle(self, request: kmock.Request) -> aiohttp.web.StreamResponse:
        try:
            user = self.identities.authenticate(request.headers.get("Authorization"))
            if user is None:
                raise unauthorized()
            self._maybe_fault(request)
            path = request.url.path
            route = parse_route(path)
            attrs = request_attrs(request.method.value, path, dict(request.params or {}), route)
            websocket = (request.headers.get("Upgrade") or "").lower() == "websocket"
            self._authorize(user, checks_for(attrs, websocket, parse_version(self.version)[1]))
            if route is None:  # discovery, /version, health
                return discovery.respond(path, request.headers.get("Host") or "", self.version)
            return await self._serve(request, route, user, attrs)
        except ApiError as e:
            return e.response()

    def _maybe_fault(self, request: kmock.Request) -> None:
        for f in self.faults:
            if f.times > 0 and f.method in (request.method.value, "*") and f.part in request.url.path:
                f.times -= 1
                f.hits += 1
                self.faults[:] = [x for x in self.faults if x.times > 0]
                route = parse_route(request.url.path)
                raise fault_error(f, request, route)

    async def _serve(self, request: kmock.Request, route: Route, user: User,
                     attrs: Attrs) -> aiohttp.web.StreamResponse:
        method = request.method.value
        params = dict(request.params or {})
        res = route.res
        if route.sub and (route.sub.startswith("proxy") or ":" in (route.name or "")) and res.plural in ("pods", "services"):
            return await connect.proxy(self, request, route)
        if route.sub == "log" and res.plural == "pods":
            return connect.pod_log(self, route, params)
        if route.sub == "portforward" and res.plural == "pods":
            return await connect.portforward(self, request, route)
        if route.name is None:
            if method == "GET":
                if params.get("watch") in ("true", "1"):
                    return await serve_watch(self.store, self.version, request, route, params)
                doc = self._list_doc(route, params)
                if tables.wants_table(request.headers.get("Accept")):  # kubectl get: server-side printing
                    doc = tables.table(res.plural, doc["items"], doc["metadata"]["resourceVersion"])
                return aiohttp.web.json_response(doc)
            if method == "POST":
                body = body_of(request)
                if route.namespace and res.namespaced:
                    body.setdefault("metadata", {}).setdefault("namespace", route.namespace)
                if not (body.get("metadata") or {}).get("name") and not (body.get("metadata") or {}).get("generateName"):
                    raise ApiError(422, "Invalid", f"{res.kind} in version \"{res.version}\" cannot be handled "
                                   "as a " + res.kind + ": name or generateName is required")
                with self._writing_as(user):
                    created = self.obj_create(body, res.plural)
                return aiohttp.web.json_response(created, status=201)
            if method == "DELETE":
                return aiohttp.web.json_response(self._delete_collection(request, route, params))
            raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        obj = self.obj_get(res.plural, route.namespace, route.name)
        if method == "GET":
            if params.get("watch") in ("true", "1"):
                params["fieldSelector"] = f"metadata.name={route.name}"
                return await serve_watch(self.store, self.version, request, route, params)
            if obj is None:
                raise not_found(res, route.name or "")
            if route.sub is None and tables.wants_table(request.headers.get("Accept")):
                return aiohttp.web.json_response(tables.table(res.plural, [obj], str(self.store.rv)))
            return aiohttp.web.json_response(obj)
        if method == "DELETE":
            body = body_of(request, default={})
            policy = params.get("propagationPolicy") or body.get("propagationPolicy")
            grace = params.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
            out = self.obj_delete(res.plural, route.namespace, route.name, policy,
                              int(grace) if grace is not None else None)
            return aiohttp.web.json_response(out)
        if method == "PATCH":
            creates = obj is None and route.sub is None and "apply-patch" in (request.headers.get("Content-Type") or "")
            if creates:  # server-side apply that creates needs `create` too
                self._authorize(user, [replace(attrs, verb="create")])
            with self._writing_as(user):
                patched = self._patch(request, route, obj, params)
            return aiohttp.web.json_response(patched, status=201 if creates else 200)
        if method == "PUT":
            body = body_of(request)
            if obj is None:
                raise not_found(res, route.name or "")
            rv = (body.get("metadata") or {}).get("resourceVersion")
            if rv and rv != obj["metadata"]["resourceVersion"]:
                raise conflict(res, route.name)
            new = copy.deepcopy(obj)
            if route.sub == "status":
                new["status"] = body.get("status") or {}
            else:
                new = self._merged(obj, body, replace=True)
            with self._writing_as(user):
                stored = self.obj_put(new, res.plural)
            return aiohttp.web.json_response(stored)
        raise ApiError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    def _delete_collection(self, request: kmock.Request, route: Route, params: dict[str, str]) -> Obj:
        """DELETE of a collection (``deletecollection``): every object the selectors match."""
        doc = self._list_doc(route, params)
        body = body_of(request, default={})
        policy = params.get("propagationPolicy") or body.get("propagationPolicy")
        grace = params.get("gracePeriodSeconds", body.get("gracePeriodSeconds"))
        for o in doc["items"]:
            meta = o["metadata"]
            with contextlib.suppress(ApiError):
                self.obj_delete(route.res.plural, meta.get("namespace"), meta["name"], policy,
                                int(grace) if grace is not None else None)
        return doc

    def _list_doc(self, route: Route, params: dict[str, str]) -> Obj:
        try:
            lab = parse_label_selector(params.get("labelSelector") or "")
            fld = parse_field_selector(params.get("fieldSelector") or "")
        except ValueError as e:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {e}") from e
        items = [copy.deepcopy(o) for (p, ns, _), o in self.store.objects.items()
                 if p == route.res.plural and (route.namespace is None or ns == route.namespace)
                 and lab((o.get("metadata") or {}).get("labels") or {}) and fld(o)]
        items.sort(key=lambda o: (o["metadata"].get("namespace") or "", o["metadata"]["name"]))
        return {"apiVersion": route.res.api_version, "kind": f"{route.res.kind}List",
                "metadata": {"resourceVersion": str(self.store.rv)}, "items": items}

    def close_watches(self) -> None:
        for w in list(self.store.watchers):
            w.queue.put_nowait(None)

    def _patch(self, request: kmock.Request, route: Route, obj: Obj | None, params: dict[str, str]) -> Obj:
        res = route.res
        ctype = (request.headers.get("Content-Type") or "").split(";")[0].strip()
        if ctype == "application/apply-patch+yaml":
            body = body_of(request)
            meta = body.get("metadata") or {}
            if not body.get("apiVersion") or not body.get("kind"):
                raise ApiError(400, "BadRequest", "invalid object type: /, Kind=")
            if meta.get("name") != route.name:
                raise ApiError(400, "BadRequest", "the name of the object "
                               f"({meta.get('name')}) does not match the name on the URL ({route.name})")
            if route.sub == "status":
                if obj is None:
                    raise not_found(res, route.name or "")
                new = copy.deepcopy(obj)
                new["status"] = merge_patch(obj.get("status") or {}, body.get("status") or {})
                return self.obj_put(new, res.plural)
            if obj is None:  # server-side apply creates
                body.setdefault("metadata", {})
                if res.namespaced:
                    body["metadata"]["namespace"] = route.namespace
                body.pop("status", None)
                return self.obj_create(body, res.plural)
            return self.obj_put(self._merged(obj, body, replace=True), res.plural)
        if obj is None:
            raise not_found(res, route.name or "")
        if ctype == "application/json-patch+json":
            try:
                patched = jsonpatch.apply_patch(obj, json.loads(request.body or b"[]"))
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, ValueError) as e:
                raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: {e}") from e
        elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            patched = merge_patch(obj, body_of(request))
        else:
            raise ApiError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                           "accepted media types include: application/json-patch+json, application/merge-patch+json, "
                           "application/apply-patch+yaml, application/strategic-merge-patch+json")
        if route.sub == "status":
            new = copy.deepcopy(obj)
            new["status"] = patched.get("status") or {}
        else:
            new = self._merged(obj, patched, replace=True)
        return self.obj_put(new, res.plural)

    def _merged(self, old: Obj, body: Obj, replace: bool) -> Obj:
        """``body`` as the new object, keeping what the server owns (uid, status, clusterIP...)."""
        new = copy.deepcopy(body)
        new["apiVersion"], new["kind"] = old["apiVersion"], old["kind"]
        ometa, nmeta = old.get("metadata") or {}, new.setdefault("metadata", {})
        for k in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds",
                  "namespace", "name", "generation"):
            if k in ometa:
                nmeta[k] = ometa[k]
            else:
                nmeta.pop(k, None)
        nmeta["annotations"] = {**(ometa.get("annotations") or {}), **(nmeta.get("annotations") or {})}
        if not nmeta["annotations"]:
            del nmeta["annotations"]
        for k in ("labels", "ownerReferences", "finalizers"):
            if k not in nmeta and k in ometa:
                nmeta[k] = ometa[k]
        if "status" in old:
            new["status"] = old["status"]
        plural = KIND_TO_PLURAL[old["kind"]]
        if plural == "services":
            for k in ("clusterIP", "clusterIPs"):
                if k in (old.get("spec") or {}) and k not in (new.get("spec") or {}):
                    new.setdefault("spec", {})[k] = old["spec"][k]
        if plural in GENERATION_KINDS and new.get("spec") != old.get("spec"):
            nmeta["generation"] = int(ometa.get("generation", 1)) + 1
        return new

    async def aclose(self) -> None:
        self.close_watches()
        if self.http is not None:
            await self.http.close()
            self.http = None
