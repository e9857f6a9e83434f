"""YAML in, validated Plan out; every problem reported at once with its field path and line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from orchestrator.errors import PlanError, Problem
from orchestrator.plan.base import CrossFieldError
from orchestrator.plan.experiment import SECTION_TYPES, Plan, cross_check

SCHEMA_VERSION = 1


def load_plan_file(path: str | Path) -> Plan:
    """Read and validate a plan file; raises PlanError (or UserError if it cannot be read)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise PlanError([Problem(str(p), f"cannot read the plan: {e.strerror or e}")]) from e
    return load_plan_text(text, source=str(p))


def load_plan_text(text: str, source: str = "<plan>") -> Plan:
    """Parse YAML (or JSON) text and validate it as a Plan."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        what = getattr(e, "problem", None) or str(e)
        raise PlanError([Problem("", f"YAML syntax: {what}", line)]) from e
    if not isinstance(data, dict):
        raise PlanError([Problem("", f"{source}: a plan is a mapping of fields, got {type(data).__name__}")])
    if set(data) == {"schema_version", "plan"} and isinstance(data["plan"], dict):
        return validate_plan(data["plan"])  # a registration's canonical JSON is a plan file too
    return validate_plan(data, lines=_line_index(root))


def validate_plan(data: dict[str, Any], lines: dict[tuple[str, ...], int] | None = None) -> Plan:
    """Validate a plan given as data; every problem is collected into one PlanError."""
    lines = lines or {}
    try:
        return Plan.model_validate(data)
    except PlanError as e:  # only the cross-section checks failed
        raise PlanError([_with_line(p, lines) for p in e.plan_problems]) from None
    except ValidationError as e:
        problems = _from_pydantic(e)
    problems.extend(_partial_cross_checks(data))
    raise PlanError(_dedupe([_with_line(p, lines) for p in problems])) from None


def _from_pydantic(e: ValidationError) -> list[Problem]:
    out: list[Problem] = []
    for err in e.errors():
        loc = [str(x) for x in err["loc"]]
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, CrossFieldError):
            for sub, msg in cause.problems:
                out.append(Problem(".".join(loc + ([sub] if sub else [])), msg))
            continue
        if isinstance(cause, PlanError):
            out.extend(cause.plan_problems)
            continue
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown field (check its spelling; `orch plan schema` lists the fields)"
        elif msg.startswith("Value error, "):
            msg = msg[len("Value error, ") :]
        elif err["type"] == "missing":
            msg = "required field is missing"
        elif "input" in err and err["type"].endswith("_type") or err["type"].endswith("_parsing"):
            msg = f"{msg} (got {err['input']!r})"
        out.append(Problem(".".join(loc), msg))
    return out


def _partial_cross_checks(data: dict[str, Any]) -> list[Problem]:
    sections: dict[str, Any] = {}
    for name, typ in SECTION_TYPES.items():
        if name not in data:
            field = Plan.model_fields[name]
            sections[name] = field.get_default(call_default_factory=True) if not field.is_required() else None
            continue
        try:
            sections[name] = TypeAdapter(typ).validate_python(data[name])
        except (ValidationError, PlanError):
            sections[name] = None
    if isinstance(sections.get("arms"), dict) and set(sections["arms"]) != {"A", "B"}:
        sections["arms"] = None
    return cross_check(**sections)


def _with_line(p: Problem, lines: dict[tuple[str, ...], int]) -> Problem:
    if p.line is not None or not p.path:
        return p
    parts = tuple(p.path.split("."))
    while parts:
        if parts in lines:
            return Problem(p.path, p.message, lines[parts])
        parts = parts[:-1]
    return p


def _dedupe(problems: list[Problem]) -> list[Problem]:
    seen: set[tuple[str, str]] = set()
    out = []
    for p in problems:
        if (p.path, p.message) not in seen:
            seen.add((p.path, p.message))
            out.append(p)
    return out


def _line_index(node: yaml.Node | None, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], int]:
    """Map each field path in the YAML document to its 1-based line number."""
    out: dict[tuple[str, ...], int] = {}
    if node is None:
        return out
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            path = (*prefix, str(key.value))
            out[path] = key.start_mark.line + 1
            out.update(_line_index(value, path))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            path = (*prefix, str(i))
            out[path] = item.start_mark.line + 1
            out.update(_line_index(item, path))
    return out


def canonical_json(plan: Plan) -> str:
    """The plan's canonical form: every effective value, sorted keys, no whitespace."""
    body = {"schema_version": SCHEMA_VERSION, "plan": plan.model_dump(mode="json", by_alias=True)}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def plan_hash(plan: Plan) -> str:
    """sha256 of the canonical JSON: key order and layout never change it; meaning always does."""
    return hashlib.sha256(canonical_json(plan).encode()).hexdigest()


def plan_from_canonical(text: str) -> Plan:
    """Rebuild a Plan from its canonical JSON (as stored at registration)."""
    body = json.loads(text)
    return validate_plan(body["plan"])


def json_schema() -> dict[str, Any]:
    """JSON Schema of the plan language (what a YAML plan may contain)."""
    schema = Plan.model_json_schema(by_alias=True, mode="validation")
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "orchestrator experiment plan"
    return schema
