"""Render one arm of a plan to the Kubernetes objects it runs as (plain dicts, apply order).

Builders over YAML bases (manifests/README.md says why): each base in ``manifests/`` is a
valid object on its own; the functions here copy it and set what the arm decides.
"""

from __future__ import annotations

import copy
import json
import math
import os
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from orchestrator.backends.base import RunKey
from orchestrator.backends.kubernetes import naming
from orchestrator.engines import DiscoveredWorkers, Role, RouterTarget, ServeTarget, engine_for
from orchestrator.errors import EnvironmentProblem, UserError
from orchestrator.plan import Arm, Plan, PoolSpec
from orchestrator.plan.kubernetes import KubernetesSettings

Obj = dict[str, Any]
HTTP_PORT = 8000
NIXL_PORT = 5600
ROUTER_METRICS_PORT = 29000


def manifests_dir() -> Path:
    """Where the YAML bases are: ORCH_MANIFESTS_DIR, else ``manifests/`` of the checkout, else
    the copy a wheel ships in orchestrator/_data."""
    env = os.environ.get("ORCH_MANIFESTS_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    source = here.parents[3] / "manifests"
    return source if source.is_dir() else here.parents[2] / "_data" / "manifests"


@cache
def _bases(directory: str) -> dict[tuple[str, str], Obj]:
    out: dict[tuple[str, str], Obj] = {}
    for path in sorted(Path(directory).glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            out[(path.stem, doc["kind"])] = doc
    return out


def base(file: str, kind: str) -> Obj:
    """A deep copy of the base object ``kind`` from ``manifests/<file>.yaml``."""
    directory = manifests_dir()
    try:
        return copy.deepcopy(_bases(str(directory))[(file, kind)])
    except KeyError:
        raise EnvironmentProblem(
            f"manifest base {file}.yaml ({kind}) not found in {directory}: "
            "set ORCH_MANIFESTS_DIR to the repository's manifests/ folder"
        ) from None


def namespace_of(plan: Plan, experiment: str | None = None) -> str:
    """The namespace an arm's objects go to: the plan's, else one per experiment."""
    return plan.kubernetes.namespace or naming.experiment_namespace(experiment or plan.name)


def render_arm(plan: Plan, arm_name: str, key: RunKey, namespace: str | None = None) -> list[Obj]:
    """Every object the arm applies, in apply order: [Namespace], owner, router RBAC, pools,
    their Services, the router and its Service. ``namespace`` overrides the plan's."""
    arm = plan.arm(arm_name)
    if arm.external:
        raise UserError(f"arms.{arm_name} is an external endpoint: it runs elsewhere, nothing to render")
    if arm.layout == "disaggregated" and arm.kv_connector == "example":
        # Its KV goes through a folder both sides read; a cluster's pods share none.
        raise UserError(f"arms.{arm_name}.kv_connector: example keeps KV in a folder of one machine, which "
                        "pods on a cluster do not share; use nixl or lmcache on the kubernetes backend")
    ns = namespace or namespace_of(plan, key.experiment)
    labels = naming.run_labels(key)
    objs: list[Obj] = []
    if namespace is None and plan.kubernetes.namespace is None:
        ns_obj = base("namespace", "Namespace")
        ns_obj["metadata"]["name"] = ns
        ns_obj["metadata"]["labels"] = {
            **ns_obj["metadata"]["labels"], naming.EXPERIMENT_LABEL: labels[naming.EXPERIMENT_LABEL],
        }
        objs.append(ns_obj)
    objs.append(_owner(plan, arm_name, key, ns, labels))
    objs.extend(_router_rbac(key, ns, labels))
    side_channel = _uses_nixl(arm) and engine_for(arm).kv_side_channel_env is not None
    for role, pool in arm.pools().items():
        objs.append(_pool_deployment(plan, arm, role, pool, key, ns, labels))
        objs.append(_service(key, role, ns, labels, headless=True, nixl=side_channel))
    objs.append(_router_deployment(plan, arm_name, key, ns, labels))
    objs.append(_service(key, "router", ns, labels, headless=False, nixl=False))
    return objs


def owner_reference(owner: Obj) -> Obj:
    """The ownerReference to the run's owner ConfigMap (needs its uid from the server)."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap", "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"], "blockOwnerDeletion": True,
    }


def _meta(name: str, ns: str, labels: dict[str, str], role: str | None) -> Obj:
    out = {**labels, naming.ROLE_LABEL: role} if role else dict(labels)
    return {"name": name, "namespace": ns, "labels": out}


def _owner(plan: Plan, arm_name: str, key: RunKey, ns: str, labels: dict[str, str]) -> Obj:
    obj = base("owner", "ConfigMap")
    obj["metadata"] = _meta(naming.run_name(key), ns, labels, "owner")
    obj["data"] = {
        "arm": arm_name,
        "arm.json": json.dumps(plan.arm(arm_name).model_dump(mode="json"), sort_keys=True),
        "run": key.slug,
    }
    return obj


def _router_rbac(key: RunKey, ns: str, labels: dict[str, str]) -> list[Obj]:
    name = naming.object_name(key, "router")
    out = []
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        obj = base("router-rbac", kind)
        obj["metadata"] = _meta(name, ns, labels, "router")
        out.append(obj)
    out[2]["roleRef"]["name"] = name
    out[2]["subjects"][0]["name"] = name
    return out


def _uses_nixl(arm: Arm) -> bool:
    return arm.layout == "disaggregated" and arm.kv_connector == "nixl"


def vllm_args(plan: Plan, arm: Arm, tp: int, role: Role = "worker") -> list[str]:
    """The engine container's arguments for one worker of ``arm`` in role ``role``: the engine
    adapter's, as its image's command takes them (``vllm serve MODEL ...``; SGLang's
    ``sglang.launch_server --model-path MODEL ...``). A P/D prefill worker of an engine with a
    bootstrap server listens on the engine's default bootstrap port (one per pod)."""
    engine = engine_for(arm)
    target = ServeTarget(model=plan.model.hf_id or plan.model.name, host="0.0.0.0", port=HTTP_PORT,
                         tp=tp, role=role, device="cuda",
                         bootstrap_port=engine.bootstrap_port if role == "prefill" else None)
    return list(engine.container.args(engine.serve_args(plan, arm, target)))


engine_args = vllm_args  # the name for any engine (vllm_args: the older one, kept for callers)


HOSTNAME = "kubernetes.io/hostname"


def _pd_placement(placement: str, arm: Arm, role: Role, labels: dict[str, str]) -> Obj:
    """A disaggregated arm's prefill and decode pods of one run, together on a node
    (same-node: each pod must land where a pod of the pair already runs; the first may go
    anywhere) or never on one (spread: anti-affinity to the other role); nothing when free."""
    if arm.layout != "disaggregated" or placement == "free" or role not in ("prefill", "decode"):
        return {}
    run = {naming.RUN_LABEL: labels[naming.RUN_LABEL]}
    if placement == "same-node":
        selector = {"matchLabels": run, "matchExpressions": [
            {"key": naming.ROLE_LABEL, "operator": "In", "values": ["prefill", "decode"]}]}
        return {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
            {"labelSelector": selector, "topologyKey": HOSTNAME}]}}
    other = "decode" if role == "prefill" else "prefill"
    return {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"labelSelector": {"matchLabels": {**run, naming.ROLE_LABEL: other}}, "topologyKey": HOSTNAME}]}}


def _gpu_affinity(plan: Plan, arm: Arm) -> Obj:
    assert arm.gpu is not None  # plan validation: a provisioned arm names its GPU (external ones are refused)
    return gpu_affinity(plan.kubernetes, arm.gpu)


def gpu_affinity(k: KubernetesSettings, gpu: str) -> Obj:
    """The node affinity that places a pod on ``gpu`` nodes (the product label's values from the
    catalog, or the settings' gpu_products); the device probe's Job uses it too."""
    expr = {"key": k.gpu_product_label, "operator": "In", "values": list(k.product_labels(gpu))}
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [expr]}]
            }
        }
    }


def pull_secrets(pod_spec: Obj, names: tuple[str, ...]) -> None:
    """The plan's image pull secrets on a pod (the securityContext is the base's, manifests/)."""
    if names:
        pod_spec["imagePullSecrets"] = [{"name": n} for n in names]


def _quantity_times(quantity: str, n: int) -> str:
    digits = quantity.rstrip("KMGTik")
    unit = quantity[len(digits):]
    value = float(digits) * n
    return f"{int(value) if value.is_integer() else value}{unit}"


def _pool_deployment(
    plan: Plan, arm: Arm, role: Role, pool: PoolSpec, key: RunKey, ns: str, labels: dict[str, str]
) -> Obj:
    k = plan.kubernetes
    obj = base("vllm-worker", "Deployment")
    name = naming.object_name(key, role)
    obj["metadata"] = _meta(name, ns, {**obj["metadata"]["labels"], **labels}, role)
    pod_labels = {**obj["spec"]["template"]["metadata"]["labels"], **labels, naming.ROLE_LABEL: role}
    obj["spec"]["replicas"] = pool.replicas
    obj["spec"]["selector"] = {"matchLabels": {naming.RUN_LABEL: labels[naming.RUN_LABEL], naming.ROLE_LABEL: role}}
    tpl = obj["spec"]["template"]
    tpl["metadata"]["labels"] = pod_labels
    spec = tpl["spec"]
    spec["terminationGracePeriodSeconds"] = k.termination_grace_s
    pull_secrets(spec, k.image_pull_secrets)
    spec["affinity"] = {**_gpu_affinity(plan, arm), **_pd_placement(k.placement, arm, role, labels)}
    if k.node_selector:
        spec["nodeSelector"] = dict(sorted(k.node_selector.items()))
    if k.tolerations:
        spec["tolerations"] = [toleration(t) for t in k.tolerations]
    engine = engine_for(arm)
    annotations = engine.pod_annotations(role) if arm.layout == "disaggregated" else {}
    if annotations:
        tpl["metadata"].setdefault("annotations", {}).update(annotations)
    c = spec["containers"][0]
    c["image"] = f"{k.image_repository_for(arm.engine.kind)}:{arm.engine.version}"
    c["imagePullPolicy"] = k.image_pull_policy
    c["command"] = list(engine.container.command)
    c["args"] = vllm_args(plan, arm, pool.tp, role)
    for probe in ("startupProbe", "readinessProbe"):
        c[probe]["httpGet"]["path"] = engine.ready_path
    gpus = str(pool.tp)
    c["resources"] = {
        "requests": {
            "cpu": str(k.cpu_per_gpu * pool.tp),
            "memory": _quantity_times(k.memory_per_gpu, pool.tp),
            "nvidia.com/gpu": gpus,
        },
        "limits": {"nvidia.com/gpu": gpus},
    }
    c["startupProbe"]["failureThreshold"] = math.ceil(k.startup_timeout_s / c["startupProbe"]["periodSeconds"])
    if k.hf_token_secret:
        c["env"].append(
            {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": k.hf_token_secret, "key": "token"}}}
        )
    if _uses_nixl(arm):
        _nixl(tpl, c, plan, engine.kv_side_channel_env)
    if role == "prefill" and arm.layout == "disaggregated" and engine.bootstrap_port is not None:
        c["ports"].append({"name": "bootstrap", "containerPort": engine.bootstrap_port, "protocol": "TCP"})
    for vol in spec["volumes"]:
        if vol["name"] == "dshm":
            vol["emptyDir"]["sizeLimit"] = k.shm_size
        elif vol["name"] == "model-cache":
            _weights_volume(vol, plan)
    if "emptyDir" in next(v for v in spec["volumes"] if v["name"] == "model-cache"):
        # The weights land on the node's disk: the scheduler must see that, and the kubelet
        # evicts a pod past it rather than fill the node.
        size = emptydir_weights_size(plan)
        c["resources"]["requests"]["ephemeral-storage"] = size
        c["resources"]["limits"]["ephemeral-storage"] = size
    return obj


def emptydir_weights_size(plan: Plan) -> str:
    """What a pod that downloads the weights into an emptyDir may write: the weights at their
    released precision, a quarter more (the download's temporary files, tokenizer, config),
    and 10 GiB for vLLM's compile and kernel caches under HOME; whole GiB."""
    weights = plan.model.weight_bytes()
    return f"{math.ceil(weights * 1.25 / 2**30) + 10}Gi"


def toleration(t: Any) -> Obj:
    """A Toleration as Kubernetes reads it. ``operator`` is always written: left out it means
    Equal, and ``{key: dedicated}`` with Equal "" tolerates no ``dedicated=h200`` taint."""
    out: Obj = {"operator": t.operator}
    if t.key:
        out["key"] = t.key
    if t.operator == "Equal":
        out["value"] = t.value
    if t.effect:
        out["effect"] = t.effect
    return out


def weights_source(plan: Plan) -> str:
    """Where the weights come from, in words (for messages and the report)."""
    k = plan.kubernetes
    if k.model_cache_pvc:
        return f"PersistentVolumeClaim {k.model_cache_pvc}"
    if k.model_cache_host_path:
        return f"hostPath {k.model_cache_host_path}"
    return "download into an emptyDir" + (f" (HF token from Secret {k.hf_token_secret})" if k.hf_token_secret else "")


def _weights_volume(vol: Obj, plan: Plan) -> None:
    k = plan.kubernetes
    for source in ("persistentVolumeClaim", "emptyDir", "hostPath"):
        vol.pop(source, None)
    if k.model_cache_pvc:
        vol["persistentVolumeClaim"] = {"claimName": k.model_cache_pvc}
    elif k.model_cache_host_path:
        vol["hostPath"] = {"path": k.model_cache_host_path, "type": "DirectoryOrCreate"}
    else:
        vol["emptyDir"] = {"sizeLimit": emptydir_weights_size(plan)}


def kv_transport(plan: Plan, arm: Arm) -> str | None:
    """How the arm's KV moves between prefill and decode: e.g. ``nixl/tcp``, ``nixl/rdma``."""
    if arm.layout != "disaggregated" or not arm.kv_connector:
        return None
    if arm.kv_connector == "nixl":
        return f"nixl/{plan.kubernetes.kv_network.transport}"
    return arm.kv_connector


def _nixl(tpl: Obj, c: Obj, plan: Plan, side_channel_env: tuple[str, str] | None) -> None:
    """NIXL's side channel where the engine has one (vLLM: decode pulls KV from prefill over
    UCX; each pod advertises its IP; SGLang exchanges NIXL metadata through its bootstrap
    server instead) and, if asked, RDMA: the device resource, IPC_LOCK for pinned memory,
    UCX's rc transport, the device names and a secondary network."""
    k = plan.kubernetes
    net = k.kv_network
    tls = k.ucx_tls if not net.rdma else ",".join(dict.fromkeys(["rc", *k.ucx_tls.split(",")]))
    if side_channel_env is not None:
        host_env, port_env = side_channel_env
        c["env"] += [
            {"name": host_env, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": port_env, "value": str(NIXL_PORT)},
        ]
    c["env"].append({"name": "UCX_TLS", "value": tls})
    if side_channel_env is not None:
        c["ports"].append({"name": "nixl", "containerPort": NIXL_PORT, "protocol": "TCP"})
    if not net.rdma:
        return
    if net.ucx_net_devices:
        c["env"].append({"name": "UCX_NET_DEVICES", "value": net.ucx_net_devices})
    for part in ("requests", "limits"):
        c["resources"][part][net.resource] = str(net.count)
    sc = c.setdefault("securityContext", {})
    caps = sc.setdefault("capabilities", {})
    caps["add"] = sorted({*caps.get("add", []), "IPC_LOCK"})
    if net.network_annotation:
        tpl["metadata"].setdefault("annotations", {})["k8s.v1.cni.cncf.io/networks"] = net.network_annotation


def router_args(plan: Plan, arm_name: str, ns: str, labels: dict[str, str]) -> list[str]:
    """Arguments of the arm's engine's router (``vllm-router``, ``sglang_router``): the plan's
    policy over workers it discovers by label, or its P/D mode over the prefill and decode
    pools (the engine adapter's)."""
    arm = plan.arm(arm_name)
    engine = engine_for(arm)
    kv = engine.kv_connector(arm, "prefill", "cuda", None)
    target = RouterTarget(
        host="0.0.0.0", port=HTTP_PORT, metrics_host="0.0.0.0", metrics_port=ROUTER_METRICS_PORT,
        workers=DiscoveredWorkers(namespace=ns, port=HTTP_PORT,
                                  run_selector=f"{naming.RUN_LABEL}={labels[naming.RUN_LABEL]}",
                                  role_label=naming.ROLE_LABEL),
        kv_connector=kv.name if kv is not None else None)
    return list(engine.router_args(plan, arm_name, target))


def _router_deployment(plan: Plan, arm_name: str, key: RunKey, ns: str, labels: dict[str, str]) -> Obj:
    k = plan.kubernetes
    obj = base("router", "Deployment")
    name = naming.object_name(key, "router")
    obj["metadata"] = _meta(name, ns, {**obj["metadata"]["labels"], **labels}, "router")
    obj["spec"]["selector"] = {
        "matchLabels": {naming.RUN_LABEL: labels[naming.RUN_LABEL], naming.ROLE_LABEL: "router"}
    }
    tpl = obj["spec"]["template"]
    tpl["metadata"]["labels"] = {**tpl["metadata"]["labels"], **labels, naming.ROLE_LABEL: "router"}
    tpl["spec"]["serviceAccountName"] = name
    pull_secrets(tpl["spec"], k.image_pull_secrets)
    if k.tolerations:  # a cluster of tainted GPU nodes only must still place the router
        tpl["spec"]["tolerations"] = [toleration(t) for t in k.tolerations]
    c = tpl["spec"]["containers"][0]
    arm = plan.arm(arm_name)
    engine = engine_for(arm)
    if engine.router_module is None:  # its own image and executable (the base's command)
        c["image"] = k.router_image
    else:  # a module of the engine's image, run by the image's interpreter
        c["image"] = f"{k.image_repository_for(arm.engine.kind)}:{arm.engine.version}"
        c["command"] = [engine.container.command[0], *engine.router_module]
    c["imagePullPolicy"] = k.image_pull_policy
    c["args"] = router_args(plan, arm_name, ns, labels)
    return obj


def _service(key: RunKey, role: str, ns: str, labels: dict[str, str], headless: bool, nixl: bool) -> Obj:
    obj = base("service", "Service")
    obj["metadata"] = _meta(naming.object_name(key, role), ns, {**obj["metadata"]["labels"], **labels}, role)
    spec = obj["spec"]
    spec["selector"] = {naming.RUN_LABEL: labels[naming.RUN_LABEL], naming.ROLE_LABEL: role}
    if headless:
        spec["clusterIP"] = "None"
    if nixl:
        spec["ports"].append({"name": "nixl", "port": NIXL_PORT, "targetPort": "nixl", "protocol": "TCP"})
    if role == "router":
        spec["ports"].append(
            {"name": "metrics", "port": ROUTER_METRICS_PORT, "targetPort": "metrics", "protocol": "TCP"}
        )
    return obj


LOADGEN_ROLE = "loadgen"


def render_load_generator(plan: Plan, key: RunKey, ns: str) -> Obj:
    """The run's in-cluster load generator (``manifests/loadgen.yaml``: ``orch loadgen agent``
    in ``kubernetes.loadgen_image``): a Deployment labelled with the experiment (cleaned up with
    the run) but not with the run's label, so its pod is none of the arm's (not scraped, not in
    the fingerprint); its own run label selects it."""
    k = plan.kubernetes
    obj = base("loadgen", "Deployment")
    name = naming.object_name(key, LOADGEN_ROLE)
    labels = {**naming.run_labels(key), naming.RUN_LABEL: naming.label_value(name)}
    obj["metadata"] = _meta(name, ns, {**obj["metadata"]["labels"], **labels}, LOADGEN_ROLE)
    obj["spec"]["selector"] = {"matchLabels": {naming.RUN_LABEL: labels[naming.RUN_LABEL],
                                               naming.ROLE_LABEL: LOADGEN_ROLE}}
    tpl = obj["spec"]["template"]
    tpl["metadata"]["labels"] = {**tpl["metadata"]["labels"], **labels, naming.ROLE_LABEL: LOADGEN_ROLE}
    pull_secrets(tpl["spec"], k.image_pull_secrets)
    if k.tolerations:  # a cluster of tainted nodes only must still place it
        tpl["spec"]["tolerations"] = [toleration(t) for t in k.tolerations]
    c = tpl["spec"]["containers"][0]
    c["image"] = k.loadgen_image
    c["imagePullPolicy"] = k.image_pull_policy
    c["command"] = [*c["command"][:-1], str(HTTP_PORT)]
    return obj


def to_yaml(objs: list[Obj]) -> str:
    """Objects as one multi-document YAML text (stable key order as built)."""
    return "".join("---\n" + yaml.safe_dump(o, sort_keys=False, width=1000) for o in objs)


def file_name(index: int, obj: Obj) -> str:
    """``NN-kind-name.yaml``: apply order first, then what it is."""
    return f"{index:02d}-{obj['kind'].lower()}-{obj['metadata']['name']}.yaml"


def write_objects(objs: list[Obj], out: Path) -> list[Path]:
    """Write each object to its own file under ``out`` (created); returns the paths in order."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for i, obj in enumerate(objs, start=1):
        path = out / file_name(i, obj)
        path.write_text(yaml.safe_dump(obj, sort_keys=False, width=1000))
        paths.append(path)
    return paths
