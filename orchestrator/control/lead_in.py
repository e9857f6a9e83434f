"""Lead-in runs (``design.carryover.lead_in_s``, issue 31): before each measured run that would
not otherwise follow a run of its block's first arm, that arm is deployed and sent the workload
for ``lead_in_s`` at its last capacity in the experiment, unmeasured, then torn down. Every
measured run of a block then follows a run of the same arm, so a first-order carry-over (whatever
runs after an arm is slowed) is the same for all of them and cancels in each block's ratios,
whichever arm leaves it and however many arms a block holds. Nothing of a lead-in is stored but
a progress line; its resources are named ``...-b<block>-lead<n>`` (attempt -n)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.backends.base import Backend, RunKey
from orchestrator.control.points import PointRunner
from orchestrator.control.progress import ProgressSink
from orchestrator.plan import Plan
from orchestrator.store.protocol import StoreLike

if TYPE_CHECKING:
    from orchestrator.control.executor import ExecutorConfig


class LeadIns:
    """What this process ran last and the lead-ins it ran per block."""

    def __init__(self, store: StoreLike, backend: Backend, config: ExecutorConfig, progress: ProgressSink) -> None:
        self.store, self.backend, self.config, self.progress = store, backend, config, progress
        self.last_ran: tuple[int, str] | None = None  # (block, arm) of the last deployment, a lead-in's too
        self.count: dict[int, int] = {}  # block -> lead-ins run (their attempts are -1, -2, ...)

    def ran(self, block: int, arm: str) -> None:
        """A measured attempt of ``arm`` in ``block`` is starting (it counts whether or not it ends valid)."""
        self.last_ran = (block, arm)

    def needed(self, plan: Plan, block: int, first: str) -> bool:
        """Whether the next measured run of ``block`` needs a lead-in of its ``first`` arm: the
        block's first run, a run after another arm's (a third arm, a retried second run), a resume."""
        return plan.design.carryover.lead_in_s > 0 and self.last_ran != (block, first)

    def run(self, plan: Plan, exp_id: int, exp_name: str, block: int, arm: str) -> None:
        """One lead-in of ``arm`` (errors propagate: the caller counts a failed attempt)."""
        n = self.count[block] = self.count.get(block, 0) + 1
        key = RunKey(exp_name, arm, block, -n)
        seconds = plan.design.carryover.lead_in_s
        rate = self.last_capacity_rate(plan, exp_id, arm)
        self.last_ran = None  # until it has run: a failed lead-in is run again
        at = "the search's lowest rate" if rate is None else f"{rate:.3g}/s, its last capacity"
        self.progress.note(f"block {block}: lead-in {n} of arm {arm} ({seconds:g} s at {at}, unmeasured)")
        dep = self.backend.deploy(plan, arm, key)
        try:
            self.backend.ready(dep, self.config.ready_deadline_s or self.backend.startup_budget_s(plan, arm))
            runner = PointRunner(self.store, self.backend, plan, self.config.state_dir / "spool",
                                 self.config.generator_ceiling, self.config.max_shards, progress=self.progress)
            runner.warm_up(dep, arm, block, key.attempt, seconds=seconds, rate=rate)
        finally:
            self.backend.teardown(dep)
        self.last_ran = (block, arm)

    def last_capacity_rate(self, plan: Plan, exp_id: int, arm: str) -> float | None:
        """The rate (the plan's unit) ``arm`` held for every class in its latest valid run of this
        experiment: what a lead-in sends, so it leaves what a run leaves. None before one."""
        if not plan.workload.open_loop:
            return None
        caps = self.store.capacities(exp_id)
        if caps.empty:
            return None
        done = caps[(caps["arm"] == arm) & (caps["status"] == "done") & caps["valid"].astype(bool)]
        if done.empty:
            return None
        rates = done[done["run_id"] == done["run_id"].max()]["at_rate"].dropna()
        return float(rates.min()) if not rates.empty and rates.min() > 0 else None
