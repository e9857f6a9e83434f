"""`orch run`, `orch demo`, `orch verdict`, `orch status`: experiments from plan to verdict."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from orchestrator.cli.apps import JSON_OPTION, app
from orchestrator.cli.output import emit_json, say, warn
from orchestrator.errors import UserError
from orchestrator.plan import Bar, Plan, load_plan_file, plan_from_canonical

if TYPE_CHECKING:
    from orchestrator.control.executor import ExperimentOutcome
    from orchestrator.control.verdicts import BarOutcome
    from orchestrator.store import StoreLike

# Heavy parts (control, store: pandas, scipy, sqlalchemy) are imported inside the commands so
# `orch --help` and the other commands start quickly.

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo.yaml"
# `orch verdict --verify`: a finished run's records no longer give the digest stored with it.
VERIFY_EXIT = 6


def _num(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else x


def _outcome_doc(store: StoreLike, out: ExperimentOutcome, rate_unit: str) -> dict:
    runs = store.runs(out.experiment_id)
    return {
        "experiment": {"id": out.experiment_id, "name": out.experiment_name,
                       "registration_id": out.registration_id, "sha256": out.sha256,
                       "resumed": out.resumed, "complete": out.complete, "rate_unit": rate_unit},
        "verdicts": [_judged_row(o) for o in out.bars],
        "runs": [
            {"id": r.id, "block": r.block, "arm": r.arm, "position": r.position, "attempt": r.attempt,
             "status": r.status, "valid": r.valid, "reason": r.invalid_reason}
            for r in runs
        ],
        "gate_exit_code": out.gate_code,
        "chain_head": store.chain_head(),
    } | _stored_sweep(store, out.experiment_id)


def _stored_sweep(store: StoreLike, experiment_id: int) -> dict:
    """A sweep plan's effects as stored with its verdicts ({"sweep": ...}); {} for any other plan."""
    for v in store.verdicts(experiment_id):
        if v.evidence and v.evidence.get("sweep"):
            return {"sweep": v.evidence["sweep"]}
    return {}


def _print_outcome(doc: dict, details: bool = False) -> None:
    """Runs and verdicts for people: each verdict summarised, or in full with ``details``."""
    from orchestrator.cli.verdict_text import DETAILS_HINT, verdict_lines

    e = doc["experiment"]
    say("")
    say(f"experiment {e['name']} (id {e['id']}), plan sha256 {e['sha256'][:16]}")
    say("runs:")
    for r in doc["runs"]:
        state = "valid" if r["valid"] else f"INVALID: {r['reason']}" if r["status"] != "running" else "running"
        say(f"  block {r['block']} arm {r['arm']} attempt {r['attempt']}: {r['status']}, {state}")
    say("verdicts:")
    if not doc["verdicts"]:
        say("  (the plan has no bars)")
    for v in doc["verdicts"]:
        for line in verdict_lines(v, details, e.get("rate_unit", "req/s")):
            say(line)
    if doc.get("sweep"):
        for line in sweep_lines(doc["sweep"]):
            say(line)
    if not details and any(verdict_lines(v) != verdict_lines(v, True) for v in doc["verdicts"]):
        say(DETAILS_HINT.format(name=e["name"]))
    if not e["complete"]:
        say("note: some blocks have no valid run of an arm; `orch verdict --gate` exits 5")
    if doc.get("chain_head"):
        say(f"chain head: {doc['chain_head']} (keep it: `orch verify --head` proves nothing before it changed)")


YES_OPTION = typer.Option(False, "--yes", "-y", help="Run even if the dry run predicts a bar's power "
                          "below 50% (interactive terminals ask otherwise).")
ALLOW_LOW_POWER_OPTION = typer.Option(False, "--allow-low-power", help="Run even if the dry run predicts a "
                                      "bar's power below 50% (a non-interactive run refuses otherwise).")


def _check_power(plan: Plan, yes: bool, allow_low_power: bool) -> None:
    """Issue 21: a run whose bars the dry run predicts it cannot judge costs GPU-hours for an
    INCONCLUSIVE; say so first, and ask (a terminal) or refuse (a script) unless told to go on."""
    from orchestrator.control.dryrun import power_check

    check = power_check(plan)
    if check.ok:
        return
    if yes or allow_low_power:
        warn(check.message())
        return
    if sys.stdin.isatty():
        warn(check.message())
        if typer.confirm("run anyway?", default=False, err=True):
            return
        raise UserError("not run: low predicted power (--yes runs it anyway)")
    raise UserError(f"{check.message()}; not run: pass --allow-low-power to run anyway")


@app.command("run")
def run(
    file: Path = typer.Argument(..., help="Plan file (YAML)."),
    backend: str | None = typer.Option(None, "--backend", help="sim | virtual | local | kubernetes (default: the plan's)."),
    blocks: int | None = typer.Option(None, "--blocks", min=1, max=100, help="Run only the first N blocks now (at most 100, as design.blocks)."),
    new: bool = typer.Option(False, "--new", help="Start a new experiment instead of resuming."),
    name: str | None = typer.Option(None, "--name", help="Experiment name (default: <plan>-<n>)."),
    take_over: bool = typer.Option(False, "--take-over", help="Resume an experiment whose controller "
                                   "died (never one whose controller is alive: that is refused)."),
    shards: int | None = typer.Option(None, "--shards", min=1, max=64, help="The most load-generator "
                                      "processes (Ray shards) a point may use above one process's calibrated "
                                      "ceiling; 1: one process, no Ray (default ORCH_LOADGEN_MAX_SHARDS, else one per "
                                      "core up to 8)."),
    yes: bool = YES_OPTION,
    allow_low_power: bool = ALLOW_LOW_POWER_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Register the plan if needed, run it (or resume it) here, print the verdicts."""
    from orchestrator.control.session import run_plan
    from orchestrator.store import Store

    plan = load_plan_file(file)
    _check_power(plan, yes, allow_low_power)
    with Store.open() as store:
        out = run_plan(plan, store, backend=backend, blocks=blocks, new=new, name=name, take_over=take_over,
                       shards=shards)
        doc = _outcome_doc(store, out, plan.workload.rate_unit)
    emit_json(doc) if as_json else _print_outcome(doc)


@app.command("demo")
def demo(as_json: bool = JSON_OPTION) -> None:
    """The demo plan (examples/demo.yaml), end to end on embedded defaults (SQLite, this
    machine, the simulated engine) in virtual time; `orch run examples/demo.yaml` runs it on
    live simulated servers behind the real vllm-router."""
    from orchestrator.control.session import run_plan
    from orchestrator.store import Store

    if not DEMO.exists():
        raise UserError(f"{DEMO} not found: run `orch demo` from a checkout of the repository")
    from orchestrator.control.session import state_dir
    from orchestrator.report import write_report

    plan = load_plan_file(DEMO)
    # The demo shows the pipeline end to end: a low predicted power is said, never asked about.
    _check_power(plan, yes=False, allow_low_power=True)
    with Store.open() as store:
        out = run_plan(plan, store, backend="virtual", new=True)
        doc = _outcome_doc(store, out, plan.workload.rate_unit)
        say_url = store.engine.url.render_as_string(hide_password=True)
        report = write_report(store, out.experiment_id, state_dir() / "reports" / out.experiment_name)
    doc["report"] = str(report.resolve())
    if as_json:
        emit_json(doc)
        return
    _print_outcome(doc)
    say(f"stored in {say_url}; `orch verdict {doc['experiment']['name']}` and "
        f"`orch capacity --model {plan.model.name}` read it back")
    say(f"report: {doc['report']}")


def sweep_lines(sweep: dict) -> list[str]:
    """A sweep's arms by readable name, then each effect on one line with its interval."""
    lines = ["sweep arms: " + ", ".join(f"{k} {n}" for k, n in sweep["arms"].items())]
    if sweep.get("design"):  # incomplete blocks: the design, and how its effects are estimated
        lines.append(f"sweep design: {sweep['design']}; effects by {sweep.get('method', 'intrablock least squares')}")
    lines.append("effects (capacity ratios):")
    for e in sweep["effects"]:
        what = "main effect" if e["kind"] == "main" else "interaction"
        interval = ("no interval (fewer than 2 blocks)" if e["lower"] is None or e["upper"] is None
                    else f"{e['confidence']:.0%} interval {e['lower']:.3g}..{e['upper']:.3g}")
        lines.append(f"  {what} [{e['class']}] {e['label']}: x{e['ratio']:.3g}, {interval}, {e['blocks']} block(s)")
    lines += [f"  left out of [{x['class']}] effects: block {x['block']}: {x['why']}" for x in sweep["left_out"]]
    return lines


def _fallback_label(lower: float | None, upper: float | None, confidence: float, compare: str = "B/A") -> str:
    """For a verdict stored before its label was (migration 0005): what lower..upper then was."""
    lo = "-" if _num(lower) is None else f"{lower:.4g}"
    hi = "-" if _num(upper) is None else f"{upper:.4g}"
    return (f"{compare} {lo}..{hi}: each end a one-sided {confidence:.0%} bound (together a "
            f"{2 * confidence - 1:.0%} two-sided interval); stored before labels were")


def _verdict_row(bar: Bar, verdict: str, estimate: float | None, lower: float | None,
                 upper: float | None, blocks: int, note: str = "",
                 label: str | None = None, evidence: dict | None = None) -> dict:
    row = {"bar": bar.id, "compare": bar.compare, "class": bar.service_class, "metric": bar.metric, "rate": bar.rate,
           **({"users": bar.users} if bar.users is not None else {}),
           "threshold": bar.threshold, "direction": bar.direction, "verdict": verdict,
           "estimate": _num(estimate), "lower": _num(lower), "upper": _num(upper),
           "confidence": bar.confidence, "blocks": blocks, "note": note or "",
           "label": label or _fallback_label(lower, upper, bar.confidence, bar.compare),
           "blocks_used": None, "censored": [], "dropped": []}
    row.update(evidence or {})
    return row


def _judged_row(o: BarOutcome) -> dict:
    j = o.judgement
    return _verdict_row(o.bar, j.verdict, j.estimate, j.lower, j.upper, j.n, j.note, j.label, o.evidence())


def _experiment_doc(store: StoreLike, key: str) -> tuple[dict, int]:
    """An experiment's verdicts (as stored when it finished; judged now if it has none yet)."""
    from orchestrator.control.verdicts import experiment_complete, gate_code, judge_experiment

    exp = store.get_experiment(key)
    reg = store.get_registration(exp.registration_id)
    plan = plan_from_canonical(reg.canonical_json)
    runs = store.runs(exp.id)
    complete = experiment_complete(store, exp.id, plan)
    stored = {v.bar_id: v for v in store.verdicts(exp.id)}
    if stored:
        verdicts = [
            _verdict_row(b, v.verdict, v.estimate, v.lower, v.upper, v.blocks, v.note or "", v.label, v.evidence)
            if (v := stored.get(b.id))
            else _verdict_row(b, "INCONCLUSIVE", None, None, None, 0, "not judged", "not judged: no interval")
            for b in plan.bars
        ]
    else:
        verdicts = [_judged_row(o) for o in judge_experiment(store, exp.id, plan)]
    code = gate_code([v["verdict"] for v in verdicts], not complete)
    doc = {
        "experiment": {"id": exp.id, "name": exp.name, "registration_id": reg.id, "sha256": reg.sha256,
                       "status": exp.status, "complete": complete, "resumed": False,
                       "rate_unit": plan.workload.rate_unit,
                       "blocks_started": len({r.block for r in runs}), "blocks_planned": plan.design.blocks},
        "verdicts": verdicts,
        "runs": [{"id": r.id, "block": r.block, "arm": r.arm, "position": r.position, "attempt": r.attempt,
                  "status": r.status, "valid": r.valid, "reason": r.invalid_reason} for r in runs],
        "gate_exit_code": code,
    } | _stored_sweep(store, exp.id)
    for row in verdicts:
        row.pop("sweep", None)  # once, at the top of the document
    return doc, code


@app.command("verdict")
def verdict(
    experiment: str = typer.Argument(..., help="Experiment name or id."),
    gate: bool = typer.Option(False, "--gate", help="Exit 0 all accepted, 3 rejected, 4 inconclusive, 5 a run invalid."),
    verify: bool = typer.Option(False, "--verify", help="Recompute each finished run's digest and each "
                                f"bar's verdict; exit {VERIFY_EXIT} (one line per run or bar) if its records "
                                "changed since it finished or a stored verdict is not what they give."),
    details: bool = typer.Option(False, "--details", help="Every note, censored and dropped block and the "
                                 "interval's whole label (by default each bar is summarised)."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Bar verdicts of an experiment with estimates and intervals (--gate, --verify: judged again)."""
    from orchestrator.cli.verdict_verify import recheck
    from orchestrator.store import Store

    with Store.open() as store:
        doc, code = _experiment_doc(store, experiment)
        checks = store.verify_digests(doc["experiment"]["id"]) if verify else []
        # --gate and --verify never trust a stored verdict: every bar is judged again (issue 30).
        differ = recheck(store, doc, _judged_row) if gate or verify else []
        code = doc["gate_exit_code"]
        chain_report = store.verify_chain() if verify else None
        doc["chain_head"] = chain_report.head if chain_report is not None else store.chain_head()
    changed = [c for c in checks if c.changed]
    if verify:
        doc["verify"] = {"checked": sum(c.stored is not None for c in checks),
                         "unchecked": [c.run_id for c in checks if c.stored is None],
                         "changed": [{"run": c.run_id, "block": c.block, "arm": c.arm, "attempt": c.attempt,
                                      "stored": c.stored, "actual": c.actual} for c in changed]}
    if chain_report is not None:
        doc["verify"]["chain"] = chain_report.to_dict()
    emit_json(doc) if as_json else _print_outcome(doc, details)
    for line in chain_report.problems if chain_report is not None else []:
        sys.stderr.write(line + "\n")
    for c in changed:
        stored = (c.stored or "")[:12]
        sys.stderr.write(f"run {c.run_id} (block {c.block}, arm {c.arm}, attempt {c.attempt}): records changed "
                         f"since the run finished (digest stored {stored}, now {c.actual[:12]})\n")
    for line in differ:
        sys.stderr.write(line + "\n")
    if changed or differ or (chain_report is not None and chain_report.problems):
        raise typer.Exit(VERIFY_EXIT)
    if gate and code:
        raise typer.Exit(code)


@app.command("verify")
def verify_cmd(
    head: str = typer.Option(None, "--head", help="A chain head printed earlier (by orch verdict or orch verify; "
                             "12 or more hex digits): it must be a link of the chain."),
    as_json: bool = JSON_OPTION,
) -> None:
    """Walk the hash chain over every finished run and verdict: each link, each sealed row's
    content now, and --head. Exit 6 (one line per problem) when anything changed since it was
    sealed or the kept head is not in the chain; prints the head."""
    import re

    from orchestrator.store import Store

    if head is not None and not re.fullmatch(r"[0-9a-fA-F]{12,64}", head):
        raise UserError(f"--head: {head!r} is not a chain head (12 to 64 hex digits)")
    with Store.open() as store:
        report = store.verify_chain(head)
    if as_json:
        emit_json(report.to_dict())
    else:
        say(f"chain: {report.links} links, head {report.head or '(none: nothing sealed yet)'}")
        if report.unsealed_runs or report.unsealed_verdicts:
            say(f"not sealed (stored before the chain, migration 0012): {report.unsealed_runs} finished runs, "
                f"{report.unsealed_verdicts} verdicts")
        if report.head_found and not report.problems:
            say(f"the kept head is link {report.links - report.after_head}, {report.after_head} links since: "
                "nothing sealed up to it changed")
    for line in report.problems:
        sys.stderr.write(line + "\n")
    if report.problems:
        raise typer.Exit(VERIFY_EXIT)


@app.command("status")
def status(
    experiment: str | None = typer.Argument(None, help="Experiment name or id (default: all)."),
    as_json: bool = JSON_OPTION,
    watch: bool = typer.Option(False, "--watch", help="Follow EXPERIMENT (run by anyone) until it ends."),
    interval: float = typer.Option(2.0, "--interval", min=0.05, max=3600, help="--watch: seconds between polls."),
) -> None:
    """Experiments, their progress and the validity of every run."""
    from orchestrator.store import Store

    if watch:
        if experiment is None:
            raise UserError("--watch follows one experiment: `orch status --watch EXPERIMENT`")
        if as_json:
            raise UserError("--watch prints lines for people; without --watch, --json prints one document")
        _watch(experiment, interval)
    with Store.open() as store:
        exps = [store.get_experiment(experiment)] if experiment else store.list_experiments()
        docs: list[dict[str, Any]] = []
        for e in exps:
            runs = store.runs(e.id)
            plan = plan_from_canonical(store.get_registration(e.registration_id).canonical_json)
            docs.append({
                "id": e.id, "name": e.name, "status": e.status, "plan": plan.name,
                "reason": _failed_reason(e.status, runs),
                "created_at": e.created_at.isoformat(),
                "runs_valid": sum(1 for r in runs if r.valid),
                "runs_planned": plan.planned_runs,
                "runs": [{"id": r.id, "block": r.block, "arm": r.arm, "attempt": r.attempt,
                          "status": r.status, "valid": r.valid, "reason": r.invalid_reason} for r in runs],
            })
    if as_json:
        emit_json({"experiments": docs})
        return
    if not docs:
        say("no experiments yet: `orch run FILE` or `orch demo`")
    for d in docs:
        say(f"{d['name']} (id {d['id']}): {d['status']}, {d['runs_valid']}/{d['runs_planned']} valid runs"
            + (f"; {d['reason']}" if d["reason"] else ""))
        if experiment:
            for r in d["runs"]:
                say(f"  block {r['block']} arm {r['arm']} attempt {r['attempt']}: {r['status']}"
                    + ("" if r["valid"] or r["status"] == "running" else f" INVALID: {r['reason']}"))
    sys.stdout.flush()


def _failed_reason(status: str, runs: list[Any]) -> str | None:
    """Why a failed experiment stopped: the reason stored with its last failed run (the
    PermanentError that stopped it; None for any other status, or when no run failed)."""
    if status != "failed":
        return None
    failed = [r for r in runs if r.status == "failed" and r.invalid_reason]
    return max(failed, key=lambda r: r.id).invalid_reason if failed else None


# How long `status --watch` waits for an experiment that does not exist yet: `orch run` creates
# it after the plan's dry run and power check, and `orch submit`'s once its GPUs are free.
WATCH_APPEAR_S = 600.0


def _watch(experiment: str, interval: float, appear_s: float | None = None) -> None:
    """Poll the store: a line whenever the progress changes (redrawn in place on a terminal,
    folded at its width), until the experiment is no longer queued or running; the final status
    line follows. An experiment not created yet (its `orch run` still in the dry run) is waited
    for, up to ``appear_s``."""
    import time

    from orchestrator.control.progress import stored_progress
    from orchestrator.store import NotFound, Store

    live = _LiveLine() if sys.stdout.isatty() else None
    shown = None
    appear_s = WATCH_APPEAR_S if appear_s is None else appear_s
    try:
        with Store.open() as store:
            deadline = time.monotonic() + appear_s
            waited = False
            while True:
                try:
                    p = stored_progress(store, experiment)
                except NotFound:
                    if time.monotonic() >= deadline:
                        raise UserError(f"no experiment {experiment!r} appeared within {appear_s:.0f}s "
                                        "(`orch status` lists them)") from None
                    if not waited:
                        say(f"waiting for experiment {experiment} to start (its run may still be in the dry run)")
                        waited = True
                    time.sleep(interval)
                    continue
                if not p.running:
                    break
                if live is not None:
                    live.show(p.eta_line())
                elif p.line() != shown:
                    say(p.eta_line())
                shown = p.line()
                sys.stdout.flush()
                time.sleep(interval)
    finally:
        if live is not None:
            live.close()
    sys.stdout.flush()


class _LiveLine:
    """One status line redrawn in place on a terminal: rich folds it at the terminal's width
    and erases every row it took before drawing the next (a carriage return erases only the
    last row of a line the terminal wrapped, and left the others behind)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.live import Live

        self.live = Live(console=Console(highlight=False), auto_refresh=False, transient=True,
                         redirect_stdout=False, redirect_stderr=False)
        self.started = False

    def show(self, line: str) -> None:
        from rich.text import Text

        if not self.started:
            self.live.start()
            self.started = True
        self.live.update(Text(line), refresh=True)

    def close(self) -> None:
        if self.started:
            self.live.stop()


@app.command("submit")
def submit(
    file: Path = typer.Argument(..., help="Plan file (YAML)."),
    address: str | None = typer.Option(None, "--address", help="Ray cluster address (default: RAY_ADDRESS)."),
    name: str | None = typer.Option(None, "--name", help="Experiment name (default: <plan>-<n>)."),
    yes: bool = YES_OPTION,
    allow_low_power: bool = ALLOW_LOW_POWER_OPTION,
    as_json: bool = JSON_OPTION,
) -> None:
    """Queue the plan on the cluster's Ray controller; it starts when its GPUs are free."""
    import ray

    from orchestrator.control.controller import connect, controller
    from orchestrator.control.session import state_dir
    from orchestrator.errors import EnvironmentProblem
    from orchestrator.store.database import default_url

    plan = load_plan_file(file)
    connect(address)
    try:
        _check_power(plan, yes, allow_low_power)  # after connect: an unreachable cluster is exit 2 first
        url = default_url()
        ctl = controller(url, str(state_dir()))
        res = ray.get(ctl.submit.remote(plan.model_dump(mode="json", by_alias=True), name, url))
    finally:
        ray.shutdown()
    if "error" in res:
        raise EnvironmentProblem(res["error"])
    if as_json:
        emit_json(res)
        return
    say(f"queued experiment {res['name']} (id {res['experiment_id']}), needs GPUs {res['gpus']}; "
        f"`orch status {res['name']}` follows it")


@app.command("cancel")
def cancel(
    experiment: str = typer.Argument(..., help="Experiment name or id."),
    address: str | None = typer.Option(None, "--address", help="Ray cluster address (default: RAY_ADDRESS)."),
) -> None:
    """Cancel a queued or running experiment on the Ray controller (its records are kept)."""
    import ray

    from orchestrator.control.controller import check_database, connect, controller
    from orchestrator.control.session import state_dir
    from orchestrator.store import Store
    from orchestrator.store.database import default_url

    with Store.open() as store:
        exp = store.get_experiment(experiment)
    connect(address)
    try:
        url = default_url()
        ctl = controller(url, str(state_dir()))
        check_database(ray.get(ctl.database.remote()), url)  # an id means nothing in another database
        stopped = ray.get(ctl.cancel.remote(exp.id))
    finally:
        ray.shutdown()
    say(f"experiment {exp.name}: cancelled" + ("" if stopped else " (it was not running on this controller)"))
