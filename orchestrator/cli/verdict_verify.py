"""`orch verdict --verify` and `--gate`: the verdicts judged again, never read on trust.

A stored ``bar_verdicts`` row is what some process wrote; the runtime role may write one (the
table is insert-only, not read-only). So `--gate` and `--verify` judge every bar again from the
stored records and the registered plan (``control.verdicts.recheck_verdicts``: the executor's
own judge), show and gate on the recomputed verdicts, and name each bar whose latest stored
verdict differs (exit 6, one line per bar, with ``VERIFY_EXIT`` of the digest check).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from orchestrator.plan import plan_from_canonical

if TYPE_CHECKING:
    from orchestrator.control.verdicts import BarOutcome
    from orchestrator.store import StoreLike


def recheck(store: StoreLike, doc: dict[str, Any], row_of: Callable[[BarOutcome], dict]) -> list[str]:
    """Replace ``doc``'s verdicts and gate code (``orch verdict``'s document) by the ones judged
    now (``row_of``: a verdict row of the document), add ``verdict_check``, and return one line
    per bar whose stored verdict is not what its records give."""
    from orchestrator.control.verdicts import gate_code, recheck_verdicts

    e = doc["experiment"]
    plan = plan_from_canonical(store.get_registration(e["registration_id"]).canonical_json)
    checks = recheck_verdicts(store, e["id"], plan)
    doc["verdicts"] = [row_of(c.judged) for c in checks]
    doc["gate_exit_code"] = gate_code([c.judged.judgement.verdict for c in checks], not e["complete"])
    differ = [c for c in checks if c.differs]
    doc["verdict_check"] = {"recomputed": True, "differ": [c.bar_id for c in differ],
                            "superseded": [c.bar_id for c in checks if c.superseded],
                            "bars": [c.to_dict() for c in checks]}
    return [c.line() for c in differ] + _sweep_differs(store, doc, plan, checks)


def _sweep_differs(store: StoreLike, doc: dict[str, Any], plan: Any, checks: list[Any]) -> list[str]:
    """A sweep's effects judged again from the stored capacities: one line per stored verdict
    (not superseded) whose effects are not what the records give; ``doc["sweep"]`` the effects
    judged now."""
    from orchestrator.control.effects import experiment_effects

    effects = experiment_effects(store, doc["experiment"]["id"], plan)
    if effects is None:
        return []
    doc["sweep"] = _plain(effects.to_dict())
    # each stored verdict against the resolution it was judged with (today's: computed above)
    by_rule: dict[float, Any] = {effects.resolution: doc["sweep"]}

    def again(stored: Any) -> Any:
        resolution = float((stored or {}).get("resolution", 0.0))
        if resolution not in by_rule:
            found = experiment_effects(store, doc["experiment"]["id"], plan, resolution=resolution)
            by_rule[resolution] = _plain(found.to_dict()) if found is not None else None
        return by_rule[resolution]

    return [f"bar {c.bar_id}: the sweep's effects stored with its verdict are not what its records give; "
            "the stored effects are not trusted"
            for c in checks if c.stored is not None and not c.superseded
            and _plain((c.stored.evidence or {}).get("sweep")) != again((c.stored.evidence or {}).get("sweep"))]


def _plain(doc: Any) -> Any:
    """A document as the store keeps it (JSON): floats rounded to 12 significant digits, so a
    database that rounds a double on the way does not count as a change."""
    if isinstance(doc, dict):
        return {str(k): _plain(v) for k, v in doc.items()}
    if isinstance(doc, list | tuple):
        return [_plain(v) for v in doc]
    if isinstance(doc, float):
        return float(f"{doc:.12g}")
    return doc
