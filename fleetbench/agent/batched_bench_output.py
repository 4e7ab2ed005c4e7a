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
from fleetbench.agent.batched_bench_table import Header, NotOurs, header_of, rows_of
from fleetbench.contract.kv_cache import kv_cells
from fleetbench.contract.wire import S_TG_TOLERANCE, EngineBuild, Point, RunSettings

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
    columns: list[str]
    settings: RunSettings = field(default_factory=RunSettings)
    engine: EngineBuild = field(default_factory=EngineBuild)
    points: list[Point] = field(default_factory=list)
    failure: str | None = None  # a header with no rows after it: why (the run crashed)


_INT_COLUMNS = {"pp", "tg", "b", "n_kv"}

_SETTINGS_LINE = re.compile(r"^(?:[\w.]+:\s*)?(n_kv_max\s*=.*)$")
_SETTINGS_INSIDE = re.compile(r"(?:^|\s)((?:[\w.]+:\s*)?n_kv_max\s*=[^|]*)$")
_SETTING = re.compile(r"(\w+)\s*=\s*(-?\d+)")
_FLASH_ATTN = {-1: "auto", 0: "off", 1: "on"}
# What a run that dies after printing its header says (CUDA, Metal, ggml, the shell).
_CRASH = re.compile(
    r"error|assert|abort|out of memory|failed|segmentation fault|core dumped|killed|"
    r"terminate called|exception",
    re.IGNORECASE,
)
MAX_CRASH_LINE = 500


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
    there is none, and `BadRow` for a row that is not a valid measurement or a header with a
    column the tool never printed; with `skipped`, such a table is left out instead, its
    BadRow appended there, and the other tables are read (BadRow is raised only when no
    table is left). Other tools' tables are passed over, each said in `passed_over`. A file
    whose one build line comes after every table (a report's footer) gives that build to
    every table."""
    reader = _Reader()
    for number, raw in enumerate(text.splitlines(), start=1):
        reader.read(raw.strip(), number)
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
        seen = "".join(f"; passed over {p}" for p in reader.passed_over)
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
        if not line.startswith("|") and (table_at := _table_inside(line)) is not None:
            # A log whose line breaks were lost: what comes before the table (its settings
            # line among other text), then the table.
            before = line[:table_at]
            settings = _SETTINGS_INSIDE.search(before)
            self.read(settings.group(1) if settings else before.strip(), number)
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
            if len(rows) > 1 and not self._flattened(rows, number):
                return
            for cells in rows:
                self._row(cells, number)
            return
        self.other = None
        if self.table is not None and not self.table.run.points:
            self.table.observe_crash(line)
        # Any other line (stderr noise, prose) is skipped, inside a table too.

    def _row(self, cells: list[str] | None, number: int) -> None:
        if cells is None:  # a |---| alignment row: it ends a table that has rows
            if self.other is not None:  # ... and makes the line above it a table's header
                self._pass_over(*self.other)
            if self.table is not None and self.table.run.points:
                self.close()
            return
        self.other = None
        if self.table is not None and self.table.add_row(cells, number):
            return
        header = header_of(cells)
        if isinstance(header, Header):
            self.close()
            self.table = _TableBuilder(number, header.columns, self.settings, self.build.engine())
            self.settings = {}  # a settings line describes the one table after it
            return
        self.close()  # a row of some other table ends ours
        if header.ours:
            self.problems.append(BadRow(f"line {number}: {header.reason}"))
        else:
            self.other = (number, header)

    def _flattened(self, rows: list[list[str] | None], number: int) -> bool:
        """Whether the rows of a line whose line breaks were lost can be told apart: its
        header's, and every row as many cells as the header has columns."""
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
        elif table.run.points:
            table.run.settings = _with_kv_layout(table.run.settings, table.run.points)
            self.runs.append(table.run)
        else:
            table.run.failure = table.crash or (
                "the table has no rows: the run stopped before its first row and printed no error"
            )
            self.runs.append(table.run)


def _table_inside(line: str) -> int | None:
    """Where a llama-batched-bench header starts inside a line that holds other text first."""
    at = line.find("|")
    if at <= 0:
        return None
    first = rows_of(line[at:])[0]
    return at if first is not None and isinstance(header_of(first), Header) else None


class _TableBuilder:
    def __init__(
        self, line: int, columns: list[str], settings: dict[str, int], engine: EngineBuild
    ) -> None:
        self.run = ParsedRun(
            line=line,
            format="table",
            columns=columns,
            settings=_settings_from(settings),
            engine=engine,
        )
        self.problem: BadRow | None = None  # its first row that is no valid measurement
        self.crash: str | None = None  # the error printed after its header, before any row

    def observe_crash(self, line: str) -> None:
        if self.crash is None and _CRASH.search(line):
            self.crash = f"the run stopped before its first row: {line[:MAX_CRASH_LINE]}"

    def add_row(self, cells: list[str], line: int) -> bool:
        """Adds the row if it belongs to this table (as many cells, all numbers); a row that
        belongs but is no valid measurement is the table's problem."""
        if len(cells) != len(self.run.columns):
            return False
        values: dict[str, float | int | None] = {}
        decimals: dict[str, int] = {}
        for column, cell in zip(self.run.columns, cells, strict=True):
            number = _number(cell, integer=column in _INT_COLUMNS)
            if number is _NOT_A_NUMBER:
                return False
            values[column] = number  # type: ignore[assignment]
            decimals[column] = len(cell.partition(".")[2])
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


def _with_kv_layout(settings: RunSettings, points: list[Point]) -> RunSettings:
    """Shared prompt and unified KV cache, where N_KV shows them: with B > 1 sequences, only a
    shared prompt in a unified cache uses PP + B*TG cells (batched-bench's n_ctx_req)."""
    if settings.kv_unified is not None:
        return settings
    for p in points:
        if p.b > 1 and p.pp > 0 and p.n_kv == kv_cells(p.pp, p.tg, p.b, shared=True, unified=True):
            return settings.model_copy(update={"pp_shared": True, "kv_unified": True})
        separate = kv_cells(p.pp, p.tg, p.b, shared=False, unified=False)
        if p.b > 1 and settings.pp_shared and p.n_kv == separate:
            return settings.model_copy(update={"kv_unified": False})
    return settings


def _settings_from(values: dict[str, Any]) -> RunSettings:
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
    settings = _settings_from({k: record[k] for k in _JSONL_SETTINGS if k in record})
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
        return Point.model_validate(_derived(values, settings, decimals))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'row'}: {e['msg']}" for e in exc.errors()
        )
        raise BadRow(f"line {line}: {problems}") from None


def _derived(
    values: dict[str, float | int | None], settings: RunSettings, decimals: dict[str, int]
) -> dict[str, float | int | None]:
    v = dict(values)
    b, pp, tg = int(v["b"] or 0), int(v["pp"] or 0), int(v["tg"] or 0)

    shared = settings.pp_shared
    if b == 1:
        shared = False  # one sequence: shared and separate prompts are the same work
    elif shared is None and v.get("n_kv") == kv_cells(pp, tg, b, shared=True, unified=True):
        shared = True  # only a shared prompt in a unified KV cache uses PP + B*TG cells

    decode_tokens = b * tg
    _fill_rate(v, "t_tg", "s_tg", decode_tokens)
    _mend_rounding(v, "t_tg", "s_tg", decode_tokens, decimals)
    if shared is not None:
        prompt_tokens = pp if shared else b * pp
        _fill_rate(v, "t_pp", "s_pp", prompt_tokens)
        if v.get("t") is None and v.get("t_pp") is not None and v.get("t_tg") is not None:
            v["t"] = float(v["t_pp"]) + float(v["t_tg"])  # type: ignore[arg-type]
        _fill_rate(v, "t", "s", prompt_tokens + decode_tokens)
        if v.get("n_kv") is None and not shared:
            v["n_kv"] = kv_cells(pp, tg, b, shared=False, unified=False)
    return v


def _fill_rate(v: dict[str, float | int | None], time: str, speed: str, tokens: int) -> None:
    """speed = tokens / time: fill whichever of the two is missing."""
    t, s = v.get(time), v.get(speed)
    if t is None and s:
        v[time] = tokens / s
    elif s is None and t:
        v[speed] = tokens / t


def _mend_rounding(
    v: dict[str, float | int | None],
    time: str,
    speed: str,
    tokens: int,
    decimals: dict[str, int],
) -> None:
    """The table prints times to 3 decimals and speeds to 2: on short runs (the time) or on
    slow machines (the speed: 0.16 t/s for 5 tokens in 30.895 s) rounding alone can move
    tokens/time past the 1% the wire format allows. Where one figure's printed precision
    explains the gap, that figure is taken from the other, more precise one."""
    t, s = v.get(time), v.get(speed)
    if not t or not s or not tokens or time not in decimals or speed not in decimals:
        return
    from_time = tokens / t
    if abs(s - from_time) / from_time <= S_TG_TOLERANCE:
        return
    if abs(tokens / s - t) <= 0.5 * 10 ** -decimals[time]:
        v[time] = tokens / s
    elif abs(from_time - s) <= 0.5 * 10 ** -decimals[speed]:
        v[speed] = from_time
