"""Tables for people that fit the terminal: columns with priorities, long text folded.

At a terminal's width (80 columns and up) the columns of lowest priority leave first, long text
columns fold (wrap at spaces, a long word folded) down to a minimum width, never zero, and the
others keep their whole value. ``--wide`` (and output that is not a terminal: a pipe, a file)
shows every column unfolded; ``--json`` has every field. Every cell is literal text, never rich
markup: a workload signature ``[ab2c8965]`` is a style tag to rich.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rich.cells import cell_len

if TYPE_CHECKING:
    from rich.console import Console, JustifyMethod

# Each column costs its cells' padding (one space each side) and a rule; the table one rule more.
COLUMN_OVERHEAD = 3
TABLE_OVERHEAD = 1
# A word longer than this in a folding column is folded rather than widening the column's floor.
WORD_CAP = 16
# Below its floor (a terminal too narrow for the columns that always stay) a folding column
# still keeps this many columns: never zero.
NARROWEST = 4


@dataclass(frozen=True, slots=True)
class Column:
    """One column: ``priority`` 0 is always shown, higher numbers leave first on a narrow
    terminal; ``fold`` columns (long text) wrap down to ``min_width``, the others keep their
    whole value or leave."""

    header: str
    priority: int = 0
    justify: JustifyMethod = "left"
    fold: bool = False
    min_width: int = 10


@dataclass(frozen=True, slots=True)
class Fit:
    """The columns shown (indexes, in table order), the width of each, and the headers left out."""

    shown: tuple[int, ...]
    widths: tuple[int, ...]
    left_out: tuple[str, ...]


def natural_width(column: Column, cells: Sequence[str]) -> int:
    """The width that shows the header and every cell on one line."""
    return max([cell_len(column.header), *(cell_len(c) for c in cells)])


def narrowest(column: Column, cells: Sequence[str]) -> int:
    """A column's floor. Headers fold between words, so never below the header's longest word;
    a folding column goes down to ``min_width`` but keeps a cell's words whole up to
    ``WORD_CAP`` (a number, a shape like ``3P(TP1)+3D(TP1)``); any other keeps each cell whole."""
    header_word = max(cell_len(w) for w in column.header.split() or [""])
    if not column.fold:
        return max([header_word, *(cell_len(c) for c in cells)])
    cell_word = min(WORD_CAP, max([0, *(cell_len(w) for c in cells for w in c.split())]))
    return min(natural_width(column, cells), max(column.min_width, header_word, cell_word))


def table_width(widths: Sequence[int]) -> int:
    return sum(widths) + COLUMN_OVERHEAD * len(widths) + TABLE_OVERHEAD


def fit_columns(columns: Sequence[Column], rows: Sequence[Sequence[str]], width: int) -> Fit:
    """Choose the columns and their widths for a terminal ``width`` columns wide: columns join
    by priority (then table order) while their floors fit, the first that does not and every
    column after it leave (priority 0 always stays); the room left widens the folding columns,
    the one furthest from its whole value first. On a terminal too narrow for the priority-0
    columns the folding ones shrink below their floors, to ``NARROWEST`` at the least."""
    cells = [[str(r[i]) for r in rows] for i in range(len(columns))]
    floors = [narrowest(c, cells[i]) for i, c in enumerate(columns)]
    naturals = [natural_width(c, cells[i]) for i, c in enumerate(columns)]
    order = sorted(range(len(columns)), key=lambda i: (columns[i].priority, i))
    kept: list[int] = []
    used = TABLE_OVERHEAD
    for i in order:
        need = floors[i] + COLUMN_OVERHEAD
        if columns[i].priority > 0 and used + need > width:
            break
        kept.append(i)
        used += need
    kept.sort()
    widths = {i: floors[i] for i in kept}
    spare = width - used
    while spare < 0:  # the columns that always stay are wider than a very narrow terminal
        folding = [i for i in kept if columns[i].fold and widths[i] > NARROWEST]
        if not folding:
            break
        widths[max(folding, key=lambda i: widths[i])] -= 1
        spare += 1
    while spare > 0:
        short = [i for i in kept if columns[i].fold and widths[i] < naturals[i]]
        if not short:
            break
        widest_gap = max(short, key=lambda i: naturals[i] - widths[i])
        widths[widest_gap] += 1
        spare -= 1
    left_out = tuple(columns[i].header for i in range(len(columns)) if i not in widths)
    return Fit(tuple(kept), tuple(widths[i] for i in kept), left_out)


def full_fit(columns: Sequence[Column], rows: Sequence[Sequence[str]]) -> Fit:
    """Every column at its whole width (``--wide``, and output that is not a terminal)."""
    return Fit(tuple(range(len(columns))),
               tuple(natural_width(c, [str(r[i]) for r in rows]) for i, c in enumerate(columns)), ())


def print_table(title: str, columns: Sequence[Column], rows: Sequence[Sequence[object] | None], *,
                wide: bool = False, console: Console | None = None) -> Fit:
    """Print a table of literal text; a ``None`` row starts a new section (a rule). On a terminal
    (unless ``wide``) it fits the terminal's width and says which columns it left out."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = console or Console(highlight=False)
    data = [[str(c) for c in r] for r in rows if r is not None]
    fitted = console.is_terminal and not wide
    fit = fit_columns(columns, data, console.width) if fitted else full_fit(columns, data)
    if not fitted:  # as wide as the table: the lines are the table's, not the console's guess
        console = Console(width=max(table_width(fit.widths), cell_len(title), 80), highlight=False,
                          file=console.file)
    table = Table(title=Text(title), title_justify="left", header_style="bold")
    for i, w in zip(fit.shown, fit.widths, strict=True):
        table.add_column(Text(columns[i].header), justify=columns[i].justify, width=w, overflow="fold")
    first = True
    for r in rows:
        if r is None:
            if not first:
                table.add_section()
            continue
        first = False
        table.add_row(*(Text(str(r[i]), no_wrap=not columns[i].fold, overflow="fold") for i in fit.shown))
    console.print(table)
    if fit.left_out:
        console.print(Text(f"not shown at {console.width} columns: {', '.join(fit.left_out)} "
                           "(--wide shows every column; --json has every field)"))
    return fit
