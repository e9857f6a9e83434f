"""Issue 32, item 3, the parts that are arithmetic: how a table's columns fit a width, how a
line folds, how a verdict is summarised. (The same, seen in a real 80-column terminal:
tests/e2e/test_terminal_width.py.)"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from orchestrator.cli.output import fold
from orchestrator.cli.tables import Column, fit_columns, print_table, table_width
from orchestrator.cli.verdict_text import block_list, censoring_cause, summary_note, verdict_lines

pytestmark = pytest.mark.unit

COLUMNS = (
    Column("name", 0, fold=True, min_width=8),
    Column("note", 2, fold=True, min_width=12),
    Column("value", 0, "right"),
    Column("when", 1),
)
ROWS = [["a configuration label with many words in it", "a long note that folds between its words", "1,234",
         "2026-12-06"]]


def test_every_column_at_its_whole_width_when_the_terminal_is_wide_enough() -> None:
    fit = fit_columns(COLUMNS, ROWS, 200)
    assert fit.shown == (0, 1, 2, 3) and fit.left_out == ()
    assert fit.widths == (len(ROWS[0][0]), len(ROWS[0][1]), 5, 10)


def test_columns_leave_by_priority_and_text_folds_never_to_zero() -> None:
    # floors: name 13 (its longest word), note 12, value 5 ("value"), when 10; each column 3 more,
    # the table 1
    fit = fit_columns(COLUMNS, ROWS, 40)
    assert fit.shown == (0, 2, 3) and fit.left_out == ("note",)
    assert table_width(fit.widths) == 40  # the room left widens the folding column
    assert fit.widths == (40 - 1 - 9 - 5 - 10, 5, 10)
    narrow = fit_columns(COLUMNS, ROWS, 20)  # below what priority 0 needs: the text column shrinks
    assert narrow.shown == (0, 2) and narrow.widths == (8, 5) and table_width(narrow.widths) == 20
    assert narrow.left_out == ("note", "when")
    assert fit_columns(COLUMNS, ROWS, 5).widths == (4, 5)  # never below 4


def test_a_words_and_headers_floor() -> None:
    cols = (Column("tok/s per copy", 0, fold=True, min_width=4), Column("x", 0, fold=True, min_width=4))
    fit = fit_columns(cols, [["(950-1,050) more", "a-word-longer-than-sixteen-columns"]], 34)  # no room left
    # a number stays whole (11 wide); a header folds between its words; a word past 16 folds
    assert fit.widths == (11, 16)


def test_a_fitted_table_prints_within_its_width_and_names_what_it_left_out() -> None:
    out = io.StringIO()
    console = Console(file=out, width=40, force_terminal=True, color_system=None, highlight=False)
    print_table("title [bold]", COLUMNS, [*ROWS, None, ROWS[0]], console=console)
    lines = out.getvalue().splitlines()
    assert all(len(line) <= 40 for line in lines), lines
    text = " ".join(out.getvalue().split())
    assert "title [bold]" in text and "not shown at 40 columns: note" in text


def test_wide_keeps_every_column_unfolded() -> None:
    out = io.StringIO()
    console = Console(file=out, width=40, force_terminal=True, color_system=None, highlight=False)
    print_table("t", COLUMNS, ROWS, console=console, wide=True)
    assert ROWS[0][0] in out.getvalue() and ROWS[0][1] in out.getvalue() and "not shown" not in out.getvalue()


def test_fold_breaks_between_words_and_indents_the_rest() -> None:
    line = "  block 3 arm B attempt 1: failed INVALID: guard failed at 4 req/s: generator_lag behind"
    rows = fold(line, 40).split("\n")
    assert all(len(r) <= 40 for r in rows) and rows[0].startswith("  block 3")
    assert all(r.startswith("    ") for r in rows[1:])
    assert " ".join(" ".join(rows).split()) == " ".join(line.split())
    assert fold("short", 40) == "short"


def test_block_lists_and_causes() -> None:
    assert block_list([0, 1, 2, 3, 5, 7, 8]) == "0-3, 5, 7, 8"
    assert block_list([]) == ""
    why = ("A above the search's highest rate: in [1200, inf]; B at the load generator's ceiling: in [900, inf]; "
           "B/A in [0, inf]")
    assert censoring_cause(why) == "A above the search's highest rate and B at the load generator's ceiling"
    assert censoring_cause("both arms at 0 (no passing rate): no ratio (0/0 is not 1)") == \
        "both arms at 0 (no passing rate)"


def test_summary_note_drops_per_block_reasons_and_holms_levels() -> None:
    note = ("a block's ratio is unbounded (censored or 0/0): no bound on the mean; block 0: A at x: in [1, inf]; "
            "B at x: in [2, inf]; B/A in [0, inf]; block 1: A at x: in [1, inf]; B/A in [0, 3]; "
            "Holm-adjusted over 2 bars at family level 95%: ACCEPT tested at "
            "97.5% (rank 1 of 2), REJECT at 95% (rank 2 of 2)")
    assert summary_note(note) == ("a block's ratio is unbounded (censored or 0/0): no bound on the mean; "
                                  "Holm-adjusted over 2 bars at family level 95%")


def _verdict(censored: int, of: int) -> dict:
    why = "A above the search's highest rate: in [{0}, inf]; B/A in [0, {0}]"
    return {"bar": "win", "verdict": "INCONCLUSIVE", "compare": "B/A", "metric": "capacity", "rate": None,
            "class": "interactive", "estimate": 1.1, "direction": "at_least", "threshold": 1.05,
            "confidence": 0.95, "blocks": of, "blocks_used": list(range(of)),
            "label": "B/A 0.9..1.3: each end a one-sided 95% bound; skew-robust t bound",
            "note": f"{censored} block(s) censored or unconverged: judged as intervals",
            "censored": [{"block": b, "why": why.format(100 + b)} for b in range(0, 2 * censored, 2)],
            "dropped": [{"block": of, "why": "arm B: no valid run in 3 attempt(s)"},
                        {"block": of + 1, "why": "arm B: no valid run in 3 attempt(s)"}]}


def test_a_verdict_summary_says_each_kind_of_block_once() -> None:
    lines = verdict_lines(_verdict(3, 10))
    assert lines[1] == "    interval: B/A 0.9..1.3: each end a one-sided 95% bound"
    assert lines[2] == "    blocks used: 0-9"
    assert lines[3] == "    3 of 10 blocks censored: A above the search's highest rate (blocks 0, 2, 4)"
    assert lines[4] == "    2 of 12 planned blocks dropped: arm B: no valid run in 3 attempt(s) (blocks 10, 11)"
    assert len(lines) == 6 and lines[5].startswith("    note: 3 block(s) censored")
    full = verdict_lines(_verdict(3, 10), details=True)
    assert sum(line.startswith("    censored block ") for line in full) == 3
    assert sum(line.startswith("    dropped block ") for line in full) == 2
    assert "skew-robust t bound" in full[1] and "blocks used: 0, 1, 2, 3" in full[2]


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_say_folds_on_a_terminal_except_a_line_to_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    from orchestrator.cli import output

    out = _Tty()
    monkeypatch.setattr(output.sys, "stdout", out)
    monkeypatch.setenv("COLUMNS", "30")
    line = "export KUBECONFIG=/tmp/a/kubeconfig and more words past thirty"
    output.say(line)
    output.say(line, whole=True)
    rows = out.getvalue().splitlines()
    assert all(len(r) <= 30 for r in rows[:-1]) and len(rows) > 2
    assert rows[-1] == line


def test_the_capacity_history_keeps_its_key_columns_at_80_with_longer_values() -> None:
    """Longer history cells ("5 = 3 points + 2 censored" runs, a ">= 256" median) fold in
    their columns; at 80 columns the same columns stay."""
    from orchestrator.cli.capacity_cmd import HISTORY_COLUMNS

    row = ["interactive", "300/10 ms", "qwen3-8b", "H200 1P(TP1)+1D(TP1) kv=auto seqs=64 round_robin v0.32.0",
           "in 3000±900 / out 64 / prefix 0.2 / poisson [4eb7a79d]", "measured (local)",
           "5 = 3 points + 2 censored", ">= 256", "256-inf", "250-270", "3.0%", "2026-12-06"]
    fit = fit_columns(HISTORY_COLUMNS, [row], 80)
    assert [HISTORY_COLUMNS[i].header for i in fit.shown] == [
        "class", "configuration", "workload", "source", "runs", "median tok/s"]
    assert table_width(fit.widths) <= 80 and min(fit.widths) >= 6
