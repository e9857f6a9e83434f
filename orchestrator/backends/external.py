"""The external backend: arms that already run behind OpenAI-compatible URLs.

Nothing is deployed or torn down. ``deploy`` reads the endpoint's identity (its fingerprint:
``/v1/models``, response headers, ``/version`` and, where the plan gives it, ``/metrics``);
``ready`` waits until ``/v1/models`` lists the model and a test completion returns exactly the
tokens asked for. Header values (API keys) are read from the environment variables the plan
names, when the run starts; they are never put into the fingerprint, the store or a log.

What cannot be observed from outside is not invented: the fingerprint carries no ``gpu_type``
or ``node_pool`` (the arm's labels describe them, and history files the arm under its labels).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import httpx

from orchestrator import logs, secrets
from orchestrator.backends.base import (
    QUICK_START_BUDGET_S,
    Deployment,
    Endpoint,
    Fingerprint,
    RunKey,
)
from orchestrator.backends.readiness import NotYet, refuse_auth, served_models, wait_until_serving
from orchestrator.engines import engine_for
from orchestrator.errors import OrchestratorError, TransientError, UserError
from orchestrator.loadgen.client import Api
from orchestrator.loadgen.scrape import parse_metrics
from orchestrator.plan import Plan
from orchestrator.plan.external import ExternalEndpoint

_log = logs.get_logger(__name__)

# Response headers worth keeping in the fingerprint: they name the server software.
IDENTITY_HEADERS = ("server", "x-powered-by", "via")


def resolve_headers(endpoint: ExternalEndpoint, arm: str, env: Mapping[str, str]) -> dict[str, str]:
    """Header name -> value, each value read from its environment variable now; a variable
    that is not set is the user's to fix (one clear line naming it)."""
    out: dict[str, str] = {}
    for name, source in endpoint.headers.items():
        value = env.get(source.env)
        if not value:
            raise UserError(
                f"arms.{arm}.endpoint.headers.{name} reads its value from the environment variable "
                f"{source.env}, which is not set: export {source.env}=... before the run"
            )
        out[name] = f"{source.scheme} {value}" if source.scheme else value
        secrets.register(value)  # scrubbed from every text stored, printed or logged
    return out


def engine_version_from_metrics(text: str) -> str | None:
    """A version label on an engine info metric (e.g. a build-info gauge), if the server has
    one. Only the engine's own metrics count: ``python_info`` carries Python's version."""
    metrics = engine_for().metrics
    # The same names with an underscore where an exporter cannot write a colon.
    prefixes = (metrics.prefix, metrics.prefix.replace(":", "_"))
    try:
        samples = parse_metrics(text)
    except ValueError:
        return None
    for s in samples:
        if s.name.startswith(prefixes):
            for key in metrics.version_labels:
                if s.labels.get(key):
                    return s.labels[key]
    return None


def cache_config_from_metrics(text: str) -> dict[str, str] | None:
    """Labels of the engine's cache config info metric (block size, cache dtype, GPU blocks...), if exported."""
    try:
        samples = parse_metrics(text)
    except ValueError:
        return None
    for s in samples:
        if s.name == engine_for().metrics.cache_config_info:
            return dict(sorted(s.labels.items()))
    return None


@dataclass
class ExternalHandles:
    """An external arm's resolved request headers (its API key: never stored) and API."""

    headers: dict[str, str]
    api: Api


class ExternalBackend:
    """Arms served by stacks the orchestrator did not start (plan ``backend: external``)."""

    name = "external"

    def __init__(self, env: Mapping[str, str] | None = None, timeout_s: float = 10.0,
                 log: Callable[[str], None] | None = None):
        self.env = os.environ if env is None else env
        self.timeout_s = timeout_s
        self.log = log or _log.info

    def sends_load_here(self, plan: Plan) -> bool:
        return True

    def startup_budget_s(self, plan: Plan, arm: str) -> float:
        """The stack already runs: a short wait covers a restart in progress."""
        return QUICK_START_BUDGET_S

    # -- deploy: nothing to start; read who answers -------------------------------------------
    def deploy(self, plan: Plan, arm: str, key: RunKey) -> Deployment:
        spec = plan.arm(arm)
        ep = spec.endpoint
        if ep is None:
            raise UserError(f"arms.{arm} has no endpoint: backend external sends load to a running "
                            "stack given as `endpoint: {url, model}`")
        headers = resolve_headers(ep, arm, self.env)
        endpoint = Endpoint(url=ep.url, model=ep.model, metrics_urls=(ep.metrics_url,) if ep.metrics_url else (),
                            headers=tuple(sorted(headers.items())))
        fingerprint = self._fingerprint(plan, arm, endpoint, headers)
        return Deployment(key=key, endpoint=endpoint, fingerprint=fingerprint,
                          handles=ExternalHandles(headers, plan.workload.api))

    def _fingerprint(self, plan: Plan, arm: str, endpoint: Endpoint, headers: dict[str, str]) -> Fingerprint:
        spec = plan.arm(arm)
        fp: dict[str, Any] = {
            "endpoint": endpoint.url,
            "served_model": endpoint.model,
            "labels": spec.labels.model_dump(mode="json") if spec.labels else {},
        }
        with httpx.Client(timeout=self.timeout_s, headers=headers) as client:
            try:
                r = client.get(f"{endpoint.url}/v1/models")
                refuse_auth(r, f"arm {arm}", _auth_hint(arm))
                fp["models"] = _models(r)
            except (httpx.HTTPError, ValueError) as e:
                raise TransientError(f"arm {arm}: {endpoint.url}/v1/models did not answer as an "
                                     f"OpenAI-compatible server ({type(e).__name__}: {e}); is the stack "
                                     "running at that URL?", delay=2.0) from e
            kept = {k: r.headers[k] for k in IDENTITY_HEADERS if k in r.headers}
            kept |= {k.lower(): v for k, v in r.headers.items() if "version" in k.lower()}
            fp["response_headers"] = dict(sorted(kept.items()))
            version, source = _version_endpoint(client, endpoint.url)
            for url in endpoint.metrics_urls:
                text = _get_text(client, url)
                if text is None:
                    fp["metrics"] = f"{url} did not answer"
                    continue
                fp["metrics"] = "read"
                if version is None and (v := engine_version_from_metrics(text)):
                    version, source = v, "/metrics"
                if (cache := cache_config_from_metrics(text)) is not None:
                    fp["cache_config"] = cache
        identity = {k: fp.get(k) for k in ("models", "response_headers", "cache_config")}
        identity["engine_version"] = version
        fp["identity"] = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
        # What cannot be observed from outside is not invented: no GPU products, pools or nodes.
        return Fingerprint(
            backend="external", engine_version=version,
            engine_version_source=source or "unknown", details=fp,
        )

    # -- ready / scrape / teardown -------------------------------------------------------------
    def ready(self, deployment: Deployment, deadline_s: float) -> None:
        """Until the deadline: ``/v1/models`` lists the model, then the one readiness check
        (orchestrator.backends.readiness). Refusals that waiting cannot fix are raised at once."""
        arm = deployment.key.arm
        wait_until_serving(
            deployment.endpoint, deadline_s, f"arm {arm}", require_model=True,
            api=deployment.handles_as(ExternalHandles).api, headers=deployment.handles_as(ExternalHandles).headers,
            auth_hint=_auth_hint(arm), timeout_s=min(self.timeout_s, max(deadline_s, 1.0)), retry_delay_s=2.0,
        )

    def alive(self, deployment: Deployment) -> bool:
        """The stack is not ours to watch: whether it still answers ``/v1/models``."""
        try:
            with httpx.Client(timeout=self.timeout_s, headers=deployment.handles_as(ExternalHandles).headers) as c:
                served_models(c, deployment.endpoint.url, f"arm {deployment.key.arm}", _auth_hint(deployment.key.arm))
            return True
        except (NotYet, OrchestratorError):
            return False

    def scrape(self, deployment: Deployment) -> dict[str, str]:
        out: dict[str, str] = {}
        with httpx.Client(timeout=self.timeout_s, headers=deployment.handles_as(ExternalHandles).headers) as client:
            for url in deployment.endpoint.metrics_urls:
                text = _get_text(client, url)
                if text is not None:
                    out[url] = text
        return out

    def teardown(self, deployment: Deployment) -> None:
        """Nothing to stop: the stack was running before the run and keeps running."""

    def cleanup(self, experiment: str, final: bool = False) -> int:
        """Nothing is ever left behind."""
        return 0


# -- helpers ---------------------------------------------------------------------------------
def _auth_hint(arm: str) -> str:
    return (f"give the credential as arms.{arm}.endpoint.headers "
            "(e.g. Authorization: {env: MY_KEY, scheme: Bearer})")


def _models(r: httpx.Response) -> list[dict[str, Any]]:
    """The served models of a ``/v1/models`` answer (id, root, max_model_len, owned_by)."""
    if r.status_code != 200:
        raise httpx.HTTPStatusError(f"/v1/models answered HTTP {r.status_code}", request=r.request, response=r)
    doc = r.json()
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise ValueError("/v1/models has no `data` list")
    keep = ("id", "root", "max_model_len", "owned_by")
    return [{k: m.get(k) for k in keep if k in m} for m in data[:50] if isinstance(m, dict) and "id" in m]


def _version_endpoint(client: httpx.Client, url: str) -> tuple[str | None, str | None]:
    """vLLM's API server answers ``GET /version`` with ``{"version": ...}``; others may not."""
    try:
        r = client.get(f"{url}/version")
        if r.status_code == 200:
            v = r.json().get("version")
            if isinstance(v, str) and v:
                return v, "/version"
    except (httpx.HTTPError, ValueError, AttributeError):
        pass
    return None, None


def _get_text(client: httpx.Client, url: str) -> str | None:
    try:
        r = client.get(url)
    except httpx.HTTPError:
        return None
    return r.text if r.status_code == 200 else None
