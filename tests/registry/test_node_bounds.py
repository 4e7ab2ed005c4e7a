"""What one node's reports can do to the others: it cannot take another node's name for a
model, nor fill the registry with rows; and what a plan says of the nodes' insides is
shown to tokens only."""

from __future__ import annotations

from typing import Any

from fleetbench.registry.config import RegistrySettings
from tests.factories import (
    ARTICLE_MODEL_INFO,
    LiveRegistry,
    make_report,
    post_report,
    running_registry,
)

DIGEST = "5" * 64


def test_a_node_cannot_take_another_nodes_name_for_a_model(live_registry: LiveRegistry) -> None:
    """Node B reports digest S as "Squatted-Name" first; node A then reports S as
    "Beta-13B-Q4". Before, A's run showed B's name and placement by A's name was a 404."""
    squatted = ARTICLE_MODEL_INFO.model_copy(update={"name": "Squatted-Name", "sha256": DIGEST})
    honest = ARTICLE_MODEL_INFO.model_copy(update={"name": "Beta-13B-Q4", "sha256": DIGEST})
    with live_registry.client(live_registry.token("node-b")) as client:
        assert post_report(client, make_report(node="node-b", model=squatted)).status_code == 201
    with live_registry.client(live_registry.token("node-a")) as client:
        sent = make_report(node="node-a", model=honest)
        assert post_report(client, sent).status_code == 201
    with live_registry.client() as reader:
        run = reader.get(f"/v1/runs/{sent.run_id}").json()
        placed = reader.get("/v1/placement", params={"model": "Beta-13B-Q4", "min_tps_per_user": 1})
        by_digest = reader.get("/v1/placement", params={"model": DIGEST, "min_tps_per_user": 1})
    assert run["model"] == "Beta-13B-Q4"
    assert placed.status_code == 200, placed.text
    assert {c["node"] for c in placed.json()["candidates"]} == {"node-a"}
    # the file itself is one file: asked by its digest, both nodes' runs answer
    assert {c["node"] for c in by_digest.json()["candidates"]} == {"node-a", "node-b"}


def _failed_run(node: str, model: str) -> dict[str, Any]:
    failed = make_report(node=node, model=model, table=[], status="failed", error="OOM")
    return failed.model_dump(mode="json")


def test_a_node_makes_at_most_so_many_models(registry_settings: RegistrySettings) -> None:
    """Failed runs naming ever new models: past FLEETBENCH_MAX_ROWS_PER_NODE each is
    refused with the reason, and another node still reports its own. Before, every one
    made a model (300 runs: 300 models)."""
    settings = registry_settings.model_copy(update={"max_rows_per_node": 5})
    with running_registry(settings) as registry:
        with registry.client(registry.token("noisy")) as client:
            answers = [post_report(client, _failed_run("noisy", f"m-{i}")) for i in range(8)]
        with registry.client(registry.token("quiet")) as client:
            theirs = post_report(client, _failed_run("quiet", "their-own"))
        with registry.client() as reader:
            models = reader.get("/v1/models").json()
    assert [a.status_code for a in answers] == [201] * 5 + [422] * 3
    assert "made 5 models already" in answers[-1].json()["detail"]
    assert theirs.status_code == 201
    assert models["count"] == 6


OFFLINE_PLAN = {
    "model": {"path": "/srv/models/secret-project.gguf"},
    "cron": "0 3 * * *",
    "binary": "/opt/llama/bin/llama-batched-bench",
}
SERVING_PLAN = {
    "kind": "serving",
    "url": "http://10.1.2.3:8080",
    "model": {"name": "served"},
    "cron": "0 4 * * *",
}


def test_a_plans_paths_and_urls_are_shown_to_tokens_only(live_registry: LiveRegistry) -> None:
    """With reads open, anyone reads the plans, but not the paths, binaries and server URLs
    in them (before: all of them); a reader token sees them."""
    admin = live_registry.scoped_token("admin", name="ops")
    with live_registry.client(admin) as client:
        for name, plan in (("nightly", OFFLINE_PLAN), ("serving", SERVING_PLAN)):
            assert client.put(f"/v1/plans/{name}", json=plan).status_code == 201
    with live_registry.client() as anyone:
        hidden = anyone.get("/v1/plans").json()
        history = anyone.get("/v1/plans/nightly/versions").json()
    with live_registry.client(live_registry.scoped_token("reader")) as reader:
        shown = reader.get("/v1/plans").json()
    plans = {p["name"]: p for p in hidden["data"]}
    assert hidden["paths_hidden"] is True
    assert plans["nightly"]["model"]["path"] is None
    assert plans["nightly"]["binary"] is None
    assert plans["serving"]["url"] is None
    assert plans["nightly"]["cron"] == "0 3 * * *"  # the rest is shown
    assert "secret-project" not in str(history) and "llama-batched-bench" not in str(history)
    assert shown["paths_hidden"] is False
    assert {p["name"]: p.get("url") for p in shown["data"]}["serving"] == "http://10.1.2.3:8080"
