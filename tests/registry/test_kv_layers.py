"""Per-layer KV facts as the registry keeps and uses them: stored with the model's facts,
sized by the node's build's rules in placement (which say which rules, for which build),
"fit unknown" with its reason where the maths cannot say, no part of a run's identity when
absent, and the prediction's error in /metrics; on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from fleetbench.contract import wire
from tests.factories import LiveRegistry, make_report, post_report
from tests.registry.test_metrics import scrape, series

GIB, MIB = 2**30, 2**20
H100 = wire.HardwareFingerprint(
    hash="b" * 64,
    data={
        "probes": {
            "nvidia": {
                "driver_version": "550.54.15",
                "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_bytes": 80 * GIB}],
            }
        }
    },
)
# Gemma 4 12B's layers: 40 sliding-window ones of 8 KV heads x 256, 8 full ones of 1 x 512
GEMMA4 = wire.ModelInfo(
    name="gemma-4-12b",
    file_size=7 * GIB,
    n_layer=48,
    n_head_kv=8,
    head_dim_k=512,
    head_dim_v=512,
    sliding_window=1024,
    n_swa_layers=40,
    layers=wire.KvLayers(
        architecture="gemma4",
        head_count_kv=[8, 8, 8, 8, 8, 1] * 8,
        sliding_window_layers=([True] * 5 + [False]) * 8,
        head_dim_k_swa=256,
        head_dim_v_swa=256,
    ),
)  # fmt: skip
# A GLM-DSA file that does not say which layers keep an indexer cache
GLM_DSA = wire.ModelInfo(
    name="glm-5.2",
    file_size=7 * GIB,
    n_layer=79,
    n_head_kv=1,
    head_dim_k=576,
    head_dim_v=512,
    layers=wire.KvLayers(
        architecture="glm-dsa", head_count_kv=[1] * 79, mla=True, nextn_layers=1,
        indexer_head_dim=128,
    ),
)  # fmt: skip


def _report(model: wire.ModelInfo, **fields: Any) -> wire.RunReport:
    return make_report(node="h100", model=model, hardware=H100, build_number=10505, **fields)


def _placement(registry: LiveRegistry, model: str, **params: Any) -> dict[str, Any]:
    with registry.client() as client:
        response = client.get(
            "/v1/placement", params={"model": model, "min_tps_per_user": 6, **params}
        )
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_per_layer_facts_size_the_cache_by_the_node_s_build(live_registry: LiveRegistry) -> None:
    sent = _report(GEMMA4, settings=wire.RunSettings(swa_full=True))
    with live_registry.client(live_registry.token("h100")) as client:
        assert post_report(client, sent).status_code == 201
    [candidate] = _placement(live_registry, GEMMA4.name)["candidates"]
    # 32 users at the point's 640 tokens, each padded to 768 cells in a stream of its own;
    # the window layers as large as the context (swa_full): 8 x 512 + 40 x 2048 per cell
    assert candidate["concurrency"] == 32
    per_cell = (8 * 512 + 40 * 2048) * 2 * 2
    assert candidate["kv_cache_gib"] == pytest.approx(32 * 768 * per_cell / GIB)
    assert candidate["kv_rules"] == "llama.cpp b10243+ rules, for b10505"
    assert live_registry.count("model_facts WHERE layers IS NOT NULL") == 1


def test_a_model_the_maths_cannot_express_is_fit_unknown(live_registry: LiveRegistry) -> None:
    with live_registry.client(live_registry.token("h100")) as client:
        assert post_report(client, _report(GLM_DSA)).status_code == 201
    answer = _placement(live_registry, GLM_DSA.name, context_tokens=8000)
    [candidate] = answer["candidates"]
    assert candidate["kv_cache_gib"] is None and candidate["fit"] == "not checked"
    assert candidate["kv_rules"].startswith("fit unknown: GLM-DSA keeps an indexer cache")
    assert "KV-cache fit unknown for 1 node(s) (h100: GLM-DSA keeps an indexer" in answer["reason"]


def test_fields_at_their_defaults_are_not_part_of_a_run_s_identity() -> None:
    """A report without per-layer facts or swa_full is, for a retry's digest, what it was
    before those fields existed: a field added with a default changes no identity."""
    settings = wire.RunSettings(n_ctx=4096)
    defining = json.loads(wire.defining_json(make_report(settings=settings)))
    assert defining["settings"] == {"n_ctx": 4096}  # swa_full, at its default, left out
    assert "layers" not in defining["model"] and "schema_version" not in defining


def test_the_prediction_s_error_is_in_metrics(live_registry: LiveRegistry) -> None:
    # 20480 cells of the article's model (160 KiB each) in one unified cache: 3,200 MiB
    # predicted, 3,072 allocated
    settings = wire.RunSettings(n_ctx=20480, kv_unified=True)
    buffers = [wire.AllocatedBuffer(kind="kv", device="CUDA0", bytes=3_072 * MIB)]
    article = wire.ModelInfo(name="nemo", n_layer=40, n_head_kv=8, head_dim_k=128, head_dim_v=128)
    sent = make_report(node="h100", model=article, settings=settings, buffers=buffers)
    with live_registry.client(live_registry.token("h100")) as client:
        assert post_report(client, sent).status_code == 201
        errors = series(scrape(client), "fleetbench_kv_prediction_error_percent", "node", "model")
    assert errors == {("h100", "nemo"): pytest.approx(100 * 128 / 3072)}


def test_a_retry_finds_the_facts_stored_with_their_layers(live_registry: LiveRegistry) -> None:
    first, second = _report(GEMMA4), _report(GEMMA4, run_id=uuid.uuid4())
    with live_registry.client(live_registry.token("h100")) as client:
        assert post_report(client, first).status_code == 201
        assert post_report(client, second).status_code == 201
    assert live_registry.count("model_facts") == 1
