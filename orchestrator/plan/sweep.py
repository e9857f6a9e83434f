"""Sweeps: factors and levels over arm fields, expanded into the plan's arms. Pure.

A plan with ``sweep:`` gives one arm, A (the base arm), and a mapping of factors: an arm
field path (``engine.max_num_seqs``, ``router.policy``, ``decode.replicas``) to its levels.
The expansion (``expand``) writes one arm per cell of the design:

- ``full``: every combination of levels (the Cartesian product).
- ``fractional``: 2-level factors only, at least 3 of them: the half fraction whose defining
  relation is I = +/-(the product of every factor) and that holds the baseline, so the number
  of factors is its resolution (3 factors: resolution III, main effects aliased with two-factor
  interactions; 4: IV). Only main effects are estimated from a fraction.

``max_arms_per_block`` (k) below the number of arms makes the blocks incomplete: each runs the
baseline A and k - 1 others, every other arm in equally many blocks (``plan.incomplete``).

The baseline is arm A: the first level of every factor (the base arm's own value of a swept
field is replaced). The other cells follow in the product's order, factors sorted by path (so
a plan's canonical JSON, whose keys are sorted, expands to the same letters), and are named by
consecutive letters as every plan's arms are. Each arm also has a readable name built from its
levels (``cell_name``: ``mns128-pc`` ...). The expanded arms are the plan's arms: stored in its
canonical JSON, priced by the dry run and run like hand-written ones; the sweep declaration is
stored beside them, so the plan hash covers both.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
    SerializerFunctionWrapHandler,
    ValidationError,
    field_validator,
    model_serializer,
)

from orchestrator.plan.arms import Arm
from orchestrator.plan.base import StrictModel, omit_while
from orchestrator.plan.incomplete import describe_blocks

Level = bool | int | float | str
SweepDesign = Literal["full", "fractional"]
MAX_LEVELS = 8  # levels of one factor


class Sweep(StrictModel):
    """Factors and levels over the fields of arm A; expanded to the plan's arms."""

    factors: dict[str, list[Level]] = Field(
        min_length=1, max_length=6,
        description="Arm field path (e.g. engine.max_num_seqs, router.policy) -> its levels, 2 to 8 of "
                    "them; the first level of every factor is the baseline (arm A).",
    )
    design: SweepDesign = Field(
        default="full",
        description="full: every combination of levels; fractional: the half fraction of 3 or more "
                    "2-level factors that holds the baseline (resolution = number of factors).",
    )
    confidence: float = Field(
        default=0.95, ge=0.5, lt=1,
        description="Two-sided confidence of the intervals on the factors' effects.",
    )
    max_arms_per_block: int | None = Field(
        default=None, ge=2, le=16,
        description="At most this many arms per block (2 to 16; default: every arm in every block). Fewer "
                    "than the sweep's arms: incomplete blocks, each the baseline A and that many minus one "
                    "others, every other arm in equally many blocks (design.blocks a multiple of what that "
                    "needs); effects by intrablock least squares.",
    )

    @model_serializer(mode="wrap")
    def _omit_complete(self, handler: SerializerFunctionWrapHandler) -> Any:
        # Added after sweep plans were registered (a plan that sets it hashes apart).
        return omit_while(handler(self), {"max_arms_per_block": None})

    @field_validator("factors")
    @classmethod
    def _levels(cls, v: dict[str, list[Level]]) -> dict[str, list[Level]]:
        problems = []
        for path, levels in v.items():
            if not re.fullmatch(r"[a-z_]+(\.[a-z_]+)*", path):
                problems.append(f"{path!r} is not an arm field path (e.g. engine.max_num_seqs)")
            elif not 2 <= len(levels) <= MAX_LEVELS:
                problems.append(f"{path}: give 2 to {MAX_LEVELS} levels (got {len(levels)})")
            elif len({repr(x) for x in levels}) < len(levels):
                problems.append(f"{path}: a level is given twice")
        if problems:
            raise ValueError("; ".join(problems))
        return dict(sorted(v.items()))  # the canonical order: the arms' letters never depend on key order


def cells(sweep: Sweep) -> list[tuple[int, ...]]:
    """The design's cells as level indices, one per factor in ``sweep.factors`` order; the
    first is the baseline (every factor at its first level)."""
    every = list(itertools.product(*(range(len(levels)) for levels in sweep.factors.values())))
    if sweep.design == "full":
        return every
    # 2-level factors: code level 0 as -1 and 1 as +1; keep the half whose product of codes is
    # that of the baseline (all -1).
    want = (-1) ** len(sweep.factors)
    return [c for c in every if math.prod(1 if i else -1 for i in c) == want]


def design_problems(sweep: Sweep) -> list[tuple[str, str]]:
    """What the sweep's design cannot do with its factors: (path below ``sweep``, message)."""
    if sweep.design != "fractional":
        return []
    out = [(f"factors.{path}", f"a fractional design takes 2-level factors; this one has {len(levels)}")
           for path, levels in sweep.factors.items() if len(levels) != 2]
    if len(sweep.factors) < 3:
        out.append(("design", f"a half fraction of {len(sweep.factors)} factors confounds a main effect with "
                              "another (resolution II): use design: full, or sweep 3 or more 2-level factors"))
    return out


def _abbrev(path: str) -> str:
    """engine.max_num_seqs -> mns; router.policy -> policy; decode.replicas -> replicas."""
    words = path.rsplit(".", 1)[-1].split("_")
    return "".join(w[0] for w in words) if len(words) > 1 else words[0]


def level_text(level: Level) -> str:
    if isinstance(level, bool):
        return "on" if level else "off"
    if isinstance(level, float) and level.is_integer():
        return str(int(level))
    return str(level)


def cell_name(sweep: Sweep, cell: tuple[int, ...]) -> str:
    """A readable name of an arm of the sweep: each factor's abbreviation and level, joined by
    dashes (``mns128-policyround_robin`` reads badly, so a text level stands alone:
    ``mns128-round_robin``)."""
    parts = []
    for (path, levels), i in zip(sweep.factors.items(), cell, strict=True):
        level = levels[i]
        text = level_text(level)
        parts.append(text if isinstance(level, str) else f"{_abbrev(path)}{text}")
    return "-".join(parts)


def arm_names(sweep: Sweep, letters: str) -> dict[str, str]:
    """Letter -> readable name of each arm the sweep writes (A: the baseline)."""
    return {letter: cell_name(sweep, cell) for letter, cell in zip(letters, cells(sweep), strict=False)}


def per_block(sweep: Sweep) -> int | None:
    """Arms per block of an incomplete design; None when every block holds every arm."""
    k = sweep.max_arms_per_block
    return k if k is not None and k < len(cells(sweep)) else None


def describe(sweep: Sweep) -> str:
    """The design in words: ``full design of 3 x 2 levels (engine.max_num_seqs x replicas): 6 arms``,
    and with incomplete blocks ``..., incomplete blocks: 3 arms of 6 per block, baseline in every block``."""
    sizes = " x ".join(str(len(v)) for v in sweep.factors.values())
    n = len(cells(sweep))
    text = f"{sweep.design} design of {sizes} levels ({' x '.join(sweep.factors)}): {n} arms"
    k = per_block(sweep)
    return text if k is None else f"{text}, {describe_blocks(n, k)}"


def _set(doc: dict[str, Any], path: str, value: Level, fallback: Mapping[str, Any]) -> None:
    """Set ``path`` in an arm's dump; a missing mapping on the way starts from ``fallback``'s
    (the plan's router for an arm without its own)."""
    node = doc
    parts = path.split(".")
    for depth, part in enumerate(parts[:-1]):
        if not isinstance(node.get(part), dict):
            start = fallback.get(part) if depth == 0 else None
            node[part] = dict(start) if isinstance(start, Mapping) else {}
        node = node[part]
    node[parts[-1]] = value


def field_path_problem(path: str) -> str | None:
    """Why ``path`` names no field of an arm (None when it does): each part a field of the
    model before it, the last a value (not a whole section)."""
    model: type[BaseModel] = Arm
    parts = path.split(".")
    for k, part in enumerate(parts):
        if part not in model.model_fields:
            where = "an arm" if k == 0 else f"arm field {'.'.join(parts[:k])}"
            return f"{part!r} is not a field of {where} (fields: {', '.join(model.model_fields)})"
        inner = _model_of(model.model_fields[part].annotation)
        if k < len(parts) - 1:
            if inner is None:
                return f"arm field {'.'.join(parts[: k + 1])} is a value, not a section: it has no {parts[k + 1]!r}"
            model = inner
        elif inner is not None:
            return (f"arm field {path} is a section; sweep one of its values "
                    f"(e.g. {path}.{next(iter(inner.model_fields))})")
    return None


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation holds (``X | None`` too), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def expand(sweep: Sweep, base: Arm, names: str, plan_router: Mapping[str, Any] | None = None,
           ) -> tuple[dict[str, Arm], list[tuple[str, str]]]:
    """The sweep's arms by letter (``names``: the letters in order, A first), or the problems
    (path below ``sweep``, message): a field path no arm has, a level its field refuses, a
    design its factors cannot make, more cells than letters."""
    problems = design_problems(sweep)
    problems += [(f"factors.{p}", why) for p in sweep.factors if (why := field_path_problem(p))]
    if problems:
        return {}, problems
    design = cells(sweep)
    if len(design) > len(names):
        sizes = " x ".join(str(len(v)) for v in sweep.factors.values())
        return {}, [("factors", f"the {sweep.design} design of {sizes} levels makes {len(design)} arms; a plan "
                                f"holds at most {len(names)} ({names[0]} to {names[-1]}): drop a level or "
                                "a factor, or use design: fractional")]
    base_doc = base.model_dump(mode="json", by_alias=True)
    arms: dict[str, Arm] = {}
    bad: dict[tuple[str, str], str] = {}
    for letter, cell in zip(names, design, strict=False):
        doc = _deep_copy(base_doc)
        for (path, levels), i in zip(sweep.factors.items(), cell, strict=True):
            _set(doc, path, levels[i], plan_router and {"router": plan_router} or {})
        try:
            arms[letter] = Arm.model_validate(doc)
        except ValidationError as e:
            for err in e.errors():
                loc = ".".join(str(x) for x in err["loc"])
                msg = str(err["msg"]).removeprefix("Value error, ")
                hit = next(((p, cell[k]) for k, p in enumerate(sweep.factors) if loc == p), None)
                if hit is not None:
                    bad[(f"factors.{hit[0]}.{hit[1]}", f"level {sweep.factors[hit[0]][hit[1]]!r}: {msg}")] = ""
                else:
                    levels_txt = ", ".join(f"{p}={level_text(sweep.factors[p][i])}"
                                           for p, i in zip(sweep.factors, cell, strict=True))
                    bad[("factors", f"arm {letter} ({levels_txt}): {loc or 'arm'}: {msg}")] = ""
    return arms, list(bad)


def _deep_copy(doc: Any) -> Any:
    if isinstance(doc, dict):
        return {k: _deep_copy(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [_deep_copy(v) for v in doc]
    return doc
