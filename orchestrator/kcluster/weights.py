"""Model weights as the emulated cluster keeps them: what `vllm serve` does with ``HF_HOME``.

vLLM downloads a model's weights into the Hugging Face cache under ``HF_HOME`` unless they are
already there. So whether a pod downloads depends on the volume mounted at ``HF_HOME`` and on
what an earlier pod left in it: a PersistentVolumeClaim is one store for every pod that mounts
it (on any node: ReadWriteMany, the only mode pods on several nodes can share); a hostPath is
the node's own folder (once per node); an emptyDir lives and dies with its pod (once per pod,
on every attempt); no volume at all is the container's own filesystem (once per container
start). The emulator counts each download (``WeightStore.fetches``) with its bytes (the
catalog's weight size), so a test can count downloads across an experiment; it downloads
nothing.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]


@dataclass(frozen=True)
class Fetch:
    """One download of a model's weights."""

    node: str
    namespace: str
    pod: str
    volume: str  # persistentVolumeClaim, hostPath, emptyDir or container
    store: tuple[str, ...]  # which store it filled
    model: str
    bytes: int


def weights_store(container: Obj, pod: Obj, node: str, restarts: int) -> tuple[str, tuple[str, ...]]:
    """The volume kind and the store (a key) the container's ``HF_HOME`` lands in."""
    meta = pod.get("metadata") or {}
    ns, uid = meta.get("namespace", ""), meta.get("uid", meta.get("name", ""))
    env = {e.get("name"): e.get("value") for e in container.get("env") or [] if "value" in e}
    home = env.get("HF_HOME") or "/root/.cache/huggingface"
    mounts = sorted(((m.get("mountPath", "").rstrip("/"), m.get("name")) for m in container.get("volumeMounts") or []),
                    key=lambda m: len(m[0]), reverse=True)
    name = next((n for path, n in mounts if path and (home == path or home.startswith(path + "/"))), None)
    volumes = {v.get("name"): v for v in (pod.get("spec") or {}).get("volumes") or []}
    vol = volumes.get(name) if name else None
    if vol is None:
        return "container", ("container", uid, str(container.get("name")), str(restarts))
    if "persistentVolumeClaim" in vol:
        return "persistentVolumeClaim", ("pvc", ns, str(vol["persistentVolumeClaim"].get("claimName")))
    if "hostPath" in vol:
        return "hostPath", ("hostPath", node, str(vol["hostPath"].get("path")))
    return "emptyDir", ("emptyDir", uid, str(name))


class WeightStore:
    """Which stores hold which models' weights, and every download that filled one."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._held: set[tuple[tuple[str, ...], str]] = set()
        self.fetches: list[Fetch] = []

    def load(self, container: Obj, pod: Obj, node: str, restarts: int, model: str, nbytes: int) -> Fetch | None:
        """The container starts serving ``model``: its weights are downloaded into its store
        unless already there. The download, or None when the store held them."""
        kind, store = weights_store(container, pod, node, restarts)
        meta = pod.get("metadata") or {}
        with self._lock:
            if (store, model) in self._held:
                return None
            self._held.add((store, model))
            fetch = Fetch(node, meta.get("namespace", ""), meta.get("name", ""), kind, store, model, nbytes)
            self.fetches.append(fetch)
            return fetch
