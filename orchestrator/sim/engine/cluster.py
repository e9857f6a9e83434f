"""What one arm looks like to the simulator: worker models, pools, router, link (pure)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from orchestrator.plan import GPUS, Arm, ModelSpec, RouterConfig, SimSettings
from orchestrator.sim.engine.routing import Router
from orchestrator.sim.engine.worker import Worker
from orchestrator.sim.model import DeviceProfile, WorkerModel


@dataclass(frozen=True)
class ClusterSpec:
    """Colocated workers (``workers``) or prefill and decode pools, behind one router."""

    workers: tuple[WorkerModel, ...] = ()
    prefill: tuple[WorkerModel, ...] = ()
    decode: tuple[WorkerModel, ...] = ()
    policy: str = "round_robin"
    cache_threshold: float = 0.5
    balance_abs_threshold: int = 32
    link_bytes_s: float = 0.0  # prefill -> decode KV path per GPU; 0: the GPU's NVLink
    stall_every_steps: int = 0
    stall_s: float = 0.0

    @property
    def disaggregated(self) -> bool:
        """True when prefill and decode run on separate pools."""
        return bool(self.prefill)

    @property
    def gpus(self) -> int:
        """GPUs the cluster occupies."""
        return sum(w.tp for w in (*self.workers, *self.prefill, *self.decode))

    def worker(self, model: WorkerModel, name: str, track_emissions: bool = False,
               chain_blocks: bool = False) -> Worker:
        """A worker of this cluster (its KV link and stalls)."""
        return Worker(model, name=name, link_bytes_s=self.link_bytes_s,
                      stall_every_steps=self.stall_every_steps, stall_s=self.stall_s,
                      track_emissions=track_emissions, chain_blocks=chain_blocks)

    def router(self, n_workers: int, seed: int) -> Router:
        """A router of this cluster's policy over ``n_workers`` workers."""
        return Router(self.policy, n_workers, seed=seed, cache_threshold=self.cache_threshold,
                      balance_abs_threshold=self.balance_abs_threshold)


def cluster_for_arm(
    model: ModelSpec,
    arm: Arm,
    router: RouterConfig,
    sim: SimSettings | None = None,
    efficiency_scale: float = 1.0,
    with_faults: bool = True,
    profile: DeviceProfile | None = None,
) -> ClusterSpec:
    """The simulated cluster of a plan's arm (noise: pass the run's ``efficiency_scale``); with a
    measured ``profile``, its workers run at the profile's rates instead of the datasheet's."""
    sim = sim or SimSettings()
    assert arm.gpu is not None, "a simulated arm names its GPU (only an external arm has none)"
    gpu = GPUS[arm.gpu]

    def pool(replicas: int, tp: int) -> tuple[WorkerModel, ...]:
        if profile is not None:
            return (profile.worker(model, arm.engine, tp, efficiency_scale),) * replicas
        w = WorkerModel.from_engine(gpu, model, tp, arm.engine, efficiency_scale)
        return (w,) * replicas

    link = gpu.nvlink_bytes_s if sim.kv_link == "nvlink" else sim.rdma_bytes_s
    common = ClusterSpec(
        policy=router.policy,
        cache_threshold=router.cache_threshold,
        balance_abs_threshold=router.balance_abs_threshold,
        link_bytes_s=link,
        stall_every_steps=sim.stall_every_steps if with_faults else 0,
        stall_s=sim.stall_ms / 1000.0 if with_faults else 0.0,
    )
    if arm.layout == "colocated":
        return replace(common, workers=pool(arm.replicas or 1, arm.tp))
    assert arm.prefill and arm.decode
    return replace(
        common,
        prefill=pool(arm.prefill.replicas, arm.prefill.tp),
        decode=pool(arm.decode.replicas, arm.decode.tp),
    )
