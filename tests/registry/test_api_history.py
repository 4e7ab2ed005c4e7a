"""Regressions, curves, series and node health over a real server and database."""

from __future__ import annotations

import csv
import io
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fleetbench.contract import wire
from tests.factories import (
    ARTICLE_MODEL,
    DAY0,
    WOBBLE,
    LiveRegistry,
    agent,
    make_report,
    post_history,
    post_report,
)


def get(registry: LiveRegistry, path: str, **params: object) -> Any:
    with registry.client() as client:
        response = client.get(path, params=params)  # type: ignore[arg-type]
    assert response.status_code == 200, response.text
    return response.json()


def test_a_15_percent_slower_build_is_a_regression_caused_by_the_build(
    live_registry: LiveRegistry,
) -> None:
    post_history(
        live_registry,
        [(11429, w) for w in WOBBLE[:5]] + [(11500, 0.85 * w) for w in WOBBLE[5:7]],
    )
    found = get(live_registry, "/v1/regressions")
    # every B of S_TG and S_PP got slower: 6 x 2 series
    assert found["count"] == 12
    by_series = {(r["metric"], r["b"]): r for r in found["data"]}
    eight = by_series[("s_tg", 8)]
    assert eight["node"] == "m4pro" and eight["model"] == ARTICLE_MODEL
    assert (eight["pp"], eight["tg"], eight["kind"]) == (512, 128, "regression")
    assert eight["cause_kinds"] == ["llama.cpp build"]
    assert (
        eight["cause"]
        == "llama.cpp build changed (llama.cpp b11429 Metal -> llama.cpp b11500 Metal)"
    )
    assert (eight["before_build"], eight["after_build"]) == (
        "llama.cpp b11429 Metal",
        "llama.cpp b11500 Metal",
    )
    assert eight["before"] == pytest.approx(133.65 * 1.003, rel=0.01)
    assert eight["change_pct"] == pytest.approx(-15, abs=1.5)
    assert 0 < eight["noise_pct"] < 3
    assert eight["confidence"] > 0.99
    assert (eight["runs_before"], eight["runs_after"]) == (5, 2)
    assert eight["first_seen_at"] == (DAY0 + timedelta(days=5)).isoformat().replace("+00:00", "Z")
    # filters
    assert get(live_registry, "/v1/regressions", min_change=20)["count"] == 0
    with live_registry.client() as client:
        for asked in ({"node": "m4pr0"}, {"model": "no-such-model"}):
            unknown = client.get("/v1/regressions", params=asked)
            assert unknown.status_code == 404, unknown.text
            assert "not found" in unknown.json()["detail"]
    assert get(live_registry, "/v1/regressions", node="m4pro", min_change=20)["count"] == 0
    later = (DAY0 + timedelta(days=6)).isoformat()
    assert get(live_registry, "/v1/regressions", since=later)["count"] == 0
    [node] = get(live_registry, "/v1/nodes")["data"]
    assert (node["health"], node["open_regressions"]) == ("regressed", 12)
    assert node["engine"] == "llama.cpp b11500 Metal"


def test_the_agent_cli_lists_the_regressions_as_the_api_gives_them(
    live_registry: LiveRegistry,
) -> None:
    post_history(
        live_registry,
        [(11429, w) for w in WOBBLE[:5]] + [(11500, 0.85 * w) for w in WOBBLE[5:7]],
    )
    asked = ("regressions", "--registry", live_registry.url)
    table = agent(*asked, "--node", "m4pro", "--min-change", "10")
    assert table.returncode == 0, table.stderr
    as_json = json.loads(agent(*asked, "--json").stdout)
    assert as_json == get(live_registry, "/v1/regressions")
    [eight] = [r for r in as_json["data"] if (r["metric"], r["b"]) == ("s_tg", 8)]
    rows = [
        [cell.strip() for cell in row.split("\u2502")[1:-1]] for row in table.stdout.splitlines()
    ]
    [cells] = [row for row in rows if row[:1] == [str(eight["id"])]]
    assert cells == [
        str(eight["id"]), "m4pro", ARTICLE_MODEL, "512", "128", "8", "s_tg",
        f"{eight['before']:.2f}", f"{eight['after']:.2f}", f"{eight['change_pct']:+.1f}",
        f"{eight['noise_pct']:.1f}", "2026-11-06 06:00",
        "llama.cpp build changed (llama.cpp b11429 Metal -> llama.cpp b11500 Metal)",
    ]  # fmt: skip
    assert len([row for row in rows if len(row) == 13]) == 12  # one row a step
    none = agent(*asked, "--min-change", "20")
    assert none.returncode == 0 and "no regression found" in none.stdout
    refused = agent(*asked, "--min-change", "-1")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    misspelt = agent(*asked, "--node", "m4pr0")
    assert misspelt.returncode == 2
    assert misspelt.stderr.startswith("error: registry answered 404: node 'm4pr0' not found")
    gone = agent("regressions", "--registry", "http://127.0.0.1:9")
    assert gone.returncode == 4, gone.stderr


def test_repeated_runs_with_only_noise_raise_nothing(live_registry: LiveRegistry) -> None:
    post_history(live_registry, [(11429, w) for w in WOBBLE] + [(11500, w) for w in WOBBLE])
    assert get(live_registry, "/v1/regressions", include_improvements=True)["count"] == 0


def test_an_outlier_reported_then_withdrawn_when_the_series_reverts(
    live_registry: LiveRegistry,
) -> None:
    # two slow runs on the new build: a regression...
    post_history(live_registry, [(1, w) for w in WOBBLE[:5]] + [(2, 0.8), (2, 0.8)])
    assert get(live_registry, "/v1/regressions")["count"] == 12
    token = live_registry.token("m4pro")
    with live_registry.client(token) as client:
        for day in (7, 8, 9):  # ...until three more runs on that build are back to normal
            sent = make_report(build_number=2, started_at=DAY0 + timedelta(days=day))
            assert post_report(client, sent).status_code == 201
    assert get(live_registry, "/v1/regressions")["count"] == 0


def test_acknowledged_regressions_stop_being_reported(live_registry: LiveRegistry) -> None:
    post_history(live_registry, [(1, w) for w in WOBBLE[:5]] + [(2, 0.8), (2, 0.8)])
    [first, *_] = get(live_registry, "/v1/regressions")["data"]
    with live_registry.client() as anonymous:
        refused = anonymous.post(f"/v1/regressions/{first['id']}/acknowledge", json={"note": "x"})
        assert refused.status_code == 401
    for node in ("other", "m4pro"):  # the node that regressed cannot silence itself
        with live_registry.client(live_registry.token(node)) as node_client:
            refused = node_client.post(
                f"/v1/regressions/{first['id']}/acknowledge", json={"note": "x"}
            )
            assert refused.status_code == 403, refused.text
            assert "needs an admin token" in refused.json()["detail"]
    with live_registry.client(live_registry.scoped_token("admin", "ops-alice")) as client:
        done = client.post(
            f"/v1/regressions/{first['id']}/acknowledge", json={"note": "expected: new sampler"}
        )
        assert done.status_code == 200, done.text
        assert done.json()["note"] == "expected: new sampler"
        assert done.json()["acknowledged_at"] is not None
        # its name and id: two admin tokens may share a name
        assert re.fullmatch(r"ops-alice \(token \d+\)", done.json()["acknowledged_by"])
        missing = client.post("/v1/regressions/999999/acknowledge", json={"note": "x"})
        assert missing.status_code == 404
    assert get(live_registry, "/v1/regressions")["count"] == 11
    everything = get(live_registry, "/v1/regressions", include_acknowledged=True)
    assert everything["count"] == 12


def test_curves_one_per_build_with_the_knee(live_registry: LiveRegistry) -> None:
    post_history(live_registry, [(11429, 1.0), (11429, 1.01), (11500, 0.9)])
    answer = get(live_registry, "/v1/curves", node="m4pro", model=ARTICLE_MODEL)
    assert answer["knee_threshold"] == 0.25
    old, new = answer["curves"]
    assert (old["label"], new["label"]) == ("llama.cpp b11429 Metal", "llama.cpp b11500 Metal")
    assert old["measured_at"] == (DAY0 + timedelta(days=1)).isoformat().replace("+00:00", "Z")
    assert (old["knee"], new["knee"]) == (8, 8)
    assert [p["b"] for p in old["points"]] == [1, 2, 4, 8, 16, 32]
    assert [p["past_knee"] for p in old["points"]] == [False] * 4 + [True] * 2
    eight = old["points"][3]
    assert eight["total_tps"] == pytest.approx(133.65 * 1.01)
    assert eight["per_user_tps"] == pytest.approx(133.65 * 1.01 / 8)
    assert eight["ms_per_token"] == pytest.approx(1000 / (133.65 * 1.01 / 8))
    assert eight["prefill_tps"] == pytest.approx(285.83 * 1.01)
    with live_registry.client() as client:
        assert client.get("/v1/curves", params={"node": "x", "model": "y"}).status_code == 404


def test_series_marks_the_build_change_and_exports_csv(live_registry: LiveRegistry) -> None:
    post_history(live_registry, [(1, w) for w in WOBBLE[:5]] + [(2, 0.8), (2, 0.8)])
    params = {"node": "m4pro", "model": ARTICLE_MODEL, "pp": 512, "tg": 128, "b": 8}
    answer = get(live_registry, "/v1/series", **params)
    assert [p["value"] for p in answer["points"]] == pytest.approx(
        [133.65 * w for w in WOBBLE[:5]] + [133.65 * 0.8] * 2
    )
    changes = [p["change"] for p in answer["points"]]
    assert changes[:5] == [None] * 5 and changes[6] is None
    assert changes[5] == "llama.cpp build changed (llama.cpp b1 Metal -> llama.cpp b2 Metal)"
    [regression] = answer["regressions"]
    assert regression["b"] == 8 and regression["metric"] == "s_tg"
    with live_registry.client() as client:
        response = client.get("/v1/series", params={**params, "format": "csv"})
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/csv")
    assert "attachment" in response.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert len(rows) == 7
    assert float(rows[5]["value"]) == pytest.approx(133.65 * 0.8)
    assert rows[5]["build"] == "llama.cpp b2 Metal"
    assert rows[0]["node"] == "m4pro" and rows[0]["b"] == "8"


def test_node_health_stale_failing_and_hardware(live_registry: LiveRegistry) -> None:
    token = live_registry.token("h100")
    live_registry.token("idle")
    hardware = wire.HardwareFingerprint(
        hash="f" * 64,
        data={
            "probes": {
                "nvidia": {
                    "driver_version": "550.54.15",
                    "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_bytes": 80 * 2**30}],
                }
            }
        },
    )
    with live_registry.client(token) as client:
        old = make_report(node="h100", hardware=hardware, started_at=DAY0)
        assert post_report(client, old).status_code == 201
    nodes = {n["name"]: n for n in get(live_registry, "/v1/nodes")["data"]}
    assert nodes["idle"]["health"] == "no runs"
    assert nodes["h100"]["health"] == "stale"  # DAY0 is weeks before now
    assert nodes["h100"]["hardware"] == "NVIDIA H100 80GB HBM3 (driver 550.54.15)"
    assert nodes["h100"]["last_status"] == "ok"
    with live_registry.client(token) as client:
        failed = make_report(
            node="h100",
            started_at=datetime.now(UTC),
            status="failed",
            error="model failed to load",
            points=[],
        )
        assert post_report(client, failed).status_code == 201
    nodes = {n["name"]: n for n in get(live_registry, "/v1/nodes")["data"]}
    assert nodes["h100"]["health"] == "failing"
    assert nodes["h100"]["last_status"] == "failed"


def test_a_regression_a_later_build_recovered_stays_listed_but_the_node_is_healthy(
    live_registry: LiveRegistry,
) -> None:
    now = datetime.now(UTC) - timedelta(days=11)  # the last run today: not stale
    post_history(
        live_registry,
        [(1, w) for w in WOBBLE[:5]] + [(2, 0.8)] * 3 + [(3, w) for w in WOBBLE[:3]],
        start=now,
    )
    assert get(live_registry, "/v1/regressions")["count"] == 12  # build 2 was slower
    everything = get(live_registry, "/v1/regressions", include_improvements=True)
    assert everything["count"] == 24  # and build 3 recovered
    recovered = {(r["after_build"], r["kind"]) for r in everything["data"]}
    assert recovered == {
        ("llama.cpp b2 Metal", "regression"),
        ("llama.cpp b3 Metal", "improvement"),
    }
    [node] = get(live_registry, "/v1/nodes")["data"]
    assert (node["health"], node["open_regressions"]) == ("ok", 0)
