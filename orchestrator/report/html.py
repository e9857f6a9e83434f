"""The report page: one self-contained HTML file (inline CSS, no script, no network) that shows
the PNG figures written beside it."""

from __future__ import annotations

import json
from typing import Any

import jinja2
import yaml

TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Report: {{ e.name }}</title>
<style>
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1150px;
       color: #222; line-height: 1.4; padding: 0 1em; }
h1 { margin-bottom: 0.1em; } h2 { border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 2em; }
table { border-collapse: collapse; margin: 0.6em 0; font-size: 0.92em; }
th, td { border: 1px solid #ddd; padding: 0.25em 0.6em; text-align: left; vertical-align: top; }
th { background: #f3f3f3; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.ACCEPT { color: #1a7f1a; font-weight: bold; } .REJECT { color: #c62828; font-weight: bold; }
.INCONCLUSIVE { color: #d97706; font-weight: bold; } .NOT { color: #777; font-weight: bold; }
tr.fail td { background: #fdecea; } .valid { color: #1a7f1a; } .invalid { color: #c62828; font-weight: bold; }
img { max-width: 100%; border: 1px solid #eee; margin: 0.4em 0; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 0.85em; }
.meta td:first-child { color: #555; } .muted { color: #777; }
</style>
</head>
<body>
<h1>{{ e.name }}</h1>
<p class="muted">{{ e.plan.hypothesis or "no hypothesis given" }}</p>
<table class="meta" id="registration">
<tr><td>plan</td><td>{{ e.plan.name }}</td></tr>
<tr><td>registration</td><td>id {{ e.plan.registration_id }}, sha256 <code>{{ e.plan.sha256 }}</code></td></tr>
<tr><td>registered at</td><td>{{ e.plan.registered_at }} (UTC)</td></tr>
<tr><td>experiment</td><td>id {{ e.id }}, {{ e.status }}; started {{ e.started_at or "-" }}, finished {{ e.finished_at or "-" }}</td></tr>
</table>

<h2 id="verdict-section">Verdicts</h2>
{% if verdicts %}
<table id="verdicts">
<thead><tr><th>bar</th><th>metric</th><th>class</th><th>bar (ratio)</th><th>verdict</th><th>estimate</th>
<th>interval</th><th>confidence</th><th>blocks</th><th>blocks used, censored, dropped</th></tr></thead>
<tbody>
{% for v in verdicts %}
<tr data-bar="{{ v.bar }}"><td>{{ v.bar }}</td><td>{{ v.metric }}{% if v.rate %} at {{ v.rate }} {{ e.rate_unit }}{% endif %}</td>
<td>{{ v.class }}</td><td>{{ v.compare }} {{ ">=" if v.direction == "at_least" else "<=" }} {{ v.threshold }}</td>
<td class="{{ v.verdict.split()[0] }}">{{ v.verdict }}</td><td class="num">{{ f3(v.estimate) }}</td>
<td class="label">{{ v.label }}</td><td class="num">{{ "%.0f%%"|format(100 * v.confidence) }}</td>
<td class="num">{{ v.blocks }}</td>
<td><div class="used">used: {% if v.blocks_used is none %}not stored{% elif v.blocks_used %}{{ v.blocks_used|join(", ") }}{% else %}none{% endif %}</div>
{% for c in v.censored %}<div class="censored">censored block {{ c.block }}: {{ c.why }}</div>{% endfor %}
{% for d in v.dropped %}<div class="dropped">dropped block {{ d.block }}: {{ d.why }}</div>{% endfor %}
{% if v.note %}<div class="muted">{{ v.note }}</div>{% endif %}</td></tr>
{% endfor %}
</tbody>
</table>
<p class="muted">Estimate: geometric mean of the per-block ratios of the bar's two arms (B/A, or
the pair it names: C/A), each from the two arms' runs in one block. The interval column says
exactly what the interval is: each end's one-sided level (the two together are a two-sided
interval at twice the level minus one), Holm's adjustment over all the plan's bars when there are several, and the
censored blocks judged as intervals. Only blocks with a valid run of each arm count; a block
whose capacity is censored (below the search's lowest rate, above its highest, at the load
generator's ceiling) or unconverged is a bound, never a point.</p>
{% if images.verdicts %}<img src="{{ images.verdicts }}" alt="verdict intervals against the bars">{% endif %}
{% else %}
<p id="verdicts-none">The plan registered no bars: nothing was judged.</p>
{% endif %}

{% if sweep %}
<h2 id="sweep-section">Sweep effects</h2>
<p>Arms: {% for k, n in sweep.arms.items() %}{{ k }} {{ n }}{% if not loop.last %}, {% endif %}{% endfor %}
(A: every factor at its first level, the baseline).</p>
{% if sweep.get("design") %}<p id="sweep-design">Design: {{ sweep.design }}; effects by {{ sweep.method }}.</p>{% endif %}
<table id="sweep-effects">
<thead><tr><th>effect</th><th>class</th><th>contrast</th><th>capacity ratio</th><th>interval</th><th>blocks</th></tr></thead>
<tbody>
{% for x in sweep.effects %}
<tr><td>{{ "main effect" if x.kind == "main" else "interaction" }}</td><td>{{ x["class"] }}</td><td>{{ x.label }}</td>
<td class="num">{{ f3(x.ratio) }}</td>
<td>{% if x.lower is none %}none (fewer than 2 blocks){% else %}{{ f3(x.lower) }}..{{ f3(x.upper) }} ({{ "%.0f%%"|format(100 * x.confidence) }} two-sided){% endif %}</td>
<td class="num">{{ x.blocks }}</td></tr>
{% endfor %}
</tbody>
</table>
{% for x in sweep.left_out %}<div class="dropped">left out of [{{ x["class"] }}]: block {{ x.block }}: {{ x.why }}</div>{% endfor %}
<p class="muted">A main effect is the ratio of geometric mean capacities between a factor's level and its
first level, over the other factors' levels; an interaction is how much one factor's ratio changes with the
other's level (1: none). {% if sweep.get("design") %}Each is estimated within blocks (each block's arms against its
baseline, so the block effect cancels) by least squares, its interval Student's t on the fit's residual degrees of
freedom.{% else %}Each is a contrast of ln capacity within each block (the block effect cancels),
its interval Student's t over the blocks where every arm has a point capacity.{% endif %}</p>
{% endif %}

<h2>Capacity per run</h2>
<table id="capacities">
<thead><tr><th>run</th><th>block</th><th>arm</th><th>attempt</th><th>class</th><th>valid</th>
<th>capacity, tok/s</th><th>at, {{ e.rate_unit }}</th><th>attainment</th><th>points</th><th>censoring</th></tr></thead>
<tbody>
{% for c in capacities %}
<tr{% if not c.valid %} class="fail"{% endif %}><td>{{ c.run_id }}</td><td>{{ c.block }}</td><td>{{ c.arm }}</td>
<td>{{ c.attempt }}</td><td>{{ c["class"] }}</td><td>{{ "yes" if c.valid else "no" }}</td>
<td class="num">{{ f0(c.capacity_tok_s) }}</td><td class="num">{{ f3(c.at_rate) }}</td>
<td class="num">{{ f3(c.attainment) }}</td><td class="num">{{ c.points_used }}</td>
<td>{{ c.censoring }}</td></tr>
{% endfor %}
</tbody>
</table>

{% for cls in classes %}
<h2>Class {{ cls.name }} <span class="muted">(TTFT &le; {{ cls.ttft_ms }} ms, TPOT &le; {{ cls.tpot_ms }} ms)</span></h2>
{% if images.curves[cls.name] %}<img src="{{ images.curves[cls.name] }}" alt="attainment and goodput vs offered load, {{ cls.name }}">{% else %}<p>No load points were measured.</p>{% endif %}
{% if images.latency[cls.name] %}<img src="{{ images.latency[cls.name] }}" alt="TTFT and TPOT at capacity, {{ cls.name }}">{% else %}<p>No valid run reached a capacity at this class: no latency distribution to show.</p>{% endif %}
{% endfor %}

<h2>Validity of every run</h2>
<table id="runs">
<thead><tr><th>run</th><th>block</th><th>arm</th><th>attempt</th><th>status</th><th>valid</th><th>points</th>
<th>guards</th><th>failed guards (value vs threshold)</th></tr></thead>
<tbody>
{% for r in runs %}
<tr{% if not r.valid %} class="fail"{% endif %}><td>{{ r.run_id }}</td><td>{{ r.block }}</td><td>{{ r.arm }}</td>
<td>{{ r.attempt }}</td><td>{{ r.status }}</td>
<td class="{{ 'valid' if r.valid else 'invalid' }}">{{ "valid" if r.valid else "INVALID" }}{% if r.reason %}: {{ r.reason }}{% endif %}</td>
<td class="num">{{ r.points }}</td><td class="num">{{ r.guards_checked }}</td>
<td>{% for g in r.guards_failed %}<div>{{ g.guard }}: {{ f3(g.value) }} vs {{ f3(g.threshold) }}{% if g.offered_rate %} at {{ f3(g.offered_rate) }} {{ e.rate_unit }}{% endif %} &mdash; {{ g.detail }}</div>{% else %}none{% endfor %}</td></tr>
{% endfor %}
</tbody>
</table>
<details><summary>Every guard result ({{ guards|length }})</summary>
<table id="guards">
<thead><tr><th>run</th><th>guard</th><th>point</th><th>passed</th><th>value</th><th>threshold</th><th>detail</th></tr></thead>
<tbody>
{% for g in guards %}
<tr{% if not g.passed %} class="fail"{% endif %}><td>{{ g.run }}</td><td>{{ g.guard }}</td>
<td>{{ f3(g.offered_rate) + " " + e.rate_unit if g.offered_rate else "run" }}</td><td>{{ "yes" if g.passed else "NO" }}</td>
<td class="num">{{ f3(g.value) }}</td><td class="num">{{ f3(g.threshold) }}</td><td>{{ g.detail }}</td></tr>
{% endfor %}
</tbody>
</table>
</details>

<h2>Environment fingerprints</h2>
<table id="fingerprints">
<thead><tr><th>run</th><th>fingerprint</th></tr></thead>
<tbody>
{% for f in fingerprints %}
<tr><td>{{ f.run }}</td><td><pre>{{ dumps(f.fingerprint) }}</pre></td></tr>
{% endfor %}
</tbody>
</table>

<h2>Server metrics over time</h2>
{% if images.server %}<img src="{{ images.server }}" alt="requests running and waiting, KV cache use, prefix-cache hit rate">
{% else %}<p>No server metrics were scraped.</p>{% endif %}

<h2>The registered plan</h2>
<pre id="plan">{{ plan_yaml }}</pre>
</body>
</html>
"""


def _f3(x: Any) -> str:
    """Three significant figures; thousands with separators; a dash for nothing."""
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.3g}"


def _f0(x: Any) -> str:
    return "-" if x is None else f"{x:,.0f}"


def render(doc: dict[str, Any], images: dict[str, Any], plan_doc: dict[str, Any], classes: list) -> str:
    """The page for a report document (summary.* rows) and the relative paths of its images."""
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    template = env.from_string(TEMPLATE)
    return template.render(
        e={"rate_unit": "req/s", **doc["experiment"]}, verdicts=doc["verdicts"], sweep=doc.get("sweep"),
        capacities=doc["capacities"],
        runs=doc["runs"], guards=doc["guards"], fingerprints=doc["fingerprints"], images=images,
        classes=classes, plan_yaml=yaml.safe_dump(plan_doc, sort_keys=False, width=100),
        f3=_f3, f0=_f0, dumps=lambda d: json.dumps(d, indent=1, sort_keys=True, default=str),
    )
