"""The build comparison as both command lines give it (`fleetbench-agent compare` over HTTP,
`fleetbench-registry compare` from the database): its options, its exit status, and the
answer as tables like llama.cpp's compare-llama-bench.py (from, to, the ratio) for the
terminal, as Markdown for a pull request or a ticket, or as JSON."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from fleetbench.cli_answers import (
    ANSWERED_EXIT,
    HOLD_EXIT,
    UNKNOWN_EXIT,
    exit_status_help,
    print_table,
)
from fleetbench.contract.answers import (
    COMPARE_METRIC_NAMES,
    CompareAnswer,
    CompareKind,
    CompareVerdict,
    PointRatio,
)
from fleetbench.printable import printable

__all__ = [
    "CLASS_COLUMNS",
    "POINT_COLUMNS",
    "CompareKindOption",
    "FromBuildOption",
    "MarkdownOption",
    "ToBuildOption",
    "check_one_format",
    "class_rows",
    "compare_help",
    "markdown",
    "point_rows",
    "print_compare",
    "verdict_exit",
]

FromBuildOption = Annotated[
    str, typer.Option(help="the build rolled out now: b4567, a commit, 0.3.16, a label")
]
ToBuildOption = Annotated[str, typer.Option(help="the build to roll out")]
CompareKindOption = Annotated[
    CompareKind,
    typer.Option(help="offline curves (S_TG, S_PP) or serving runs (TTFT p90, per-user p10)"),
]
MarkdownOption = Annotated[
    bool, typer.Option("--markdown", help="print Markdown, for a pull request or a ticket")
]

_VERDICT_EXITS: dict[CompareVerdict, int] = {
    "go": ANSWERED_EXIT,
    "hold": HOLD_EXIT,
    "unknown": UNKNOWN_EXIT,
}


def compare_help(no_answer: str) -> str:
    """The exit statuses of a `compare` that cannot answer for `no_answer`, for its help."""
    answered = (
        f"{ANSWERED_EXIT} go, {HOLD_EXIT} hold, {UNKNOWN_EXIT} unknown (too few runs, a build "
        "no node ran)"
    )
    return exit_status_help(answered, no_answer)


def verdict_exit(verdict: CompareVerdict) -> int:
    """A pipeline goes on go alone: it stops on hold, and on unknown, a typo's verdict too."""
    return _VERDICT_EXITS[verdict]


POINT_COLUMNS = ("node", "metric", "PP", "TG", "B", "from", "to", "ratio", "95% CI", "seen at")
CLASS_COLUMNS = ("hardware class", "verdict", "nodes", "why")


def _mark(point: PointRatio) -> str:
    """The ratio, flagged where the change is beyond what the runs tell from noise."""
    flag = ""
    if point.beyond_detection:
        flag = " worse" if point.worse_pct > 0 else " better"
    return f"{point.ratio:.3f}{flag}"


def point_rows(answer: CompareAnswer) -> list[tuple[str, ...]]:
    return [
        (
            node.node,
            COMPARE_METRIC_NAMES.get(p.metric, p.metric),
            str(p.pp),
            str(p.tg),
            str(p.b),
            _figure(p.metric, p.from_value),
            _figure(p.metric, p.to_value),
            _mark(p),
            f"{p.ratio_low:.3f}-{p.ratio_high:.3f}",
            f"{p.detectable_pct:.1f}%",
        )
        for node in answer.nodes
        for p in node.points
    ]


def _figure(metric: str, value: float) -> str:
    # joules per token run to thousandths on a GPU at a large B
    return f"{value:.4g}" if metric == "joules_per_token" else f"{value:.2f}"


def class_rows(answer: CompareAnswer) -> list[tuple[str, ...]]:
    return [
        (
            c.hardware_class,
            c.verdict,
            str(c.nodes_compared),
            c.reason
            + (f"; costs more energy: {c.efficiency}" if c.efficiency else "")
            # changed outputs hold the class and are its reason already
            + (f"; {c.outputs.reason}" if c.outputs and c.outputs.state != "changed" else ""),
        )
        for c in answer.classes
    ]


def _markdown_table(columns: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    escaped = [[printable(cell).replace("|", "\\|") for cell in row] for row in rows]
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in escaped]


def markdown(answer: CompareAnswer) -> str:
    """The verdict, each hardware class's and each point's ratio, as Markdown; what the
    registry and the nodes wrote in it on the lines it belongs to, its control characters
    escaped (fleetbench.printable)."""
    before = printable(", ".join(answer.from_builds) or answer.from_build)
    after = printable(", ".join(answer.to_builds) or answer.to_build)
    lines = [
        f"## {printable(answer.model)}: {before} -> {after} ({answer.kind})",
        "",
        f"**Verdict: {answer.verdict}**: {printable(answer.reason)}",
        "",
        *_markdown_table(CLASS_COLUMNS, class_rows(answer)),
        "",
        *_markdown_table(POINT_COLUMNS, point_rows(answer)),
    ]
    if answer.nodes_compared > len(answer.nodes):
        lines += ["", f"The {len(answer.nodes)} worst of {answer.nodes_compared} nodes compared."]
    if answer.not_compared:
        lines += ["", "Not compared:", ""]
        lines += [f"- {printable(n.node)}: {printable(n.reason)}" for n in answer.not_compared]
    return "\n".join(lines) + "\n"


def _tables(answer: CompareAnswer) -> tuple[Table, Table]:
    """Each point's ratio (names and figures: no column wraps), then each hardware class's
    verdict and why (which wraps)."""
    points = Table()
    for header in POINT_COLUMNS[:2]:
        points.add_column(header, no_wrap=True)
    for header in POINT_COLUMNS[2:]:
        points.add_column(header, justify="right", no_wrap=True)
    for row in point_rows(answer):
        points.add_row(*row)
    classes = Table()
    for header in CLASS_COLUMNS[:-1]:
        classes.add_column(header, no_wrap=True)
    classes.add_column(CLASS_COLUMNS[-1], overflow="fold")
    for row in class_rows(answer):
        classes.add_row(*row)
    return points, classes


def check_one_format(*, as_json: bool, as_markdown: bool) -> None:
    """A usage error for both, before anything is asked."""
    if as_json and as_markdown:
        raise typer.BadParameter("give one of --json and --markdown", param_hint="--markdown")


def print_compare(out: Console, answer: CompareAnswer, *, as_json: bool, as_markdown: bool) -> None:
    """The answer as JSON, as Markdown, or as tables: the points, the classes, then the
    nodes not compared and the verdict, each on one line (a log's reader greps them)."""
    if as_json:
        out.print_json(answer.model_dump_json())
    elif as_markdown:  # a line at a time: the console escapes a string's line breaks
        for line in markdown(answer).splitlines():
            out.out(line, highlight=False)
    else:
        for table in _tables(answer):
            print_table(out, table)
        for node in answer.not_compared:
            out.print(f"not compared: {node.node}: {node.reason}", soft_wrap=True)
        out.print(f"verdict: {answer.verdict}: {answer.reason}", soft_wrap=True)
