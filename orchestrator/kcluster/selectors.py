"""Label and field selectors, and resource quantities, read the way the API server reads them."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

Labels = Mapping[str, str]

_SET_TERM = re.compile(r"^\s*([^\s!=]+)\s+(in|notin)\s+\((.*)\)\s*$")


def _split_terms(selector: str) -> list[str]:
    """Top-level comma split (commas inside ``in (a,b)`` stay)."""
    out, depth, cur = [], 0, ""
    for ch in selector:
        depth += ch == "("
        depth -= ch == ")"
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    return [t.strip() for t in [*out, cur] if t.strip()]


def parse_label_selector(selector: str) -> Callable[[Labels], bool]:
    """A predicate for ``selector``: ``a=b``, ``a==b``, ``a!=b``, ``a in (x,y)``, ``a notin (x)``,
    ``a`` (exists), ``!a`` (does not exist); terms joined by commas. ValueError if malformed
    (the API server answers 400 then)."""
    checks: list[Callable[[Labels], bool]] = []
    for term in _split_terms(selector or ""):
        m = _SET_TERM.match(term)
        if m:
            key, op, raw = m.group(1), m.group(2), m.group(3)
            values = {v.strip() for v in raw.split(",") if v.strip()}
            if op == "in":
                checks.append(_check(lambda lb, k=key, vs=values: lb.get(k) in vs))
            else:
                checks.append(_check(lambda lb, k=key, vs=values: lb.get(k) not in vs))
        elif "!=" in term:
            key, value = (p.strip() for p in term.split("!=", 1))
            checks.append(_check(lambda lb, k=key, v=value: lb.get(k) != v))
        elif "=" in term:
            key, value = (p.strip() for p in term.replace("==", "=").split("=", 1))
            if not key:
                raise ValueError(f"invalid label selector term {term!r}")
            checks.append(_check(lambda lb, k=key, v=value: lb.get(k) == v))
        elif term.startswith("!"):
            key = term[1:].strip()
            checks.append(_check(lambda lb, k=key: k not in lb))
        elif re.fullmatch(r"[A-Za-z0-9._/-]+", term):
            checks.append(_check(lambda lb, k=term: k in lb))
        else:
            raise ValueError(f"invalid label selector term {term!r}")
    return lambda labels: all(c(labels or {}) for c in checks)


def matches_labels(labels: Labels | None, selector: str | None) -> bool:
    return parse_label_selector(selector or "")(labels or {})


def _path_get(obj: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = obj
    for part in dotted.split("."):
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


def parse_field_selector(selector: str) -> Callable[[Mapping[str, Any]], bool]:
    """``metadata.name=x,spec.nodeName!=y`` (equality only, as the API server supports)."""
    checks: list[Callable[[Mapping[str, Any]], bool]] = []
    for term in _split_terms(selector or ""):
        neg = "!=" in term
        key, value = (p.strip() for p in term.replace("==", "=").split("!=" if neg else "=", 1))

        def check(obj: Mapping[str, Any], k: str = key, v: str = value, n: bool = neg) -> bool:
            got = _path_get(obj, k)
            got = "" if got is None else str(got)
            return (got != v) if n else (got == v)

        checks.append(check)
    return lambda obj: all(c(obj) for c in checks)


def match_label_selector_object(labels: Labels | None, sel: Mapping[str, Any] | None) -> bool:
    """A LabelSelector object (``matchLabels`` + ``matchExpressions``), as Services/Deployments use."""
    labels = labels or {}
    sel = sel or {}
    for k, v in (sel.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    return all(match_expression(labels, expr) for expr in sel.get("matchExpressions") or [])


def _check(fn: Callable[..., bool]) -> Callable[[Labels], bool]:
    """A selector term (typed once: lambdas with bound defaults defeat inference)."""
    return fn


def match_expression(labels: Labels, expr: Mapping[str, Any]) -> bool:
    """One NodeSelectorRequirement / LabelSelectorRequirement."""
    key, op, values = expr.get("key"), expr.get("operator"), list(expr.get("values") or [])
    has = key in labels
    value = labels.get(key) if isinstance(key, str) else None
    if op == "In":
        return has and value in values
    if op == "NotIn":
        return not has or value not in values
    if op == "Exists":
        return has
    if op == "DoesNotExist":
        return not has
    if op in ("Gt", "Lt"):
        try:
            a, b = int(value or ""), int(values[0])
        except (ValueError, IndexError):
            return False
        return a > b if op == "Gt" else a < b
    return False


# -- quantities -----------------------------------------------------------------------------

_SUFFIX = {
    "": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
    "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3, "Ti": 1024**4, "Pi": 1024**5, "Ei": 1024**6,
}


def quantity(value: Any) -> float:
    """``"500m"`` -> 0.5, ``"64Gi"`` -> 68719476736, ``2`` -> 2."""
    if value is None:
        return 0.0
    if isinstance(value, int | float):
        return float(value)
    m = re.fullmatch(r"\s*([0-9.]+(?:e[0-9]+)?)\s*([A-Za-z]*)\s*", str(value))
    if not m or m.group(2) not in _SUFFIX:
        raise ValueError(f"quantities must match the regular expression: {value!r}")
    return float(m.group(1)) * _SUFFIX[m.group(2)]
