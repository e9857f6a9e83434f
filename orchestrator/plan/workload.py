"""The workload: how requests arrive and what they ask for."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    Field,
    SerializerFunctionWrapHandler,
    field_validator,
    model_serializer,
    model_validator,
)

from orchestrator.plan.base import CrossFieldError, StrictModel
from orchestrator.plan.sources import (
    DataFileError,
    DataSource,
    file_sha256,
    session_stats,
    source_stats,
)

OPTIONAL_LATER_FIELDS = ("sessions", "source", "output_dist", "tokenizer")

# The workload's kind: which of its mutually exclusive fields is given decides it (the plan
# language keeps those fields, so every registered plan keeps its hash); code asks the kind,
# never the fields (``orchestrator.control.load_kinds`` has one implementation per kind).
WorkloadKind = Literal["open", "closed", "sessions", "dataset", "trace"]
# What a point's rate counts, per kind (a closed loop has users, not a rate).
RATE_UNITS: dict[WorkloadKind, str] = {
    "open": "req/s", "dataset": "req/s", "trace": "req/s", "sessions": "sessions/s", "closed": "users",
}


def kind_of(closed: bool, sessions: bool, source_kind: str | None) -> WorkloadKind:
    """The kind of a workload from which of its fields are given (a model's or a stored doc's)."""
    if closed:
        return "closed"
    if sessions:
        return "sessions"
    if source_kind is not None:
        return "trace" if source_kind == "trace" else "dataset"
    return "open"


def kind_of_doc(doc: Any) -> WorkloadKind:
    """The kind of a stored plan's workload section (its canonical JSON, read back)."""
    if not isinstance(doc, dict):
        return "open"
    src = doc.get("source")
    return kind_of(isinstance(doc.get("closed"), dict), isinstance(doc.get("sessions"), dict),
                   str(src.get("kind")) if isinstance(src, dict) else None)


class LengthDist(StrictModel):
    """A distribution of token counts (prompt lengths)."""

    mean: float = Field(gt=0, le=1_000_000, description="Mean token count (at most 1000000).")
    dist: Literal["fixed", "lognormal", "uniform", "normal"] = Field(
        default="fixed", description="Shape of the distribution."
    )
    sigma: float = Field(
        default=0.0,
        ge=0,
        le=1_000_000,
        description="lognormal: sigma of the log (at most 4); normal: standard deviation in tokens "
        "(at most 1000000); uniform: half-width as a share of the mean (below 1).",
    )
    min: int = Field(default=1, ge=1, le=1_000_000, description="Lower clip, tokens (at most 1000000).")
    max: int | None = Field(default=None, ge=1, le=1_000_000, description="Upper clip, tokens (default none; at most 1000000).")

    @model_validator(mode="after")
    def _bounds(self) -> LengthDist:
        if self.max is not None and self.max < self.min:
            raise CrossFieldError([("max", f"max ({self.max}) is below min ({self.min})")])
        if self.dist == "uniform" and self.sigma >= 1:
            raise CrossFieldError([("sigma", "uniform half-width share must be < 1")])
        if self.dist == "lognormal" and self.sigma > 4:
            raise CrossFieldError([("sigma", f"lognormal sigma {self.sigma} is beyond 4 (e^4 = 55x spread)")])
        return self


class OpenLoop(StrictModel):
    """Requests sent on a clock, whether or not the server keeps up (capacity needs this)."""

    process: Literal["poisson", "gamma", "constant"] = Field(
        default="poisson", description="Inter-arrival process."
    )
    burstiness: float = Field(
        default=1.0,
        gt=0,
        le=1000,
        description="gamma: shape factor; 1 is poisson, below 1 burstier (vllm bench's meaning); at most 1000.",
    )


UserCount = Annotated[int, Field(ge=1, le=100_000)]
MAX_USER_LEVELS = 8


class ClosedLoop(StrictModel):
    """N users, each waiting for its reply (and a think time) before sending again; or a
    concurrency sweep: a list of user counts, each measured as one point of every run."""

    users: UserCount | list[UserCount] = Field(
        description="Concurrent users (at most 100000); or a list of 2 to 8 levels (e.g. [8, 32, 128]): every "
                    "run measures one point at each, in the order given.")

    @field_validator("users")
    @classmethod
    def _levels(cls, v: int | list[int]) -> int | list[int]:
        if isinstance(v, list) and not 2 <= len(v) <= MAX_USER_LEVELS:
            raise ValueError(f"give one user count, or 2 to {MAX_USER_LEVELS} levels (got {len(v)})")
        if isinstance(v, list) and len(set(v)) < len(v):
            raise ValueError("a users level is given twice")
        return v

    @property
    def levels(self) -> tuple[int, ...]:
        """The user counts measured in every run (one, or the sweep's levels in order)."""
        return tuple(self.users) if isinstance(self.users, list) else (self.users,)

    def level(self) -> int:
        """The one user count of a closed loop (a sweep's run is measured a level at a time:
        ``at(n)``)."""
        if isinstance(self.users, list):
            raise ValueError("a concurrency sweep is measured one level at a time (ClosedLoop.at)")
        return self.users

    def at(self, users: int) -> ClosedLoop:
        """This closed loop at one of its levels."""
        return self.model_copy(update={"users": users})
    think_s: float = Field(default=0.0, ge=0, le=86_400, description="Pause between a reply and the next request, s (at most 86400).")
    ramp_up_s: float = Field(default=0.0, ge=0, le=86_400, description="Users start evenly over this time, s (at most 86400).")


class ThinkTime(StrictModel):
    """A user's pause between a reply's arrival and the session's next turn, s."""

    mean_s: float = Field(default=0.0, ge=0, le=86_400, description="Mean pause, s (at most 86400).")
    dist: Literal["fixed", "exponential", "lognormal", "uniform"] = Field(
        default="fixed", description="Shape of the distribution (mean is `mean_s`)."
    )
    sigma: float = Field(
        default=0.0, ge=0, le=4,
        description="lognormal: sigma of the log (at most 4); uniform: half-width as a share of the mean (below 1).",
    )

    @model_validator(mode="after")
    def _shape(self) -> ThinkTime:
        if self.dist == "uniform" and self.sigma >= 1:
            raise CrossFieldError([("sigma", "uniform half-width share must be < 1")])
        return self


class Sessions(StrictModel):
    """Live multi-turn sessions: a session starts on the open-loop clock (``arrival``); each
    next turn is due when the previous reply has arrived plus a think time, and carries the
    returned text in its history (``prompts.turns`` turns per session). With a data ``source``
    the sessions are the file's: a prompts file's conversations (started on the clock), or a
    trace's sessions by ``session_id`` (started at their own times, scaled to the rate)."""

    think: ThinkTime = Field(default_factory=ThinkTime, description="Pause before each later turn.")


class PromptTokenizer(StrictModel):
    """Whose tokenizer counts the synthetic prompts: before each point's requests are sent,
    every first-turn completion prompt is fitted to exactly its asked length under it, so the
    records' ``prompt_tokens`` are the served model's own count. Give one of the two."""

    file: str | None = Field(
        default=None, min_length=1, max_length=4096,
        description="Path of a local `tokenizer.json` (read with the `tokenizers` library).",
    )
    server: bool = Field(
        default=False, description="Ask the served endpoint's `POST /tokenize` (vLLM has it).",
    )
    sha256: str | None = Field(
        default=None, pattern=r"^[0-9a-f]{64}$",
        description="sha256 of `file`; filled in from the file when the plan is loaded, so the "
        "registered plan names the exact tokenizer (an edited file is another plan) and a run "
        "refuses a file that changed since.",
    )

    @model_validator(mode="after")
    def _one(self) -> PromptTokenizer:
        if (self.file is not None) == self.server:
            raise CrossFieldError([("file", "give either `file: PATH` (a tokenizer.json) or `server: true`")])
        return self


class PromptSpec(StrictModel):
    """What the prompts look like."""

    input_tokens: LengthDist = Field(description="Prompt length of a conversation's first turn.")
    shared_prefix: float = Field(
        default=0.0,
        ge=0,
        lt=1,
        description="Share of first-turn prompt tokens common to all requests (a system prompt).",
    )
    conversations: int = Field(default=1000, ge=1, le=1_000_000, description="Distinct conversations (at most 1000000).")
    turns: int = Field(default=1, ge=1, le=1000, description="Turns per conversation; history grows each turn (at most 1000).")
    followup_tokens: LengthDist | None = Field(
        default=None,
        description="New user tokens per later turn; default: the unshared part of input_tokens.",
    )


class Workload(StrictModel):
    """Arrivals, prompts and replies."""

    arrival: OpenLoop | None = Field(
        default=None, description="Open-loop arrivals (default poisson when `closed` is absent)."
    )
    closed: ClosedLoop | None = Field(default=None, description="Closed-loop users instead of arrivals.")
    sessions: Sessions | None = Field(
        default=None,
        description="Live sessions: `arrival` starts sessions (the search's rate is sessions/s); "
        "each later turn waits for the previous reply plus a think time and carries its text. "
        "With `source`: the file's conversations (a prompts file) or a trace's sessions by "
        "`session_id`, each user turn sent after the reply before it.",
    )
    prompts: PromptSpec = Field(description="Prompt lengths, sharing and conversations.")
    output_tokens: int = Field(
        ge=1, le=1_000_000, description="Reply length, enforced with max_tokens + ignore_eos and checked (at most 1000000)."
    )
    output_dist: LengthDist | None = Field(
        default=None,
        description="Reply lengths drawn per request from this distribution (each still enforced "
        "and checked exactly); `output_tokens` is then its mean (filled in when absent).",
    )
    api: Literal["completions", "chat"] = Field(default="completions", description="Endpoint used.")
    source: DataSource | None = Field(
        default=None,
        description="The user's own data: a prompts file (lengths and content from it) or a trace "
        "(arrivals, lengths and shared blocks from it, replayed scaled to the search's rate; "
        "`arrival` then stands in for it only in the virtual-time dry run). With `sessions`, the "
        "file's conversations (or a trace's `session_id`s) are replayed as live sessions. Without "
        "`prompts` or `output_tokens`, their means come from the file.",
    )

    tokenizer: PromptTokenizer | None = Field(
        default=None,
        description="Fit the synthetic prompts to their exact asked lengths with the served model's "
        "tokenizer (`{file: PATH}` or `{server: true}`); default: one word = one token. Open-loop "
        "synthetic prompts only (not with `source`, `sessions` or `closed`).",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_arrival(cls, data: object) -> object:
        if isinstance(data, dict) and "arrival" not in data and "closed" not in data:
            data = {**data, "arrival": {"process": "poisson"}}
        if isinstance(data, dict) and isinstance(data.get("source"), dict):
            data = _pin_source(data)
        if isinstance(data, dict) and isinstance(data.get("tokenizer"), dict):
            data = _pin_tokenizer(data)
        if isinstance(data, dict) and "output_tokens" not in data and isinstance(data.get("output_dist"), dict):
            mean = data["output_dist"].get("mean")
            if isinstance(mean, int | float) and not isinstance(mean, bool) and mean >= 1:
                data = {**data, "output_tokens": max(1, round(mean))}
        return data

    @model_validator(mode="after")
    def _one_loop(self) -> Workload:
        if self.arrival is not None and self.closed is not None:
            raise CrossFieldError([("closed", "give either `arrival` (open loop) or `closed`, not both")])
        if self.source is not None and self.source.kind == "trace" and self.closed is not None:
            raise CrossFieldError([("source", "a trace brings its own arrivals (open loop); remove `closed`")])
        if (self.source is not None and self.source.kind == "trace" and self.sessions is not None
                and self.sessions.think != ThinkTime()):
            raise CrossFieldError([("sessions.think", "a trace's sessions keep the trace's own pace (its "
                                                      "timestamps, or `delay`); remove `think`")])
        if self.output_dist is not None and self.output_tokens != max(1, round(self.output_dist.mean)):
            raise CrossFieldError([("output_tokens", f"with `output_dist`, output_tokens is its mean "
                                                     f"({max(1, round(self.output_dist.mean))}); "
                                                     "give one or make them agree")])
        if self.source is not None and self.output_dist is not None:
            raise CrossFieldError([("output_dist", "a data `source` sets reply lengths per request "
                                                   "itself; remove `output_dist`")])
        if self.tokenizer is not None and (self.source is not None or self.sessions is not None
                                           or self.closed is not None):
            raise CrossFieldError([("tokenizer", "exact prompt fitting applies to open-loop synthetic "
                                                 "prompts; remove `tokenizer`, or `source`/`sessions`/`closed`")])
        if self.sessions is not None and self.closed is not None:
            raise CrossFieldError([("sessions", "sessions start on the open-loop clock (`arrival`); "
                                                "remove `closed` or `sessions`")])
        return self

    @model_serializer(mode="wrap")
    def _omit_unset_new_fields(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Fields added after plans were registered are left out while unset, so every earlier
        # plan keeps its canonical JSON and hash.
        out = handler(self)
        if isinstance(out, dict):
            for key in OPTIONAL_LATER_FIELDS:
                if out.get(key) is None:
                    out.pop(key, None)
        return out

    @property
    def kind(self) -> WorkloadKind:
        """Which kind of load this is (``WorkloadKind``); not serialized (the hash keeps its fields)."""
        return kind_of(self.closed is not None, self.sessions is not None,
                       self.source.kind if self.source is not None else None)

    @property
    def rate_unit(self) -> str:
        return RATE_UNITS[self.kind]

    @property
    def open_loop(self) -> bool:
        """True when requests arrive on a clock (the only kind capacity may come from)."""
        return self.kind != "closed"

    def mean_context_tokens(self) -> float:
        """Mean tokens a sequence holds at the end of its reply, averaged over turns."""
        p = self.prompts
        first = p.input_tokens.mean
        follow = (
            p.followup_tokens.mean
            if p.followup_tokens is not None
            else p.input_tokens.mean * (1 - p.shared_prefix)
        )
        # Turn t (0-based) prompt = first + t * (output + follow); its context adds the reply.
        total = 0.0
        for t in range(p.turns):
            total += first + t * (self.output_tokens + follow) + self.output_tokens
        return total / p.turns


def _pin_tokenizer(data: dict[str, Any]) -> dict[str, Any]:
    """The tokenizer file's sha256, pinned into the registered plan like a data source's."""
    tok = dict(data["tokenizer"])
    path = tok.get("file")
    if not isinstance(path, str) or not path or tok.get("sha256") is not None:
        return data  # no file (server), already pinned, or a wrong value its validation reports
    try:
        tok["sha256"] = file_sha256(path)
    except DataFileError as e:
        raise CrossFieldError([("tokenizer.file", str(e))]) from None
    return {**data, "tokenizer": tok}


def _pin_source(data: dict[str, Any]) -> dict[str, Any]:
    """The file's sha256 (pinned into the registered plan) and, where the plan gives none, the
    prompt and reply lengths the file implies (so every consumer of the plan sees them)."""
    src = dict(data["source"])
    path = src.get("path")
    if not isinstance(path, str) or not path:
        return data  # the field's own validation reports it
    sessions = isinstance(data.get("sessions"), dict)
    pinned = src.get("sha256") is not None  # a registered plan read back: the file may be elsewhere
    try:
        if not pinned:
            src["sha256"] = file_sha256(path)
        if "prompts" in data and "output_tokens" in data and (pinned or not sessions):
            return {**data, "source": src}
        if sessions:  # checked to have sessions when first pinned (and by the plan file's loader)
            return _session_lengths({**data, "source": src})
        stats = source_stats(DataSource.model_validate({**src, "sha256": None}))
    except DataFileError as e:
        raise CrossFieldError([("source.path", str(e))]) from None
    except ValueError:
        return {**data, "source": src}  # a wrong kind or option: the field's validation says which
    out = {**data, "source": src}
    if "prompts" not in out:
        out["prompts"] = {"input_tokens": {"mean": round(stats.mean_input_tokens, 3)},
                          "conversations": min(stats.records, 1_000_000)}
    if "output_tokens" not in out and stats.mean_output_tokens is not None:
        out["output_tokens"] = max(1, round(stats.mean_output_tokens))
    return out


def _session_lengths(data: dict[str, Any]) -> dict[str, Any]:
    """A file replayed as sessions: checked to have sessions (a file of single turns is refused
    at ``source.path``), and, where the plan gives none, its sessions' turns and lengths."""
    stats = session_stats(DataSource.model_validate({**data["source"], "sha256": None}))
    out = dict(data)
    if "prompts" not in out:
        prompts: dict[str, Any] = {"input_tokens": {"mean": round(stats.mean_first_tokens, 3)},
                                   "conversations": min(stats.sessions, 1_000_000),
                                   "turns": min(1000, max(1, round(stats.mean_turns)))}
        if stats.mean_followup_tokens is not None:
            prompts["followup_tokens"] = {"mean": round(stats.mean_followup_tokens, 3)}
        out["prompts"] = prompts
    if "output_tokens" not in out and stats.mean_output_tokens is not None:
        out["output_tokens"] = max(1, round(stats.mean_output_tokens))
    return out
