"""GET /v1/runs/{run_id}/export as CSV and JSON, read back with the csv and json modules,
and the reusable formatting of registry/export.py."""

from __future__ import annotations

import csv
import io
import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from fleetbench.contract import wire
from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.export import (
    RUN_COLUMNS,
    Cell,
    export_response,
    rows_to_csv,
    rows_to_json,
    safe_filename,
)
from tests.factories import (
    ARTICLE_MODEL,
    ARTICLE_TABLE,
    LiveRegistry,
    make_report,
    post_report,
    running_registry,
)

REASON = 'failed to find a memory slot, "n_ctx" too small\nsecond line'


def full_report() -> wire.RunReport:
    """The article's curve with every figure, and one failed point."""
    points = []
    for b, s_pp, s_tg in ARTICLE_TABLE:
        t_pp = round(b * 512 / s_pp, 3)
        t_tg = round(b * 128 / s_tg, 3)
        points.append(
            wire.Point(
                pp=512,
                tg=128,
                b=b,
                n_kv=b * 640,
                t_pp=t_pp,
                s_pp=s_pp,
                t_tg=t_tg,
                s_tg=s_tg,
                t=round(t_pp + t_tg, 3),
                s=round(b * 640 / (t_pp + t_tg), 2),
                repeats=3,
                s_tg_stdev=0.25,
            )
        )
    return make_report(
        points=list(reversed(points)),  # stored in this order, exported by B
        status="partial",
        failures=[wire.FailedPoint(pp=512, tg=128, b=64, reason=REASON)],
    )


def test_run_export_csv_reads_back_as_the_run(live_registry: LiveRegistry) -> None:
    report = full_report()
    with live_registry.client(live_registry.token("m4pro")) as client:
        assert post_report(client, report).status_code == 201
        response = client.get(f"/v1/runs/{report.run_id}/export", params={"format": "csv"})
        default = client.get(f"/v1/runs/{report.run_id}/export")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "text/csv; charset=utf-8"
    assert response.headers["content-disposition"] == (
        f'attachment; filename="fleetbench-run-m4pro-{report.run_id}.csv"'
    )
    assert default.content == response.content

    reader = csv.DictReader(io.StringIO(response.text, newline=""))
    assert reader.fieldnames == list(RUN_COLUMNS)
    rows = list(reader)
    assert [int(row["b"]) for row in rows] == [1, 2, 4, 8, 16, 32, 64]
    by_b = {int(row["b"]): row for row in rows}
    sent = {p.b: p for p in report.points}
    for b, row in by_b.items():
        assert row["run_id"] == str(report.run_id)
        assert row["node"] == "m4pro"
        assert row["model"] == ARTICLE_MODEL
        assert row["build"] == "llama.cpp b11429 Metal"
        assert row["build_number"] == "11429"
        assert row["started_at"] == "2026-10-16T12:00:00Z"
        assert (row["pp"], row["tg"]) == ("512", "128")
        if b == 64:
            continue
        point = sent[b]
        assert int(row["n_kv"]) == b * 640
        for column in ("t_pp", "s_pp", "t_tg", "s_tg", "t", "s"):
            assert float(row[column]) == getattr(point, column), (b, column)
        assert point.s_tg is not None
        assert float(row["per_user_tps"]) == point.s_tg / b
        assert (row["repeats"], row["s_tg_stdev"], row["s_pp_stdev"]) == ("3", "0.25", "")
        assert row["reason"] == ""
    assert float(by_b[8]["s_tg"]) == 133.65
    assert float(by_b[8]["per_user_tps"]) == 16.70625
    assert float(by_b[8]["t_tg"]) == 7.662
    failed = by_b[64]
    assert failed["reason"] == REASON
    assert all(failed[c] == "" for c in ("n_kv", "s_pp", "s_tg", "per_user_tps", "repeats"))


def test_run_export_json_rows(live_registry: LiveRegistry) -> None:
    report = full_report()
    with live_registry.client(live_registry.token("m4pro")) as client:
        assert post_report(client, report).status_code == 201
        response = client.get(f"/v1/runs/{report.run_id}/export", params={"format": "json"})
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/json"
    assert response.headers["content-disposition"] == (
        f'attachment; filename="fleetbench-run-m4pro-{report.run_id}.json"'
    )
    rows = response.json()
    assert [list(row) for row in rows] == [list(RUN_COLUMNS)] * 7
    assert [row["b"] for row in rows] == [1, 2, 4, 8, 16, 32, 64]
    b8 = rows[3]
    assert (b8["s_tg"], b8["per_user_tps"], b8["s_pp"], b8["n_kv"]) == (
        133.65,
        16.70625,
        285.83,
        5120,
    )
    assert b8["reason"] is None
    assert b8["build_number"] == 11429
    assert b8["started_at"] == "2026-10-16T12:00:00Z"
    assert rows[-1] == {
        **dict.fromkeys(RUN_COLUMNS),
        "run_id": str(report.run_id),
        "node": "m4pro",
        "model": ARTICLE_MODEL,
        "build": "llama.cpp b11429 Metal",
        "build_number": 11429,
        "started_at": "2026-10-16T12:00:00Z",
        "pp": 512,
        "tg": 128,
        "b": 64,
        "reason": REASON,
    }


def test_run_export_refusals(live_registry: LiveRegistry) -> None:
    report = make_report(engine=wire.EngineBuild(commit="0c1e570abcdef1234", backend=None))
    with live_registry.client(live_registry.token("m4pro")) as client:
        assert post_report(client, report).status_code == 201
        assert client.get(f"/v1/runs/{uuid.uuid4()}/export").status_code == 404
        assert client.get(f"/v1/runs/{report.run_id}/export?format=xml").status_code == 422
        assert client.get("/v1/runs/not-a-uuid/export").status_code == 422
        rows = client.get(f"/v1/runs/{report.run_id}/export?format=json").json()
    assert {row["build"] for row in rows} == {"llama.cpp 0c1e570abcde"}
    assert {row["build_number"] for row in rows} == {None}
    assert [row["t_tg"] for row in rows] == [None] * 6  # not sent, not made up


def test_run_export_needs_a_token_when_reads_are_closed(database_url: str) -> None:
    settings = RegistrySettings(database_url=database_url, read_token_required=True)
    report = make_report()
    with running_registry(settings) as registry:
        with registry.client(registry.token("m4pro")) as client:
            assert post_report(client, report).status_code == 201
        with registry.client(registry.scoped_token("reader")) as client:
            allowed = client.get(f"/v1/runs/{report.run_id}/export")
        with registry.client() as anonymous:
            refused = anonymous.get(f"/v1/runs/{report.run_id}/export")
    assert refused.status_code == 401
    assert allowed.status_code == 200
    assert len(list(csv.DictReader(io.StringIO(allowed.text)))) == 6


def test_rows_to_csv_round_trips_values() -> None:
    columns = ["name", "n", "x", "flag", "at", "missing"]
    rows: list[dict[str, Cell]] = [
        {
            "name": 'a, "quoted"\nline',
            "n": 7,
            "x": 0.1 + 0.2,
            "flag": True,
            "at": datetime(2026, 1, 2, 5, 4, 5, tzinfo=timezone(timedelta(hours=2))),
            "extra": "ignored",
        },
        {"name": None, "n": 0, "x": 1e-9, "flag": False, "at": datetime(2026, 1, 2, 3, 4)},
    ]
    text = rows_to_csv(columns, rows)
    assert text.startswith("name,n,x,flag,at,missing\r\n")
    read = list(csv.reader(io.StringIO(text, newline="")))
    assert read[0] == columns
    assert read[1] == [
        'a, "quoted"\nline',
        "7",
        repr(0.1 + 0.2),
        "true",
        "2026-01-02T03:04:05Z",
        "",
    ]
    assert float(read[1][2]) == 0.1 + 0.2
    assert read[2] == ["", "0", "1e-09", "false", "2026-01-02T03:04:00Z", ""]
    assert rows_to_csv(columns, []) == "name,n,x,flag,at,missing\r\n"


def test_rows_to_json_keeps_columns_in_order() -> None:
    moment = datetime(2026, 10, 16, 12, tzinfo=UTC)
    run_id = uuid.UUID("12345678-1234-5678-1234-567812345678")
    text = rows_to_json(["b", "a", "when", "id"], [{"a": 1.5, "when": moment, "id": run_id}])
    assert text == (
        '[{"b": null, "a": 1.5, "when": "2026-10-16T12:00:00Z", '
        '"id": "12345678-1234-5678-1234-567812345678"}]'
    )
    with pytest.raises(ValueError):
        rows_to_json(["x"], [{"x": float("nan")}])


def test_export_response_names_the_download() -> None:
    response = export_response(
        [{"b": 8}], columns=["b"], format="csv", filename='series m4pro/"Mistral"'
    )
    assert response.media_type == "text/csv; charset=utf-8"
    assert response.headers["content-disposition"] == (
        'attachment; filename="series_m4pro__Mistral_.csv"'
    )
    assert response.body == b"b\r\n8\r\n"
    assert safe_filename("fleetbench-run", "", "gpu 07", "x.y") == "fleetbench-run-gpu_07-x.y"
    assert safe_filename("") == "export"


def test_text_a_spreadsheet_would_run_as_a_formula_is_quoted() -> None:
    from fleetbench.registry.export import rows_to_csv

    text = rows_to_csv(["node", "s_tg"], [{"node": "=HYPERLINK(1)", "s_tg": -1.5}])
    assert text.splitlines()[1] == "'=HYPERLINK(1),-1.5"  # numbers stay numbers
