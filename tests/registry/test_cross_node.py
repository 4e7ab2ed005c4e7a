"""What one node may do to the others: nothing. A node's run ids are its own (another node
reporting the same id neither blocks it nor is blocked), and the model facts it reports are
its own (placement checks each node's fit against the facts that node reported, never
against whichever node reported the model first)."""

from __future__ import annotations

from typing import Any

import pytest

from fleetbench.contract import wire
from fleetbench.registry import crud
from fleetbench.registry.db import session_factory
from fleetbench.registry.ingest import Stored, ingest_batch
from tests.factories import (
    ARTICLE_MODEL,
    ARTICLE_MODEL_INFO,
    LiveRegistry,
    make_report,
    post_report,
)

SHA = "feed" + "0" * 60
NEMO = ARTICLE_MODEL_INFO.model_copy(update={"sha256": SHA})
# The same file as another node reports it: 100 times the layers, 100 times the size.
NEMO_LIES = NEMO.model_copy(update={"n_layer": 4000, "file_size": 747_720_755_200})


def _mac(name: str) -> wire.HardwareFingerprint:
    return wire.HardwareFingerprint(
        hash=name.ljust(64, "0")[:64].encode().hex()[:64],
        data={"probes": {"apple": {"chip": "Apple M4 Pro", "memory_bytes": 24 * 2**30}}},
    )


def _post(registry: LiveRegistry, report: wire.RunReport) -> Any:
    with registry.client(registry.token(report.node)) as client:
        return post_report(client, report)


def test_another_nodes_run_with_the_same_id_is_stored_beside_it(
    live_registry: LiveRegistry,
) -> None:
    mine = make_report(node="node-a")
    theirs = make_report(node="node-b", run_id=mine.run_id, error="node b's own run")
    first, second = _post(live_registry, mine), _post(live_registry, theirs)
    assert (first.status_code, second.status_code) == (201, 201)
    assert first.json()["stored_as"] == str(mine.run_id)
    moved = second.json()["stored_as"]
    assert second.json()["run_id"] == str(mine.run_id) != moved
    with live_registry.client() as client:
        assert client.get(f"/v1/runs/{mine.run_id}").json()["node"] == "node-a"
        detail = client.get(f"/v1/runs/{moved}").json()
    assert (detail["node"], detail["reported_id"], detail["error"]) == (
        "node-b",
        str(mine.run_id),
        "node b's own run",
    )
    # Each node's retry finds its own run; each node's edit conflicts with its own only.
    again = _post(live_registry, theirs)
    assert (again.status_code, again.json()["stored_as"]) == (200, moved)
    assert _post(live_registry, mine).status_code == 200
    edited = _post(live_registry, mine.model_copy(update={"error": "edited"}))
    assert edited.status_code == 409
    assert live_registry.count("runs") == 2


def test_a_node_cannot_take_a_run_id_ahead_of_its_owner(live_registry: LiveRegistry) -> None:
    owner = make_report(node="node-a")
    squatter = make_report(node="node-b", run_id=owner.run_id, table=[(1, 1.0, 1.0)])
    assert _post(live_registry, squatter).status_code == 201
    answer = _post(live_registry, owner)
    assert answer.status_code == 201, answer.text
    with live_registry.client() as client:
        detail = client.get(f"/v1/runs/{answer.json()['stored_as']}").json()
        runs = client.get("/v1/runs", params={"node": "node-a"}).json()
    assert (detail["node"], len(detail["points"])) == ("node-a", 6)
    assert [r["reported_id"] for r in runs["data"]] == [str(owner.run_id)]


def test_one_batch_with_two_nodes_on_one_run_id_stores_both(live_registry: LiveRegistry) -> None:
    one = make_report(node="node-a")
    other = make_report(node="node-b", run_id=one.run_id)
    live_registry.token("node-a"), live_registry.token("node-b")
    with session_factory(live_registry.engine)() as session:
        node_ids = [crud.find_node(session, r.node).id for r in (one, other)]  # type: ignore[union-attr]
        answers = ingest_batch(session, list(zip([one, other], node_ids, strict=True)))
        session.commit()
    stored = [answer.run_id for answer in answers if isinstance(answer, Stored)]
    assert len(stored) == 2
    assert stored[0] == one.run_id != stored[1]
    assert live_registry.count("runs") == 2


def _fit_answer(registry: LiveRegistry) -> dict[str, Any]:
    with registry.client() as client:
        response = client.get(
            "/v1/placement",
            params={"model": SHA, "min_tps_per_user": 6, "context_tokens": 8000},
        )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


@pytest.mark.parametrize("liar_first", [True, False])
def test_placement_checks_each_node_against_its_own_model_facts(
    live_registry: LiveRegistry, liar_first: bool
) -> None:
    honest = make_report(node="honest", model=NEMO, hardware=_mac("honest"))
    liar = make_report(node="liar", model=NEMO_LIES, hardware=_mac("liar"))
    for report in [liar, honest] if liar_first else [honest, liar]:
        assert _post(live_registry, report).status_code == 201
    answer = _fit_answer(live_registry)
    # The honest node's fit is its own facts' (8 users of 8,000 tokens, each padded to 8,192
    # cells, fit in 24 GiB),
    # whoever reported the model first; the other node's 747 GB file fits nowhere.
    [candidate] = answer["candidates"]
    assert (candidate["node"], candidate["concurrency"]) == ("honest", 8)
    assert (candidate["fit"], candidate["facts_from"]) == ("fits", "node")
    assert candidate["kv_cache_gib"] == pytest.approx(8 * 8192 * 160 * 1024 / 2**30)
    refused = {r["node"]: r for r in answer["rejected"]}
    assert refused["honest"]["concurrency"] == 32
    assert "not even one user fits" in refused["liar"]["reason"]
    with live_registry.client() as client:
        [model] = client.get("/v1/models").json()["data"]
    assert model["fact_sets"] == 2


def test_a_node_without_facts_is_checked_against_what_most_nodes_report(
    live_registry: LiveRegistry,
) -> None:
    for node in ("a", "b"):
        assert (
            _post(
                live_registry, make_report(node=node, model=NEMO, hardware=_mac(node))
            ).status_code
            == 201
        )
    assert (
        _post(live_registry, make_report(node="c", model=NEMO_LIES, hardware=_mac("c"))).status_code
        == 201
    )
    bare = wire.ModelInfo(name=ARTICLE_MODEL, sha256=SHA)  # an imported table: no facts
    assert (
        _post(live_registry, make_report(node="d", model=bare, hardware=_mac("d"))).status_code
        == 201
    )
    candidates = {c["node"]: c for c in _fit_answer(live_registry)["candidates"]}
    assert candidates["d"]["facts_from"] == "most nodes"
    assert candidates["d"]["fit"] == "fits"
    assert candidates["d"]["concurrency"] == 8  # a and b's facts, not c's
    assert candidates["a"]["facts_from"] == "node"
    assert "c" not in candidates
