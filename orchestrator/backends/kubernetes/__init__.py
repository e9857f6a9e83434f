"""The Kubernetes backend: render an arm to objects, apply them, wait, scrape, tear down.

``render`` needs no cluster client; ``KubernetesBackend`` (which imports the `kubernetes`
client) is loaded on first use, so `orch k8s render` and other commands start fast.
"""

from typing import TYPE_CHECKING, Any

from orchestrator.backends.kubernetes.render import namespace_of, render_arm, to_yaml, vllm_args

if TYPE_CHECKING:  # the checker sees the class itself, not the Any of __getattr__ below
    from orchestrator.backends.kubernetes.backend import KubernetesBackend

__all__ = ["KubernetesBackend", "namespace_of", "render_arm", "to_yaml", "vllm_args"]


def __getattr__(name: str) -> Any:
    if name == "KubernetesBackend":
        from orchestrator.backends.kubernetes.backend import KubernetesBackend

        return KubernetesBackend
    raise AttributeError(name)
