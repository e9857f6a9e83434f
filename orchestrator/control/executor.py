"""The experiment executor: register, then for each block the arms in the registered order:
deploy, wait ready, capacity search per class, guards, store, tear down; then judge the bars.

Resumable: everything is in the store as it happens. Started again on the same plan, it marks
runs an earlier process left half-done as aborted (their records are kept), cleans up what
that process left running, and continues at the first (block, arm) without a valid run. It
never runs an edited plan under an old registration.

A PermanentError (a 403, no node with the GPU type, a Pod Security refusal, an image that
never pulls, a deterministic guard failure) stops the experiment as ``failed``: the backend
deletes every object and namespace it created for it, and the error names the remedy. Run
again on the same plan once that is fixed, the failed experiment resumes like an interrupted
one (its records kept) and runs to done; a run that failed permanently does not count against
``design.max_retries``. An interruption, a transient error, a database outage or a lost lease
leave the experiment ``running`` (resumable) as before.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from orchestrator import logs
from orchestrator.analysis.search import search_capacity
from orchestrator.backends.base import Backend, Deployment, Fingerprint, RunKey
from orchestrator.control.block_guards import judge_block
from orchestrator.control.design import plan_order
from orchestrator.control.effects import experiment_effects
from orchestrator.control.eta import point_seconds
from orchestrator.control.lead_in import LeadIns
from orchestrator.control.load_kinds import level_plans, load_kind
from orchestrator.control.points import PointOutcome, PointRunner
from orchestrator.control.progress import PlainProgress, ProgressSink
from orchestrator.control.spool import replay, spooled_points
from orchestrator.control.verdicts import (
    BarOutcome,
    experiment_complete,
    gate_exit_code,
    judge_experiment,
)
from orchestrator.errors import (
    OrchestratorError,
    PermanentError,
    Terminated,
    TransientError,
    UserError,
)
from orchestrator.plan import Plan
from orchestrator.records import ERROR_OR_TIMEOUT_STATUSES
from orchestrator.store.integrity import same_plan
from orchestrator.store.lease import ExperimentLease, LeaseLost
from orchestrator.store.protocol import StoreLike
from orchestrator.store.repository import Store
from orchestrator.store.retry import DatabaseOutage, ResilientStore, first_line, retrying
from orchestrator.store.rows import Registration


class RunInvalid(Exception):
    """A run that may not be counted; the message is stored as its reason."""


# How the reason of a run stopped by a PermanentError begins (``orch status`` shows it).
PERMANENT_REASON = "PermanentError: "


class ExperimentFailed(PermanentError):
    """The experiment stopped for a PermanentError (``__cause__``): stored as ``failed``, what
    the backend created for it deleted. One line: the experiment, the reason, how to resume."""

    def __init__(self, experiment: str, cause: PermanentError, cleanup_error: str | None = None):
        self.experiment = experiment
        self.reason = " | ".join(line.strip() for line in str(cause).splitlines() if line.strip())
        left = (f"; cleaning up failed too ({cleanup_error}): `orch run` of the plan cleans up again"
                if cleanup_error else "")
        super().__init__(f"experiment {experiment} failed: {self.reason}{left}; fix that and run the same "
                         "plan again to resume it (its records are kept)")


@dataclass
class ExecutorConfig:
    state_dir: Path
    ready_deadline_s: float | None = None  # None: the backend's start-up budget for the arm
    max_blocks: int | None = None  # run only this many blocks now (a later run resumes)
    generator_ceiling: float | None = None  # requests/s one process sustains (calibration)
    max_shards: int = 1  # Ray load-generator shards a point may use above that ceiling
    calibration: dict[str, Any] | None = None  # the calibration behind the ceiling (its steps)
    priors: dict[str, dict[str, float]] = field(default_factory=dict)  # arm -> class -> rate
    db_retry_budget_s: float | None = None  # None: ORCH_DB_RETRY_BUDGET_S, else 60 s


@dataclass
class RunSummary:
    run_id: int
    block: int
    arm: str
    attempt: int
    valid: bool
    reason: str | None
    capacities: dict[str, float]
    points: int
    retry_after_s: float = 0.0  # a transient failure's delay before the next attempt


@dataclass
class ExperimentOutcome:
    experiment_id: int
    experiment_name: str
    registration_id: int
    sha256: str
    bars: list[BarOutcome]
    complete: bool  # done, and every planned block counts (valid runs of every arm, guards passed)
    resumed: bool

    @property
    def gate_code(self) -> int:
        return gate_exit_code(self.bars, not self.complete)


class Executor:
    """Runs one plan to its verdicts on one backend, storing everything as it goes."""

    def __init__(self, store: StoreLike, backend: Backend, config: ExecutorConfig,
                 progress: ProgressSink | None = None, session: str | None = None,
                 take_over: bool = False) -> None:
        self.store: StoreLike = store
        self.take_over = take_over
        self._lease: ExperimentLease | None = None
        self.backend = backend
        self.config = config
        self.progress = progress or PlainProgress()
        self.session = session or f"{socket.gethostname()}:{os.getpid()}"
        self._measured: dict[tuple[int, float], int] = {}  # (run, rate) -> times measured
        self._lead_ins = LeadIns(store, backend, config, self.progress)  # design.carryover.lead_in_s
        self._sleep: Callable[[float], None] = time.sleep

    # -- experiment lifecycle -----------------------------------------------------------------
    def prepare(self, plan: Plan, new: bool = False, name: str | None = None) -> tuple[Registration, int, bool]:
        """Register the plan; resume its unfinished (queued, running) or failed experiment, or
        create one. Refuses an edited plan whose unfinished experiment runs under an older
        registration (a failed one under another registration is left as it is)."""
        reg = self.store.register_plan(plan)
        if not new:
            for exp in self.store.list_experiments():
                if exp.status not in RESUMABLE_STATUSES:
                    continue
                other = self.store.get_registration(exp.registration_id)
                if other.name != plan.name or (name and exp.name != name):
                    continue
                if other.sha256 != reg.sha256:
                    if exp.status == "failed":
                        continue  # a failed experiment resumes under its own plan only; an edited one starts anew
                    raise UserError(
                        f"experiment {exp.name} of plan {plan.name} is unfinished under registration "
                        f"{other.sha256[:12]}, but this file hashes to {reg.sha256[:12]}: the plan was "
                        "edited after registration. Registered plans never change; rename the edited "
                        "plan, or pass --new to start a separate experiment"
                    )
                return reg, exp.id, True
        exp_id = self.store.create_experiment(reg.id, name, controller_id=self.session)
        return reg, exp_id, False

    def run(self, plan: Plan, new: bool = False, name: str | None = None,
            experiment_id: int | None = None) -> ExperimentOutcome:
        """Run (or resume) to the verdicts. Log records carry the experiment, block, arm and
        attempt (``orchestrator.logs``) in a context of this call's own."""
        return contextvars.copy_context().run(self._run, plan, new, name, experiment_id)

    def _run(self, plan: Plan, new: bool, name: str | None, experiment_id: int | None) -> ExperimentOutcome:
        base = self.store
        self.store = ResilientStore(base, self.config.db_retry_budget_s)
        try:
            return self._run_owned(plan, new, name, experiment_id, base)
        finally:
            if self._lease is not None:
                self._lease.release()
                self._lease = None
            self.store = base

    @property
    def _retry_budget_s(self) -> float:
        """The retry budget of the ResilientStore that ``_run`` wraps the store in (only read
        inside ``_run``, where ``self.store`` is that ResilientStore)."""
        return cast(ResilientStore, self.store).retry_budget_s

    def _take_lease(self, base: Any, exp_id: int) -> None:
        """Own the experiment (DESIGN 12) and fence every later write of this executor by it;
        then write back what a dead process of this experiment left in the spool."""
        if isinstance(base, Store):
            self._lease = ExperimentLease(base, exp_id, self.session).acquire(self.take_over)
            self.store = ResilientStore(self._lease.fenced(), self._retry_budget_s)
        spool = self.config.state_dir / "spool"
        if spooled_points(spool, retrying(self.store.identity, "store identity", self._retry_budget_s)):
            mine: set[int] = set()
            for r in self.store.runs(exp_id):
                mine.update(int(i) for i in self.store.points(r.id)["id"])
            written = retrying(lambda: replay(self.store, spool, mine), "spool replay", self._retry_budget_s)
            if written:
                self.progress.note(f"replayed {written} spooled request record(s) of an earlier process")

    def _ensure_owner(self) -> None:
        if self._lease is not None:
            retrying(self._lease.ensure, "lease check", self._retry_budget_s)

    def _run_owned(self, plan: Plan, new: bool, name: str | None, experiment_id: int | None,
                   base: Any) -> ExperimentOutcome:
        if experiment_id is None:
            reg, exp_id, resumed = self.prepare(plan, new, name)
        else:
            exp_id, resumed = experiment_id, True
            reg = self.store.get_registration(self.store.get_experiment(exp_id).registration_id)
            if not same_plan(reg.canonical_json, plan):
                raise UserError(f"experiment {exp_id} was registered with a different plan")
        self._take_lease(base, exp_id)
        exp = self.store.get_experiment(exp_id)
        logs.bind(experiment=exp.name, block=None, arm=None, attempt=None)
        was = exp.status
        self.store.set_experiment_status(exp_id, "running", controller_id=self.session)
        try:
            self._recover(exp_id, exp.name)
            if resumed:
                self.progress.note(f"resuming experiment {exp.name} (id {exp_id})"
                                   + (", which had failed" if was == "failed" else ""))
            else:
                self.progress.note(f"experiment {exp.name} (id {exp_id}), plan sha256 {reg.sha256[:16]}")
            order = plan_order(plan)
            if self.config.max_blocks is not None:
                order = order[: self.config.max_blocks]
            self.progress.blocks(len(order))
            valid = {(r.block, r.arm) for r in self.store.runs(exp_id) if r.status == "done" and r.valid}
            self.progress.schedule(sum(len(arms) for _, arms in order),
                                   sum(1 for b, arms in order for a in arms if (b, a) in valid),
                                   point_seconds(plan.search.point_s, plan.search.warmup_s, plan.search.cooldown_s),
                                   plan.search.max_points)
            config_ids = {arm: self.store.deployment_config(plan, arm) for arm in plan.arms}
            stopped = False
            for block, arms in order:
                for position, arm in enumerate(arms):
                    self._ensure_run(plan, exp_id, exp.name, block, position, arm, config_ids[arm], arms[0])
                judge_block(self.store, self.progress, plan, exp_id, block)
                self.progress.block_done()
                if stopped := self._decided_early(plan, exp_id):
                    break
        except (DatabaseOutage, LeaseLost):
            raise  # the store cannot, or must not, be written; the experiment stays resumable
        except PermanentError as e:
            raise self._fail(exp_id, exp.name, e) from e
        except BaseException:
            self.store.set_experiment_status(exp_id, "running")  # resumable; status stays open
            raise
        bars = judge_experiment(self.store, exp_id, plan)
        effects = experiment_effects(self.store, exp_id, plan)
        for o in bars:
            j = o.judgement
            # A sweep's effects are stored with every bar's verdict (one judgement of the records).
            sweep = {} if effects is None else {"sweep": effects.to_dict()}
            self.store.record_verdict(exp_id, reg.id, o.bar.id, j.verdict, _finite(j.estimate),
                                      _finite(j.lower), _finite(j.upper), j.n, label=j.label, note=j.note,
                                      evidence=o.evidence() | sweep)
        finished_all = stopped or self.config.max_blocks is None or self.config.max_blocks >= plan.design.blocks
        if finished_all:
            self.store.set_experiment_status(exp_id, "done")
            self.backend.cleanup(exp.name, final=True)
        complete = experiment_complete(self.store, exp_id, plan)
        return ExperimentOutcome(exp_id, exp.name, reg.id, reg.sha256, bars, complete, resumed)

    def _decided_early(self, plan: Plan, exp_id: int) -> bool:
        """A sequential design's stop: every bar decided at a look before the last block."""
        if plan.design.sequential is None or not plan.bars:
            return False
        look = judge_experiment(self.store, exp_id, plan)[0].look
        if look is None or not look.stopped:
            return False
        self.progress.note(f"sequential design: every bar decided at look {look.index} ({look.blocks} of "
                           f"{look.planned} blocks); the remaining blocks are not run")
        return True

    def _fail(self, exp_id: int, exp_name: str, e: PermanentError) -> ExperimentFailed:
        """What waiting or retrying cannot fix stopped the experiment: it is stored as failed,
        and the backend deletes everything it created for it (its namespace too). The error
        to raise, naming the reason; a failed cleanup is said in it, never raised over it."""
        try:
            self.store.set_experiment_status(exp_id, "failed")
        except (DatabaseOutage, LeaseLost) as again:  # not stored: it stays running (resumable)
            self.progress.note(f"could not store experiment {exp_name} as failed ({first_line(again)})")
        cleanup_error = None
        try:
            removed = self.backend.cleanup(exp_name, final=True)
            if removed:
                self.progress.note(f"experiment {exp_name} failed: deleted {removed} object(s) it left")
        except Exception as again:  # noqa: BLE001 - the original failure is the one to report
            cleanup_error = first_line(again)
            self.progress.note(f"experiment {exp_name} failed, and cleaning up failed too: {cleanup_error}")
        return ExperimentFailed(exp_name, e, cleanup_error)

    def _recover(self, exp_id: int, exp_name: str) -> None:
        """Runs left 'running' by a process that died are aborted (records kept); its processes
        are stopped."""
        stale = [r for r in self.store.runs(exp_id) if r.status == "running"]
        for r in stale:
            self.store.finish_run(r.id, "aborted", False, "interrupted: the controller stopped mid-run",
                                  r.fingerprint or {})
        removed = self.backend.cleanup(exp_name)
        if stale or removed:
            self.progress.note(f"recovered: {len(stale)} interrupted run(s) aborted, {removed} leftover process(es) stopped")

    # -- one (block, arm) ---------------------------------------------------------------------
    def _ensure_run(self, plan: Plan, exp_id: int, exp_name: str, block: int, position: int,
                    arm: str, config_id: int, first: str) -> RunSummary | None:
        """Run (block, arm) until valid or out of retries; None if it was already done. With
        lead-ins, each attempt follows a run of the block's ``first`` arm (a lead-in if needed)."""
        prior = [r for r in self.store.runs(exp_id) if r.block == block and r.arm == arm]
        if any(r.status == "done" and r.valid for r in prior):
            return None
        # A run stopped by a PermanentError is not a retry spent: the experiment stopped there,
        # and a later process runs again once the cause is fixed.
        failures = sum(1 for r in prior if r.status == "failed"
                       and not (r.invalid_reason or "").startswith(PERMANENT_REASON))
        attempt = 1 + max((r.attempt for r in prior), default=-1)
        last: RunSummary | None = None
        while failures <= plan.design.max_retries:
            if last is not None and last.retry_after_s > 0:
                self.progress.note(f"block {block} arm {arm}: retrying in {last.retry_after_s:.0f}s")
                self._sleep(last.retry_after_s)
            if self._lead_ins.needed(plan, block, first):
                try:
                    self._ensure_owner()
                    self._lead_ins.run(plan, exp_id, exp_name, block, first)
                except (RunInvalid, TransientError) as e:
                    self.progress.note(f"block {block}: the lead-in of arm {first} failed ({first_line(e)}); "
                                       f"counted as a failed attempt of arm {arm}")
                    failures += 1
                    if isinstance(e, TransientError) and e.delay > 0 and failures <= plan.design.max_retries:
                        self._sleep(e.delay)
                    continue
            last = self._run_once(plan, exp_id, exp_name, block, position, arm, attempt, config_id)
            if last.valid:
                return last
            failures += 1
            attempt += 1
        if last is not None or failures:
            self.progress.note(f"block {block} arm {arm}: no valid run after {failures} attempt(s); "
                               "the block is left out of every verdict")
        return last

    def _run_once(self, plan: Plan, exp_id: int, exp_name: str, block: int, position: int,
                  arm: str, attempt: int, config_id: int) -> RunSummary:
        """One attempt. A guard failure or a TransientError ends it invalid (retried by the
        caller, after the error's delay); a PermanentError is stored and raised: it would fail
        every attempt and every block the same way, so the experiment stops with its remedy."""
        logs.bind(block=block, arm=arm, attempt=attempt)
        self._ensure_owner()
        self._lead_ins.ran(block, arm)
        self.progress.run_started(block, arm, attempt)
        run_id = self.store.start_run(exp_id, arm, block, position, attempt, config_id)
        key = RunKey(exp_name, arm, block, attempt)
        dep: Deployment | None = None
        caps: dict[str, float] = {}
        points: dict[float, list[PointOutcome]] = {}  # rate -> every measurement of it
        facts: dict[str, Any] = {"session": self.session, "generator_ceiling_rps": self.config.generator_ceiling,
                                 "generator_max_shards": self.config.max_shards}
        if self.config.calibration is not None:
            facts["generator_calibration"] = self.config.calibration
        fingerprint = Fingerprint(backend=self.backend.name)

        def record() -> dict[str, Any]:
            return {**fingerprint.to_dict(), **facts}

        try:
            dep = self.backend.deploy(plan, arm, key)
            fingerprint = dep.fingerprint
            budget = self.config.ready_deadline_s or self.backend.startup_budget_s(plan, arm)
            self.backend.ready(dep, budget)
            fingerprint = dep.fingerprint  # ready() adds what it observed (nodes, images, versions)
            facts["ready_at"] = time.time()
            runner = PointRunner(self.store, self.backend, plan, self.config.state_dir / "spool",
                                 self.config.generator_ceiling, self.config.max_shards, progress=self.progress)
            runner.warm_up(dep, arm, block, attempt)
            if not runner.kind.searchable:
                # Closed loop: one point at the plan's N users (a concurrency sweep: one per
                # level, in order); no capacity (open loop only).
                lines = []
                for level in level_plans(plan):
                    p = self._point(level, arm, block, run_id, dep, runner.for_plan(level), points, None, None)
                    lines.append(f"{p.metrics.throughput_tok_s:.0f} tok/s at {runner.kind.label(level, None)}")
                line = "; ".join(lines)
            else:
                caps = self._search(plan, arm, block, run_id, dep, runner, points)
                for bar in plan.bars:
                    if bar.rate is not None and not _near(points, bar.rate):
                        self._point(plan, arm, block, run_id, dep, runner, points, bar.rate, None)
                line = "capacity " + ", ".join(f"{c} {v:.0f} tok/s" for c, v in caps.items())
            facts["finished_at"] = time.time()
            self.store.finish_run(run_id, "done", True, None, record())
            self.progress.run_done(f"block {block} arm {arm}: valid; {line} ({_count(points)} points)")
            return RunSummary(run_id, block, arm, attempt, True, None, caps, _count(points))
        except DatabaseOutage as e:
            # One try, no retry budget: if the database is back, the run's spooled records are
            # written first (its digest covers them), then the run says why it ended; if not,
            # the resume replays the spool and then marks the run aborted.
            try:
                inner = getattr(self.store, "inner", self.store)
                replay(inner, self.config.state_dir / "spool", {int(i) for i in inner.points(run_id)["id"]})
                inner.finish_run(run_id, "aborted", False, f"database outage: {e}", record())
            except Exception as again:  # noqa: BLE001 - still down: nothing more to do here
                self.progress.note(f"could not store the abort ({first_line(again)})")
            self.progress.run_done(f"block {block} arm {arm}: ABORTED ({e})")
            raise
        except PermanentError as e:
            reason = f"{PERMANENT_REASON}{e}"
            self.store.finish_run(run_id, "failed", False, reason, record())
            self.progress.run_done(f"block {block} arm {arm}: FAILED ({reason}); not retried")
            raise
        except KeyboardInterrupt as e:
            # Ctrl-C, SIGTERM or SIGHUP: the run ends aborted with why (its records kept); the
            # experiment stays resumable. One try (the command is stopping: no retry budget).
            reason = f"interrupted: {e.signame} received" if isinstance(e, Terminated) else "interrupted: Ctrl-C"
            with contextlib.suppress(Exception):
                getattr(self.store, "inner", self.store).finish_run(run_id, "aborted", False, reason, record())
            self.progress.run_done(f"block {block} arm {arm}: ABORTED ({reason})")
            raise
        except (RunInvalid, TransientError) as e:
            reason = str(e) if isinstance(e, RunInvalid) else f"{type(e).__name__}: {e}"
            delay = e.delay if isinstance(e, TransientError) else 0.0
            self.store.finish_run(run_id, "failed", False, reason, record())
            self.progress.run_done(f"block {block} arm {arm}: INVALID ({reason}); will retry if allowed")
            return RunSummary(run_id, block, arm, attempt, False, reason, caps, _count(points), delay)
        finally:
            if dep is not None:
                self.backend.teardown(dep)

    def _search(self, plan: Plan, arm: str, block: int, run_id: int, dep: Deployment,
                runner: PointRunner, points: dict[float, list[PointOutcome]]) -> dict[str, float]:
        """Each class's capacity search, capped by the generator's ceiling (a capacity that
        passes there is stored censored at_ceiling) and fed every measurement taken so far."""
        s = plan.search
        caps: dict[str, float] = {}
        ceiling = self._ceiling(plan)
        if ceiling is not None and ceiling <= s.rate.min:
            unit = plan.workload.rate_unit
            raise RunInvalid(f"the generator's calibrated ceiling {ceiling:.3g} {unit} (over {self._shards(plan)} "
                             f"process(es)) is at or below search.rate.min {s.rate.min:.3g} {unit}: no load point "
                             "can be measured; allow more Ray shards or lower search.rate.min")
        for cls in plan.classes:
            prior = self.config.priors.get(arm, {}).get(cls.name) if s.use_prior else None
            seen = [(rate, *p.class_values(cls.name)) for rate, measured in points.items() for p in measured]

            def measure(rate: float, cls: str = cls.name) -> tuple[float, float]:
                return self._point(plan, arm, block, run_id, dep, runner, points, rate, cls).class_values(cls)

            res = search_capacity(s, measure, seen, prior=prior, ceiling=ceiling)
            self.store.record_capacity(run_id, cls.name, res.capacity, res.at_rate, res.attainment,
                                       res.points_used, censored=res.censored, converged=res.converged,
                                       upper=res.upper)
            caps[cls.name] = res.capacity
        return caps

    def _point(self, plan: Plan, arm: str, block: int, run_id: int, dep: Deployment,
               runner: PointRunner, points: dict[float, list[PointOutcome]], rate: float | None,
               cls: str | None) -> PointOutcome:
        """One load point (``rate`` None: a closed loop's, kept under rate 0 in ``points``). The
        search never asks above the generator's ceiling; a bar's fixed rate above it (known only
        now: the ceiling is measured at run time) voids the run."""
        ceiling = self._ceiling(plan)
        if rate is not None and cls is None and ceiling is not None and rate > ceiling:
            unit = plan.workload.rate_unit
            raise RunInvalid(f"bar rate {rate:.3g} {unit} is above the generator's calibrated ceiling "
                             f"{ceiling:.3g} {unit} over {self._shards(plan)} process(es): allow more Ray "
                             "shards or a bar rate at or below it")
        self._ensure_owner()
        label = runner.kind.label(plan, rate)
        self.progress.point_started(label + (f" [{cls}]" if cls else ""),
                                    plan.search.warmup_s + plan.search.point_s + plan.search.cooldown_s)
        key = 0.0 if rate is None else rate
        seq = sum(n for (rid, _), n in self._measured.items() if rid == run_id)
        repeat = self._measured.get((run_id, key), 0)
        self._measured[(run_id, key)] = repeat + 1
        p = runner.measure(dep, run_id, arm, block, seq, rate, cls, repeat, dep.key.attempt)
        points.setdefault(key, []).append(p)
        att = ", ".join(f"{k} {v.attainment:.2f}" for k, v in p.metrics.per_class.items())
        stopped = "" if p.early_stop is None else f"  [stopped early at {p.early_stop.at_s:.1f} s: past capacity]"
        done = (f"{label}: attainment {att}" if rate is not None
                else f"{label}: {p.metrics.throughput_tok_s:.0f} tok/s, attainment {att}")
        self.progress.point_done(done + stopped + ("" if p.valid else "  [guard failed]"))
        self._check_server(dep, p)
        if not p.valid:
            failed = "; ".join(f"{g.name} ({_fmt(g.value)} vs {_fmt(g.threshold)}): {g.detail}" for g in p.failed_guards)
            if any(g.name in DETERMINISTIC_GUARDS for g in p.failed_guards):
                # The same prompts under the same tokenizer on every attempt: a retry fails alike.
                raise PermanentError(f"guard failed at {label}: {failed}. The prompts' lengths are the plan's "
                                     "and the served tokenizer's: no retry changes them; name the served model's "
                                     "tokenizer (workload.tokenizer) or give the lengths the server counts")
            raise RunInvalid(f"guard failed at {label}: {failed}")
        return p

    def _shards(self, plan: Plan) -> int:
        # Live sessions keep one process: a session's turns must stay on the shard it started on.
        return max(1, self.config.max_shards) if load_kind(plan.workload).shardable else 1

    def _ceiling(self, plan: Plan) -> float | None:
        """The highest rate the generator holds, in the plan's rate unit: one process's
        calibrated ceiling (requests/s) times the Ray shards a point may use, over the requests
        one unit brings (a session/s brings its turns' requests/s); None: not calibrated."""
        one = self.config.generator_ceiling
        if one is None:
            return None
        kind = load_kind(plan.workload)
        return one * self._shards(plan) / max(1.0, kind.requests_per_unit(plan.workload))

    def _check_server(self, dep: Deployment, p: PointOutcome) -> None:
        if not self.backend.alive(dep):
            raise RunInvalid("lost the server during the point: a server of the arm died, restarted or stopped answering")
        errors = sum(1 for r in p.records if r.status in ERROR_OR_TIMEOUT_STATUSES)
        if errors:
            try:
                self.backend.ready(dep, 10.0)
            except OrchestratorError as e:
                raise RunInvalid(f"lost the server during the point ({errors} failed requests): {e}") from e


# Experiments `orch run` of the same plan resumes (a failed one once its cause is fixed).
RESUMABLE_STATUSES = ("queued", "running", "failed")

# Guards whose failure is decided by the plan and the served model alone, not by the run: a
# retry would measure the same failure (issue 32), so the experiment stops with the remedy.
DETERMINISTIC_GUARDS = frozenset({"prompt_length"})


def _near(points: dict[float, list[PointOutcome]], rate: float) -> bool:
    return any(abs(r - rate) <= 1e-6 * max(1.0, rate) for r in points)


def _count(points: dict[float, list[PointOutcome]]) -> int:
    return sum(len(v) for v in points.values())


def _finite(x: float) -> float | None:
    return x if isinstance(x, float | int) and math.isfinite(x) else None


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"
