"""Validity guards (DESIGN section 9): each judges one load point (or a block) and returns a
GuardResult; a run is valid only if every guard passes. Thresholds come from the plan's
``GuardThresholds``. Pure: numpy only."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.analysis.metrics import measured, miss_cause, window_of
from orchestrator.plan.catalog import ServiceClass
from orchestrator.plan.experiment import GuardThresholds
from orchestrator.records import RequestRecord


@dataclass(frozen=True, slots=True)
class GuardResult:
    """One guard's judgement: ``value`` measured against ``threshold`` (None: not measurable)."""

    name: str
    passed: bool
    value: float | None
    threshold: float | None
    detail: str


@dataclass(frozen=True, slots=True)
class PointContext:
    """What the guards of one point need beyond its records."""

    n_scheduled: int  # requests the schedule put in the measurement window
    window_s: float | None = None  # measurement window length (default: from the records)
    expected_prefix_hit_rate: float | None = None  # the workload's ideal upper bound
    server_prefix_hit_rate: float | None = None  # reported by the server (/metrics)
    generator_ceiling_rate: float | None = None  # calibrated highest rate the generator holds
    offered_rate: float | None = None  # the point's offered rate (default: from the records)
    shared_prefix_tokens: int = 0
    service_class: ServiceClass | None = None  # class judged by the steady-state guard
    attainment_threshold: float = 0.90
    sim_lateness_p99_s: float | None = None  # a simulated server's step lateness (its /metrics)
    access_path_p99_s: float | None = None  # round trip the load's path adds (port-forward, ingress)


def generator_lag(records: Sequence[RequestRecord], th: GuardThresholds) -> GuardResult:
    """p99 of (actual - scheduled) send time; an unsent request counts as infinitely late."""
    recs = measured(records)
    lags = np.array([r.send_lag_s if r.send_lag_s is not None else math.inf for r in recs])
    p99 = float(np.percentile(lags, 99, method="inverted_cdf")) * 1000 if lags.size else 0.0
    bound = th.max_send_lag_p99_ms
    return GuardResult("generator_lag", p99 <= bound, p99, bound,
                       f"p99 send lag {p99:.2f} ms (bound {bound} ms) over {lags.size} requests")


def generator_rate(records: Sequence[RequestRecord], th: GuardThresholds,
                   window_s: float | None = None) -> GuardResult:
    """Shortfall of requests sent by the window's end (+ the lag bound) vs those scheduled."""
    recs = measured(records)
    if not recs:
        return GuardResult("generator_rate", True, 0.0, th.max_rate_shortfall, "no requests")
    w = window_s or window_of(recs)
    start = min(r.scheduled_s for r in recs)
    deadline = start + w + th.max_send_lag_p99_ms / 1000
    sent = sum(1 for r in recs if r.sent_s is not None and r.sent_s <= deadline)
    shortfall = 1 - sent / len(recs)
    return GuardResult("generator_rate", shortfall <= th.max_rate_shortfall, shortfall,
                       th.max_rate_shortfall,
                       f"{sent} of {len(recs)} scheduled requests sent within the window")


def generator_ceiling(offered_rate: float, ceiling: float | None) -> GuardResult:
    """Offered load must not exceed the generator's calibrated ceiling."""
    if ceiling is None:
        return GuardResult("generator_ceiling", True, offered_rate, None, "generator not calibrated")
    return GuardResult("generator_ceiling", offered_rate <= ceiling, offered_rate, ceiling,
                       f"offered {offered_rate:.3g} req/s vs calibrated ceiling {ceiling:.3g} req/s")


def repeated_prompts(records: Sequence[RequestRecord], th: GuardThresholds) -> GuardResult:
    """Prompts must be unique beyond the shared prefix: duplicates of ``prompt_hash``."""
    hashes = [r.prompt_hash for r in measured(records) if r.prompt_hash]
    dup = len(hashes) - len(set(hashes))
    return GuardResult("repeated_prompts", dup <= th.max_duplicate_prompts, float(dup),
                       float(th.max_duplicate_prompts),
                       f"{dup} repeated prompts among {len(hashes)} (beyond the shared prefix)")


def prefix_hit_rate(records: Sequence[RequestRecord], th: GuardThresholds,
                    expected: float | None, server: float | None) -> GuardResult:
    """The server's prefix-cache hit rate must not exceed what the workload allows (ideal
    expectation + tolerance): more means repeated content is flattering the server. Uses the
    server's figure, else the records' cached tokens; unmeasurable passes with a note."""
    if server is None:
        recs = [r for r in measured(records) if r.cached_tokens is not None and r.prompt_tokens]
        if recs:
            server = sum(r.cached_tokens or 0 for r in recs) / sum(r.prompt_tokens for r in recs)
    if server is None or expected is None:
        return GuardResult("prefix_hit_rate", True, server, None,
                           "hit rate or expectation unknown; not checked")
    bound = expected + th.prefix_hit_tolerance
    return GuardResult("prefix_hit_rate", server <= bound, server, bound,
                       f"server prefix hit rate {server:.3f} vs ideal {expected:.3f} "
                       f"+ tolerance {th.prefix_hit_tolerance}")


def output_limit(records: Sequence[RequestRecord], th: GuardThresholds) -> GuardResult:
    """Every finished request must return exactly the tokens it asked for."""
    fin = [r for r in measured(records) if r.finished]
    wrong = sum(1 for r in fin if r.output_tokens != r.output_tokens_asked)
    share = wrong / len(fin) if fin else 0.0
    return GuardResult("output_limit", share <= th.max_wrong_output_share, share,
                       th.max_wrong_output_share,
                       f"{wrong} of {len(fin)} finished requests returned a wrong token count")


def prompt_length(records: Sequence[RequestRecord], th: GuardThresholds,
                  not_asked: str | None = None) -> GuardResult:
    """The server's prompt token count (usage.prompt_tokens) against the length the workload asked
    for: the median relative difference over the measured requests that report usage must be at
    most ``prompt_length_tolerance``. Not checked (passes, with the reason) without usage, or when
    the workload asked for no length (``not_asked``: why, e.g. a prompts file's own text)."""
    bound = th.prompt_length_tolerance
    if not_asked is not None:
        return GuardResult("prompt_length", True, None, bound, f"{not_asked}; not checked")
    pairs = [(r.server_prompt_tokens, r.prompt_tokens) for r in measured(records)
             if r.server_prompt_tokens is not None and r.prompt_tokens > 0]
    if not pairs:
        return GuardResult("prompt_length", True, None, bound,
                           "the server reported no usage.prompt_tokens; not checked")
    got = np.array([p[0] for p in pairs], dtype=np.float64)
    asked = np.array([p[1] for p in pairs], dtype=np.float64)
    rel = np.abs(got - asked) / asked
    median = float(np.median(rel))
    beyond = int(np.count_nonzero(rel > bound))
    ratio = float(got.sum() / asked.sum())
    return GuardResult("prompt_length", median <= bound, median, bound,
                       f"median |server - asked| / asked {median:.4f} (bound {bound}) over {len(pairs)} "
                       f"requests; {beyond} beyond the bound; server/asked tokens {ratio:.3f}")


def censored_tails(records: Sequence[RequestRecord], n_scheduled: int) -> GuardResult:
    """Every scheduled request is accounted for by a record (failed and unfinished included)."""
    n = len(measured(records))
    missing = n_scheduled - n
    return GuardResult("censored_tails", missing == 0, float(missing), 0.0,
                       f"{n} records for {n_scheduled} scheduled requests")


def frozen_randomness(records: Sequence[RequestRecord], th: GuardThresholds) -> GuardResult:
    """Sampled outputs must differ: share of finished requests with the most common output."""
    hashes = [r.output_hash for r in measured(records) if r.finished and r.output_hash]
    if len(hashes) < 2:
        return GuardResult("frozen_randomness", True, None, th.max_identical_output_share,
                           "fewer than 2 outputs with a hash; not checked")
    top = Counter(hashes).most_common(1)[0][1]
    share = top / len(hashes)
    return GuardResult("frozen_randomness", share <= th.max_identical_output_share, share,
                       th.max_identical_output_share,
                       f"{top} of {len(hashes)} outputs identical")


def stalls(records: Sequence[RequestRecord], th: GuardThresholds) -> GuardResult:
    """Share of requests with an inter-token gap beyond the stall bound."""
    recs = [r for r in measured(records) if r.max_gap_s is not None]
    bound_s = th.stall_gap_ms / 1000
    stalled = sum(1 for r in recs if (r.max_gap_s or 0.0) > bound_s)
    share = stalled / len(recs) if recs else 0.0
    return GuardResult("stalls", share <= th.max_stall_share, share, th.max_stall_share,
                       f"{stalled} of {len(recs)} requests had a gap over {th.stall_gap_ms} ms")


def simulator_timing(lateness_p99_s: float | None, th: GuardThresholds) -> GuardResult:
    """A simulated server must keep to its model's timeline: when its steps end late (the
    machine's CPUs are short), tokens leave later than the model says and the point measures
    the machine, not the modelled engine."""
    bound = th.max_sim_lateness_p99_ms
    if lateness_p99_s is None:
        return GuardResult("simulator_timing", True, None, bound, "not a simulated server; not checked")
    ms = lateness_p99_s * 1000
    return GuardResult("simulator_timing", ms <= bound, ms, bound,
                       f"p99 step lateness of the simulated servers <= {ms:g} ms (bound {bound:g} ms)")


def access_path(path_p99_s: float | None, th: GuardThresholds, cls: ServiceClass | None) -> GuardResult:
    """Load sent from outside the cluster crosses a port-forward or an ingress: its own round
    trip lands in every TTFT. Measured before the points; a material share of the class's TTFT
    limit voids the point (send the load from inside: `orch submit`)."""
    if path_p99_s is None or cls is None:
        return GuardResult("access_path", True, None, None, "load sent directly; not checked")
    bound_ms = th.max_access_path_share * cls.ttft_ms
    ms = path_p99_s * 1000
    return GuardResult("access_path", ms <= bound_ms, ms, bound_ms,
                       f"p99 round trip of the access path {ms:.3g} ms vs {bound_ms:.3g} ms "
                       f"({th.max_access_path_share:.0%} of the {cls.name} TTFT limit)")


def steady_state(records: Sequence[RequestRecord], th: GuardThresholds, cls: ServiceClass,
                 window_s: float | None = None, attainment_threshold: float = 0.90) -> GuardResult:
    """Attainment and the share of requests fully served agree between the first and last
    thirds of the window, within the registered tolerance plus the sampling error of two
    proportions (z = 2.58): a third of a short point holds a handful of requests, and one
    miss among four is noise, not drift. Shares, not raw tokens/s: a Poisson third carries
    more or fewer arrivals, which says nothing about the server.

    A point whose last third is no better than its first and below the attainment threshold
    is overloaded (an open-loop queue grows): a valid *failing* observation, passed with a note."""
    recs = measured(records)
    if len(recs) < 6:
        return GuardResult("steady_state", True, None, th.steady_state_tolerance, "too few requests")
    w = window_s or window_of(recs)
    start = min(r.scheduled_s for r in recs)
    third = w / 3

    def part(lo: float, hi: float) -> tuple[float, float, int]:
        sel = [r for r in recs if lo <= r.scheduled_s - start < hi]
        if not sel:
            return 0.0, 0.0, 0
        att = sum(1 for r in sel if miss_cause(r, cls) is None) / len(sel)
        served = sum(1 for r in sel if r.finished and (r.output_tokens or 0) >= r.output_tokens_asked)
        return att, served / len(sel), len(sel)

    a1, s1, n1 = part(0, third)
    a3, s3, n3 = part(2 * third, math.inf)
    if min(n1, n3) == 0:
        return GuardResult("steady_state", True, None, th.steady_state_tolerance, "an empty third")

    def excess(p1: float, p3: float) -> float:
        pooled = (p1 * n1 + p3 * n3) / (n1 + n3)
        noise = 2.58 * math.sqrt(pooled * (1 - pooled) * (1 / n1 + 1 / n3))
        return abs(p1 - p3) - noise

    tol = th.steady_state_tolerance
    value = max(abs(a1 - a3), abs(s1 - s3))
    ok = excess(a1, a3) <= tol and excess(s1, s3) <= tol
    detail = (f"first vs last third ({n1} vs {n3} requests): attainment {a1:.3f} vs {a3:.3f}, "
              f"fully served {s1:.3f} vs {s3:.3f}")
    if not ok and a3 <= a1 and a3 < attainment_threshold:
        return GuardResult("steady_state", True, value, tol,
                           detail + "; overloaded (degrades as the queue grows), a valid fail")
    worse_n, better_n = (n1, n3) if a1 < a3 else (n3, n1)
    if not ok and worse_n >= 1.25 * better_n:
        # Same server, more load: an arrival burst explains the worse third, not drift.
        return GuardResult("steady_state", True, value, tol,
                           detail + "; the worse third carried more arrivals (a burst), not drift")
    return GuardResult("steady_state", ok, value, tol, detail + ("" if ok else " beyond sampling error"))


@dataclass(frozen=True, slots=True)
class RunEnvironment:
    """Where and when one arm's run of a block happened (its fingerprint)."""

    arm: str
    gpu_type: str
    engine_version: str
    node_pool: str
    started_s: float
    ended_s: float
    session: str = ""
    driver: str = ""
    image: str = ""  # image digests


def back_to_back(runs: Sequence[RunEnvironment], window_h: float) -> GuardResult:
    """The arms of a block ran in one session, on the same GPU type, engine version, node
    pool, driver and image, within the registered time window."""
    problems = []
    for attr in ("session", "gpu_type", "engine_version", "node_pool", "driver", "image"):
        vals = sorted({getattr(r, attr) for r in runs})
        if len(vals) > 1:
            problems.append(f"{attr} differs ({', '.join(vals)})")
    span_h = (max(r.ended_s for r in runs) - min(r.started_s for r in runs)) / 3600 if runs else 0.0
    if span_h > window_h:
        problems.append(f"block spans {span_h:.2f} h, over the {window_h} h window")
    return GuardResult("back_to_back", not problems, span_h, window_h,
                       "; ".join(problems) or f"{len(runs)} runs alike, within {span_h:.2f} h")


PD_PLACEMENT = "pd_placement"


def pd_placement_of(prefill_nodes: Sequence[str], decode_nodes: Sequence[str]) -> str:
    """Where a disaggregated run's prefill and decode pods ran relative to each other:
    ``same-node`` (every pod shares its node with a pod of the other role: the KV hand-off can
    stay inside a node), ``cross-node`` (no node holds both: every hand-off crosses the
    network), else ``mixed``."""
    p, d = set(prefill_nodes), set(decode_nodes)
    if p and p == d:
        return "same-node"
    if not p & d:
        return "cross-node"
    return "mixed"


def placement_consistency(arm: str, observed: str, reference: tuple[int, str] | None) -> GuardResult:
    """An arm's prefill/decode placement in this block against the one it had in the first
    counted block (``reference``: (block, placement)): the KV hand-off over NVLink and over the
    network are different measurements, so a block whose placement differs is not compared."""
    if reference is None or reference[1] == observed:
        return GuardResult(PD_PLACEMENT, True, None, None, f"arm {arm}: prefill/decode {observed}"
                           + ("" if reference is None else f", as in block {reference[0]}"))
    return GuardResult(PD_PLACEMENT, False, None, None,
                       f"arm {arm}: prefill/decode {observed} here, {reference[1]} in block {reference[0]}; "
                       "pin it with kubernetes.placement (same-node or spread)")


def run_guards(records: Sequence[RequestRecord], th: GuardThresholds,
               ctx: PointContext) -> list[GuardResult]:
    """Every point-level guard, in DESIGN order."""
    recs = measured(records)
    w = ctx.window_s or window_of(recs)
    offered = ctx.offered_rate if ctx.offered_rate is not None else ctx.n_scheduled / w
    out = [
        generator_lag(records, th),
        generator_rate(records, th, w),
        generator_ceiling(offered, ctx.generator_ceiling_rate),
        repeated_prompts(records, th),
        prefix_hit_rate(records, th, ctx.expected_prefix_hit_rate, ctx.server_prefix_hit_rate),
        output_limit(records, th),
        censored_tails(records, ctx.n_scheduled),
        frozen_randomness(records, th),
        stalls(records, th),
        simulator_timing(ctx.sim_lateness_p99_s, th),
        access_path(ctx.access_path_p99_s, th, ctx.service_class),
    ]
    if ctx.service_class is not None:
        out.append(steady_state(records, th, ctx.service_class, w, ctx.attainment_threshold))
    return out
