"""The block-level guards (split from control/executor.py): once every arm of a block has a valid
run, the back-to-back guard over their environments (a block whose arms ran on other GPUs,
drivers or images than the plan registers is not a pairing) and each disaggregated arm's
prefill/decode placement against the first earlier block that counts."""

from __future__ import annotations

from datetime import datetime

from orchestrator import logs
from orchestrator.analysis.guards import (
    GuardResult,
    RunEnvironment,
    back_to_back,
    placement_consistency,
)
from orchestrator.backends.base import Fingerprint
from orchestrator.control.progress import ProgressSink
from orchestrator.control.verdicts import BACK_TO_BACK, valid_runs
from orchestrator.plan import Plan
from orchestrator.store.protocol import StoreLike
from orchestrator.store.rows import RunInfo


def judge_block(store: StoreLike, progress: ProgressSink, plan: Plan, exp_id: int, block: int) -> None:
    """The back-to-back guard of a block whose arms all ran validly (their environments against
    what the plan registers as different between them) and each disaggregated arm's placement,
    recorded on every run of the block; a failure leaves the block (or the arm's run) uncounted."""
    logs.bind(block=block, arm=None, attempt=None)
    runs = [r for r in store.runs(exp_id) if r.block == block and r.status == "done" and r.valid]
    by_arm = {r.arm: r for r in runs}
    if set(by_arm) != set(plan.block_arms()[block]):
        return  # every arm of the block must have run (2 or more; an incomplete block: its own arms)
    if any(g.name == BACK_TO_BACK for r in by_arm.values() for g in store.guard_results(r.id)):
        return  # judged before (a resumed experiment)
    # What the plan registers as different between the arms (A on H100, B on H200; an
    # engine upgrade gate) is the comparison itself, not a broken back-to-back pairing.
    arms = [plan.arm(n) for n in plan.block_arms()[block]]
    registered = {
        "gpu_type": [(a.labels.gpu if a.labels else None) if a.external else a.gpu for a in arms],
        "engine_version": [(a.labels.engine_version if a.labels else None) if a.external
                           else a.engine.version for a in arms],
    }
    differs = {k for k, vals in registered.items() if len(set(vals)) > 1}
    # Other GPU types run on other nodes (pools, drivers); another version is another image.
    masked = ({"gpu_type", "gpu_products", "node_pools", "driver_versions"} if "gpu_type" in differs else set())
    masked |= {"engine_version", "images"} if "engine_version" in differs else set()
    envs = []
    for r in by_arm.values():
        fp = Fingerprint.from_dict(r.fingerprint)

        def seen(name: str, fp: Fingerprint = fp) -> str:
            if name in masked:
                return "registered per arm"
            return ",".join(fp.image_digests()) if name == "images" else fp.compared_value(name)

        envs.append(RunEnvironment(
            arm=r.arm,
            gpu_type=seen("gpu_type") + ("" if "gpu_type" in masked else f" ({seen('gpu_products')})"),
            engine_version=seen("engine_version"),
            node_pool=seen("node_pools"), driver=seen("driver_versions"), image=seen("images"),
            started_s=_ts(r.started_at), ended_s=_ts(r.finished_at or r.started_at),
            # One measurement session = one experiment on one backend; a resumed controller
            # continues the session (the time window still bounds it).
            session=f"{exp_id}:{fp.backend}",
        ))
    result: GuardResult = back_to_back(envs, window_h=plan.design.window_h)
    placements = placement_guards(store, exp_id, block, by_arm)
    for arm, r in by_arm.items():
        store.record_guards(r.id, None, [result, *placements.get(arm, [])])
    if not result.passed:
        progress.note(f"block {block}: back-to-back guard failed ({result.detail}); block not counted")
    for g in (g for gs in placements.values() for g in gs if not g.passed):
        progress.note(f"block {block}: {g.detail}; the arm's run of this block is not counted")

def placement_guards(store: StoreLike, exp_id: int, block: int, by_arm: dict[str, RunInfo]) -> dict[str, list[GuardResult]]:
    """Each disaggregated arm's observed prefill/decode placement against the one it had in
    the first earlier block that counts (analysis.guards.placement_consistency)."""
    counted = valid_runs(store, exp_id)
    runs = {r.id: r for r in store.runs(exp_id)}
    out: dict[str, list[GuardResult]] = {}
    for arm, r in by_arm.items():
        observed = (Fingerprint.from_dict(r.fingerprint).details.get("pd_placement") or {}).get("observed")
        if observed is None:
            continue
        reference = None
        for b in sorted(b for (b, a) in counted if a == arm and b < block):
            ref = (Fingerprint.from_dict(runs[counted[(b, arm)]].fingerprint).details.get("pd_placement") or {})
            if ref.get("observed"):
                reference = (b, str(ref["observed"]))
                break
        out[arm] = [placement_consistency(arm, str(observed), reference)]
    return out


def _ts(dt: datetime) -> float:
    """Epoch seconds of a stored (UTC) datetime."""
    from datetime import UTC

    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()
