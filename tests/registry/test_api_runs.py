"""POST /v1/runs: auth, idempotency, validation, size limit; GET of runs, nodes, models."""

from __future__ import annotations

import hashlib
import json
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from fleetbench.contract import wire
from fleetbench.registry.config import RegistrySettings
from tests.factories import (
    ARTICLE_MODEL,
    ARTICLE_MODEL_INFO,
    LiveRegistry,
    make_report,
    post_report,
    running_registry,
)


def test_ingest_stores_run_with_points_and_failures(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    report = make_report(
        status="partial",
        failures=[wire.FailedPoint(pp=512, tg=128, b=64, reason="failed to find a memory slot")],
        hardware=wire.HardwareFingerprint(hash="abcdef0123456789", data={"chip": "M4 Pro"}),
    )
    with live_registry.client(token) as client:
        response = post_report(client, report)
        assert response.status_code == 201, response.text
        assert response.json() == {
            "run_id": str(report.run_id),
            "stored_as": str(report.run_id),
            "outcome": "created",
            "points": 6,
            "failures": 1,
            "ignored_fields": [],
        }
        detail = client.get(f"/v1/runs/{report.run_id}").json()
    assert detail["node"] == "m4pro"
    assert detail["status"] == "partial"
    assert detail["engine"]["build_number"] == 11429
    assert [p["b"] for p in detail["points"]] == [1, 2, 4, 8, 16, 32]
    assert detail["points"][3]["s_tg"] == pytest.approx(133.65)
    assert detail["failures"] == [
        {"pp": 512, "tg": 128, "b": 64, "reason": "failed to find a memory slot"}
    ]
    assert detail["hardware"]["data"] == {"chip": "M4 Pro"}
    assert live_registry.count("run_points") == 6


def test_ingest_retry_with_same_body_is_stored_once(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    report = make_report()
    with live_registry.client(token) as client:
        first = post_report(client, report)
        second = post_report(client, report)
    assert (first.status_code, second.status_code) == (201, 200)
    assert second.json()["outcome"] == "already stored"
    assert live_registry.count("runs") == 1
    assert live_registry.count("run_points") == 6


def test_ingest_same_run_id_different_body_conflicts(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    report = make_report()
    changed = report.model_copy(update={"error": "edited"})
    with live_registry.client(token) as client:
        assert post_report(client, report).status_code == 201
        response = post_report(client, changed)
    assert response.status_code == 409
    assert str(report.run_id) in response.json()["detail"]
    assert live_registry.count("runs") == 1


def test_fields_a_newer_agent_adds_are_left_out_and_named_in_the_receipt(
    live_registry: LiveRegistry,
) -> None:
    """A tolerant reader: what the registry does not know is stored without, not refused, and
    a retry without those fields (or with a default written out) is the same run."""
    token = live_registry.token("m4pro")
    body = make_report().model_dump(mode="json")
    newer = {**body, "energy_j": 12.5, "settings": {**body["settings"], "new_knob": 1}}
    newer["points"] = [{**p, "joules": 1.0} for p in body["points"]]
    newer["model"] = {**body["model"], "layers": {"head_count_kv": [8] * 40, "rope": "yarn"}}
    with live_registry.client(token) as client:
        stored = post_report(client, newer)
        assert stored.status_code == 201, stored.text
        assert stored.json()["ignored_fields"] == [
            "energy_j",
            "model.layers.rope",
            "settings.new_knob",
            "points[].joules",
        ]
        older = {**body, "model": newer["model"], "status": "ok", "failures": []}
        retried = post_report(client, older)
        assert (retried.status_code, retried.json()["outcome"]) == (200, "already stored")
        detail = client.get(f"/v1/runs/{body['run_id']}").json()
    assert "new_knob" not in json.dumps(detail) and "joules" not in json.dumps(detail)
    assert live_registry.count("runs") == 1


def test_ingest_without_token_is_401(live_registry: LiveRegistry) -> None:
    with live_registry.client() as client:
        response = post_report(client, make_report())
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert live_registry.count("runs") == 0


def test_ingest_with_unknown_token_is_401(live_registry: LiveRegistry) -> None:
    live_registry.token("m4pro")
    with live_registry.client("fbn_not-a-token") as client:
        assert post_report(client, make_report()).status_code == 401


def test_ingest_with_another_nodes_token_is_403(live_registry: LiveRegistry) -> None:
    live_registry.token("m4pro")
    other = live_registry.token("h100-01")
    with live_registry.client(other) as client:
        response = post_report(client, make_report(node="m4pro"))
    assert response.status_code == 403
    assert "h100-01" in response.json()["detail"]
    assert live_registry.count("runs") == 0


def _valid_body() -> dict[str, Any]:
    return make_report().model_dump(mode="json")


def _with_point(**changes: Any) -> dict[str, Any]:
    body = _valid_body()
    body["points"][0].update(changes)
    return body


def _with_model(**changes: Any) -> dict[str, Any]:
    body = _valid_body()
    body["model"].update(changes)
    return body


def _without(field: str) -> dict[str, Any]:
    body = _valid_body()
    del body[field]
    return body


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (_with_point(s_tg="NaN"), ["body", "points", 0, "s_tg"]),
        (_with_point(s_pp="Infinity"), ["body", "points", 0, "s_pp"]),
        (_with_point(s_tg=-1.0), ["body", "points", 0, "s_tg"]),
        (_with_point(t_tg=-0.5), ["body", "points", 0, "t_tg"]),
        (_with_point(b=0), ["body", "points", 0, "b"]),
        (_with_point(pp=-1), ["body", "points", 0, "pp"]),
        (_with_point(tg=-128), ["body", "points", 0, "tg"]),
        # B*TG/T_TG = 1*128/4.0 = 32.0, but S_TG says 28.30: 11.6% apart
        (_with_point(t_tg=4.0), ["body", "points", 0, "s_tg"]),
        (_with_point(t_tg=0.0), ["body", "points", 0, "s_tg"]),
        (_with_point(b=2**40), ["body", "points", 0, "b"]),
        ({**_valid_body(), "schema_version": 7}, ["body", "schema_version"]),
        ({**_valid_body(), "schema_version": 5}, ["body", "schema_version"]),
        (_without("schema_version"), ["body", "schema_version"]),
        ({**_valid_body(), "started_at": "2026-10-16T12:00:00"}, ["body", "started_at"]),
        ({**_valid_body(), "source": "guess"}, ["body", "source"]),
        (_with_model(n_layer=2**40), ["body", "model", "n_layer"]),
        (
            {**_valid_body(), "hardware": {"hash": "abcdef012345", "data": {"t": "NaN"}}},
            ["body", "hardware", "data"],
        ),
        (
            {**_valid_body(), "points": [*_valid_body()["points"], _valid_body()["points"][0]]},
            ["body", "points"],
        ),
    ],
    ids=[
        "nan",
        "infinite",
        "negative-speed",
        "negative-time",
        "b-zero",
        "pp-negative",
        "tg-negative",
        "s_tg-disagrees",
        "t_tg-zero",
        "b-too-large",
        "newer-version",
        "older-version",
        "no-version",
        "naive-time",
        "unknown-source",
        "n_layer-too-large",
        "nan-in-hardware",
        "same-cell-twice",
    ],
)
def test_ingest_rejects_bad_report_naming_the_field(
    live_registry: LiveRegistry, body: dict[str, Any], field: list[Any]
) -> None:
    token = live_registry.token("m4pro")
    with live_registry.client(token) as client:
        # NaN and Infinity are not JSON: send them the way Python's json module writes them
        content = json.dumps(body).replace('"NaN"', "NaN").replace('"Infinity"', "Infinity")
        response = client.post(
            "/v1/runs", content=content, headers={"content-type": "application/json"}
        )
    assert response.status_code == 422, response.text
    locations = [error["loc"] for error in response.json()["detail"]]
    assert field in locations
    assert live_registry.count("runs") == 0
    assert live_registry.count("models") == 0


def test_s_tg_within_one_percent_of_b_tg_over_t_tg_is_accepted(
    live_registry: LiveRegistry,
) -> None:
    token = live_registry.token("m4pro")
    expected = 8 * 128 / 7.66  # 133.68
    body = _valid_body()
    body["points"][3].update(t_tg=7.66, s_tg=expected * 1.009)
    with live_registry.client(token) as client:
        assert post_report(client, body).status_code == 201


def test_body_over_size_limit_is_413_and_stores_nothing(database_url: str) -> None:
    settings = RegistrySettings(database_url=database_url, max_report_bytes=2000)
    with running_registry(settings) as registry:
        token = registry.token("m4pro")
        big = make_report(table=[(b, 280.0, 20.0 * b) for b in range(1, 41)])
        with registry.client(token) as client:
            response = post_report(client, big)
            chunked = client.post(
                "/v1/runs",
                content=iter([big.model_dump_json().encode()]),  # no Content-Length
                headers={"content-type": "application/json"},
            )
            small = post_report(client, make_report(table=[(1, 282.07, 28.30)]))
        assert response.status_code == 413
        assert "2000 bytes" in response.json()["detail"]
        assert chunked.status_code == 413
        assert small.status_code == 201
        assert registry.count("runs") == 1


def test_failed_run_needs_error_and_is_stored_without_points(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    body = _valid_body()
    body.update(status="failed", points=[], error=None)
    with live_registry.client(token) as client:
        assert post_report(client, body).status_code == 422
        body["error"] = "model file is corrupt: bad magic"
        assert post_report(client, body).status_code == 201


def test_read_runs_filters_and_paginates(live_registry: LiveRegistry) -> None:
    a, b = live_registry.token("m4pro"), live_registry.token("h100-01")
    with live_registry.client(a) as client:
        for day in (1, 2, 3):
            started = datetime(2026, 11, day, tzinfo=UTC)
            assert post_report(client, make_report(started_at=started)).status_code == 201
    with live_registry.client(b) as client:
        report = make_report(node="h100-01", model="gemma-3-270m-Q4_K_M.gguf")
        assert post_report(client, report).status_code == 201

    with live_registry.client() as client:
        everything = client.get("/v1/runs").json()
        by_node = client.get("/v1/runs", params={"node": "m4pro"}).json()
        by_model = client.get("/v1/runs", params={"model": "GEMMA-3-270M-Q4_K_M"}).json()
        since = client.get("/v1/runs", params={"since": "2026-11-02T00:00:00Z"}).json()
        page = client.get("/v1/runs", params={"node": "m4pro", "limit": 2, "offset": 2}).json()
        missing = client.get("/v1/runs/00000000-0000-0000-0000-000000000000")
    assert everything["count"] == 4
    assert by_node["count"] == 3
    assert [r["node"] for r in by_model["data"]] == ["h100-01"]
    assert since["count"] == 2  # Nov 2 and Nov 3
    assert page["count"] == 3
    assert [r["started_at"][:10] for r in page["data"]] == ["2026-11-01"]
    assert missing.status_code == 404


def test_read_nodes_and_models(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro", site="lab")
    live_registry.token("idle-node")
    model = ARTICLE_MODEL_INFO.model_copy(update={"sha256": "ab" * 32})
    with live_registry.client(token) as client:
        assert post_report(client, make_report(model=ARTICLE_MODEL)).status_code == 201
        report = make_report(model=ARTICLE_MODEL, hardware=None)
        report = report.model_copy(update={"model": model})
        assert post_report(client, report).status_code == 201
        nodes = client.get("/v1/nodes").json()
        node = client.get("/v1/nodes/m4pro").json()
        models = client.get("/v1/models").json()
        assert client.get("/v1/nodes/nope").status_code == 404
    assert [(n["name"], n["runs"]) for n in nodes["data"]] == [("idle-node", 0), ("m4pro", 2)]
    assert node["labels"] == {"site": "lab"}
    assert node["runs"] == 2
    shas = sorted((m["sha256"] or "", m["n_layer"], m["runs"]) for m in models["data"])
    assert shas == [("", None, 1), ("ab" * 32, 40, 1)]
    started = report.started_at.isoformat().replace("+00:00", "Z")
    assert [m["last_run_at"] for m in models["data"]] == [started, started]


def test_reads_can_require_a_token(database_url: str) -> None:
    settings = RegistrySettings(database_url=database_url, read_token_required=True)
    with running_registry(settings) as registry:
        reader = registry.scoped_token("reader")
        with registry.client() as anonymous, registry.client(reader) as client:
            assert anonymous.get("/v1/nodes").status_code == 401
            placement = {"model": "x", "min_tps_per_user": 1}
            assert anonymous.get("/v1/placement", params=placement).status_code == 401
            assert anonymous.get("/healthz").status_code == 200
            assert client.get("/v1/nodes").status_code == 200


def test_concurrent_retries_of_one_run_store_it_once(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    report = make_report()

    def send(_: int) -> int:
        with live_registry.client(token) as client:
            return post_report(client, report).status_code

    with ThreadPoolExecutor(max_workers=6) as pool:
        statuses = sorted(pool.map(send, range(6)))
    assert statuses == [200, 200, 200, 200, 200, 201]
    assert live_registry.count("runs") == 1
    assert live_registry.count("run_points") == 6
    assert live_registry.count("models") == 1
    assert live_registry.count("engine_builds") == 1


def test_concurrent_new_runs_share_one_model_and_build_row(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    reports = [make_report(model="brand-new-model") for _ in range(6)]

    def send(report: wire.RunReport) -> int:
        with live_registry.client(token) as client:
            return post_report(client, report).status_code

    with ThreadPoolExecutor(max_workers=6) as pool:
        statuses = list(pool.map(send, reports))
    assert statuses == [201] * 6
    assert live_registry.count("runs") == 6
    assert live_registry.count("models") == 1
    assert live_registry.count("engine_builds") == 1


def test_tokens_are_stored_only_as_their_sha256(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    with live_registry.engine.connect() as connection:
        stored = [row[0] for row in connection.exec_driver_sql("SELECT token_sha256 FROM tokens")]
    assert stored == [hashlib.sha256(token.encode()).hexdigest()]
    assert token not in stored


def test_times_are_kept_in_utc_whatever_zone_they_came_in(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    paris = timezone(timedelta(hours=2))
    report = make_report(
        started_at=datetime(2026, 10, 16, 12, 0, tzinfo=paris),
        finished_at=datetime(2026, 10, 16, 12, 30, tzinfo=paris),
    )
    with live_registry.client(token) as client:
        assert post_report(client, report).status_code == 201
        run = client.get(f"/v1/runs/{report.run_id}").json()
        before = client.get("/v1/runs", params={"since": "2026-10-16T12:30:00+02:00"}).json()
        after = client.get("/v1/runs", params={"since": "2026-10-16T11:30:00+02:00"}).json()
        naive_utc = client.get("/v1/runs", params={"since": "2026-10-16T10:00:01"}).json()
        nodes = client.get("/v1/nodes").json()
    assert (run["started_at"], run["finished_at"]) == (
        "2026-10-16T10:00:00Z",
        "2026-10-16T10:30:00Z",
    )
    assert (before["count"], after["count"], naive_utc["count"]) == (0, 1, 0)
    assert nodes["data"][0]["last_run_at"] == "2026-10-16T10:00:00Z"


def test_fingerprints_keep_first_and_last_seen(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    old_gpu = wire.HardwareFingerprint(hash="fp-old-gpu-0001", data={"gpu": "A"})
    new_gpu = wire.HardwareFingerprint(hash="fp-new-gpu-0002", data={"gpu": "B"})
    day = timedelta(days=1)
    start = datetime(2026, 11, 1, tzinfo=UTC)
    with live_registry.client(token) as client:
        for offset, hardware in ((1, old_gpu), (0, old_gpu), (3, old_gpu), (5, new_gpu)):
            report = make_report(started_at=start + offset * day, hardware=hardware)
            assert post_report(client, report).status_code == 201
        node = client.get("/v1/nodes/m4pro").json()
    assert [
        (f["hash"], f["first_seen"][:10], f["last_seen"][:10]) for f in node["fingerprints"]
    ] == [
        ("fp-new-gpu-0002", "2026-11-06", "2026-11-06"),
        ("fp-old-gpu-0001", "2026-11-01", "2026-11-04"),
    ]
    assert node["runs"] == 4
    assert node["last_run_at"] == "2026-11-06T00:00:00Z"


def test_runs_filter_by_model_sha256(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    sha = "ab" * 32
    report = make_report().model_copy(update={"model": wire.ModelInfo(name="nemo", sha256=sha)})
    with live_registry.client(token) as client:
        assert post_report(client, report).status_code == 201
        assert post_report(client, make_report()).status_code == 201
        found = client.get("/v1/runs", params={"model": sha.upper()}).json()
    assert [r["id"] for r in found["data"]] == [str(report.run_id)]
