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

import dataclasses
import hashlib
import json
import os
import time
from collections.abc import Mapping
from typing import Any

import httpx

from orchestrator.backends.base import Deployment, Endpoint, RunKey
from orchestrator.errors import PermanentError, TransientError, UserError
from orchestrator.loadgen.scrape import parse_metrics
from orchestrator.plan import Plan
from orchestrator.plan.external import ExternalEndpoint

READY_TOKENS = 4  # a test completion asks for this many tokens and must get exactly them
AUTH_STATUSES = (401, 403)
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
    return out


def engine_version_from_metrics(text: str) -> str | None:
    """A version label on a vLLM info metric (e.g. a build-info gauge), if the server has one.
    Only ``vllm:``/``vllm_`` metrics count: ``python_info`` carries Python's version."""
    try:
        samples = parse_metrics(text)
    except ValueError:
        return None
    for s in samples:
        if s.name.startswith(("vllm:", "vllm_")):
            for key in ("version", "vllm_version", "engine_version"):
                if s.labels.get(key):
                    return s.labels[key]
    return None


def cache_config_from_metrics(text: str) -> dict[str, str] | None:
    """Labels of ``vllm:cache_config_info`` (block size, cache dtype, GPU blocks...), if exported."""
    try:
        samples = parse_metrics(text)
    except ValueError:
        return None
    for s in samples:
        if s.name == "vllm:cache_config_info":
            return dict(sorted(s.labels.items()))
    return None


class ExternalBackend:
    """Arms served by stacks the orchestrator did not start (plan ``backend: external``)."""

    name = "external"

    def __init__(self, env: Mapping[str, str] | None = None, timeout_s: float = 10.0, log=print):
        self.env = os.environ if env is None else env
        self.timeout_s = timeout_s
        self.log = log

    # -- deploy: nothing to start; read who answers -------------------------------------------
    def deploy(self, plan: Plan, arm: str, key: RunKey) -> Deployment:
        spec = plan.arm(arm)
        ep = spec.endpoint
        if ep is None:
            raise UserError(f"arms.{arm} has no endpoint: backend external sends load to a running "
                            "stack given as `endpoint: {url, model}`")
        headers = resolve_headers(ep, arm, self.env)
        if headers and "headers" not in {f.name for f in dataclasses.fields(Endpoint)}:
            # The load generator must carry them too, or every load request would be refused
            # while the readiness check (which has them) passes: a silent capacity of zero.
            raise UserError(
                f"arms.{arm}.endpoint.headers: this version's load generator sends no extra headers; "
                "reach the endpoint without them (e.g. through a local proxy that adds them)"
            )
        endpoint = Endpoint(url=ep.url, model=ep.model, metrics_urls=(ep.metrics_url,) if ep.metrics_url else ())
        if headers:
            endpoint = dataclasses.replace(endpoint, headers=tuple(sorted(headers.items())))  # type: ignore[call-arg]
        fingerprint = self._fingerprint(plan, arm, endpoint, headers)
        return Deployment(key=key, endpoint=endpoint, fingerprint=fingerprint,
                          handles={"headers": headers, "api": plan.workload.api})

    def _fingerprint(self, plan: Plan, arm: str, endpoint: Endpoint, headers: dict[str, str]) -> dict[str, Any]:
        spec = plan.arm(arm)
        fp: dict[str, Any] = {
            "backend": "external",
            "endpoint": endpoint.url,
            "served_model": endpoint.model,
            "labels": spec.labels.model_dump(mode="json") if spec.labels else {},
        }
        with httpx.Client(timeout=self.timeout_s, headers=headers) as client:
            try:
                r = client.get(f"{endpoint.url}/v1/models")
                _refuse_auth(r, arm, endpoint.url)
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
        if version is not None:
            fp["engine_version"], fp["engine_version_source"] = version, source
        identity = {k: fp.get(k) for k in ("models", "response_headers", "engine_version", "cache_config")}
        fp["identity"] = hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]
        return fp

    # -- ready / scrape / teardown -------------------------------------------------------------
    def ready(self, deployment: Deployment, deadline_s: float) -> None:
        """Until the deadline: ``/v1/models`` lists the model, then a test completion returns
        exactly the asked tokens. Refusals that waiting cannot fix are raised at once."""
        ep = deployment.endpoint
        headers = deployment.handles.get("headers", {})
        api = deployment.handles.get("api", "completions")
        arm = deployment.key.arm
        deadline = time.monotonic() + deadline_s
        last = "no answer yet"
        with httpx.Client(timeout=min(self.timeout_s, max(deadline_s, 1.0)), headers=headers) as client:
            while time.monotonic() < deadline:
                try:
                    r = client.get(f"{ep.url}/v1/models")
                    _refuse_auth(r, arm, ep.url)
                    served = [m["id"] for m in _models(r)]
                    if ep.model not in served:
                        last = f"{ep.url}/v1/models lists {served or 'no model'}, not {ep.model!r}"
                    else:
                        r = client.post(f"{ep.url}{_path(api)}", json=_test_body(ep.model, api))
                        _refuse_auth(r, arm, ep.url)
                        if r.status_code == 200:
                            _check_test_completion(r, arm, ep.url)
                            return
                        last = f"test completion: HTTP {r.status_code}: {r.text[:200]}"
                except httpx.HTTPError as e:
                    last = f"{type(e).__name__}: {e}"
                except ValueError as e:  # a 200 whose body is not the API's JSON
                    last = f"not an OpenAI-compatible answer ({e})"
                time.sleep(0.25)
        raise TransientError(f"arm {arm}: {ep.url} not ready within {deadline_s:.0f}s (last: {last})", delay=2.0)

    def scrape(self, deployment: Deployment) -> dict[str, str]:
        out: dict[str, str] = {}
        with httpx.Client(timeout=self.timeout_s, headers=deployment.handles.get("headers", {})) as client:
            for url in deployment.endpoint.metrics_urls:
                text = _get_text(client, url)
                if text is not None:
                    out[url] = text
        return out

    def teardown(self, deployment: Deployment) -> None:
        """Nothing to stop: the stack was running before the run and keeps running."""

    def cleanup(self, experiment: str) -> int:
        """Nothing is ever left behind."""
        return 0


# -- helpers ---------------------------------------------------------------------------------
def _refuse_auth(r: httpx.Response, arm: str, url: str) -> None:
    if r.status_code in AUTH_STATUSES:
        raise PermanentError(
            f"arm {arm}: {url} refused the request (HTTP {r.status_code}): give the credential as "
            f"arms.{arm}.endpoint.headers (e.g. Authorization: {{env: MY_KEY, scheme: Bearer}})"
        )


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


def _path(api: str) -> str:
    return "/v1/chat/completions" if api == "chat" else "/v1/completions"


def _test_body(model: str, api: str) -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": READY_TOKENS, "ignore_eos": True, "stream": False,
                            "temperature": 1.0}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": "ready check"}]
    else:
        body["prompt"] = "ready check"
    return body


def _check_test_completion(r: httpx.Response, arm: str, url: str) -> None:
    """The reply must count exactly the asked tokens in ``usage``: a server that ignores
    max_tokens or ignore_eos would make every measured reply a different length."""
    doc = r.json()
    usage = doc.get("usage") if isinstance(doc, dict) else None
    got = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if got != READY_TOKENS:
        raise PermanentError(
            f"arm {arm}: {url} returned {got} completion tokens for max_tokens={READY_TOKENS} with "
            "ignore_eos: it must honour both (and report usage) for replies of the registered length"
        )
