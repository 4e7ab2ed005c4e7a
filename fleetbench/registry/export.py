"""Tabular export: rows as CSV or as a JSON array of objects, sent as a download.

The interface is plain so that any listing can reuse it (a run's points here, a series):

- a *row* is a mapping from column name to a value: `str`, `int`, `float`, `bool`,
  `datetime`, `UUID` or `None`; columns a row lacks are empty;
- `rows_to_csv(columns, rows)` writes a header and one line per row (RFC 4180, CRLF line
  ends; `None` is an empty cell, floats are written so they read back exactly, datetimes
  as ISO 8601 in UTC with a `Z`, booleans as `true`/`false`, and text that a spreadsheet
  would take for a formula, starting with `=`, `+`, `-`, `@`, is prefixed with `'`);
- `rows_to_json(columns, rows)` writes a JSON array of objects with exactly those keys, in
  that order (`None` is `null`);
- `export_response(rows, columns=..., format="csv"|"json", filename=...)` returns either one
  with its media type and `Content-Disposition: attachment; filename="<filename>.<format>"`.

`run_export_response(run, format)` is `GET /v1/runs/{run_id}/export`: one row per measured
point (with the per-user speed S_TG / B) and one per failed point (measurements empty,
`reason` set), ordered by PP, TG, B.
"""

from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Literal
from uuid import UUID

from fastapi import Response

from fleetbench.contract.energy import tokens_per_joule
from fleetbench.registry.models import Run
from fleetbench.registry.regressions.labels import build_label

__all__ = [
    "MEDIA_TYPES",
    "RUN_COLUMNS",
    "Cell",
    "ExportFormat",
    "Row",
    "export_response",
    "rows_to_csv",
    "rows_to_json",
    "run_export_response",
    "run_rows",
    "safe_filename",
]

ExportFormat = Literal["csv", "json"]
Cell = str | int | float | bool | datetime | UUID | None
Row = Mapping[str, Cell]

MEDIA_TYPES: dict[ExportFormat, str] = {
    "csv": "text/csv; charset=utf-8",
    "json": "application/json",
}

RUN_COLUMNS: tuple[str, ...] = (
    "run_id",
    "node",
    "model",
    "build",
    "build_number",
    "started_at",
    "pp",
    "tg",
    "b",
    "n_kv",
    "t_pp",
    "s_pp",
    "t_tg",
    "s_tg",
    "per_user_tps",
    "t",
    "s",
    "repeats",
    "s_pp_stdev",
    "s_tg_stdev",
    "mbu",
    "impossible",
    "joules",
    "tokens_per_joule",
    "energy_invalid",
    "energy_source",
    "reason",
)


def _iso(moment: datetime) -> str:
    zoned = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    return zoned.astimezone(UTC).isoformat().replace("+00:00", "Z")


_FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def _csv_cell(value: Cell) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):  # before int: bool is an int
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)  # the shortest text that reads back as the same float
    if isinstance(value, datetime):
        return _iso(value)
    if isinstance(value, str) and value.startswith(_FORMULA_STARTS):
        # Names come from node reports: a spreadsheet would run `=...` as a formula.
        return "'" + value
    return str(value)


def _json_value(value: Cell) -> str | int | float | bool | None:
    if isinstance(value, datetime):
        return _iso(value)
    if isinstance(value, UUID):
        return str(value)
    return value


def rows_to_csv(columns: Sequence[str], rows: Iterable[Row]) -> str:
    """A header line of `columns`, then each row's values in that order."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\r\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_csv_cell(row.get(column)) for column in columns])
    return buffer.getvalue()


def rows_to_json(columns: Sequence[str], rows: Iterable[Row]) -> str:
    """A JSON array with one object per row, holding exactly `columns` in that order."""
    return json.dumps(
        [{column: _json_value(row.get(column)) for column in columns} for row in rows],
        allow_nan=False,
    )


def safe_filename(*parts: str) -> str:
    """`parts` joined with `-`, anything but letters, digits, `.`, `_` and `-` made `_`:
    safe inside a quoted Content-Disposition filename and on any file system."""
    joined = "-".join(part for part in parts if part)
    return re.sub(r"[^A-Za-z0-9._-]", "_", joined)[:200] or "export"


def export_response(
    rows: Iterable[Row], *, columns: Sequence[str], format: ExportFormat, filename: str
) -> Response:
    """The rows as a download named `<filename>.<format>` (`filename` is made safe)."""
    body = rows_to_csv(columns, rows) if format == "csv" else rows_to_json(columns, rows)
    name = f"{safe_filename(filename)}.{format}"
    return Response(
        content=body,
        media_type=MEDIA_TYPES[format],
        headers={"Content-Disposition": f'attachment; filename="{name}"'},
    )


def run_rows(run: Run) -> list[dict[str, Cell]]:
    """One row per measured and per failed point of `run` (points, failures, node, model
    and build loaded, as `crud.get_run` does), ordered by PP, TG, B, measured first."""
    common: dict[str, Cell] = {
        "run_id": run.id,
        "node": run.node.name,
        "model": run.model.name,
        "build": build_label(run.build),
        "build_number": run.build.build_number,
        "started_at": run.started_at,
    }
    keyed: list[tuple[tuple[int, int, int, int], dict[str, Cell]]] = []
    source = run.energy.get("source") if run.energy else None
    for point in run.points:
        energy = point.energy or {}
        joules = energy.get("joules")
        row: dict[str, Cell] = {
            **common,
            "pp": point.pp,
            "tg": point.tg,
            "b": point.b,
            "n_kv": point.n_kv,
            "t_pp": point.t_pp,
            "s_pp": point.s_pp,
            "t_tg": point.t_tg,
            "s_tg": point.s_tg,
            "per_user_tps": point.s_tg / point.b if point.s_tg is not None else None,
            "t": point.t,
            "s": point.s,
            "repeats": point.repeats,
            "s_pp_stdev": point.s_pp_stdev,
            "s_tg_stdev": point.s_tg_stdev,
            "mbu": point.mbu,
            "impossible": point.impossible,
            "joules": joules,
            "tokens_per_joule": tokens_per_joule(point.b, point.tg, joules),
            "energy_invalid": energy.get("invalid"),
            "energy_source": source if energy else None,
            "reason": None,
        }
        keyed.append(((point.pp, point.tg, point.b, 0), row))
    for failure in run.failures:
        row = {**common, "pp": failure.pp, "tg": failure.tg, "b": failure.b}
        row["reason"] = failure.reason
        keyed.append(((failure.pp, failure.tg, failure.b, 1), row))
    keyed.sort(key=lambda item: item[0])  # stable: stored order within one key
    return [row for _, row in keyed]


def run_export_response(run: Run, format: ExportFormat) -> Response:
    """`run`'s points as `fleetbench-run-<node>-<run id>.<format>`."""
    return export_response(
        run_rows(run),
        columns=RUN_COLUMNS,
        format=format,
        filename=safe_filename("fleetbench-run", run.node.name, str(run.id)),
    )
