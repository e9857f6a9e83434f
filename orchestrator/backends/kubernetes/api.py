"""The few Kubernetes API calls the backend makes, with retries and errors that carry meaning.

Calls go through the official client's ``ApiClient`` (auth, TLS, kubeconfig or in-cluster
config) on plain paths, so objects stay dicts end to end and server-side apply needs no
discovery round trips. Errors: 409, 429, 5xx and timeouts are retried with exponential
backoff, then raised as TransientError; 403 is a PermanentError naming the RBAC verb and
resource to grant; an unreachable API server is an EnvironmentProblem.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from orchestrator.errors import EnvironmentProblem, PermanentError, TransientError

FIELD_MANAGER = "orchestrator"
RETRIED_STATUSES = {409, 429, 500, 502, 503, 504}
# RBAC file of the chart that grants what the backend uses; named in 403 messages.
RBAC_HINT = "helm/orchestrator/templates/rbac.yaml"


@dataclass(frozen=True)
class Resource:
    """Where a kind lives in the API."""

    prefix: str  # /api/v1 or /apis/<group>/<version>
    plural: str
    namespaced: bool

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        ns = f"/namespaces/{namespace}" if self.namespaced and namespace else ""
        return f"{self.prefix}{ns}/{self.plural}" + (f"/{name}" if name else "")


RESOURCES: dict[str, Resource] = {
    "Namespace": Resource("/api/v1", "namespaces", False),
    "Node": Resource("/api/v1", "nodes", False),
    "PersistentVolumeClaim": Resource("/api/v1", "persistentvolumeclaims", True),
    "ConfigMap": Resource("/api/v1", "configmaps", True),
    "ServiceAccount": Resource("/api/v1", "serviceaccounts", True),
    "Service": Resource("/api/v1", "services", True),
    "Pod": Resource("/api/v1", "pods", True),
    "Event": Resource("/api/v1", "events", True),
    "Deployment": Resource("/apis/apps/v1", "deployments", True),
    "Job": Resource("/apis/batch/v1", "jobs", True),
    "Role": Resource("/apis/rbac.authorization.k8s.io/v1", "roles", True),
    "RoleBinding": Resource("/apis/rbac.authorization.k8s.io/v1", "rolebindings", True),
}


def load_api_client() -> client.ApiClient:
    """An ApiClient from the in-cluster service account, else KUBECONFIG as kubectl reads it."""
    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as e:
            raise EnvironmentProblem(
                f"no Kubernetes cluster configured ({e}): set KUBECONFIG or run inside a cluster"
            ) from e
    return client.ApiClient()


def in_cluster() -> bool:
    """Whether this process runs in a pod (the service account token is mounted)."""
    import os

    return bool(os.environ.get("KUBERNETES_SERVICE_HOST"))


class KubeApi:
    """get / list / apply / delete on dict objects, retried and mapped to our error types."""

    def __init__(
        self,
        api_client: client.ApiClient,
        retries: int = 5,
        backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        request_timeout_s: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
    ):
        self.api_client = api_client
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.request_timeout_s = request_timeout_s
        self._sleep = sleep

    def _call(
        self, verb: str, what: str, method: str, path: str,
        query: list[tuple[str, str]] | None = None, body: Any = None,
        content_type: str | None = None, raw: bool = False,
    ) -> Any:
        headers = {"Accept": "application/json" if not raw else "*/*"}
        if content_type:
            headers["Content-Type"] = content_type
        delay = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                request = self.api_client.param_serialize(
                    method, path, query_params=query or [], header_params=headers, body=body,
                    auth_settings=["BearerToken"],
                )
                response = self.api_client.call_api(*request, _request_timeout=self.request_timeout_s)
                response.read()
                kind = "bytearray" if raw else "object"
                # The client types .data by its type-name argument (a str); it is bytes or the object.
                out: Any = self.api_client.response_deserialize(response, {"2XX": kind}).data
                return out.decode() if raw else out
            except ApiException as e:
                if e.status not in RETRIED_STATUSES or attempt == self.retries:
                    raise self._error(e, verb, what, path) from e
            except (urllib3.exceptions.HTTPError, OSError) as e:
                if attempt == self.retries:
                    host = self.api_client.configuration.host
                    raise EnvironmentProblem(
                        f"Kubernetes API at {host} unreachable after {attempt + 1} tries ({e}): "
                        "check KUBECONFIG and that the cluster is up"
                    ) from e
            self._sleep(delay)
            delay = min(delay * 2, self.max_backoff_s)
        raise AssertionError("unreachable")  # pragma: no cover

    def _error(self, e: ApiException, verb: str, what: str, path: str) -> Exception:
        message = _status_message(e)
        if e.status == 403:
            return PermanentError(
                f"forbidden to {verb} {what} ({path}): the orchestrator's identity lacks the RBAC "
                f"verb `{verb}` on `{what}`; grant it (see {RBAC_HINT}). API said: {message}"
            )
        if e.status == 401:
            return EnvironmentProblem(f"Kubernetes rejected the credentials: {message}; refresh KUBECONFIG")
        if e.status in RETRIED_STATUSES:
            return TransientError(f"{verb} {what} failed after {self.retries + 1} tries: "
                                  f"HTTP {e.status} {message}", delay=self.max_backoff_s)
        return PermanentError(f"{verb} {what} ({path}) failed: HTTP {e.status} {message}")

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply ``obj`` (create or update, our field manager owns what we set)."""
        res = RESOURCES[obj["kind"]]
        meta = obj["metadata"]
        path = res.path(meta.get("namespace"), meta["name"])
        return self._call(
            "patch", res.plural, "PATCH", path,
            query=[("fieldManager", FIELD_MANAGER), ("force", "true")],
            body=obj, content_type="application/apply-patch+yaml",
        )

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        """The object, or None if it does not exist."""
        res = RESOURCES[kind]
        try:
            return self._call("get", res.plural, "GET", res.path(namespace, name))
        except PermanentError as e:
            if isinstance(e.__cause__, ApiException) and e.__cause__.status == 404:
                return None
            raise

    def list(self, kind: str, namespace: str | None = None, labels: str | None = None,
             fields: str | None = None) -> list[dict[str, Any]]:
        """Objects of ``kind`` matching the label (and field) selectors."""
        res = RESOURCES[kind]
        query = [("labelSelector", labels)] if labels else []
        if fields:
            query.append(("fieldSelector", fields))
        out = self._call("list", res.plural, "GET", res.path(namespace), query=query)
        return list(out.get("items") or [])

    def delete(self, kind: str, name: str, namespace: str | None = None) -> bool:
        """Delete (background propagation: dependents go too); False if it was already gone."""
        res = RESOURCES[kind]
        try:
            self._call("delete", res.plural, "DELETE", res.path(namespace, name),
                       body={"propagationPolicy": "Background"})
            return True
        except PermanentError as e:
            if isinstance(e.__cause__, ApiException) and e.__cause__.status == 404:
                return False
            raise

    def pod_log(self, namespace: str, pod: str, container: str | None = None) -> str:
        """The log of a pod's container (its current or last instance), as `kubectl logs` shows it."""
        query = [("container", container)] if container else []
        return self._call("get", "pods/log", "GET", f"/api/v1/namespaces/{namespace}/pods/{pod}/log",
                          query=query, raw=True)

    def proxy_get(self, namespace: str, pod: str, port: int, path: str) -> str:
        """GET ``path`` on a pod's port through the API server's proxy (in or out of cluster)."""
        url = f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy{path}"
        return self._call("get", "pods/proxy", "GET", url, raw=True)


def _status_message(e: ApiException) -> str:
    try:
        body = json.loads(e.body or "")
        return str(body.get("message") or body.get("reason") or e.reason)
    except (ValueError, AttributeError):
        return str(e.reason)
