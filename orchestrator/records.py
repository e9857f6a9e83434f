"""The per-request record: what the load generator (and the virtual-time simulator) produce,
what analysis judges and what the store keeps. Pure data; no I/O.

Times are absolute, in seconds on the wall clock (``time.time()`` epoch) for real runs and on
the simulation clock for virtual-time runs; only differences matter to analysis. TTFT is
measured from ``scheduled_s`` (DESIGN section 7); ``sent_s`` is kept too (``send_lag_s``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, get_args

Status = Literal["ok", "http_error", "timeout", "disconnect", "cancelled", "unsent"]
STATUSES: tuple[str, ...] = get_args(Status)
# A request that ended in an error: the server answered with an error status, or the connection
# broke. analysis.metrics charges such a miss to "error"; a timeout is no error there (the
# request was still running when its time ran out: "unfinished").
ERROR_STATUSES: tuple[str, ...] = ("http_error", "disconnect")
# A request that ended without a complete reply and never will: an error or a timeout (a
# certain miss for the early stop; a failed request for the server check and the report).
ERROR_OR_TIMEOUT_STATUSES: tuple[str, ...] = (*ERROR_STATUSES, "timeout")
Phase = Literal["warmup", "measure", "cooldown"]
WARMUP: Phase = "warmup"
MEASURE: Phase = "measure"  # the only phase judged
COOLDOWN: Phase = "cooldown"


@dataclass(slots=True)
class RequestRecord:
    """One scheduled request, whatever happened to it (never dropped)."""

    request_id: int  # index in the point's schedule
    conversation_id: int
    turn: int
    phase: str  # warmup | measure | cooldown: only `measure` is judged
    scheduled_s: float  # when the schedule said to send it
    sent_s: float | None = None  # when the request actually left
    first_token_s: float | None = None  # first streamed token received
    last_token_s: float | None = None  # last streamed token received
    prompt_tokens: int = 0  # prompt length sent (by the workload's token count)
    output_tokens_asked: int = 0  # max_tokens (with ignore_eos)
    output_tokens: int | None = None  # usage.completion_tokens from the server
    cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    chunks: int = 0  # streamed chunks that carried text
    max_gap_s: float | None = None  # largest gap between consecutive chunks
    status: str = "unsent"  # one of STATUSES
    http_status: int | None = None
    error: str | None = None
    prompt_hash: str = ""  # hash of the prompt beyond the shared prefix (repeat guard)
    output_hash: str = ""  # hash of the returned text (frozen-randomness guard)
    # usage.prompt_tokens from the server: the prompt as the served model's tokenizer counted it
    # (None: no usage reported, or a record from before migration 0008). Last: columns append.
    server_prompt_tokens: int | None = None

    @property
    def finished(self) -> bool:
        """Completed without error (the token count may still be wrong)."""
        return self.status == "ok" and self.last_token_s is not None

    @property
    def ttft_s(self) -> float:
        """First token minus *scheduled* send; +inf when no token arrived."""
        if self.first_token_s is None:
            return math.inf
        return self.first_token_s - self.scheduled_s

    @property
    def tpot_s(self) -> float:
        """(last - first) / (usage output tokens - 1); +inf when unfinished; 0 for one token."""
        if (not self.finished or self.last_token_s is None or self.first_token_s is None
                or not self.output_tokens):
            return math.inf
        if self.output_tokens <= 1:
            return 0.0
        return (self.last_token_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def e2e_s(self) -> float:
        """Last token minus *scheduled* send; +inf when unfinished."""
        if not self.finished or self.last_token_s is None:
            return math.inf
        return self.last_token_s - self.scheduled_s

    @property
    def send_lag_s(self) -> float | None:
        """How late the generator sent it (actual - scheduled)."""
        return None if self.sent_s is None else self.sent_s - self.scheduled_s

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of the stored fields."""
        return asdict(self)


RECORD_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(RequestRecord))
