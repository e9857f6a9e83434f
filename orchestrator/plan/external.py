"""External arms: a serving stack that already runs behind an OpenAI-compatible URL.

The orchestrator provisions nothing for such an arm; the plan names where load goes
(``endpoint``) and describes what serves there (``labels``) so history can be filtered by it.
Secrets never enter the plan: a header names the environment variable its value is read from
at run time.
"""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, field_validator

from orchestrator.plan.base import StrictModel
from orchestrator.plan.catalog import canonical_gpu

# RFC 9110 token characters: what a header name may hold.
HEADER_NAME = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+$"
# Headers the load generator sets itself; a plan overriding them would break the protocol.
RESERVED_HEADERS = frozenset({"content-type", "content-length", "host", "transfer-encoding", "connection"})


def check_http_url(v: str, what: str) -> str:
    """A well-formed http(s) URL with a host, no query or fragment; trailing slashes dropped."""
    parts = urlsplit(v)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"{what} must start with http:// or https:// (got {v!r})")
    if not parts.hostname:
        raise ValueError(f"{what} has no host (got {v!r})")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number in range
    except ValueError as e:
        raise ValueError(f"{what} has a bad port (got {v!r})") from e
    if parts.query or parts.fragment:
        raise ValueError(f"{what} takes no query or fragment (got {v!r})")
    if parts.username or parts.password:
        raise ValueError(f"{what} must not carry credentials; use endpoint.headers with an env variable")
    return urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))


class HeaderFromEnv(StrictModel):
    """A request header whose value is read from the environment when the run starts."""

    env: str = Field(
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Environment variable holding the value; never written into the plan or the store.",
    )
    scheme: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z][A-Za-z0-9_-]*$",
        description="Put before the value with a space, e.g. Bearer (header `Bearer <value>`).",
    )


class ExternalEndpoint(StrictModel):
    """Where an external arm serves: an OpenAI-compatible base URL and the model it serves."""

    url: str = Field(
        description="Base URL of the OpenAI-compatible API, e.g. http://10.0.0.5:8000 "
        "(a trailing /v1 is accepted and dropped)."
    )
    model: str = Field(min_length=1, description="The `model` requests carry (the served model name).")
    metrics_url: str | None = Field(
        default=None,
        description="Prometheus endpoint (e.g. http://10.0.0.5:8000/metrics); without it the "
        "prefix-cache guard uses the cached tokens the replies report.",
    )
    headers: dict[str, HeaderFromEnv] = Field(
        default_factory=dict,
        description="Extra request headers, name -> {env: VARIABLE}, e.g. an API key.",
    )

    @field_validator("url")
    @classmethod
    def _base_url(cls, v: str) -> str:
        v = check_http_url(v, "url")
        return v[: -len("/v1")] if v.endswith("/v1") else v

    @field_validator("metrics_url")
    @classmethod
    def _metrics_url(cls, v: str | None) -> str | None:
        return None if v is None else check_http_url(v, "metrics_url")

    @field_validator("headers")
    @classmethod
    def _header_names(cls, v: dict[str, HeaderFromEnv]) -> dict[str, HeaderFromEnv]:
        for name in v:
            if not re.match(HEADER_NAME, name):
                raise ValueError(f"{name!r} is not a valid header name")
            if name.lower() in RESERVED_HEADERS:
                raise ValueError(f"header {name!r} is set by the load generator and cannot be overridden")
        return dict(sorted(v.items()))


class ArmLabels(StrictModel):
    """What serves behind an external endpoint, as the user describes it (not checked; the
    history filters by it: ``orch capacity --gpu H200 --layout disaggregated``)."""

    gpu: str | None = Field(default=None, description="GPU type: H100-PCIe, H100-SXM (alias H100) or H200.")
    layout: Literal["colocated", "disaggregated"] | None = Field(
        default=None, description="colocated or disaggregated prefill/decode."
    )
    replicas: int | None = Field(
        default=None, ge=1, le=4096, description="Serving replicas (workers) behind the URL."
    )
    gpus: int | None = Field(
        default=None, ge=1, le=65536, description="GPUs in all (default: replicas); history divides by it."
    )
    engine_version: str | None = Field(
        default=None, max_length=40, description="Engine version, e.g. v0.11.0 (the server's own, if it reports one, is fingerprinted too)."
    )
    tags: dict[str, str] = Field(
        default_factory=dict, description="Free-form labels, e.g. {stack: candidate, region: eu}."
    )

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, v: str | None) -> str | None:
        return None if v is None else canonical_gpu(v)

    @field_validator("tags")
    @classmethod
    def _tag_keys(cls, v: dict[str, str]) -> dict[str, str]:
        for key in v:
            if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$", key):
                raise ValueError(f"tag name {key!r}: letters, digits, '_', '.', '-' (up to 63)")
        return dict(sorted(v.items()))
