"""The one readiness check every backend uses: the endpoint serves exactly the asked tokens.

"Ready" means more than a 200 on /health: a router may answer before its workers do, and an
engine that ignores ``max_tokens``/``ignore_eos`` would make every measured reply a different
length. So readiness is a test completion of ``READY_TOKENS`` tokens with ``ignore_eos`` whose
``usage.completion_tokens`` must be exactly that. Its meanings, the same for every backend:

- no answer yet, a 5xx, a 404 while the model loads: keep polling until the deadline, then
  ``TransientError`` naming what was last seen;
- a wrong token count: ``PermanentError`` at once (waiting does not teach an engine to count);
- HTTP 401/403: ``PermanentError`` naming where credentials go.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from orchestrator import logs
from orchestrator.backends.base import Endpoint
from orchestrator.errors import PermanentError, TransientError

_log = logs.get_logger(__name__)

READY_TOKENS = 4
READY_PROMPT = "baba babe babi babo babu"
AUTH_STATUSES = (401, 403)


class NotYet(Exception):
    """One step of readiness is not there yet; the message says what is awaited."""


def completion_path(api: str) -> str:
    return "/v1/chat/completions" if api == "chat" else "/v1/completions"


def completion_body(model: str, api: str = "completions") -> dict[str, Any]:
    body: dict[str, Any] = {"model": model, "max_tokens": READY_TOKENS, "ignore_eos": True,
                            "stream": False, "temperature": 1.0}
    if api == "chat":
        body["messages"] = [{"role": "user", "content": READY_PROMPT}]
    else:
        body["prompt"] = READY_PROMPT
    return body


def refuse_auth(r: httpx.Response, where: str, auth_hint: str) -> None:
    """401/403 is not something waiting fixes."""
    if r.status_code in AUTH_STATUSES:
        raise PermanentError(f"{where}: {r.request.url} refused the request (HTTP {r.status_code}): {auth_hint}")


def check_completion(client: httpx.Client, endpoint: Endpoint, where: str, api: str = "completions",
                     auth_hint: str = "give the endpoint's credentials", timeout_s: float = 120.0) -> None:
    """One test completion: returns if it carried exactly READY_TOKENS, raises NotYet for an
    answer that may change (no answer, 5xx, 404), PermanentError for a wrong count or 401/403."""
    try:
        r = client.post(f"{endpoint.url}{completion_path(api)}", json=completion_body(endpoint.model, api),
                        timeout=timeout_s)
    except httpx.HTTPError as e:
        raise NotYet(f"test completion: {type(e).__name__}: {e}") from e
    refuse_auth(r, where, auth_hint)
    if r.status_code != 200:
        raise NotYet(f"test completion: HTTP {r.status_code}: {r.text[:200]}")
    try:
        doc = r.json()
    except ValueError as e:
        raise NotYet(f"test completion: not an OpenAI-compatible answer ({e})") from e
    usage = doc.get("usage") if isinstance(doc, dict) else None
    got = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if got != READY_TOKENS:
        raise PermanentError(
            f"{where}: a test completion asked for {READY_TOKENS} tokens with ignore_eos and got {got} "
            "completion tokens: the server must honour max_tokens and ignore_eos (and report usage) "
            "for replies of the registered length"
        )


def served_models(client: httpx.Client, url: str, where: str, auth_hint: str) -> list[str]:
    """Model ids of ``/v1/models``; NotYet while it does not answer as the API."""
    try:
        r = client.get(f"{url}/v1/models")
    except httpx.HTTPError as e:
        raise NotYet(f"{url}/v1/models: {type(e).__name__}: {e}") from e
    refuse_auth(r, where, auth_hint)
    try:
        data = r.json().get("data") if r.status_code == 200 else None
    except (ValueError, AttributeError):
        data = None
    if not isinstance(data, list):
        raise NotYet(f"{url}/v1/models answered HTTP {r.status_code} without a model list")
    return [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m]


def wait_until_serving(
    endpoint: Endpoint,
    deadline_s: float,
    where: str,
    *,
    health_urls: Sequence[str] = (),
    require_model: bool = False,
    api: str = "completions",
    headers: dict[str, str] | None = None,
    checks: Callable[[], None] | None = None,
    auth_hint: str = "give the endpoint's credentials",
    poll_s: float = 0.25,
    timeout_s: float = 10.0,
    retry_delay_s: float = 5.0,
) -> None:
    """Poll until the endpoint serves (each of ``health_urls`` answers 200, the model is listed
    if ``require_model``, then the test completion) or the deadline passes.

    ``checks`` runs first on every poll: a backend's own look at its servers (a process that
    exited, a pod that cannot be scheduled); it raises PermanentError/TransientError to stop
    waiting, or NotYet to say what it waits for."""
    deadline = time.monotonic() + deadline_s
    last = "no answer yet"
    pending = list(health_urls)
    with httpx.Client(timeout=timeout_s, headers=headers or {}) as client:
        while True:
            try:
                if checks is not None:
                    checks()
                pending = [u for u in pending if not _healthy(client, u)]
                if pending:
                    raise NotYet(f"waiting for {len(pending)} server(s): {pending[0]}/health")
                if require_model:
                    models = served_models(client, endpoint.url, where, auth_hint)
                    if endpoint.model not in models:
                        raise NotYet(f"{endpoint.url}/v1/models lists {models or 'no model'}, not {endpoint.model!r}")
                check_completion(client, endpoint, where, api, auth_hint)
                return
            except NotYet as e:
                if str(e) != last:  # what it waits for, each time that changes
                    _log.debug("%s: %s", where, e)
                last = str(e)
            if time.monotonic() >= deadline:
                raise TransientError(f"{where} not ready within {deadline_s:.0f}s (last: {last})",
                                     delay=retry_delay_s)
            time.sleep(poll_s)


def _healthy(client: httpx.Client, url: str) -> bool:
    try:
        return client.get(f"{url}/health").status_code == 200
    except httpx.HTTPError:
        return False
