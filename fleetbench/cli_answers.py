"""How both command lines give a question's answer: the exit statuses a script or a CI gate
reads, the options every question takes, and consoles and tables that never cut a number
nor show a control character of what others wrote."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.console import Console
from rich.measure import Measurement
from rich.segment import Segments
from rich.table import Table
from rich.text import Text

from fleetbench.printable import printable
from fleetbench.version import VERSION

__all__ = [
    "ANSWERED_EXIT",
    "HOLD_EXIT",
    "NO_ANSWER_EXIT",
    "UNKNOWN_EXIT",
    "USAGE_EXIT",
    "JsonOption",
    "ModelOption",
    "console",
    "exit_status_help",
    "print_table",
    "version_option",
]

# The exit statuses of `placement`, `capacity` and `compare` on either command line.
ANSWERED_EXIT = 0  # an answer; compare's: go
HOLD_EXIT = 1  # compare: the new build is slower on a hardware class
USAGE_EXIT = 2  # click's for a usage error; also a model no run has (the registry's 404)
UNKNOWN_EXIT = 3  # compare: not known yet (too few runs, a build no node ran)
# No answer: the registry unreachable, a token refused, a 5xx (the database, for
# `fleetbench-registry`). Not 1: a gate must not read an outage as a verdict.
NO_ANSWER_EXIT = 4

ModelOption = Annotated[str, typer.Option(help="display name or GGUF sha256")]


def version_option(program: str) -> Any:
    """`--version`: prints `program VERSION` and exits, before any command runs."""

    def show(asked: bool) -> None:
        if asked:
            typer.echo(f"{program} {VERSION}")
            raise typer.Exit

    return typer.Option("--version", callback=show, is_eager=True, help="print the version")


JsonOption = Annotated[bool, typer.Option("--json", help="print the answer as JSON")]


def exit_status_help(answered: str, no_answer: str) -> str:
    """A question's exit statuses, for its help: `answered` says what its answers exit with,
    `no_answer` what keeps it from answering."""
    return (
        f"Exit status: {answered}; {USAGE_EXIT} a usage error, or no model by that name; "
        f"{NO_ANSWER_EXIT} no answer ({no_answer})."
    )


# Rich lays out for 80 columns when it is not on a terminal and cuts cells to fit ("133.…");
# in a pipe or a log a table is as wide as its contents instead (tables never stretch).
_PIPE_WIDTH = 1000
_UNBOUNDED = 1_000_000


class _EscapingConsole(Console):
    """A console that shows the control characters of every string it is given escaped
    (fleetbench.printable): a GPU name, a registry's error or a plan's name, all written by
    others, never clear the screen, recolour it or forge a line. Its own styles are
    segments, not strings, and still apply."""

    def render_str(self, text: str, **options: Any) -> Text:
        return super().render_str(printable(text), **options)


def console(*, stderr: bool = False) -> Console:
    """A console as wide as the terminal, or, in a pipe or a log, as what it prints, that
    shows each string it prints on the lines it takes, its control characters escaped
    (print multi-line text a line at a time). No markup: what it prints (a model name, an
    engine's error, `fleetbench[llama]`) is shown as written, never read as style tags."""
    terminal = _EscapingConsole(stderr=stderr, markup=False)
    if terminal.is_terminal:
        return terminal
    return _EscapingConsole(stderr=stderr, width=_PIPE_WIDTH, markup=False)


def print_table(out: Console, table: Table) -> None:
    """Prints `table` with no number cut or split, at any width. Its columns are no_wrap but
    one at most, its free text, which wraps between words (overflow="fold" for a longer
    word). Rich squeezes a table to the console and, short of room, cuts every column with
    an ellipsis; here the table is laid out at least as wide as its no_wrap columns and the
    free text's longest word need, and where that is wider than the terminal its lines run
    on past the edge, where the terminal wraps them whole."""
    wrapping = [column for column in table.columns if not column.no_wrap]
    if len(wrapping) > 1:  # Rich narrows them all alike, cutting words of the narrowest
        raise ValueError(f"{len(wrapping)} columns wrap; one at most may")
    unbounded = out.options.update_width(_UNBOUNDED)
    needed = out.measure(table, options=unbounded).maximum
    for column in wrapping:
        cells = [Measurement.get(out, unbounded, cell) for cell in (column.header, *column.cells)]
        needed -= max(m.maximum for m in cells) - max(m.minimum for m in cells)
    width = max(out.width, needed)
    out.print(Segments(out.render(table, out.options.update_width(width))), crop=False)
