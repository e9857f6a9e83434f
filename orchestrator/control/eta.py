"""How long an experiment has left: pure arithmetic over the plan and the runs measured so far.

Before any run has finished, a run is expected to take ``deploy_s + max_points * point_s``
(``point_s`` = warmup + window + cooldown of one load point; ``max_points`` bounds the search,
so the first figure errs long). Once runs have finished, a run is expected to take their mean
measured duration. The run in progress is charged what it has left of that expectation (never
less than what its current point has left). Retries are not foreseen.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_DEPLOY_S = 60.0  # a deployment's start, before any run of this experiment has measured one


@dataclass(frozen=True, slots=True)
class Estimate:
    total_runs: int
    done_runs: int
    remaining_s: float  # seconds until the last planned run ends
    per_run_s: float  # what one run is expected to take


def point_seconds(point_s: float, warmup_s: float, cooldown_s: float) -> float:
    """Wall time of one load point: warmup, measurement window, cooldown."""
    return warmup_s + point_s + cooldown_s


def estimate(
    *,
    total_runs: int,
    done_runs: int,
    point_s: float,
    max_points: int,
    finished_s: Sequence[float] = (),
    running: bool = False,
    current_elapsed_s: float = 0.0,
    point_left_s: float = 0.0,
    deploy_s: float = DEFAULT_DEPLOY_S,
) -> Estimate:
    """The time left of an experiment of ``total_runs`` runs, ``done_runs`` of them ended.

    ``finished_s``: measured durations of finished runs (this process's or the store's);
    ``running``: a run is in progress (counted in neither done nor ``finished_s``), started
    ``current_elapsed_s`` ago, its current point ending in ``point_left_s``.
    """
    per_run = sum(finished_s) / len(finished_s) if finished_s else deploy_s + max_points * point_s
    waiting = max(0, total_runs - done_runs - (1 if running else 0))
    current = max(per_run - current_elapsed_s, point_left_s, 0.0) if running else 0.0
    return Estimate(total_runs, min(done_runs, total_runs), waiting * per_run + current, per_run)


def format_duration(seconds: float) -> str:
    """3h05m, 12m30s, 45s."""
    s = max(0, int(round(seconds)))
    h, rest = divmod(s, 3600)
    m, sec = divmod(rest, 60)
    if h:
        return f"{h}h{m:02d}m"
    if m:
        return f"{m}m{sec:02d}s"
    return f"{sec}s"
