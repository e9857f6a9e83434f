"""The one base of every plan model: strict (unknown keys are errors), frozen once validated."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Unknown keys are errors; instances are immutable (use ``model_copy(update=...)``)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        validate_default=True,
        str_strip_whitespace=True,
        allow_inf_nan=False,  # no field of a plan means inf or nan (YAML .inf, JSON Infinity)
    )


class CrossFieldError(ValueError):
    """Raised by model validators: several problems, each at a path below the model.

    Pydantic reports a model validator's error at the model's own location; the loader reads
    ``problems`` from this error to name the exact field (e.g. ``arms.B.decode.tp``).
    """

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{p}: {m}" if p else m for p, m in problems))


def omit_while(dump: Any, values: Mapping[str, Any]) -> Any:
    """``dump`` (a model's serialized dict) less each key of ``values`` that holds its value
    there: how a field added after plans were registered stays out of the canonical JSON while
    it is at its default, so every earlier plan keeps its hash (for a model_serializer)."""
    if isinstance(dump, dict):
        for key, value in values.items():
            if key in dump and dump[key] == value:
                del dump[key]
    return dump
