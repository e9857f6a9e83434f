"""The container registries as the emulated kubelet sees them: which images exist, and what
containerd says when one does not.

The repositories the project runs exist with every tag (vLLM, the vllm-router, SGLang, the
PyTorch image of the device probe, the orchestrator's own image under any registry); a test
or user adds others (``EmulatedCluster.add_image``) and declares an image missing
(``EmulatedCluster.missing_image``). A pull of an image that does not exist fails for good,
with containerd's words through the CRI (``rpc error: code = NotFound desc = failed to pull and
unpack image "ghcr.io/org/nope:1": failed to resolve reference "ghcr.io/org/nope:1":
ghcr.io/org/nope:1: not found``; a Docker Hub repository that does not exist:
``pull access denied, repository does not exist or may require authorization``). A transient
failure (``fail_image_pull``: a registry rate limit) reads differently, and later pulls succeed.
"""

from __future__ import annotations

import fnmatch
import threading

# Repositories (fully qualified, fnmatch patterns) that exist with any tag.
KNOWN_REPOSITORIES = (
    "docker.io/vllm/vllm-openai",
    "docker.io/vllm/vllm-router",
    "docker.io/lmsysorg/sglang",
    "docker.io/pytorch/pytorch",
    "*/orchestrator",
)


def qualify(image: str) -> str:
    """containerd's fully qualified reference: ``docker.io/library/`` for a bare name,
    ``docker.io/`` when no registry is given, ``:latest`` when no tag or digest is."""
    first, _, rest = image.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        domain, path = first, rest
    else:
        domain, path = "docker.io", image
        if "/" not in path:
            path = f"library/{path}"
    last = path.rsplit("/", 1)[-1]
    if "@" not in path and ":" not in last:
        path += ":latest"
    return f"{domain}/{path}"


def repository(image: str) -> str:
    """The qualified repository of an image (no tag, no digest)."""
    ref = qualify(image).split("@", 1)[0]
    head, _, last = ref.rpartition("/")
    return f"{head}/{last.split(':', 1)[0]}"


def not_found_message(image: str, known_repository: bool) -> str:
    """What the kubelet reports for an image the registry does not have."""
    ref = qualify(image)
    if ref.startswith("docker.io/") and not known_repository:
        cause = ("pull access denied, repository does not exist or may require authorization: server message: "
                 "insufficient_scope: authorization failed")
        return (f'rpc error: code = Unknown desc = failed to pull and unpack image "{ref}": failed to resolve '
                f'reference "{ref}": {cause}')
    return (f'rpc error: code = NotFound desc = failed to pull and unpack image "{ref}": failed to resolve '
            f'reference "{ref}": {ref}: not found')


def transient_message(image: str) -> str:
    """A pull failure that waiting fixes: the registry's rate limit."""
    ref = qualify(image)
    domain, _, repo = repository(image).partition("/")
    host = "registry-1.docker.io" if domain == "docker.io" else domain
    tag = ref.split("@", 1)[1] if "@" in ref else ref.rsplit(":", 1)[1]
    return (f'rpc error: code = Unknown desc = failed to pull and unpack image "{ref}": failed to copy: '
            f"httpReadSeeker: failed open: unexpected status code https://{host}/v2/{repo}/manifests/"
            f"{tag}: 429 Too Many Requests - Server message: toomanyrequests: "
            "You have reached your pull rate limit. You may increase the limit by authenticating and upgrading: "
            "https://www.docker.com/increase-rate-limit")


class Registry:
    """Which images exist (thread-safe: tests declare, the kubelet asks)."""

    def __init__(self, repositories: tuple[str, ...] = KNOWN_REPOSITORIES):
        self._lock = threading.Lock()
        self._repositories = list(repositories)
        self._missing: set[str] = set()

    def add(self, pattern: str) -> None:
        """Images of the repository ``pattern`` (an fnmatch pattern, e.g. ``ghcr.io/org/*``) exist."""
        with self._lock:
            self._repositories.append(repository(pattern) if "*" not in pattern else pattern)

    def declare_missing(self, image: str) -> None:
        with self._lock:
            self._missing.add(qualify(image))

    def known_repository(self, image: str) -> bool:
        repo = repository(image)
        with self._lock:
            return any(fnmatch.fnmatchcase(repo, p) for p in self._repositories)

    def exists(self, image: str) -> bool:
        with self._lock:
            if qualify(image) in self._missing:
                return False
        return self.known_repository(image)
