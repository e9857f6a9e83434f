"""The Kubernetes backend: render an arm to objects, apply them, wait, scrape, tear down."""

from orchestrator.backends.kubernetes.backend import KubernetesBackend
from orchestrator.backends.kubernetes.render import namespace_of, render_arm, to_yaml, vllm_args

__all__ = ["KubernetesBackend", "namespace_of", "render_arm", "to_yaml", "vllm_args"]
