"""Who talks to the emulated cluster and how: bearer tokens and kubeconfigs per identity,
official-client ApiClients, the admin's apply, the chart's RBAC and ``kubectl auth can-i``. A
mixin of ``EmulatedCluster`` (its ``apiserver``, ``url``, ``certificates``, ``workdir`` and
``_call``)."""

from __future__ import annotations

import base64
import copy
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import yaml

from orchestrator.kcluster.objects import KIND_TO_PLURAL, RESOURCES
from orchestrator.kcluster.rbac import ADMIN_NAME, ANONYMOUS

if TYPE_CHECKING:
    from orchestrator.kcluster.apiserver import ApiServer
    from orchestrator.kcluster.tls import Certificates

Obj = dict[str, Any]
T = TypeVar("T")


class ClusterAccess:
    """Identities and clients of an emulated cluster (see the module docstring)."""

    apiserver: ApiServer
    url: str
    certificates: Certificates | None
    workdir: Path

    def _call(self, fn: Callable[[], T], timeout: float = 30.0) -> T:
        raise NotImplementedError  # EmulatedCluster's: run on the cluster's loop

    def token_for(self, identity: str | None = None, groups: tuple[str, ...] = ()) -> str:
        """The bearer token of ``identity`` (a user name, or ``system:serviceaccount:NS:NAME``;
        None: the admin, who may do anything). What it may do is what the RBAC objects in the
        cluster grant it (``apply_objects``, ``apply_chart_rbac``)."""
        return self.apiserver.identities.token_for(identity, groups)

    def kubeconfig_for(self, identity: str | None = None, path: str | Path | None = None,
                       namespace: str = "default", anonymous: bool = False) -> str:
        """Write a kubeconfig of ``identity`` (None: the admin; ``anonymous``: no credentials)
        and return its path (default: in the workdir, one per identity). Any thread."""
        who = ANONYMOUS.name if anonymous else (identity or ADMIN_NAME)
        user: dict[str, str] = {} if anonymous else {"token": self.token_for(identity)}
        server: dict[str, str] = {"server": self.url}
        if self.certificates is not None:
            server["certificate-authority-data"] = base64.b64encode(self.certificates.ca.read_bytes()).decode()
        doc = {
            "apiVersion": "v1", "kind": "Config", "current-context": "kcluster",
            "clusters": [{"name": "kcluster", "cluster": server}],
            "users": [{"name": who, "user": user}],
            "contexts": [{"name": "kcluster", "context": {"cluster": "kcluster", "user": who,
                                                         "namespace": namespace}}],
            "preferences": {},
        }
        if path is None:
            path = self.workdir / f"kubeconfig-{re.sub(r'[^A-Za-z0-9_.-]', '_', who)}"
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(yaml.safe_dump(doc))
        tmp.chmod(0o600)
        tmp.replace(out)  # whole, or not at all: a reader never sees half a file
        return str(out)

    def api_client(self, identity: str | None = None) -> Any:
        """An official-client ApiClient for this cluster, as ``identity`` (None: the admin)."""
        from kubernetes import client

        cfg = client.Configuration()
        cfg.host = self.url
        cfg.api_key = {"authorization": self.token_for(identity)}
        cfg.api_key_prefix = {"authorization": "Bearer"}
        if self.certificates is not None:
            cfg.ssl_ca_cert = str(self.certificates.ca)
        return client.ApiClient(cfg)

    def kube_api(self, retries: int = 3, backoff_s: float = 0.01, identity: str | None = None) -> Any:
        """The backend's KubeApi on this cluster, with short back-offs, as ``identity``."""
        from orchestrator.backends.kubernetes.api import KubeApi

        return KubeApi(self.api_client(identity), retries=retries, backoff_s=backoff_s,
                       max_backoff_s=backoff_s * 2)

    def apply_objects(self, objs: list[Obj], namespace: str | None = None) -> list[Obj]:
        """Create or replace ``objs`` as the admin does (``kubectl apply``): namespaced ones go
        to their namespace, else ``namespace``, which is created if missing. The stored objects."""
        def do() -> list[Obj]:
            out = []
            for obj in copy.deepcopy(objs):
                plural = KIND_TO_PLURAL[obj["kind"]]
                meta = obj.setdefault("metadata", {})
                if RESOURCES[plural].namespaced:
                    meta["namespace"] = meta.get("namespace") or namespace or "default"
                    if self.apiserver.obj_get("namespaces", None, meta["namespace"]) is None:
                        self.apiserver.obj_create({"kind": "Namespace", "metadata": {"name": meta["namespace"]}})
                old = self.apiserver.obj_get(plural, meta.get("namespace"), meta["name"])
                if old is None:
                    out.append(copy.deepcopy(self.apiserver.obj_create(obj, plural)))
                else:
                    new = self.apiserver._merged(old, obj, replace=True)
                    out.append(copy.deepcopy(self.apiserver.obj_put(new, plural)))
            return out

        return self._call(do)

    def apply_chart_rbac(self, objs: list[Obj], namespace: str | None = None) -> str:
        """Apply the ServiceAccount and RBAC objects of a rendered chart (``objs``: every object
        the chart renders, as dicts) and return the identity its pods run as
        (``system:serviceaccount:NS:NAME``, the subject of its RoleBinding)."""
        kinds = ("ServiceAccount", "Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
        chosen = [o for o in objs if o.get("kind") in kinds]
        binding = next((o for o in chosen if o["kind"] == "RoleBinding"), None)
        if binding is None:
            raise ValueError("the chart renders no RoleBinding (rbac.create false?)")
        subject = next(s for s in binding.get("subjects") or [] if s.get("kind") == "ServiceAccount")
        ns = subject.get("namespace") or (binding.get("metadata") or {}).get("namespace") or namespace or "default"
        self.apply_objects(chosen, ns)
        return f"system:serviceaccount:{ns}:{subject['name']}"

    def can(self, identity: str | None, verb: str, resource: str, namespace: str = "",
            name: str = "", group: str = "") -> bool:
        """``kubectl auth can-i``: whether RBAC allows ``identity`` ``verb`` on ``resource``
        (``pods``, ``pods/log``) in ``namespace`` ("" : the cluster scope)."""
        from orchestrator.kcluster.rbac import Attrs, user_for

        res, _, sub = resource.partition("/")
        attrs = Attrs(verb, True, api_group=group, resource=res, subresource=sub, namespace=namespace, name=name)
        user = user_for(identity) if identity else None
        return self._call(lambda: user is None or self.apiserver.authz.allows(user, attrs))
