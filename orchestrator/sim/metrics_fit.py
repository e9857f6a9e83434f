"""A device profile fitted from vLLM's own Prometheus metrics of a real run (issue 21), pure.

The store keeps, per load point, the ``vllm:`` samples scraped before, during and after it
(control/points.py). Over a point, their deltas give what the step model needs, per request:

- mean TPOT: ``vllm:request_time_per_output_token_seconds`` sum / count (vLLM v1: (last - first
  token) / (tokens - 1) per request; older vLLM's ``vllm:time_per_output_token_seconds``, per
  token, is the same mean for equal replies);
- mean prefill time: ``vllm:request_prefill_time_seconds`` sum / count (first scheduled -> first
  token: the request's prefill chunks, with the decodes that ride along in those steps);
- mean prompt and reply: ``vllm:prompt_tokens`` and ``vllm:generation_tokens`` over
  ``vllm:request_success``; the prefix-cache hit share from ``vllm:prefix_cache_hits/queries``;
- the batch: by Little's law, the point's request rate x (mean prefill + mean decode time,
  ``vllm:request_decode_time_seconds``); without those histograms, the
  ``vllm:num_requests_running`` gauge over the point's scrapes (a few per point: noisy).

vLLM 0.32 (the CPU build of the test tier) exports every one of them; so does the simulated server.

The fit: least squares, on relative residuals, of the step-time model (``sim/model.py``, the arm's
model, TP and engine knobs from the registered plan) to each point's mean TPOT and mean prefill
time, over three terms: ``step_overhead_s`` (t0), ``bandwidth_bytes_s`` (weights and KV alike)
and ``flops``. The rate curves stay empty and the front-end terms 0: these means cannot tell
them apart from the three. Requests arriving during a step are admitted together at the next
one (vLLM v1's scheduler and the simulator's), so the prompts a step carries are a Poisson
number of mean rate x the previous step's length: a Markov chain whose stationary law weighs
steps of 0, 1, 2, ... prompts. A mean TPOT is the mean step under that law (every decoding
request gets a token each step); a mean prefill time is the step a request's arrival falls in
(picked by length) followed by its own step, with it and the others that arrived with it.
Checked against the virtual engine (same step model) below the knee: mean TPOT within 2%.

What it assumes, and what breaks it: points in a steady state (replies short against the point,
so the batch does not still grow at its end), a colocated arm, one prompt length per point,
prefix-cache hits spread evenly over a point (a cold prefix at a point's start is not: it costs
the few requests then running, not the mean one). Near and past the knee (queueing, batches
still growing) the means are not the model's: a point there pulls t0 and the bandwidth apart
(they are nearly collinear), which the standard errors show; past a threshold the fit refuses.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares
from scipy.stats import poisson

from orchestrator.engines import engine_for
from orchestrator.sim.model import PrefillChunk, WorkerModel

_M = engine_for().metrics  # the engine's names (the vLLM adapter's)
TPOT = _M.tpot
TPOT_OLD = _M.tpot_per_token  # vLLM before v1's per-request histogram
PREFILL = _M.prefill_time
DECODE = _M.decode_time
PROMPT = _M.prompt_tokens
GENERATION = _M.generation_tokens
SUCCESS = _M.request_success
RUNNING = _M.running
CACHE_QUERIES = _M.prefix_queries
CACHE_HITS = _M.prefix_hits
# The sample names a fit reads (counters with and without _total; histograms' _sum and _count).
SAMPLE_NAMES: tuple[str, ...] = (
    *(f"{h}_{s}" for h in (TPOT, TPOT_OLD, PREFILL, DECODE) for s in ("sum", "count")),
    *(n + t for n in (PROMPT, GENERATION, SUCCESS, CACHE_QUERIES, CACHE_HITS) for t in ("", "_total")),
    RUNNING,
)
# Fewer points than terms plus one leave no residual to judge the fit by.
MIN_POINTS = 3
# The decode batch must vary this much over the points: the KV term (context x batch) is what
# tells the bandwidth from t0 (both are a constant per step at one batch).
MIN_BATCH_SPREAD = 1.3
# Prompts per step beyond which a step is saturated with prefill (the engine does nothing else;
# the model no longer applies): the arrivals chain of ``predict`` stops there.
MAX_PROMPTS_PER_STEP = 24
# Points whose batch is this close to max_num_seqs queue for a place: not the step model's.
FULL_BATCH = 0.9
# A term whose relative standard error is above this is not identified by the points.
MAX_RELATIVE_SE = 0.25
# What to run when the points do not identify the terms.
EXPERIMENT_HINT = ("a rate search from a light load (batch ~1) up to the knee, at least 3 valid points "
                   "per arm (search.max_points >= 4), with prompts long enough that a batch's KV reads "
                   "are a visible share of a decode step (a few thousand tokens)")

Sample = tuple[float, str, Mapping[str, str], float]  # (t, name, labels, value), as stored


class FitRefused(ValueError):
    """The points cannot identify the profile's terms (the message says what would)."""


@dataclass(frozen=True)
class PointFigures:
    """One load point's means, per request and per worker."""

    run_id: int
    point_id: int
    requests: float
    prompt_tokens: float  # mean prompt length
    uncached_tokens: float  # mean prompt tokens computed (prefix-cache misses)
    output_tokens: float  # mean reply length
    batch: float  # time-mean of running requests per worker
    token_batch: float  # the batch a decode token sees: sum(g^2) / sum(g), per worker
    rate: float  # requests/s per worker (finished requests over the time the point sent them)
    tpot_s: float | None
    prefill_s: float | None


def _total(samples: Iterable[Sample], name: str) -> float | None:
    """A counter (``name`` or ``name_total``) or a histogram's _sum/_count over every label set
    and server of one scrape; None when the scrape has none."""
    vals = [v for _, n, _, v in samples if n in (name, name + "_total")]
    return sum(vals) if vals else None


def point_figures(run_id: int, point_id: int, samples: Sequence[Sample], send_s: float,
                  workers: int = 1) -> PointFigures | str:
    """A point's figures from its stored samples, or why it has none. ``send_s``: how long the
    point sent requests (its warm-up, measurement window and cool-down): the request rate is the requests
    it finished over that (the achieved rate of the window alone is a few seconds' Poisson draw)."""
    scrapes: dict[float, list[Sample]] = {}
    for s in samples:
        scrapes.setdefault(float(s[0]), []).append(s)
    if len(scrapes) < 2:
        return "fewer than two scrapes"
    times = sorted(scrapes)
    first, last = scrapes[times[0]], scrapes[times[-1]]

    def delta(name: str) -> float | None:
        a, b = _total(first, name), _total(last, name)
        return None if a is None or b is None else b - a

    done = delta(SUCCESS)
    if done is None or done <= 0:
        return "no finished requests (vllm:request_success)"
    prompt, gen = delta(PROMPT), delta(GENERATION)
    if prompt is None or gen is None or prompt < 0 or gen < 0:
        return "no token counters (vllm:prompt_tokens, vllm:generation_tokens)"
    queries, hits = delta(CACHE_QUERIES), delta(CACHE_HITS)
    hit = hits / queries if queries and hits is not None and queries > 0 else 0.0

    def mean_of(*hists: str) -> float | None:
        for h in hists:
            total, n = delta(h + "_sum"), delta(h + "_count")
            if total is not None and n is not None and n > 0 and total >= 0:
                return total / n
        return None

    tpot, prefill, decode = mean_of(TPOT, TPOT_OLD), mean_of(PREFILL), mean_of(DECODE)
    output = gen / done
    if decode is None and tpot is not None:
        decode = tpot * max(output - 1.0, 0.0)
    per_worker = done / send_s / workers
    if prefill is not None and decode is not None:
        # Little's law: running requests = rate x time running (scheduled -> last token). A
        # handful of gauge scrapes per point is far noisier (a 3-scrape mean was 1.8x this).
        batch = per_worker * (prefill + decode)
        # Poisson arrivals and no queue (M/G/inf): a request finds a Poisson number of others,
        # of the time mean; the batch its tokens see is that plus itself.
        token_batch = batch + 1.0
    else:
        # The running gauge: the scrapes during the point (before and after it, servers idle).
        inner = [_total(scrapes[t], RUNNING) for t in times[1:-1]] or [_total(scrapes[t], RUNNING) for t in times]
        g = [x for x in inner if x is not None]
        if not g or sum(g) <= 0:
            return "no vllm:num_requests_running during the point"
        mean = sum(g) / len(g)
        # Summed over W independent workers, sum(g^2)/sum(g) of the total is W mu + var/mu:
        # less (W - 1) mu, it is one worker's token-weighted batch.
        batch = mean / workers
        token_batch = max(sum(x * x for x in g) / sum(g) - (workers - 1) * batch, batch)
    return PointFigures(
        run_id=run_id, point_id=point_id, requests=done, prompt_tokens=prompt / done,
        uncached_tokens=prompt / done * (1.0 - hit), output_tokens=output,
        batch=batch, token_batch=token_batch, rate=per_worker, tpot_s=tpot, prefill_s=prefill,
    )


def _at_batch(f: Callable[[int], float], batch: float) -> float:
    """f at a fractional batch: linear between the integers around it (the step model is
    piecewise linear in the batch)."""
    lo = max(int(math.floor(batch)), 0)
    w = batch - lo
    return f(lo) if w < 1e-9 else (1 - w) * f(lo) + w * f(lo + 1)


def predict(worker: WorkerModel, p: PointFigures) -> tuple[float, float]:
    """(mean TPOT, mean prefill time) the step model gives at a point's figures.

    Requests that arrive during a step are admitted together at the next one (vLLM v1's
    scheduler, and the simulator's): a step carries m ~ Poisson(rate x mean step) prompts, and a
    request's own prefill step carries it and m others. Decode steps carry the batch's decodes;
    a mean TPOT is the mean step (every decoding request gets a token each step)."""
    context = p.prompt_tokens + p.output_tokens / 2.0
    uncached = max(1, round(p.uncached_tokens))
    cached = max(0, round(p.prompt_tokens) - uncached)
    budget = worker.max_num_batched_tokens

    def step(b: int, prompts: int) -> float:
        """One step of b decodes and ``prompts`` prompts' prefill (whole steps of chunks when
        they exceed the token budget: their time per step, times the steps)."""
        if prompts == 0:
            return worker.step_time_s(b, b * context)
        steps = max(1, math.ceil(prompts * uncached / max(1, budget - b)))
        chunk = PrefillChunk(max(1, round(uncached / steps)), cached)
        return steps * worker.step_time_s(b, b * context, (chunk,) * prompts)

    def with_prompts(m: int) -> Callable[[int], float]:
        return lambda b: step(b, m)

    batch = max(p.token_batch, 1.0)
    others = p.batch  # what an arriving request finds: the time mean (Poisson arrivals see time averages)
    m = np.arange(MAX_PROMPTS_PER_STEP + 1)
    steps = np.array([_at_batch(with_prompts(int(k)), batch) for k in m])  # T(m): steps with m prompts
    # The prompts of a step are those that arrived during the one before: a Markov chain
    # m' ~ Poisson(rate x T(m)) (a long prefill step brings more prompts to the next one; a mean
    # step in place of T(m) was 4% low near the knee). Its stationary law weighs the steps.
    move = np.asarray(poisson.pmf(m[None, :], p.rate * steps[:, None]), dtype=float)
    move[:, -1] += 1.0 - move.sum(axis=1)  # more than the cap: saturated, counted at the cap
    law = np.full(len(m), 1.0 / len(m))
    for _ in range(200):
        nxt = law @ move
        if np.abs(nxt - law).max() < 1e-9:
            break
        law = nxt
    tpot = float(law @ steps)  # every decoding request gets a token each step
    # A request arrives in a step picked by length; the others admitted with it arrived in that
    # same step; its own prefill step carries them and it, with the batch it found.
    alone = np.array([_at_batch(with_prompts(int(k) + 1), others) for k in m])
    picked = law * steps / max(float(law @ steps), 1e-12)
    prefill = float(picked @ (move @ alone))
    return tpot / worker.tokens_per_pass, prefill


@dataclass(frozen=True)
class PointFit:
    """One point's observed and fitted means."""

    figures: PointFigures
    tpot_fit_s: float
    prefill_fit_s: float

    @property
    def tpot_residual(self) -> float | None:
        """(fitted - observed) / observed mean TPOT."""
        t = self.figures.tpot_s
        return None if not t else self.tpot_fit_s / t - 1.0

    @property
    def prefill_residual(self) -> float | None:
        t = self.figures.prefill_s
        return None if not t else self.prefill_fit_s / t - 1.0


@dataclass(frozen=True)
class MetricsFit:
    """The fitted terms, their relative standard errors, and each point's residuals."""

    step_overhead_s: float
    bandwidth_bytes_s: float
    flops: float
    relative_se: Mapping[str, float]
    points: tuple[PointFit, ...]
    notes: tuple[str, ...]


def fit_terms(points: Sequence[PointFigures], worker_for: Callable[[float, float, float], WorkerModel],
              flops_prior: float) -> MetricsFit:
    """Least squares of the step model to the points' mean TPOT and prefill times.

    ``worker_for(t0, bandwidth, flops)`` is the arm's worker on a device of those rates. The
    GEMM rate is fitted only when some prefill is compute-bound; otherwise it stays at
    ``flops_prior`` (with a note). Raises FitRefused when the points cannot identify t0 and the
    bandwidth, saying what experiment would."""
    limit = FULL_BATCH * worker_for(0.0, 1.0, 1.0).max_num_seqs
    full = [p for p in points if p.tpot_s and p.batch >= limit]
    usable = [p for p in points if p.tpot_s and p.batch < limit]
    if len(usable) < MIN_POINTS:
        full_note = f" ({len(full)} more at max_num_seqs, queueing: left out)" if full else ""
        raise FitRefused(f"{len(usable)} point(s) with a mean TPOT{full_note}; the fit needs at least {MIN_POINTS}: "
                         f"run {EXPERIMENT_HINT}")
    kv = [p.token_batch * (p.prompt_tokens + p.output_tokens / 2) for p in usable]
    if max(kv) < MIN_BATCH_SPREAD * min(kv):
        raise FitRefused(f"every point decodes at about one batch x context ({min(kv):.0f}-{max(kv):.0f} "
                         f"tokens of KV per step): t0 and the bandwidth cannot be told apart; run {EXPERIMENT_HINT}")
    obs: list[tuple[int, str, float]] = [(i, "tpot", p.tpot_s) for i, p in enumerate(usable) if p.tpot_s]
    obs += [(i, "prefill", p.prefill_s) for i, p in enumerate(usable) if p.prefill_s]
    values = np.array([v for _, _, v in obs])

    # Starting point from the data: the lightest point's TPOT is mostly the weights stream,
    # the longest prefill mostly compute.
    probe = worker_for(0.0, 1.0, 1e30)  # at 1 B/s and no compute cost a step's time is its bytes
    light = min(usable, key=lambda p: p.token_batch)
    bytes_light = probe.step_time_s(1, light.prompt_tokens + light.output_tokens / 2)
    bw0 = bytes_light / (0.9 * float(light.tpot_s or 1.0))

    def model(x: np.ndarray, fit_flops: bool) -> np.ndarray:
        w = worker_for(x[0] * 1e-3, math.exp(x[1]), math.exp(x[2]) if fit_flops else flops_prior)
        preds = [predict(w, p) for p in usable]
        return np.array([preds[i][0 if kind == "tpot" else 1] for i, kind, _ in obs])

    def solve(fit_flops: bool) -> tuple[np.ndarray, list[float]]:
        # t0 in ms and the rates in log: steps of one size in every direction.
        x0 = [0.05 * float(light.tpot_s or 0.0) * 1e3, math.log(bw0)] + ([math.log(flops_prior)] if fit_flops else [])
        lo = [0.0, -np.inf] + ([-np.inf] if fit_flops else [])
        def residuals(x: np.ndarray) -> np.ndarray:
            return model(x if fit_flops else np.append(x, 0.0), fit_flops) / values - 1.0

        # soft_l1: a point past the knee (queueing, a batch still growing) the model cannot
        # follow weighs like a few percent, not like its square.
        res = least_squares(residuals, x0, bounds=(lo, [np.inf] * len(x0)), diff_step=[1e-4] * len(x0),
                            loss="soft_l1", f_scale=0.05)
        # The Jacobian at the solution by forward steps of fixed size (1 us of t0, 0.1% of a
        # rate): the solver's own is unreliable at the bound t0 = 0.
        r0 = residuals(res.x)
        jac = np.empty((len(r0), len(res.x)))
        for i, h in enumerate([1e-3] + [1e-3] * (len(res.x) - 1)):
            x = res.x.copy()
            x[i] += h
            jac[:, i] = (residuals(x) - r0) / h
        return res.x, _standard_errors(jac, r0)

    notes: list[str] = [f"left out point {p.point_id} (run {p.run_id}): batch {p.batch:.0f} at max_num_seqs, "
                        "requests queue for a place" for p in full]
    x, se = solve(fit_flops=True)
    if not math.isfinite(se[2]) or se[2] > MAX_RELATIVE_SE:
        notes.append(f"the GEMM rate is not identified (no prefill is compute-bound enough): kept "
                     f"{flops_prior / 1e12:.3g} TFLOP/s")
        x2, se2 = solve(fit_flops=False)
        x, se = np.append(x2, math.log(flops_prior)), [*se2, math.nan]
    t0 = float(x[0]) * 1e-3
    # t0's error relative to a typical step (it may well be ~0), the rates' relative errors.
    typical = float(np.median(values))
    rse = {"step_overhead_s": se[0] * 1e-3 / typical, "bandwidth_bytes_s": se[1], "flops": se[2]}
    if not math.isfinite(rse["bandwidth_bytes_s"]) or rse["bandwidth_bytes_s"] > MAX_RELATIVE_SE:
        raise FitRefused(f"the points do not identify the bandwidth (relative error "
                         f"{rse['bandwidth_bytes_s']:.2g}); run {EXPERIMENT_HINT}")
    w = worker_for(t0, math.exp(x[1]), math.exp(x[2]))
    fits = tuple(PointFit(p, *predict(w, p)) for p in usable)
    return MetricsFit(step_overhead_s=t0, bandwidth_bytes_s=math.exp(float(x[1])), flops=math.exp(float(x[2])),
                      relative_se=rse, points=fits, notes=tuple(notes))


def _standard_errors(jac: np.ndarray, residuals: np.ndarray) -> list[float]:
    """Standard errors of the parameters (t0 in ms; the rates in log, i.e. relative) from the
    Jacobian of the relative residuals, scaled by their spread (at least 1%: a model fitted to
    its own figures has none, and a measured mean is rarely better)."""
    n, k = jac.shape
    try:
        cov = np.linalg.inv(jac.T @ jac)
    except np.linalg.LinAlgError:
        return [math.inf] * k
    s2 = max(float(residuals @ residuals) / max(n - k, 1), 0.01**2)
    return [math.sqrt(float(cov[i, i]) * s2) if cov[i, i] >= 0 else math.inf for i in range(k)]
