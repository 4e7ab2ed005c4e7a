"""Read llama-batched-bench output: its tables, settings line, build line and JSONL records.

Accepts what nodes and people actually have: the CLI's full 10-column table, the 6-column
table pasted into reports (or any subset of the columns that names PP, TG, B and a decode
figure), several tables in one markdown file or log with unrelated lines in between, and
`--output-format jsonl` records. Pure: text in, `ParsedRun`s out.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from fleetbench.contract.kv_cache import kv_cells
from fleetbench.contract.wire import S_TG_TOLERANCE, EngineBuild, Point, RunSettings

__all__ = [
    "BadRow",
    "BatchedBenchOutputError",
    "NoTableFound",
    "ParsedRun",
    "parse_batched_bench_output",
    "parse_build",
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


# header cell (lowercased, spaces removed) -> Point field
_HEADER_CELLS = {
    "pp": "pp",
    "tg": "tg",
    "b": "b",
    "n_kv": "n_kv",
    "t_pps": "t_pp",
    "s_ppt/s": "s_pp",
    "t_tgs": "t_tg",
    "s_tgt/s": "s_tg",
    "ts": "t",
    "st/s": "s",
}
_INT_COLUMNS = {"pp", "tg", "b", "n_kv"}

_SETTINGS_LINE = re.compile(r"^(?:[\w.]+:\s*)?(n_kv_max\s*=.*)$")
_SETTING = re.compile(r"(\w+)\s*=\s*(-?\d+)")
_BUILD_LINE = re.compile(r"^build:\s*(\w+)\s*\((\w+)\)")
_VERSION_LINE = re.compile(
    r"^version:\s*\S+\s*\(build\s+(\d+),\s*commit\s+(\w+)\)|^version:\s*(\d+)\s*\((\w+)\)"
)
_BACKEND_HINTS = (
    (re.compile(r"load_backend: loaded (\w+) backend"), None),
    (re.compile(r"ggml_cuda_init:"), "CUDA"),
    (re.compile(r"ggml_metal_(?:init|device_init)"), "Metal"),
    (re.compile(r"ggml_vulkan:"), "Vulkan"),
    (re.compile(r"ggml_hip|ROCm devices"), "ROCm"),
)
_FLASH_ATTN = {-1: "auto", 0: "off", 1: "on"}


def parse_batched_bench_output(
    text: str, *, skipped: list[BadRow] | None = None
) -> list[ParsedRun]:
    """Every run found in `text`, in order. Raises `NoTableFound` when there is none, and
    `BadRow` for a row that is not a valid measurement; with `skipped`, a table holding such
    a row is left out instead, its BadRow appended there, and the other tables are read
    (BadRow is raised only when no table is left). A file whose one build line comes after
    every table (a report's footer) gives that build to every table."""
    runs: list[ParsedRun] = []
    table: _TableBuilder | None = None
    settings: dict[str, int] = {}
    build = _BuildInfo()
    problems: list[BadRow] = []
    build_lines, build_line_at = 0, 0

    def close() -> None:
        if table is not None and table.problem is not None:
            problems.append(table.problem)
        else:
            _close(table, runs)

    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if build.observe(line):
            build_lines, build_line_at = build_lines + 1, number
        if (match := _SETTINGS_LINE.match(line)) is not None:
            close()
            table = None
            settings = {k: int(v) for k, v in _SETTING.findall(match.group(1))}
        elif line.startswith("{") and "speed_tg" in line:
            close()
            table = None
            _add_jsonl_record(line, number, runs, build)
        elif line.startswith("|"):
            cells = _cells(line)
            if cells is None:  # a |---| separator: it ends a table that has rows
                if table is not None and table.run.points:
                    close()
                    table = None
            elif (columns := _header_columns(cells)) is not None:
                close()
                table = _TableBuilder(number, columns, settings, build.engine())
                settings = {}  # a settings line describes the one table after it
            elif table is not None and not table.add_row(cells, number):
                close()  # a row of some other table ends ours
                table = None
        # Any other line (stderr noise, prose) is skipped, inside a table too.

    close()
    if problems and (skipped is None or not runs):
        raise problems[0]
    if skipped is not None:
        skipped.extend(problems)
    if build_lines == 1 and all(run.line < build_line_at for run in runs):
        for run in runs:  # the one build line, after every table: a report's footer
            run.engine = _with_build(run.engine, build.engine())
    if not runs:
        raise NoTableFound(
            "no llama-batched-bench table found: expected a header such as "
            "'| PP | TG | B | N_KV | S_PP t/s | S_TG t/s |' followed by rows, "
            "or --output-format jsonl records"
        )
    return runs


def parse_build(text: str) -> EngineBuild:
    """The llama.cpp build a log or `--version` output announces (number, commit, backend)."""
    build = _BuildInfo()
    for line in text.splitlines():
        build.observe(line.strip())
    return build.engine()


class _BuildInfo:
    """The build and backend a log announces; applies to the tables after it."""

    def __init__(self) -> None:
        self.number: int | None = None
        self.commit: str | None = None
        self.backend: str | None = None

    def observe(self, line: str) -> bool:
        """Takes what the line says; True when it is a build (or version) line."""
        for pattern, backend in _BACKEND_HINTS:
            if (hint := pattern.search(line)) is not None:
                self.backend = backend or hint.group(1)
                break
        if (m := _BUILD_LINE.match(line)) is not None:
            first, second = m.groups()
            # llama.cpp prints `build: <number> (<commit>)`; people also write it reversed.
            number, commit = (first, second) if first.isdigit() else (second, first)
            if number.isdigit():
                self.number, self.commit = int(number), commit
                return True
        elif (m := _VERSION_LINE.match(line)) is not None:
            number, commit = (m.group(1), m.group(2)) if m.group(1) else (m.group(3), m.group(4))
            self.number, self.commit = int(number), commit
            return True
        return False

    def engine(self) -> EngineBuild:
        return EngineBuild(
            build_number=self.number,
            commit=self.commit,
            backend=self.backend,
            binding="llama-batched-bench",
        )


def _with_build(engine: EngineBuild, build: EngineBuild) -> EngineBuild:
    """`engine` with what it lacks taken from the file's one build line."""
    missing = {
        name: getattr(build, name)
        for name in ("build_number", "commit", "backend")
        if getattr(engine, name) is None and getattr(build, name) is not None
    }
    return engine.model_copy(update=missing) if missing else engine


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


def _cells(line: str) -> list[str] | None:
    """The cells of a `|`-row, or None for a |---|---| separator."""
    # Text after the closing pipe is not a cell (reports sometimes run prose into a row).
    end = line.rindex("|") if line.count("|") > 1 else len(line)
    cells = [c.strip() for c in line[1:end].split("|")]
    if all(set(c) <= set("-: ") for c in cells):
        return None
    return cells


def _header_columns(cells: list[str]) -> list[str] | None:
    keys = [_HEADER_CELLS.get(c.lower().replace(" ", "")) for c in cells]
    if any(k is None for k in keys):
        return None
    columns = [k for k in keys if k is not None]
    if not {"pp", "tg", "b"} <= set(columns) or not {"s_tg", "t_tg"} & set(columns):
        return None
    return columns


def _close(table: _TableBuilder | None, runs: list[ParsedRun]) -> None:
    if table is not None and table.run.points:
        table.run.settings = _with_kv_layout(table.run.settings, table.run.points)
        runs.append(table.run)


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


def _add_jsonl_record(line: str, number: int, runs: list[ParsedRun], build: _BuildInfo) -> None:
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
