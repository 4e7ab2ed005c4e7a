"""Inputs that once answered 500 (found by fuzzing and by hand), each answered 4xx naming the
problem now, on both databases; and what one node may cost the others (bounds per report and
per node, /metrics, the token checked before the body)."""

from __future__ import annotations

import json
import socket
import time
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest

from fleetbench.registry.config import RegistrySettings
from tests.factories import (
    ARTICLE_MODEL,
    JSON,
    LiveRegistry,
    make_report,
    post_report,
    running_registry,
)

BIG = 2**63  # past BIGINT
PAST_INT32 = 2**31


def _detail(response: Any) -> str:
    return json.dumps(response.json()["detail"])


@pytest.mark.parametrize(
    ("path", "field"),
    [
        (f"/v1/series?node=m4pro&model={ARTICLE_MODEL}&pp={BIG}&tg=128&b=1", "pp"),
        (f"/v1/series?node=m4pro&model={ARTICLE_MODEL}&pp={PAST_INT32}&tg=128&b=1", "pp"),
        (f"/v1/runs?offset={BIG}", "offset"),
        (
            f"/v1/placement?model={ARTICLE_MODEL}&min_tps_per_user=1&prompt_tokens={BIG}",
            "prompt_tokens",
        ),
        (f"/v1/placement?model={ARTICLE_MODEL}&min_tps_per_user=1&max_age_days=1e6", "max_age"),
        (f"/v1/placement?model={ARTICLE_MODEL}&min_tps_per_user=1e308", "min_tps_per_user"),
        ("/v1/runs?since=0001-01-01T00:00:00%2B01:00", "since"),
        ("/v1/regressions?since=0001-01-01T00:00:00%2B01:00", "since"),
        ("/v1/runs?since=1026341826", "since"),
        ("/v1/runs?node=a%00b", "node"),
        ("/v1/curves?node=m4pro&model=a%00b", "model"),
        ("/v1/nodes/a%00b", "name"),
    ],
)
def test_query_values_past_what_the_database_holds_are_422(
    live_registry: LiveRegistry, path: str, field: str
) -> None:
    token = live_registry.token("m4pro")
    with live_registry.client(token) as client:
        assert post_report(client, make_report()).status_code == 201
        response = client.get(path)
    assert response.status_code == 422, response.text
    assert field in _detail(response)


def test_an_acknowledge_id_past_the_column_is_422(live_registry: LiveRegistry) -> None:
    token = live_registry.scoped_token("admin")
    with live_registry.client(token) as client:
        response = client.post(f"/v1/regressions/{BIG}/acknowledge", json={"note": "ok"})
    assert response.status_code == 422, response.text
    assert "regression_id" in _detail(response)


def test_a_nul_in_an_acknowledgement_note_is_422(live_registry: LiveRegistry) -> None:
    token = live_registry.scoped_token("admin")
    with live_registry.client(token) as client:
        response = client.post("/v1/regressions/1/acknowledge", json={"note": "o\u0000k"})
    assert response.status_code == 422, response.text
    assert "note" in _detail(response)


def _report(**changes: Any) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(make_report().model_dump_json())
    for path, value in changes.items():
        target = body
        *parents, last = path.split("__")
        for key in parents:
            target = target.setdefault(key, {})
        target[last] = value
    return body


def _nested(levels: int) -> dict[str, Any]:
    data: dict[str, Any] = {}
    for _ in range(levels):
        data = {"deeper": data}
    return data


GPU = {"name": "NVIDIA H100 80GB HBM3", "memory_bytes": 85_899_345_920}
HOSTILE_REPORTS = {
    "probes is text": (_report(hardware={"hash": "abcdef0123", "data": {"probes": "x"}}), "probes"),
    "GPU list of strings": (
        _report(hardware={"hash": "abcdef0123", "data": {"probes": {"nvidia": {"gpus": ["x"]}}}}),
        "gpus",
    ),
    "GPU memory of 10^30": (
        _report(
            hardware={
                "hash": "abcdef0123",
                "data": {"probes": {"nvidia": {"gpus": [{**GPU, "memory_bytes": 10**30}]}}},
            }
        ),
        "memory_bytes",
    ),
    "GPU name of 301 characters": (
        _report(
            hardware={
                "hash": "abcdef0123",
                "data": {"probes": {"nvidia": {"gpus": [{**GPU, "name": "G" * 301}]}}},
            }
        ),
        "name",
    ),
    "hardware data 256 levels deep": (
        _report(hardware={"hash": "abcdef0123", "data": _nested(256)}),
        "deeper than 16 levels",
    ),
    "started_at in year 1 (+14:00)": (
        _report(started_at="0001-01-01T00:00:00+14:00"),
        "started_at",
    ),
    "NUL in a text field": (_report(engine__commit="d812\u0000350"), "commit"),
    "NUL in hardware data": (
        _report(hardware={"hash": "abcdef0123", "data": {"notes": {"host": "a\u0000b"}}}),
        "notes",
    ),
    "model name whose lower case outgrows its column": (
        _report(model={"name": "\u0130" * 120}),
        "lower-case form",
    ),
    "S_TG of 1e308": (
        _report(points=[{"pp": 512, "tg": 128, "b": 1, "s_tg": 1e308}]),
        "s_tg",
    ),
    "T_TG so small that B*TG/T_TG is infinite": (
        _report(points=[{"pp": 512, "tg": 128, "b": 1, "t_tg": 5e-324, "s_tg": 10.0}]),
        "s_tg",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE_REPORTS), ids=list(HOSTILE_REPORTS))
def test_reports_the_database_could_not_hold_are_422_naming_the_field(
    live_registry: LiveRegistry, case: str
) -> None:
    body, named = HOSTILE_REPORTS[case]
    token = live_registry.token("m4pro")
    with live_registry.client(token) as client:
        response = client.post("/v1/runs", content=json.dumps(body), headers=JSON)
        assert post_report(client, make_report()).status_code == 201  # the next one is fine
    assert response.status_code == 422, response.text
    assert named in _detail(response)
    assert live_registry.count("runs") == 1


def test_a_lone_surrogate_in_a_text_field_is_422(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    text = make_report().model_dump_json().replace('"Metal"', '"Met\\ud800al"')
    with live_registry.client(token) as client:
        response = client.post("/v1/runs", content=text, headers=JSON)
    assert response.status_code == 422, response.text
    assert "backend" in _detail(response)
    assert live_registry.count("runs") == 0


def test_extreme_but_valid_speeds_give_finite_answers(live_registry: LiveRegistry) -> None:
    """Speeds at the bounds, 1e12 and 1e-300 tokens/s, in one series: every run is stored,
    and every answer about it is a number (no overflow, no null)."""
    token = live_registry.token("m4pro")
    start = datetime(2026, 11, 1, tzinfo=UTC)
    with live_registry.client(token) as client:
        for day in range(10):
            s_tg = 1e-300 if day % 3 == 1 else 1e12  # the latest, day 9, is fast
            table = [(1, 1.0, s_tg), (2, 1.0, s_tg)]
            report = make_report(table=table, started_at=start + timedelta(days=day))
            assert post_report(client, report).status_code == 201
        regressions = client.get("/v1/regressions", params={"include_improvements": True})
        curves = client.get("/v1/curves", params={"node": "m4pro", "model": ARTICLE_MODEL})
        series = client.get(
            "/v1/series",
            params={"node": "m4pro", "model": ARTICLE_MODEL, "pp": 512, "tg": 128, "b": 1},
        )
        placement = client.get(
            "/v1/placement", params={"model": ARTICLE_MODEL, "min_tps_per_user": 1e9}
        )
        metrics = client.get("/metrics")
    for response in (regressions, curves, series, placement, metrics):
        assert response.status_code == 200, response.text
    assert all(isinstance(r["change_pct"], float) for r in regressions.json()["data"])
    points = curves.json()["curves"][0]["points"]
    assert [p["total_tps"] for p in points] == [1e12, 1e12]
    assert placement.json()["candidates"][0]["concurrency"] == 2


def test_bounds_per_report_and_per_node_are_422_saying_which(database_url: str) -> None:
    settings = RegistrySettings(
        database_url=database_url, max_points_per_report=8, max_series_per_node=10
    )
    with running_registry(settings) as registry:
        token = registry.token("m4pro")
        many = make_report(table=[(b, 100.0, 10.0 * b) for b in range(1, 10)])
        six = make_report()  # 6 points
        other_model = make_report(model="Other-Model-Q4_K_M")  # 6 more: 12 > 10
        with registry.client(token) as client:
            too_many = post_report(client, many)
            first = post_report(client, six)
            over = post_report(client, other_model)
            again = post_report(client, make_report(started_at=datetime(2026, 10, 17, tzinfo=UTC)))
        assert too_many.status_code == 422
        assert "FLEETBENCH_MAX_POINTS_PER_REPORT" in too_many.json()["detail"]
        assert "9 points" in too_many.json()["detail"]
        assert first.status_code == 201
        assert over.status_code == 422
        assert "12 points in its latest curves" in over.json()["detail"]
        assert "FLEETBENCH_MAX_SERIES_PER_NODE" in over.json()["detail"]
        assert again.status_code == 201  # the same model again replaces its own curve
        assert registry.count("runs") == 2
        with registry.client() as client:
            schema = client.get("/openapi.json").json()
    # the schema declares both shapes of 422 where a route answers both: a sentence, as
    # here, and a list naming each field for a request the schema refuses
    for path, method in (
        ("/v1/runs", "post"),
        ("/v1/plans/{name}", "put"),
        ("/v1/plans/{name}", "delete"),
    ):
        declared = schema["paths"][path][method]["responses"]["422"]["content"]
        detail = declared["application/json"]["schema"]["properties"]["detail"]["anyOf"]
        assert {"type": "string"} in detail, (path, method)
        assert [d["type"] for d in detail] == ["string", "array"]


def test_metrics_stay_small_whatever_the_fleet_sends(database_url: str) -> None:
    settings = RegistrySettings(database_url=database_url, metrics_max_points=5)
    with running_registry(settings) as registry:
        for node in ("a", "b"):
            with registry.client(registry.token(node)) as client:
                assert post_report(client, make_report(node=node)).status_code == 201
        with registry.client() as client:
            text = client.get("/metrics").text
    decode = [line for line in text.splitlines() if line.startswith("fleetbench_decode_")]
    assert len(decode) == 5
    assert all('node="a"' in line for line in decode)  # the first by node, model, PP, TG, B
    assert "fleetbench_fleet_points_truncated 1.0" in text


def test_an_unknown_token_is_refused_before_the_body_is_read(live_registry: LiveRegistry) -> None:
    """The request declares a 1 MB body and sends 100 bytes of it: the 401 comes at once,
    without the registry waiting for (or reading) the rest."""
    url = urlsplit(live_registry.url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/runs HTTP/1.1\r\nHost: registry\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer fbn_not-a-token\r\nContent-Length: 1000000\r\n\r\n" + b"{" * 100
        )
        began = time.monotonic()
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):  # the head, then the body
            if not (part := sock.recv(65536)):
                break
            answer += part
        waited = time.monotonic() - began
    assert answer.startswith(b"HTTP/1.1 401"), answer[:200]
    assert b"a valid token is required" in answer
    assert waited < 5
    assert live_registry.count("runs") == 0
