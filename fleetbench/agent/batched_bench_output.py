"""Read llama-batched-bench output: its tables, settings line, build line and JSONL records.

Accepts what nodes and people actually have: the CLI's full 10-column table in every
spelling of its header (agent.batched_bench_table), the 6-column table pasted into reports
(or any subset of the columns that names PP, TG, B and a decode figure), several tables in
one markdown file or log with unrelated lines and other tools' tables in between (passed
over, each with why), a header with no rows after it (a failed run, with the error printed
after it), a log whose line breaks were lost, and `--output-format jsonl` records. Pure:
text in, `ParsedRun`s out.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from fleetbench.agent.batched_bench_build import BuildInfo, with_build
from fleetbench.agent.batched_bench_figures import derived_figures, with_kv_layout
from fleetbench.agent.batched_bench_table import Header, NotOurs, header_of, rows_of
from fleetbench.contract.bounds import storable_text
from fleetbench.contract.wire import ERROR_LENGTH, EngineBuild, Point, RunSettings

__all__ = [
    "BadRow",
    "BatchedBenchOutputError",
    "NoTableFound",
    "ParsedRun",
    "PassedOver",
    "parse_batched_bench_output",
]


class BatchedBenchOutputError(ValueError):
    """The text cannot be read as llama-batched-bench output."""


class NoTableFound(BatchedBenchOutputError):
    """The text holds no llama-batched-bench table or JSONL record."""


class BadRow(BatchedBenchOutputError):
    """A row or record of a table is not a valid measurement (the message names its line)."""


@dataclass
class ParsedRun:
    """One table (or one block of JSONL records sharing a configuration)."""

    line: int  # 1-based line where it starts, for messages
    format: str  # "table" or "jsonl"
    columns: list[str | None]  # None: a column read past (left_out)
    left_out: tuple[str, ...] = ()  # columns its author added, which fleetbench does not read
    settings: RunSettings = field(default_factory=RunSettings)
    engine: EngineBuild = field(default_factory=EngineBuild)
    points: list[Point] = field(default_factory=list)
    failure: str | None = None  # a header with no rows after it: why (the run crashed)


_INT_COLUMNS = {"pp", "tg", "b", "n_kv"}

_SETTINGS_LINE = re.compile(r"^(?:[\w.]+:\s*)?(n_kv_max\s*=.*)$")
_SETTINGS_INSIDE = re.compile(r"(?:^|\s)((?:[\w.]+:\s*)?n_kv_max\s*=[^|]*)$")
_SETTING = re.compile(r"(\w+)\s*=\s*(-?\d+)")
_FLASH_ATTN = {-1: "auto", 0: "off", 1: "on"}
# Lines that say a run died (ggml's asserts and aborts, CUDA's and the C++ runtime's errors,
# the shell's signals), not prose that mentions an error.
_CRASH = re.compile(
    r"GGML_ASSERT|ggml_abort|CUDA error|out of memory|segmentation fault|core dumped|"
    r"\baborted\b|\bkilled\b|terminate called|failed to \w+|\berror:",
    re.IGNORECASE,
)
CRASH_WITHIN_LINES = 20
MAX_SAID = 5  # passed-over tables named in the error when none is importable


@dataclass(frozen=True)
class PassedOver:
    """A table-like block that is not a llama-batched-bench table, and why."""

    line: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.reason}"


def parse_batched_bench_output(
    text: str,
    *,
    skipped: list[BadRow] | None = None,
    passed_over: list[PassedOver] | None = None,
) -> list[ParsedRun]:
    """Every run found in `text`, in order; a header printed with no rows after it (the run
    crashed) is a run without points whose `failure` says why. Raises `NoTableFound` when
    there is none, and `BadRow` for a row that is not a valid measurement or a header naming
    a column twice (a column its author added is read past: ParsedRun.left_out); with
    `skipped`, such a table is left out instead, its BadRow appended there, and the other
    tables are read (BadRow is raised only when no table is left). Other tools' tables are
    passed over, each said in `passed_over`. A file whose one build line comes after every
    table (a report's footer) gives that build to every table."""
    reader = _Reader()
    for number, raw in enumerate(text.splitlines(), start=1):
        reader.read(_unquoted(raw.strip()), number)
    reader.close()
    runs, problems = reader.runs, reader.problems
    if problems and (skipped is None or not runs):
        raise problems[0]
    if skipped is not None:
        skipped.extend(problems)
    if passed_over is not None:
        passed_over.extend(reader.passed_over)
    if reader.build_lines == 1 and all(run.line < reader.build_line_at for run in runs):
        for run in runs:  # the one build line, after every table: a report's footer
            run.engine = with_build(run.engine, reader.build.engine())
    if not runs:
        seen = "".join(f"; passed over {p}" for p in reader.passed_over[:MAX_SAID])
        if len(reader.passed_over) > MAX_SAID:
            seen += f"; and {len(reader.passed_over) - MAX_SAID} more"
        raise NoTableFound(
            "no llama-batched-bench table found: expected a header such as "
            "'| PP | TG | B | N_KV | S_PP t/s | S_TG t/s |' (or PL for B, units in "
            "parentheses) followed by rows, or --output-format jsonl records" + seen
        )
    return runs


class _Reader:
    """The state of one pass over the lines: the table being read, the settings line that
    describes the next table, the build announced so far."""

    def __init__(self) -> None:
        self.runs: list[ParsedRun] = []
        self.problems: list[BadRow] = []
        self.passed_over: list[PassedOver] = []
        self.table: _TableBuilder | None = None
        self.settings: dict[str, int] = {}
        self.build = BuildInfo()
        self.build_lines, self.build_line_at = 0, 0
        self.other: tuple[int, NotOurs] | None = None  # the last |-line not ours, unsaid

    def read(self, line: str, number: int) -> None:
        if not line.startswith("|") and (table_at := _whole_table_at(line)) is not None:
            # A log whose line breaks were lost: what comes before the table (a build line,
            # a settings line among other text), then the table.
            before = line[:table_at]
            if settings := _SETTINGS_INSIDE.search(before):
                self.read(before[: settings.start(1)].strip(), number)
                self.read(settings.group(1).strip(), number)
            else:
                self.read(before.strip(), number)
            self.read(line[table_at:], number)
            return
        if self.build.observe(line):
            self.build_lines, self.build_line_at = self.build_lines + 1, number
        if (match := _SETTINGS_LINE.match(line)) is not None:
            self.close()
            self.settings = {k: int(v) for k, v in _SETTING.findall(match.group(1))}
        elif line.startswith("{") and "speed_tg" in line:
            self.close()
            _add_jsonl_record(line, number, self.runs, self.build)
        elif line.startswith("|"):
            rows = rows_of(line)
            if len(rows) > 1 and not self._rows_told_apart(rows, number):
                return
            for cells in rows:
                self._row(cells, number)
            return
        self.other = None
        if self.table is not None and not self.table.rows:
            self.table.observe_crash(line, number)
        # Any other line (stderr noise, prose) is skipped, inside a table too.

    def _row(self, cells: list[str] | None, number: int) -> None:
        if cells is None:  # a |---| alignment row: it ends a table that has rows
            if self.other is not None:  # ... and makes the line above it a table's header
                self._pass_over(*self.other)
            if self.table is not None and self.table.rows:
                self.close()
            return
        self.other = None
        if self.table is not None and self.table.add_row(cells, number):
            return
        header = header_of(cells)
        if self.table is not None and not self.table.rows and self.table.crash is None:
            # Rows came after the header, but none of it: the table is not a crashed run.
            self._close_unread(number, header)
        if isinstance(header, Header):
            self.close()
            self.table = _TableBuilder(number, header, self.settings, self.build.engine())
            self.settings = {}  # a settings line describes the one table after it
            return
        self.close()  # a row of some other table ends ours
        if header.ours:
            self.problems.append(BadRow(f"line {number}: {header.reason}"))
        else:
            self.other = (number, header)

    def _close_unread(self, number: int, header: Header | NotOurs) -> None:
        """A table that has no rows, whose header is followed by a |-row not of it: another
        table's header (the first was a template or an example), or a row that does not fit
        it, which is an error naming both lines."""
        table, self.table = self.table, None
        assert table is not None
        if isinstance(header, Header):
            reason = "a llama-batched-bench header with no rows before the next table"
            self.passed_over.append(PassedOver(table.run.line, reason))
        else:
            self.problems.append(
                BadRow(
                    f"line {number}: a row that does not fit the llama-batched-bench header "
                    f"at line {table.run.line} (cells that are not numbers, or too many or too "
                    "few of them)"
                )
            )

    def _rows_told_apart(self, rows: list[list[str] | None], number: int) -> bool:
        """Whether the rows of a |-line holding several can be read one by one: those of
        other tables always, those of a table whose line breaks were lost when each has as
        many cells as its header has columns (else the error says they cannot be told
        apart)."""
        first = rows[0]
        if first is None or not isinstance(header_of(first), Header):
            return True  # not a table of ours: its rows are read (or passed over) one by one
        widths = {len(row) for row in rows[1:] if row is not None}
        if widths <= {len(first)}:
            return True
        self.close()
        self.problems.append(
            BadRow(
                f"line {number}: a table whose line breaks were lost, with rows of "
                f"{', '.join(str(w) for w in sorted(widths))} cells under a header of "
                f"{len(first)}: its rows cannot be told apart; put each row on its own line"
            )
        )
        return False

    def _pass_over(self, number: int, header: NotOurs) -> None:
        self.passed_over.append(PassedOver(number, header.reason))
        self.other = None

    def close(self) -> None:
        table, self.table = self.table, None
        if table is None:
            return
        if table.problem is not None:
            self.problems.append(table.problem)
        elif table.rows:
            table.run.settings = with_kv_layout(table.run.settings, table.run.points)
            self.runs.append(table.run)
        else:
            table.run.failure = storable_text(
                table.crash
                or "the table has no rows: the run stopped before its first row and printed "
                "no error",
                ERROR_LENGTH,
            )
            self.runs.append(table.run)


def _unquoted(line: str) -> str:
    """A line of a markdown quote (`> | PP | TG |...`, a GitHub reply) without its quote."""
    return line.lstrip(">").lstrip() if line.startswith(">") else line


def _whole_table_at(line: str) -> int | None:
    """Where a llama-batched-bench table starts inside a line that holds other text first
    and the table's rows too (a log whose line breaks were lost)."""
    at = line.find("|")
    if at <= 0:
        return None
    rows = rows_of(line[at:])
    first = rows[0]
    whole = len(rows) > 1 and first is not None and isinstance(header_of(first), Header)
    return at if whole else None


class _TableBuilder:
    def __init__(
        self, line: int, header: Header, settings: dict[str, int], engine: EngineBuild
    ) -> None:
        self.problem: BadRow | None = None  # its first row that is no valid measurement
        try:
            run_settings = _settings_from(settings, line=line)
        except BadRow as bad:
            run_settings, self.problem = RunSettings(), bad
        self.run = ParsedRun(
            line=line,
            format="table",
            columns=header.columns,
            left_out=header.left_out,
            settings=run_settings,
            engine=engine,
        )
        self.crash: str | None = None  # the error printed after its header, before any row
        self.rows = 0  # that belong to it, valid or not

    def observe_crash(self, line: str, number: int) -> None:
        """Takes the line as the reason the run stopped if it is an error a crash prints,
        within a few lines of the header."""
        near = number - self.run.line <= CRASH_WITHIN_LINES
        if self.crash is None and near and _CRASH.search(line):
            self.crash = f"the run stopped before its first row: {line}"

    def add_row(self, cells: list[str], line: int) -> bool:
        """Adds the row if it belongs to this table (as many cells, all numbers); a row that
        belongs but is no valid measurement is the table's problem."""
        if len(cells) != len(self.run.columns):
            return False
        values: dict[str, float | int | None] = {}
        decimals: dict[str, int] = {}
        for column, cell in zip(self.run.columns, cells, strict=True):
            if column is None:  # a column read past, whatever it holds
                continue
            number = _number(cell, integer=column in _INT_COLUMNS)
            if number is _NOT_A_NUMBER:
                return False
            values[column] = number  # type: ignore[assignment]
            decimals[column] = len(cell.partition(".")[2])
        self.rows += 1
        try:
            self.run.points.append(_point(values, self.run.settings, decimals, line=line))
        except BadRow as bad:
            self.problem = self.problem or bad
        return True


_NOT_A_NUMBER = object()


def _number(cell: str, *, integer: bool) -> object:
    try:
        value = int(cell) if integer else float(cell)
    except ValueError:
        return _NOT_A_NUMBER
    if isinstance(value, float) and not math.isfinite(value):
        return None  # `inf` or `nan` printed for a zero time: the figure is unknown
    return value


def _settings_from(values: dict[str, Any], *, line: int) -> RunSettings:
    """The settings a settings line or a JSONL record gives; BadRow naming the table's (or
    record's) line for a value no run may carry (n_kv_max past 2^31, say)."""
    try:
        return _run_settings(values)
    except ValidationError as exc:
        raise BadRow(f"line {line}: its settings: {_problems(exc)}") from None


def _run_settings(values: dict[str, Any]) -> RunSettings:
    def flag(key: str) -> bool | None:
        return bool(values[key]) if key in values else None

    flash = values.get("flash_attn")
    return RunSettings(
        n_ctx=values.get("n_kv_max"),
        n_batch=values.get("n_batch"),
        n_ubatch=values.get("n_ubatch"),
        flash_attn=_FLASH_ATTN.get(flash) if flash is not None else None,
        pp_shared=flag("is_pp_shared"),
        tg_separate=flag("is_tg_separate"),
        n_gpu_layers=values.get("n_gpu_layers"),
        n_threads=values.get("n_threads"),
        n_threads_batch=values.get("n_threads_batch"),
    )


_JSONL_SETTINGS = (
    "n_kv_max",
    "n_batch",
    "n_ubatch",
    "flash_attn",
    "is_pp_shared",
    "n_gpu_layers",
    "n_threads",
    "n_threads_batch",
)
_JSONL_FIGURES = {
    "pp": "pp",
    "tg": "tg",
    "pl": "b",
    "n_kv": "n_kv",
    "t_pp": "t_pp",
    "speed_pp": "s_pp",
    "t_tg": "t_tg",
    "speed_tg": "s_tg",
    "t": "t",
    "speed": "s",
}


_BARE_NON_FINITE = re.compile(r"(?<=[:\s])-?(?:nan|inf)(?=\s*[,}])", re.IGNORECASE)


def _add_jsonl_record(line: str, number: int, runs: list[ParsedRun], build: BuildInfo) -> None:
    # llama-batched-bench prints figures with %f: a zero time gives a bare nan or inf,
    # which is not JSON. The figure is unknown.
    try:
        record = json.loads(_BARE_NON_FINITE.sub("null", line))
    except json.JSONDecodeError as exc:
        raise BadRow(f"line {number}: not a JSON record: {exc}") from None
    if not isinstance(record, dict) or not {"pp", "tg", "pl"} <= record.keys():
        raise BadRow(f"line {number}: a record without pp, tg and pl")
    settings = _settings_from({k: record[k] for k in _JSONL_SETTINGS if k in record}, line=number)
    if not runs or runs[-1].format != "jsonl" or runs[-1].settings != settings:
        runs.append(
            ParsedRun(
                line=number,
                format="jsonl",
                columns=list(_JSONL_FIGURES.values()),
                settings=settings,
                engine=build.engine(),
            )
        )
    values = {
        field_name: _finite(record.get(key), integer=field_name in _INT_COLUMNS)
        for key, field_name in _JSONL_FIGURES.items()
    }
    runs[-1].points.append(_point(values, settings, decimals={}, line=number))


def _finite(value: object, *, integer: bool) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if integer:
        return int(value)
    return float(value) if math.isfinite(value) else None


def _point(
    values: dict[str, float | int | None],
    settings: RunSettings,
    decimals: dict[str, int],
    *,
    line: int,
) -> Point:
    """A Point with the derived figures filled in where they follow exactly."""
    try:
        return Point.model_validate(derived_figures(values, settings, decimals))
    except ValidationError as exc:
        raise BadRow(f"line {line}: {_problems(exc)}") from None


def _problems(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'row'}: {e['msg']}" for e in exc.errors()
    )
