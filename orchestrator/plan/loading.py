"""YAML in, validated Plan out; every problem reported at once with its field path and line."""

from __future__ import annotations

import copy
import hashlib
import json
import math
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError
from yaml.composer import ComposerError

from orchestrator.errors import PlanError, Problem
from orchestrator.plan.base import CrossFieldError
from orchestrator.plan.experiment import (
    ARM_NAMES,
    SECTION_TYPES,
    Plan,
    arm_names_problem,
    cross_check,
    swept_arms,
)
from orchestrator.plan.sources import (
    DataFileError,
    open_regular,
    read_bounded,
    session_stats,
    source_stats,
)

SCHEMA_VERSION = 1

# Bounds of what the loader reads: a plan is a page of YAML, never megabytes, never a structure
# dozens of levels deep. Anchors and aliases are refused outright (no plan needs them and an
# alias bomb expands exponentially); so a plan costs time and memory in proportion to its bytes.
MAX_PLAN_BYTES = 1 << 20  # 1 MiB
MAX_DEPTH = 32  # nesting of mappings and lists
MAX_PROBLEMS = 200  # one error report, not an unbounded flood
_RELAX_PASSES = 3  # re-validations with the wrong fields left out (problems they hid)


def load_plan_file(path: str | Path) -> Plan:
    """Read and validate a plan file; raises PlanError (or UserError if it cannot be read)."""
    p = Path(path)
    try:
        with open_regular(p) as f:  # a FIFO, device or /proc file is refused, never read
            raw = f.read(MAX_PLAN_BYTES + 1)
    except DataFileError as e:
        raise PlanError([Problem(str(p), f"cannot read the plan: {e}")]) from None
    except OSError as e:
        raise PlanError([Problem(str(p), f"cannot read the plan: {e.strerror or e}")]) from None
    if len(raw) > MAX_PLAN_BYTES:
        raise PlanError([Problem(str(p), f"the plan is larger than {MAX_PLAN_BYTES} bytes; a plan is a page of YAML")])
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise PlanError([Problem(str(p), f"not UTF-8 text (byte {e.start}); a plan is a YAML or JSON text file", line)]) from None
    plan = load_plan_text(text, source=str(p))
    problems = _named_files_problems(plan)
    if problems:
        raise PlanError(problems)
    return plan


def _named_files_problems(plan: Plan) -> list[Problem]:
    """The files a plan names, read and checked now (a plan file is the user's: its data must
    be there), not after engines are deployed: a data source's records, a tokenizer file."""
    out: list[Problem] = []
    src, tok = plan.workload.source, plan.workload.tokenizer
    if src is not None:
        try:
            session_stats(src) if plan.workload.sessions is not None else source_stats(src)
        except DataFileError as e:
            out.append(Problem("workload.source.path", str(e)))
    if tok is not None and tok.file is not None:
        from tokenizers import Tokenizer  # only for a plan that names a tokenizer file

        try:
            Tokenizer.from_str(read_bounded(tok.file).decode("utf-8", errors="replace"))
        except DataFileError as e:
            out.append(Problem("workload.tokenizer.file", str(e)))
        except Exception as e:  # noqa: BLE001 - the tokenizers library raises its own type
            out.append(Problem("workload.tokenizer.file", f"{tok.file} is not a tokenizer.json the tokenizers "
                                                          f"library loads: {str(e).splitlines()[0][:200]}"))
    return out


class _PlanLoader(yaml.SafeLoader):
    """SafeLoader that refuses anchors and aliases and nesting beyond MAX_DEPTH, before it
    builds anything: the composed tree is never larger than the text."""

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise ComposerError(
                None, None, "anchors and aliases (&name, *name, <<) are not allowed in a plan; write the values out",
                event.start_mark,
            )
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise ComposerError(
                None, None, f"nested deeper than {MAX_DEPTH} levels; a plan is not that deep", event.start_mark
            )
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _parse(text: str) -> tuple[Any, yaml.Node | None]:
    """The YAML document's data and its node tree; every failure is one PlanError."""
    if len(text) > MAX_PLAN_BYTES:
        raise PlanError([Problem("", f"the plan is larger than {MAX_PLAN_BYTES} characters; a plan is a page of YAML")])
    loader: _PlanLoader | None = None
    try:
        loader = _PlanLoader(text)  # the reader refuses control characters here
        root = loader.get_single_node()
        if root is not None:
            dupes = _duplicate_keys(root)
            if dupes:
                raise PlanError([_printable(d) for d in dupes])
        data = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        what = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise PlanError([Problem("", f"YAML syntax: {what}", line)]) from None
    except (ValueError, TypeError, OverflowError, RecursionError) as e:  # e.g. an int of 5000 digits
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise PlanError([Problem("", f"YAML value cannot be read: {msg[:200]}")]) from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, root


def _duplicate_keys(node: yaml.Node, prefix: tuple[str, ...] = ()) -> list[Problem]:
    """A key given twice in one mapping: YAML would keep the last silently; here it is an error."""
    out: list[Problem] = []
    if isinstance(node, yaml.MappingNode):
        first: dict[str, int] = {}
        for key, value in node.value:
            name = str(key.value)
            line = key.start_mark.line + 1
            if isinstance(key, yaml.ScalarNode) and name in first:
                out.append(Problem(".".join((*prefix, name)),
                                   f"duplicate key: given on line {first[name]} and again on line {line}", line))
            elif isinstance(key, yaml.ScalarNode):
                first[name] = line
            out.extend(_duplicate_keys(value, (*prefix, name)))
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            out.extend(_duplicate_keys(item, (*prefix, str(i))))
    return out


def load_plan_text(text: str, source: str = "<plan>") -> Plan:
    """Parse YAML (or JSON) text and validate it as a Plan."""
    data, root = _parse(text)
    if not isinstance(data, dict):
        raise PlanError([Problem("", f"{source}: a plan is a mapping of fields, got {type(data).__name__}")])
    if set(data) == {"schema_version", "plan"} and isinstance(data["plan"], dict):
        return validate_plan(data["plan"])  # a registration's canonical JSON is a plan file too
    return validate_plan(data, lines=_line_index(root))


def validate_plan(data: dict[str, Any], lines: dict[tuple[str, ...], int] | None = None) -> Plan:
    """Validate a plan given as data; every problem is collected into one PlanError.

    Problems a wrong field hides are found too: the plan is validated again with the wrong
    fields left out (an arm with an unknown key still has its decode TP checked against its
    prefill TP), and what that finds away from the fields left out is reported as well."""
    lines = lines or {}
    if not isinstance(data, dict):
        raise PlanError([Problem("", f"a plan is a mapping of fields, got {type(data).__name__}")])
    non_finite = _non_finite(data)
    plan, problems, bad = _check(data)
    if plan is not None and not non_finite:
        return plan
    inf_paths = {p.path for p in non_finite}
    problems = non_finite + [p for p in problems if p.path not in inf_paths]
    removed: list[tuple[str, ...]] = []
    current = data
    for _ in range(_RELAX_PASSES):
        locs = [loc for loc in bad if loc not in removed]
        if not locs:
            break
        current = copy.deepcopy(current)
        cut = [loc for loc in locs if _remove(current, loc)]
        if not cut:
            break
        removed.extend(cut)
        _plan, more, bad = _check(current)
        problems.extend(p for p in more if not _under_any(p.path, removed))
    raise PlanError(_dedupe([_printable(_with_line(p, lines)) for p in problems])[:MAX_PROBLEMS]) from None


def _printable(p: Problem) -> Problem:
    """A field path on one line: a key holding a newline or another control character (a
    mangled plan may have one) is shown escaped, so a problem stays one line."""
    if p.path.isprintable():
        return p
    return Problem(p.path.encode("unicode_escape").decode("ascii"), p.message, p.line)


def _check(data: dict[str, Any]) -> tuple[Plan | None, list[Problem], list[tuple[str, ...]]]:
    """(plan, [], []) or (None, problems, the locations of the fields found wrong)."""
    try:
        return Plan.model_validate(data), [], []
    except PlanError as e:  # only the cross-section checks failed
        return None, list(e.plan_problems), []
    except ValidationError as e:
        problems = _from_pydantic(e)
        # A field's own error (not a model's cross-field one: leaving the model out hides more).
        bad = [tuple(str(x) for x in err["loc"]) for err in e.errors()
               if err["loc"] and not isinstance((err.get("ctx") or {}).get("error"), CrossFieldError | PlanError)]
    problems.extend(_partial_cross_checks(data))
    swept = swept_arms(data)
    if swept is not None and swept[1]:
        # The sweep's problems stop the plan before its fields are checked: check them with arm A
        # standing in for every arm (whatever a bar compares), its problems said once, as A's.
        stand_in = {**data, "sweep": None, "arms": dict.fromkeys(ARM_NAMES, data["arms"].get("A"))}
        _plan, more, more_bad = _check(stand_in)
        problems.extend(p for p in more if p.path.startswith("arms.A.") or p.path.split(".")[0] != "arms")
        bad.extend(loc for loc in more_bad if loc[:1] != ("arms",))
    return None, problems, bad


def _remove(data: Any, loc: tuple[str, ...]) -> bool:
    """Delete the mapping key at ``loc`` (a pydantic location); False if it is not one."""
    node = data
    for part in loc[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    if isinstance(node, dict) and loc and loc[-1] in node:
        del node[loc[-1]]
        return True
    return False


def _under_any(path: str, removed: list[tuple[str, ...]]) -> bool:
    parts = tuple(path.split(".")) if path else ()
    return any(parts[: len(r)] == r for r in removed)


def _non_finite(data: Any, prefix: tuple[str, ...] = ()) -> list[Problem]:
    """inf and nan, wherever they are: no field of a plan means them (YAML .inf, JSON Infinity)."""
    out: list[Problem] = []
    stack: list[tuple[Any, tuple[str, ...]]] = [(data, prefix)]
    while stack:
        value, path = stack.pop()
        if isinstance(value, float) and not math.isfinite(value):
            out.append(Problem(".".join(path), f"{value} is not a number a plan may hold (finite values only)"))
        elif isinstance(value, dict):
            stack.extend((v, (*path, str(k))) for k, v in value.items())
        elif isinstance(value, list | tuple):
            stack.extend((v, (*path, str(i))) for i, v in enumerate(value))
    return sorted(out, key=lambda p: p.path)


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
            got = repr(err.get("input"))
            msg = f"{msg} (got {got[:80] + '...' if len(got) > 80 else got})"
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
    swept = swept_arms(data)
    if swept is not None:  # a sweep plan's arms are its expansion (None: its own problems say why)
        sections["arms"] = swept[0] if not swept[1] else None
    if isinstance(sections.get("arms"), dict) and arm_names_problem(sections["arms"]):
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
