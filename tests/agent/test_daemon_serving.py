"""Serving sweeps in the daemon: `[[serve_sweep]]` tables and the registry's serving plans,
run against servers on loopback, put off while the server serves others, swept again when
the server's build changes, and delivered to a live registry."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest

from fleetbench.agent.daemon import ConfigError, ServeSweepConfig, load_config
from tests.agent.serving_stub import stub_server
from tests.factories import LiveRegistry, a_daemon

TABLE = """
[agent]
node = "gpu-07"

[[serve_sweep]]
name = "gemma-server"
url = "http://127.0.0.1:8080/"
model = "gemma-3-270m"
cron = "30 * * * *"
concurrency = [1, 2, 4]
prompt_tokens = 256
gen_tokens = 64
"""

LOAD = {"prompt_tokens": 8, "gen_tokens": 10, "requests": 4, "concurrency": [1, 2]}


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "agent.toml"
    path.write_text(text)
    return path


def test_a_serve_sweep_table_is_read_with_its_load(tmp_path: Path) -> None:
    [sweep] = load_config(_write(tmp_path, TABLE)).sweeps
    assert isinstance(sweep, ServeSweepConfig)
    assert (sweep.name, sweep.url, sweep.model, sweep.cron) == (
        "gemma-server",
        "http://127.0.0.1:8080",
        "gemma-3-270m",
        "30 * * * *",
    )
    spec = sweep.spec()
    assert (spec.concurrency, spec.prompt_tokens, spec.gen_tokens) == ((1, 2, 4), 256, 64)
    searched = load_config(_write(tmp_path, TABLE + 'slo = "ttft_p90 <= 2s"\n')).sweeps[0]
    assert searched.spec().slo == "ttft_p90<=2000ms"  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('url = "http://127.0.0.1:8080/"', 'url = "ftp://x"'), "serve_sweep[0].url"),
        (('cron = "30 * * * *"', 'cron = "61 * * * *"'), "serve_sweep[0].cron"),
        (("gen_tokens = 64", 'slo = "ttft_p90>=1"'), "serve_sweep[0].slo"),
        (("gen_tokens = 64", "requests = 4\nduration_s = 9"), "not both"),
        (("gen_tokens = 64", "npl = [1]"), "serve_sweep[0].npl: Extra inputs"),
        (("[[serve_sweep]]", "[serve_sweep]"), "[[sweep]] and [[serve_sweep]] lists"),
        (
            ("[agent]", '[[sweep]]\nname = "gemma-server"\nmodel = "/m"\ncron = "0 3 * * *"\n'
             "[agent]"),
            "sweep names must be unique across [[sweep]] and [[serve_sweep]]",
        ),
    ],
)  # fmt: skip
def test_a_bad_serve_sweep_table_names_the_key(
    tmp_path: Path, change: tuple[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_config(_write(tmp_path, TABLE.replace(*change)))


def _serve_sweep(url: str, **load: Any) -> ServeSweepConfig:
    return ServeSweepConfig.model_validate(
        {"name": "server", "url": url, "model": "m", "cron": "0 * * * *", **LOAD, **load}
    )


def test_the_daemon_sweeps_a_server_and_again_when_its_build_changes(
    tmp_path: Path, live_registry: LiveRegistry
) -> None:
    token = live_registry.token("ci-node")
    with stub_server(slots=4, version="0.6.0") as stub:
        sweep = _serve_sweep(stub.url)
        # a busy machine puts offline sweeps off, not a serving sweep: its load is the server
        daemon = a_daemon(
            tmp_path, sweep, load=(99.0, None), registry_url=live_registry.url, token=token
        )
        assert daemon.changed_since_last_success(sweep) == "no successful run yet"
        assert daemon.run_sweep(sweep, why="test") == "ok"
        assert daemon.changed_since_last_success(sweep) is None
        stub.version = "0.6.1"  # upgraded
        assert daemon.changed_since_last_success(sweep) == (
            "changed: server vllm 0.6.0 -> vllm 0.6.1"
        )
    assert daemon.changed_since_last_success(sweep) is None  # gone: nothing to tell
    with live_registry.client() as client:
        [run] = client.get("/v1/runs", params={"node": "ci-node"}).json()["data"]
        detail = client.get(f"/v1/runs/{run['id']}").json()
    assert (run["kind"], run["status"]) == ("serving", "ok")
    assert detail["server"]["kind"] == "vllm" and detail["engine"]["binding_version"] == "0.6.0"
    assert [p["concurrency"] for p in detail["serving_points"]] == [1, 2]
    assert [p["output_tokens"] for p in detail["serving_points"]] == [40, 40]


def test_a_server_serving_others_is_left_alone_and_the_sweep_put_off(tmp_path: Path) -> None:
    with stub_server(slots=4) as stub:
        stub.others_in_flight = 3
        daemon = a_daemon(tmp_path, _serve_sweep(stub.url))
        sweep = daemon.config.sweeps[0]
        status = daemon.run_sweep(sweep, why="test")
        sent = stub.requests
    assert status == "postponed: not measured: the server is serving 3 request(s) of others"
    assert sent == 0  # not one request of ours reached it
    assert daemon.spool.counts()["queued"] == 0


def _plan(registry: LiveRegistry, admin: str, server: str, **body: Any) -> httpx.Response:
    plan = {
        "kind": "serving",
        "cron": "0 3 * * *",
        "model": {"name": "gemma-3-270m"},
        "url": server,
        "serve": LOAD,
        **body,
    }
    with registry.client(admin) as client:
        return client.put("/v1/plans/served", json=plan)


def test_a_serving_plan_runs_where_the_node_allows_its_server_and_is_skipped_elsewhere(
    tmp_path: Path, live_registry: LiveRegistry
) -> None:
    admin = live_registry.scoped_token("admin", name="ops")
    with stub_server(slots=4) as stub:
        saved = _plan(live_registry, admin, stub.url + "/")
        assert saved.status_code == 201, saved.text
        daemons = {
            node: a_daemon(
                tmp_path / node,
                node=node,
                registry_url=live_registry.url,
                token=live_registry.token(node),
                **allowed,
            )
            for node, allowed in (("allows", {"plan_serve_urls": [stub.url]}), ("other", {}))
        }
        for daemon in daemons.values():
            daemon.schedule()
            daemon.poll_plans()
        planned = daemons["allows"].planned["served"].sweep
        assert isinstance(planned, ServeSweepConfig) and planned.url == stub.url
        assert daemons["allows"].run_sweep(planned, why="test") == "ok"
    skipped = daemons["other"].planned["served"]
    assert skipped.sweep is None
    assert skipped.skipped == (
        f"server {stub.url} is not one this node lets plans load-test (agent.plan_serve_urls)"
    )
    with live_registry.client() as client:
        runs = client.get("/v1/runs", params={"node": "allows"}).json()["data"]
    assert [(r["kind"], r["model"]) for r in runs] == [("serving", "gemma-3-270m")]


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"model": {"path": "/m.gguf"}}, "a serving plan names its server's url and its model"),
        (
            {"settings": {"npl": [1]}},
            "settings, engine, binary and binding_version are an offline plan's",
        ),
        ({"serve": {"concurrency": [0]}}, '"loc":["body","serve","concurrency",0]'),
        ({"url": "file:///etc/passwd"}, "is not an http(s) URL with a host"),
        ({"kind": "offline", "model": {"path": "/m.gguf"}}, "url and serve are a serving plan"),
    ],
)
def test_bad_serving_plans_are_refused_with_the_field_named(
    live_registry: LiveRegistry, body: dict[str, Any], problem: str
) -> None:
    admin = live_registry.scoped_token("admin")
    refused = _plan(live_registry, admin, "http://127.0.0.1:8080", **body)
    assert refused.status_code == 422
    assert problem in refused.text


def test_a_node_pulls_the_kinds_of_plan_it_asks_for_each_with_its_own_fields(
    live_registry: LiveRegistry,
) -> None:
    admin = live_registry.scoped_token("admin")
    token = live_registry.token("old-node")
    offline = {"cron": "0 3 * * *", "model": {"path": "/models/m.gguf"}}
    with live_registry.client(admin) as client:
        assert client.put("/v1/plans/nightly", json=offline).status_code == 201
        # an objective written with an exponent, and seconds: kept as milliseconds
        served = _plan(live_registry, admin, "http://127.0.0.1:8080",
                       serve={"slo": "e2e_p99<=1e3s,total_tps>=1500000"})  # fmt: skip
        assert served.status_code == 201, served.text
        assert served.json()["serve"]["slo"] == "e2e_p99<=1000000ms,total_tps>=1500000"
    with live_registry.client(token) as client:
        offline_only = client.get("/v1/agent/plans", params={"kind": "offline"}).json()
        every_kind = client.get("/v1/agent/plans").json()
    [nightly] = offline_only["plans"]
    assert nightly["name"] == "nightly" and nightly["kind"] == "offline"
    assert not {"url", "serve"} & nightly.keys()  # a plan holds its own kind's fields
    assert [(p["name"], p["kind"]) for p in every_kind["plans"]] == [
        ("nightly", "offline"),
        ("served", "serving"),
    ]
    assert not {"settings", "engine", "binary"} & every_kind["plans"][1].keys()
