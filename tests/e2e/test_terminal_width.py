"""Issue 32, item 3: what people read fits an 80-column terminal. Each command runs as a user
runs it, in a real pseudo-terminal 80 columns wide (``tests/support/terminal.py``): no line it
writes is wider than the terminal, no table column collapses (every value is on the screen,
folded if long), the columns left out are named (``--wide`` shows them, ``--json`` has every
field), `status --watch` redraws in place without leaving fragments, and `orch verdict` says
each kind of censored block once (``--details``: every block and note in full)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.store import Store
from tests.e2e.helpers import ROOT, run_virtual, small_plan
from tests.support.seeding import quickstart_plan, running_experiment
from tests.support.terminal import Terminal, orch_command

QUICKSTART = ROOT / "examples" / "quickstart.yaml"
# A table whose column rich squeezed to nothing draws two rules side by side.
COLLAPSED = re.compile("[│┃][│┃]|[┳┏][┳┓]|[╇┡][╇┩]|[┴└][┴┘]")


def _seed_history(url: str) -> None:
    """Capacities and load points of three configurations of quickstart's workload at class
    interactive: two measured (colocated, disaggregated), one simulated."""
    seeds = [("x", "local", "H200", "A", [600.0, 640.0, 700.0]), ("y", "local", "H200", "B", [900.0, 1100.0]),
             ("w", "sim", "H100", "A", [5000.0] * 3)]
    with Store.open(url) as store:
        for name, backend, gpu, arm, caps in seeds:
            plan = quickstart_plan(name, backend, gpu)
            exp = store.create_experiment(store.register_plan(plan).id)
            cfg = store.deployment_config(plan, arm)
            for block, cap in enumerate(caps):
                run = store.start_run(exp, arm, block, 0, 0, cfg)
                store.record_point(run, seq=0, window_start_s=0, window_end_s=10, offered_rate=3.0,
                                   throughput_tok_s=cap, percentiles={"tpot_s": {"p50": 0.008}}, valid=True)
                store.record_capacity(run, "interactive", cap, 3.0, 0.91, 6)
                store.finish_run(run, "done", valid=True, fingerprint={"engine_version": "v0.11.0"})


def _json(url: str, *args: str) -> dict:
    out = subprocess.run([*orch_command(*args), "--json"], env={**_env(url)}, cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def _env(url: str) -> dict[str, str]:
    import os

    env = {**os.environ, "ORCH_DATABASE_URL": url}
    for name in ("ORCH_DEBUG", "ORCH_GPU_PRICES"):
        env.pop(name, None)
    return env


def _in_terminal(url: str, *args: str, cols: int = 80) -> Terminal:
    term = Terminal(orch_command(*args), env=_env(url), cols=cols)
    try:
        code = term.finish(timeout=300)
    finally:
        term.close()
    assert code == 0, term.text
    return term


def _words_visible(screen: str, value: str) -> None:
    """Every word of ``value`` is on the screen (a folded cell splits a value between rows,
    a long word between rows too: compare without the table's rules and spaces)."""
    flat = re.sub(r"[\s│┃]", "", screen)
    for word in value.split():
        assert word in flat, f"{word!r} of {value!r} is not on the screen:\n{screen}"


@pytest.fixture
def history(sqlite_url: str) -> str:
    _seed_history(sqlite_url)
    return sqlite_url


def test_capacity_fits_80_columns_and_shows_every_kept_value(history: str) -> None:
    rows = _json(history, "capacity")["rows"]
    term = _in_terminal(history, "capacity")
    screen = "\n".join(term.display())
    assert term.long_lines() == [], term.text
    assert not COLLAPSED.search(screen), screen
    for r in rows:  # the configuration, workload and capacity of every group, whole or folded
        _words_visible(screen, r["label"])
        _words_visible(screen, f"{r['workload']} [{r['workload_sha256'][:8]}]")
        _words_visible(screen, f"{r['median']:,.0f}")
    for header in ("class", "configuration", "workload", "source", "runs"):
        assert header in screen, screen
    flat = " ".join(screen.split())
    assert "not shown at 80 columns: limits ttft/tpot, model, median interval, p25-p75, spread, last measured" in flat, screen
    assert "--wide shows every column" in flat


def test_capacity_wide_shows_every_column_unfolded(history: str) -> None:
    rows = _json(history, "capacity")["rows"]
    term = _in_terminal(history, "capacity", "--wide")
    text = term.text
    for header in ("limits ttft/tpot", "model", "p25-p75", "spread", "last measured"):
        assert header in text, text
    for r in rows:
        assert r["label"] in text  # on one line: nothing folded
    assert "not shown" not in text


def test_capacity_plan_and_pareto_fit_80_columns(history: str) -> None:
    plan_args = ("capacity", "plan", "--plan", str(QUICKSTART), "--class", "interactive", "--rate", "40")
    rows = _json(history, *plan_args)["rows"]
    assert rows
    term = _in_terminal(history, *plan_args)
    screen = "\n".join(term.display())
    assert term.long_lines() == [], term.text
    assert not COLLAPSED.search(screen), screen
    for r in rows:
        _words_visible(screen, r["label"])
    assert "USD/day" in screen and "deploy" in screen

    front = _json(history, "capacity", "--pareto")["rows"]
    assert front
    term = _in_terminal(history, "capacity", "--pareto")
    screen = "\n".join(term.display())
    assert term.long_lines() == [], term.text
    assert not COLLAPSED.search(screen), screen
    for r in front:
        _words_visible(screen, r["label"])
        _words_visible(screen, f"{r['tok_s_per_gpu']:,.0f}")


# -- orch status --watch ------------------------------------------------------------------------


def test_status_watch_redraws_in_place_without_fragments(sqlite_url: str) -> None:
    name = "watched-with-a-name-long-enough-to-matter"
    exp = running_experiment(sqlite_url, quickstart_plan("quick", "sim"), name)
    with Terminal(orch_command("status", "--watch", name, "--interval", "0.1"), env=_env(sqlite_url)) as term:
        term.wait_for_text("ETA")
        # Redrawn every poll: wait for many redraws (each writes the line again).
        term.wait_for(lambda t: t.text.count("ETA") >= 10, what="ten redraws")
        screen = term.display()
        # One progress line on the screen (folded between words, never cut by the terminal),
        # however many times it was drawn.
        assert sum(row.startswith(f"{name} (id {exp})") for row in screen) == 1, "\n".join(screen)
        assert len(screen) <= 3 and all(len(row) <= 80 for row in screen), "\n".join(screen)
        with Store.open(sqlite_url) as st:
            st.set_experiment_status(exp, "done")
        assert term.finish() == 0
        screen = term.display()
    # the live line is gone; the final status (and its runs) follows
    blocks = quickstart_plan("quick", "sim").design.blocks
    assert screen[0] == f"{name} (id {exp}): done, 1/{2 * blocks} valid runs", screen
    assert not any("ETA" in row for row in screen), screen


# -- the live display of orch run ---------------------------------------------------------------

LIVE_SCRIPT = """
import sys
from orchestrator.control.progress import AttainmentTally, RichProgress, SoFar
t = [0.0]
p = RichProgress(clock=lambda: t[0])
p.schedule(8, 3, 155.0, 12)
p.run_started(2, "B", 1)
t[0] = 432.0
p.point_started("1.5 req/s [interactive]", 155.0)
p.point_done("1.2 req/s [interactive]: attainment interactive 0.95, batch 1.00  [stopped early at 41.0 s: past capacity]")
p.point_started("1.5 req/s [interactive]", 155.0)
t[0] = 495.0
p.point_progress(SoFar(412, 900, (("interactive", 400), ("batch", 412))))
p.live.refresh()
sys.stdin.readline()
p.close()
"""


def test_the_live_display_of_a_run_fits_80_columns() -> None:
    """The display `orch run` shows on a terminal, driven with recorded events: its three
    lines (runs and ETA, the running point, the window so far) each fit on one row."""
    with Terminal([sys.executable, "-c", LIVE_SCRIPT]) as term:
        term.wait_for(lambda t: any(row.startswith(("window so far", "so far")) for row in t.display()),
                      what="the window-so-far line")
        screen = term.display()
        term.send(b"\n")
        assert term.finish() == 0
    # the event lines above it (printed as they came), then the display's three rows
    head, point, so_far = screen[-3:]
    assert head.startswith("runs 3/8") and "block 2 arm B" in head, screen
    assert point.startswith("point 1.5 req/s [interactive]: 63/155s [#") and point.endswith("]"), screen
    assert so_far.startswith(("window so far: 412/900", "so far: 412/900")), screen
    assert so_far.endswith("interactive 0.97, batch 1.00"), screen
    assert all(len(row) <= 80 for row in screen), screen


# -- orch verdict: summarised, --details in full -------------------------------------------------


def test_verdict_summarises_censored_blocks_and_details_prints_every_one(store, state, tmp_path: Path) -> None:
    """Every block censored at the generator's ceiling: the summary says it once for the four
    blocks; `--details` prints each block's reason and the whole note."""
    plan = small_plan(
        name="e2e-terminal-censored", design={"blocks": 4, "order": "ABBA", "seed": 11},
        bars=[{"id": "win", "metric": "capacity", "class": "standard", "at_least": 1.05, "confidence": 0.95}],
    )
    out = run_virtual(store, plan, state, generator_ceiling=1.5)
    (bar,) = out.bars
    assert sorted(bar.censored) == [0, 1, 2, 3], bar.censored
    url = f"sqlite:///{tmp_path / 'orch.sqlite'}"

    term = _in_terminal(url, "verdict", out.experiment_name)
    assert term.long_lines() == [], term.text
    text = " ".join(term.text.split())  # folded lines joined again
    assert "4 of 4 blocks censored: A at the load generator's ceiling and B at the load generator's ceiling " \
           "(blocks 0-3)" in text, term.text
    assert "censored block" not in text and "blocks used: 0-3" in text, term.text
    assert "in [" not in text, term.text  # no block's interval repeated in the note
    assert "note: a block's ratio is unbounded (censored or 0/0): no bound on the mean" in text, term.text
    assert f"`orch verdict {out.experiment_name} --details` prints every note" in text

    term = _in_terminal(url, "verdict", out.experiment_name, "--details")
    assert term.long_lines() == [], term.text
    text = " ".join(term.text.split())
    for block in range(4):
        assert f"censored block {block}: {bar.censored[block]}" in text, term.text
    assert f"interval: {bar.judgement.label}" in text and f"note: {bar.judgement.note}" in text, term.text


def test_status_lines_fold_between_words_at_80_columns(sqlite_url: str) -> None:
    """`orch status` and `orch status EXPERIMENT`: a failed run's reason runs long; on an
    80-column terminal each line folds between words (every word of it still shown), and
    piped output keeps each line whole."""
    reason = ("guard failed at 14.9 req/s: generator_lag (43.7 vs 25): p99 send lag 43.72 ms (bound 25.0 ms) "
              "over 13 requests")
    with Store.open(sqlite_url) as st:
        plan = quickstart_plan("quick", "sim")
        exp = st.create_experiment(st.register_plan(plan).id, name="folded-status")
        run = st.start_run(exp, "A", 0, 0, 0, st.deployment_config(plan, "A"))
        st.finish_run(run, "failed", False, invalid_reason=reason)
        st.set_experiment_status(exp, "failed")
    for args in (("status",), ("status", "folded-status")):
        term = _in_terminal(sqlite_url, *args)
        assert term.long_lines() == [], term.text
        assert reason in " ".join(term.text.split()), term.text
        piped = subprocess.run(orch_command(*args), env=_env(sqlite_url), cwd=ROOT, capture_output=True, text=True,
                               timeout=300)
        assert piped.returncode == 0 and any(line.endswith(reason) for line in piped.stdout.splitlines()), piped
