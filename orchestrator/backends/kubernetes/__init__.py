"""The Kubernetes backend: render an arm to objects, apply them, wait, scrape, tear down."""

from orchestrator.backends.kubernetes.render import namespace_of, render_arm, to_yaml, vllm_args

__all__ = ["namespace_of", "render_arm", "to_yaml", "vllm_args"]
