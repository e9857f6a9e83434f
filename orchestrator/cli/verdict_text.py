"""A verdict as text for people: a summary per bar by default, every note in full with
`orch verdict --details`.

The summary says each kind of censored or dropped block once ("3 of 10 blocks censored: A
above the search's highest rate (blocks 1, 4, 7)"), the interval's first clause (what its ends
are), and the notes without what those lines already say; ``--details`` (and ``--json``) keep
the label, every block's reason and every note whole."""

from __future__ import annotations

import math
import re
from typing import Any

DETAILS_HINT = "`orch verdict {name} --details` prints every note, block and interval in full"


def block_list(blocks: list[int]) -> str:
    """``0-3, 5, 7, 8``: runs of three or more consecutive blocks as a range."""
    out: list[str] = []
    run: list[int] = []
    for b in sorted(blocks):
        if run and b == run[-1] + 1:
            run.append(b)
            continue
        out.extend(_run_text(run))
        run = [b]
    out.extend(_run_text(run))
    return ", ".join(out)


def _run_text(run: list[int]) -> list[str]:
    if len(run) >= 3:
        return [f"{run[0]}-{run[-1]}"]
    return [str(b) for b in run]


def censoring_cause(why: str) -> str:
    """What a censored block's reason says about its arms, without its numbers: "A above the
    search's highest rate" (and the other arm's, joined by "and"); the reason's first clause
    when no arm has an interval ("both arms at 0 (no passing rate)")."""
    causes = [m.group(1) for part in why.split("; ") if (m := re.match(r"(.+?): in \[", part))]
    return " and ".join(causes) if causes else why.split(": ")[0]


def _grouped(items: list[dict[str, Any]], key: Any) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for item in items:
        groups.setdefault(key(item["why"]), []).append(int(item["block"]))
    return groups


def _plural(n: int) -> str:
    return "block" if n == 1 else "blocks"


def summary_note(note: str) -> str:
    """A note without the per-block reasons (the censored lines say them) and with Holm's
    statement down to its family (the levels each test ran at: ``--details``)."""
    parts: list[str] = []
    for part in note.split("; "):
        # a block's reason: "block 2: A ...: in [lo, hi]; B ...: in [lo, hi]; B/A in [lo, hi]"
        if not part or re.match(r"block \d+: ", part) or re.search(r"(: |^\S+/\S+ )in \[", part):
            continue
        if part.startswith("Holm-adjusted over"):
            part = part.split(": ")[0]
        if part not in parts:
            parts.append(part)
    return "; ".join(parts)


def _pct(x: float) -> str:
    return f"{100 * math.expm1(x):+.2f}%"


def rule_lines(v: dict[str, Any]) -> list[str]:
    """The verdict's rule in words (issue 31): its estimand, the carry-over estimate, a
    sequential stop and the attempts voided per arm (stored with the verdict's evidence)."""
    out = []
    if v.get("estimand"):
        floor = f"; the search's resolution {_pct(v['resolution'])} on each end" if v.get("resolution") else ""
        out.append(f"    estimand: the {v['estimand']}{floor}")
    co = v.get("carryover")
    if co and co.get("estimate") is not None:
        if co.get("lower") is None:
            out.append(f"    carry-over: order effect {_pct(co['estimate'])} (not estimable: fewer than 2 blocks each way)")
        else:
            out.append(f"    carry-over: order effect {_pct(co['estimate'])} ({_pct(co['lower'])}..{_pct(co['upper'])}; "
                       f"bound +-{100 * math.expm1(co['bound']):.2g}%{': EXCEEDED' if co.get('exceeds') else ''})")
    seq = v.get("sequential")
    if seq:
        saved = seq.get("gpu_hours_saved")
        what = (f"stopped at look {seq['look']} of {seq['looks']}: {seq['blocks']} of {seq['planned']} blocks run"
                + (f", {saved:.2f} GPU-hours saved" if saved is not None else "")) if seq.get("stopped") else \
            f"look {seq['look']} of {seq['looks']} at {seq['blocks']} of {seq['planned']} blocks ({seq['spending']})"
        out.append(f"    sequential: {what}")
    voided = {a: n for a, n in (v.get("voided_attempts") or {}).items() if n}
    if voided:
        out.append("    voided attempts (retried or block left out): "
                   + ", ".join(f"{a} {n}" for a, n in sorted(voided.items())))
    return out


def verdict_lines(v: dict[str, Any], details: bool = False, rate_unit: str = "req/s") -> list[str]:
    """A verdict as lines: the estimate against the bar, what the interval is, the blocks used,
    the censored and dropped blocks (each kind once, or each block with ``details``), the notes."""
    est = "-" if v["estimate"] is None else f"{v['estimate']:.3f}"
    cmp_ = ">=" if v["direction"] == "at_least" else "<="
    what = v["metric"] + (f" at {v['rate']:g} {rate_unit}" if v.get("rate") is not None else "")
    what += f" at {v['users']} users" if v.get("users") is not None else ""
    lines = [f"  {v['bar']}: {v['verdict']}  {v.get('compare') or 'B/A'} {what} [{v['class']}] = {est} over "
             f"{v['blocks']} block(s) (bar {cmp_} {v['threshold']:g}, confidence {v['confidence']:.0%})"]
    label = v["label"] if details else v["label"].split("; ")[0]
    lines.append(f"    interval: {label}")
    lines += rule_lines(v)
    used = v.get("blocks_used")
    censored, dropped = v.get("censored") or [], v.get("dropped") or []
    if used is not None:
        shown = ", ".join(str(b) for b in used) if details else block_list(list(used))
        lines.append("    blocks used: " + (shown or "none"))
    if details:
        lines += [f"    censored block {c['block']}: {c['why']}" for c in censored]
        lines += [f"    dropped block {d['block']}: {d['why']}" for d in dropped]
    else:
        of_used = len(used) if used is not None else v["blocks"]
        for cause, blocks in _grouped(censored, censoring_cause).items():
            lines.append(f"    {len(blocks)} of {of_used} {_plural(of_used)} censored: {cause} "
                         f"({_plural(len(blocks))} {block_list(blocks)})")
        planned = (len(used) if used is not None else v["blocks"]) + len(dropped)
        for why, blocks in _grouped(dropped, str).items():
            lines.append(f"    {len(blocks)} of {planned} planned {_plural(planned)} dropped: {why} "
                         f"({_plural(len(blocks))} {block_list(blocks)})")
    note = v["note"] if details else summary_note(v["note"] or "")
    if note:
        lines.append(f"    note: {note}")
    return lines
