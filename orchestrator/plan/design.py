"""The plan's search and design sections (split from ``plan.experiment``): the capacity search's
rate range and stopping rule, and the block design with its carry-over rule and sequential
looks (issue 31)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer, model_validator

from orchestrator.plan.base import CrossFieldError, StrictModel, omit_while


class RateRange(StrictModel):
    """Bounds of the offered request rate the capacity search may try."""

    min: float = Field(gt=0, le=100_000, description="Lowest rate, requests/s or sessions/s (live sessions; at most 100000).")
    max: float = Field(gt=0, le=100_000, description="Highest rate, requests/s or sessions/s (live sessions; at most 100000).")

    @model_validator(mode="after")
    def _ordered(self) -> RateRange:
        if self.max <= self.min:
            raise CrossFieldError([("max", f"max ({self.max}) must exceed min ({self.min})")])
        return self


class SearchSettings(StrictModel):
    """Capacity search: bracket then bisect the open-loop rate, one fixed-length point at a time."""

    rate: RateRange = Field(description="Rate bounds, requests/s (sessions/s for live sessions).")
    precision: float = Field(
        default=0.02, gt=0, lt=0.5, description="Stop when the bracket is this narrow (relative)."
    )
    point_s: float = Field(default=120, gt=0, le=86_400, description="Measurement window of one load point, s (at most 86400).")
    warmup_s: float = Field(default=30, ge=0, le=86_400, description="Sent before the window, not judged, s (at most 86400).")
    cooldown_s: float = Field(default=5, ge=0, le=86_400, description="Sent after the window, not judged, s (at most 86400).")
    attainment: float = Field(
        default=0.90, gt=0, le=1, description="Attainment a point needs to count toward capacity."
    )
    max_points: int = Field(default=12, ge=2, le=64, description="Most load points per search (at most 64).")
    use_prior: bool = Field(
        default=True, description="Start from the simulator's predicted capacity when available."
    )
    early_stop: bool = Field(
        default=False,
        description="End a search point early once it is certain to miss the attainment bar for every "
                    "class (recorded as a failing point, past capacity). Off by default: the requests "
                    "in flight at the stop are cancelled, so a fault that shows late in a stream (a "
                    "stall) can escape its guard on a stopped point.",
    )

    @model_serializer(mode="wrap")
    def _omit_default_early_stop(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Added after plans were registered (a plan that turns it on hashes apart).
        return omit_while(handler(self), {"early_stop": False})


class CarryOver(StrictModel):
    """What a verdict does when its blocks show an order effect (issue 31): the mean ln ratio of
    the blocks where the bar's numerator ran after its denominator minus where it ran before,
    with an interval at the bar's confidence (analysis.carryover). ABBA balances a carry-over
    both arms leave alike, not one only one arm leaves; lead-in runs (``lead_in_s``) balance a
    first-order one whichever arm leaves it."""

    bound: float = Field(
        default=0.0, ge=0, le=0.5,
        description="Largest order effect tolerated, as a ratio (0.01: 1%); exceeded when the effect's "
                    "interval lies wholly outside +-bound.",
    )
    action: Literal["void", "warn"] = Field(
        default="void",
        description="void: the bar is INCONCLUSIVE (rerun with a settle period or a cache reset between "
                    "arms); warn: the verdict stands and its note gives the estimate.",
    )
    lead_in_s: float = Field(
        default=0, ge=0, le=86_400,
        description="Lead-in runs: before each measured run that would not otherwise follow a run of its "
                    "block's first arm, that arm is deployed and sent the workload (at its last capacity in the "
                    "experiment) for this many seconds, unmeasured; so every measured run of a block follows the same "
                    "arm and a first-order carry-over (whatever runs after an arm is slowed) cancels in "
                    "each block's ratio, whichever arm leaves it. 0: off (at most 86400).",
    )

    @model_serializer(mode="wrap")
    def _omit_default_lead_in(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Added after plans were registered (a plan that turns it on hashes apart).
        return omit_while(handler(self), {"lead_in_s": 0})


class Sequential(StrictModel):
    """A group-sequential design (issue 31): look after every whole design from ``min_blocks``
    and stop as soon as every bar is decided (analysis.sequential)."""

    min_blocks: int = Field(default=4, ge=2, le=100, description="The first look, in blocks (at least 2).")
    spending: Literal["obrien_fleming", "pocock"] = Field(
        default="obrien_fleming",
        description="Alpha-spending function over the looks: obrien_fleming keeps nearly all of alpha for the "
                    "last look; pocock spreads it evenly (earlier stops, less power at the end).",
    )


class Design(StrictModel):
    """Blocks of back-to-back runs (one of each arm) and their order."""

    blocks: int = Field(default=4, ge=1, le=100, description="Blocks; a bar needs at least 2 (at most 100).")
    order: Literal["ABBA", "randomized"] = Field(
        default="ABBA",
        description="ABBA alternates which arm goes first (more than two arms: a Williams order, every "
                    "arm at every position and right after every other equally often); randomized draws it.",
    )
    seed: int = Field(default=0, ge=0, le=2**63 - 1, description="Seed of every random draw of the experiment (at most 2^63-1).")
    max_retries: int = Field(
        default=2, ge=0, le=10, description="Retries of a run that fails a guard or loses its server (at most 10)."
    )
    window_h: float = Field(
        default=24, gt=0, le=8760, description="The arms of a block must run within this many hours (at most 8760)."
    )
    carryover: CarryOver = Field(
        default_factory=CarryOver, description="The order-effect rule: its bound and what exceeding it does."
    )
    sequential: Sequential | None = Field(
        default=None, description="Stop at the first look at which every bar is decided (off: a fixed design)."
    )

    @model_validator(mode="after")
    def _looks_fit(self) -> Design:
        if self.sequential is not None and self.blocks < 2:
            raise CrossFieldError([("sequential", f"a sequential design looks at 2 or more blocks; design.blocks is "
                                                  f"{self.blocks}")])
        if self.sequential is not None and self.sequential.min_blocks > self.blocks:
            raise CrossFieldError([("sequential.min_blocks", f"the first look ({self.sequential.min_blocks} blocks) "
                                                             f"comes after the last block ({self.blocks})")])
        return self

    @model_serializer(mode="wrap")
    def _omit_defaults(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Added after plans were registered (a plan that sets them hashes apart).
        return omit_while(handler(self), {"carryover": CarryOver().model_dump(mode="json"), "sequential": None})
