"""comparable history: capacities keyed by workload signature, class limits, backend and
simulated-or-measured; workload signatures; summaries per comparable group.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

DESIGN section 7: capacities are comparable only under the same configuration, workload
signature, class limits and backend kind; simulated and measured capacities are never pooled.

- ``workload_signatures``: one row per distinct workload (sha256 of its effective JSON, a
  readable summary, the values range filters use, the JSON itself).
- ``capacities`` gains the keys (``workload_sha256``, ``ttft_ms``, ``tpot_ms``, ``backend``,
  ``simulated``) and the observed fingerprint's ``observed_gpu`` and ``observed_engine``. They
  are copies like ``config_id``/``counted``/``measured_at`` (0003): not measured columns, so the
  append-only trigger of 0006 lets them be written on a finished run's capacities (this
  back-fill, and the repository's refresh), and no trigger is touched here. Plain ADD COLUMN
  (no batch rebuild on SQLite, which would drop 0006's triggers).
- ``capacity_summaries`` is rebuilt with the keys in its primary key ('' / 0 for an unknown
  key) and filled again, so existing history is split into comparable groups at once.

Back-fill: each capacity's keys come from its run's registration, read as plain JSON (no
orchestrator import: a revision keeps meaning what it meant): the workload section hashed as
canonical JSON (sort_keys, compact, null-valued keys left out: what
``orchestrator.plan.signature`` does to the effective dump a registration stores), the class's limits from the plan's ``classes``, the plan's
``backend``; ``simulated`` when the backend is sim or the run's engine version starts with
``sim-``. ``Store.rebuild_capacity_summaries`` derives the keys again with the plan language of
its day (after a change of the workload language).

Downgrade: summaries per (configuration, class) again (pooled, as before 0007), the columns and
the signature table dropped.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

BATCH = 5_000
JSON_DOC = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
NEW_COLUMNS = (
    ("workload_sha256", sa.String(64)), ("ttft_ms", sa.Double()), ("tpot_ms", sa.Double()),
    ("backend", sa.String(20)), ("simulated", sa.Boolean()), ("observed_gpu", sa.String(200)),
    ("observed_engine", sa.String(40)),
)
KEYS = ("workload_sha256", "ttft_ms", "tpot_ms", "backend", "simulated")
UNKNOWN: dict[str, Any] = {"workload_sha256": "", "ttft_ms": 0.0, "tpot_ms": 0.0, "backend": "", "simulated": False}
STATS = ("runs", "median", "p25", "p75", "min", "max", "last_measured")


def _quantile(sorted_values: list[float], q: float) -> float:
    pos = (len(sorted_values) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _g(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def _summary_values(doc: dict[str, Any]) -> dict[str, Any]:
    """Frozen copy of orchestrator.plan.signature.summary_values as of this revision."""
    prompts = doc.get("prompts") if isinstance(doc.get("prompts"), dict) else {}
    inp = prompts.get("input_tokens") if isinstance(prompts.get("input_tokens"), dict) else {}
    mean = _num(inp.get("mean"))
    sigma = _num(inp.get("sigma")) or 0.0
    dist = inp.get("dist", "fixed")
    sd: float | None = None
    if mean is not None:
        sd = {"lognormal": mean * sigma, "uniform": mean * sigma, "normal": sigma}.get(str(dist), 0.0)
    out = _num(doc.get("output_tokens"))
    prefix = _num(prompts.get("shared_prefix"))
    turns = _num(prompts.get("turns"))
    closed = doc.get("closed") if isinstance(doc.get("closed"), dict) else None
    arrival_doc = doc.get("arrival") if isinstance(doc.get("arrival"), dict) else {}
    if closed is not None:
        arrival = f"closed({closed.get('users')} users)"
    else:
        arrival = str(arrival_doc.get("process", "poisson"))
        burst = _num(arrival_doc.get("burstiness"))
        if arrival == "gamma" and burst is not None:
            arrival = f"gamma({_g(burst)})"
    parts = []
    if mean is not None:
        parts.append(f"in {_g(mean)}" + (f"±{_g(sd)}" if sd else ""))
    if out is not None:
        parts.append(f"out {_g(out)}")
    if prefix:
        parts.append(f"prefix {_g(prefix)}")
    if turns and turns > 1:
        parts.append(f"{_g(turns)} turns")
    parts.append(arrival)
    kind = doc.get("kind")
    if isinstance(kind, str) and kind:
        parts.insert(0, kind)
    return {"summary": " / ".join(parts)[:200], "input_mean": mean, "input_sd": sd, "output_tokens": out,
            "shared_prefix": prefix, "arrival": arrival[:40]}


def _without_nulls(v: Any) -> Any:
    """Frozen copy of orchestrator.plan.signature._without_nulls (null keys are not hashed)."""
    if isinstance(v, dict):
        return {k: _without_nulls(x) for k, x in v.items() if x is not None}
    if isinstance(v, list):
        return [_without_nulls(x) for x in v]
    return v


def _json(v: Any) -> Any:
    return json.loads(v) if isinstance(v, str) else v


def _registration_keys(text: str) -> tuple[dict[str, Any] | None, str, dict[str, tuple[float, float]]]:
    """(workload signature row or None, backend, class -> (ttft_ms, tpot_ms)) of a registration."""
    try:
        plan = json.loads(text).get("plan", {})
    except (ValueError, AttributeError):
        return None, "", {}
    limits: dict[str, tuple[float, float]] = {}
    for c in plan.get("classes") or []:
        if isinstance(c, dict) and {"name", "ttft_ms", "tpot_ms"} <= set(c):
            limits[str(c["name"])] = (float(c["ttft_ms"]), float(c["tpot_ms"]))
    workload = plan.get("workload")
    sig = None
    if isinstance(workload, dict):
        canonical = json.dumps(_without_nulls(workload), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        sig = {"sha256": hashlib.sha256(canonical.encode()).hexdigest(), "doc": workload,
               **_summary_values(workload)}
    return sig, str(plan.get("backend", "sim")), limits


def _observed(fp: Any, gpu_type: str | None, engine: str | None) -> tuple[str | None, str | None]:
    fp = _json(fp)
    products = fp.get("gpu_products") if isinstance(fp, dict) else None
    gpu = ",".join(str(p) for p in products) if isinstance(products, list) and products else gpu_type
    return (gpu[:200] if gpu else None), (engine[:40] if engine else None)


def _summaries_table(with_keys: bool) -> list[Any]:
    keys = [
        sa.Column("workload_sha256", sa.String(64), nullable=False),
        sa.Column("ttft_ms", sa.Double(), nullable=False),
        sa.Column("tpot_ms", sa.Double(), nullable=False),
        sa.Column("backend", sa.String(20), nullable=False),
        sa.Column("simulated", sa.Boolean(), nullable=False),
    ] if with_keys else []
    return [
        sa.Column("config_id", sa.BigInteger(), nullable=False),
        sa.Column("class_name", sa.String(length=60), nullable=False),
        *keys,
        sa.Column("runs", sa.Integer(), nullable=False),
        sa.Column("median", sa.Double(), nullable=False),
        sa.Column("p25", sa.Double(), nullable=False),
        sa.Column("p75", sa.Double(), nullable=False),
        sa.Column("min", sa.Double(), nullable=False),
        sa.Column("max", sa.Double(), nullable=False),
        sa.Column("last_measured", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(["config_id"], ["deployment_configs.id"],
                                name=op.f("fk_capacity_summaries_config_id_deployment_configs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("config_id", "class_name", *(KEYS if with_keys else ()),
                                name=op.f("pk_capacity_summaries")),
    ]


def _fill_summaries(table: Any, with_keys: bool) -> None:
    keys = ", ".join(f"c.{k}" for k in KEYS) + ", " if with_keys else ""
    rows = op.get_bind().execute(sa.text(
        f"SELECT r.config_id, c.class_name, {keys}c.capacity, r.finished_at FROM capacities c "
        "JOIN runs r ON r.id = c.run_id WHERE r.valid AND r.status = 'done' "
        "AND c.censored IS NULL AND c.converged"
    ))
    groups: dict[tuple[Any, ...], list[tuple[float, Any]]] = defaultdict(list)
    n = len(KEYS) if with_keys else 0
    for row in rows:
        finished_at = row[-1]
        if isinstance(finished_at, str):  # SQLite hands timestamps back as text (naive UTC)
            finished_at = datetime.fromisoformat(finished_at)
        key = (row[0], row[1], *(UNKNOWN[k] if v is None else v for k, v in zip(KEYS[:n], row[2:2 + n], strict=True)))
        groups[key].append((row[-2], finished_at))
    out = []
    for key, items in groups.items():
        values = sorted(v for v, _ in items)
        stamps = [t for _, t in items if t is not None]
        out.append({
            "config_id": key[0], "class_name": key[1], **dict(zip(KEYS[:n], key[2:], strict=True)),
            "runs": len(values), "median": _quantile(values, 0.5), "p25": _quantile(values, 0.25),
            "p75": _quantile(values, 0.75), "min": values[0], "max": values[-1],
            "last_measured": max(stamps) if stamps else None,
        })
    for start in range(0, len(out), BATCH):
        op.bulk_insert(table, out[start : start + BATCH])


def upgrade() -> None:
    bind = op.get_bind()
    signatures = op.create_table(
        "workload_signatures",
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("summary", sa.String(200), nullable=False),
        sa.Column("input_mean", sa.Double(), nullable=True),
        sa.Column("input_sd", sa.Double(), nullable=True),
        sa.Column("output_tokens", sa.Double(), nullable=True),
        sa.Column("shared_prefix", sa.Double(), nullable=True),
        sa.Column("arrival", sa.String(40), nullable=False),
        sa.Column("doc", JSON_DOC, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("sha256", name=op.f("pk_workload_signatures")),
    )
    for name, type_ in NEW_COLUMNS:
        op.add_column("capacities", sa.Column(name, type_, nullable=True))
    op.drop_table("capacity_summaries")
    summaries = op.create_table("capacity_summaries", *_summaries_table(with_keys=True))

    # back-fill the keys of every capacity from its run's registration and fingerprint
    by_reg = {rid: _registration_keys(text) for rid, text in
              bind.execute(sa.text("SELECT id, canonical_json FROM plan_registrations"))}
    now = datetime.now(UTC)
    if bind.dialect.name == "sqlite":  # stored as naive UTC text there (as the models do)
        now = now.replace(tzinfo=None)
    seen: dict[str, dict[str, Any]] = {}
    for sig, _, _ in by_reg.values():
        if sig is not None and sig["sha256"] not in seen:
            seen[sig["sha256"]] = {**sig, "created_at": now}
    if seen:
        op.bulk_insert(signatures, list(seen.values()))
    groups: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for run_id, reg_id, fp, gpu_type, engine in bind.execute(sa.text(
        "SELECT r.id, e.registration_id, r.fingerprint, r.gpu_type, r.engine_version FROM runs r "
        "JOIN experiments e ON e.id = r.experiment_id"
    )):
        groups[(reg_id, *_observed(fp, gpu_type, engine))].append(run_id)
    for (reg_id, gpu, engine), run_ids in groups.items():
        sig, backend, limits = by_reg[reg_id]
        simulated = backend == "sim" or bool(engine and engine.startswith("sim-"))
        params: dict[str, Any] = {"w": sig["sha256"] if sig else None, "b": backend or None, "s": simulated,
                                  "g": gpu, "e": engine}
        cases = []
        for which, col in ((0, "ttft_ms"), (1, "tpot_ms")):
            whens = []
            for i, (name, lim) in enumerate(sorted(limits.items())):
                params[f"n{which}_{i}"], params[f"v{which}_{i}"] = name, lim[which]
                whens.append(f"WHEN :n{which}_{i} THEN :v{which}_{i}")
            cases.append(f"{col} = CASE class_name {' '.join(whens)} ELSE NULL END" if whens else f"{col} = NULL")
        sql = sa.text(
            "UPDATE capacities SET workload_sha256 = :w, backend = :b, simulated = :s, observed_gpu = :g, "
            f"observed_engine = :e, {', '.join(cases)} WHERE run_id IN :ids"
        ).bindparams(sa.bindparam("ids", expanding=True))
        for start in range(0, len(run_ids), BATCH):
            bind.execute(sql, {**params, "ids": run_ids[start : start + BATCH]})
    _fill_summaries(summaries, with_keys=True)


def downgrade() -> None:
    op.drop_table("capacity_summaries")
    summaries = op.create_table("capacity_summaries", *_summaries_table(with_keys=False))
    _fill_summaries(summaries, with_keys=False)
    # not batch mode: rebuilding capacities on SQLite would drop 0006's triggers
    for name, _ in reversed(NEW_COLUMNS):
        op.execute(f"ALTER TABLE capacities DROP COLUMN {name}")
    op.drop_table("workload_signatures")
