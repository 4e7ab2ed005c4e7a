"""What llama.cpp allocated, as the registry keeps it: the KV-cache prediction checked on the
run and the node, placement's fit checked against the measured weights and compute buffers,
a GPU's memory in use, and what a report's buffers may hold, on SQLite and PostgreSQL."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from fleetbench.contract import wire
from tests.factories import (
    ARTICLE_MODEL,
    ARTICLE_MODEL_INFO,
    LiveRegistry,
    make_report,
    make_serving_report,
    post_report,
)

MIB = 2**20
M4PRO_24GB = wire.HardwareFingerprint(
    hash="a" * 64,
    data={"probes": {"apple": {"chip": "Apple M4 Pro", "memory_bytes": 24 * 2**30}}},
)
# The article's sweep (B up to 32, PP 512 + TG 128) in one unified cache: 32 x 640 cells of
# 160 KiB = 3,200 MiB predicted (separate caches would pad each sequence's 640 to 768); this
# llama.cpp allocated 3,072 MiB of KV cache, 7,131 MiB of weights and 2,000 MiB of compute
# scratch on Metal.
SETTINGS = wire.RunSettings(
    n_ctx=32 * 640, n_ubatch=512, cache_type_k="f16", cache_type_v="f16", kv_unified=True
)
BUFFERS = [
    wire.AllocatedBuffer(kind="model", device="Metal_Mapped", bytes=7_131 * MIB),
    wire.AllocatedBuffer(kind="output", device="CPU", bytes=4 * MIB),
    wire.AllocatedBuffer(kind="kv", device="Metal", bytes=3_072 * MIB),
    wire.AllocatedBuffer(kind="compute", device="Metal", bytes=2_000 * MIB),
]

# An H100's memory in use around a CUDA sweep, as NVML counts it.
DEVICE_MEMORY = [
    wire.DeviceMemoryUse(gpu=0, total_bytes=81_559 * MIB, before_bytes=0, peak_bytes=9_874 * MIB)
]


def _report(node: str, **fields: Any) -> wire.RunReport:
    return make_report(node=node, model=ARTICLE_MODEL_INFO, hardware=M4PRO_24GB, **fields)


def _placement(registry: LiveRegistry) -> dict[str, Any]:
    with registry.client() as client:
        answer: dict[str, Any] = client.get(
            "/v1/placement",
            params={"model": ARTICLE_MODEL, "min_tps_per_user": 6, "context_tokens": 8000},
        ).json()
    return answer


def test_a_run_s_buffers_check_the_kv_prediction_on_the_run_and_its_node(
    live_registry: LiveRegistry,
) -> None:
    sent = _report("m4pro", settings=SETTINGS, buffers=BUFFERS)
    with live_registry.client(live_registry.token("m4pro")) as client:
        assert post_report(client, sent).status_code == 201
    with live_registry.client() as client:
        run = client.get(f"/v1/runs/{sent.run_id}").json()
        listed = client.get("/v1/runs", params={"node": "m4pro"}).json()["data"][0]
        node = client.get("/v1/nodes/m4pro").json()
    assert run["kv_predicted_bytes"] == 3_200 * MIB
    assert run["kv_allocated_bytes"] == 3_072 * MIB
    assert run["kv_prediction_error_pct"] == pytest.approx(100 * 128 / 3072)  # +4.17%
    assert [b["kind"] for b in run["buffers"]] == ["model", "output", "kv", "compute"]
    assert run["buffers"][0] == {"kind": "model", "device": "Metal_Mapped", "bytes": 7_131 * MIB}
    assert listed["kv_prediction_error_pct"] == pytest.approx(4.1667, abs=1e-3)
    assert node["kv_prediction_error_pct"] == pytest.approx(4.1667, abs=1e-3)


def test_a_gpu_run_keeps_its_memory_in_use(live_registry: LiveRegistry) -> None:
    sent = _report("h100", buffers=BUFFERS, device_memory=DEVICE_MEMORY)
    with live_registry.client(live_registry.token("h100")) as client:
        assert post_report(client, sent).status_code == 201
    with live_registry.client() as client:
        run = client.get(f"/v1/runs/{sent.run_id}").json()
    assert run["device_memory"] == [
        {
            "gpu": 0,
            "total_bytes": 81_559 * MIB,
            "before_bytes": 0,
            "peak_bytes": 9_874 * MIB,
        }
    ]


def test_a_run_without_buffers_has_a_prediction_and_nothing_to_check_it_with(
    live_registry: LiveRegistry,
) -> None:
    sent = _report("old-agent", settings=SETTINGS)
    with live_registry.client(live_registry.token("old-agent")) as client:
        assert post_report(client, sent).status_code == 201
    with live_registry.client() as client:
        run = client.get(f"/v1/runs/{sent.run_id}").json()
    assert run["kv_predicted_bytes"] == 3_200 * MIB
    assert (run["kv_allocated_bytes"], run["kv_prediction_error_pct"]) == (None, None)
    assert run["buffers"] == [] and run["device_memory"] == []


def test_placement_fits_users_beside_the_measured_weights_and_compute_buffers(
    live_registry: LiveRegistry,
) -> None:
    """Predicted only (the file's 6.96 GiB stands for everything beside the KV cache), 8 users
    of 8,000 tokens (each padded to 8,192 cells) fit the M4 Pro's GPU share: concurrency 8.
    Measured, the weights and the compute scratch take 8.88 GiB: 7 users fit, and the
    largest measured B below is 4."""
    with live_registry.client(live_registry.token("m4pro")) as client:
        assert post_report(client, _report("m4pro", settings=SETTINGS)).status_code == 201
    predicted = _placement(live_registry)
    measured_run = _report("m4pro", settings=SETTINGS, buffers=BUFFERS)
    measured_run = measured_run.model_copy(
        update={"started_at": measured_run.started_at.replace(hour=13)}
    )
    with live_registry.client(live_registry.token("m4pro")) as client:
        assert post_report(client, measured_run).status_code == 201
    measured = _placement(live_registry)
    [before] = predicted["candidates"]
    assert (before["concurrency"], before["fit"], before["fit_basis"]) == (
        8,
        "fits",
        "predicted only",
    )
    assert "the fit of 1 listed node(s) is predicted only (m4pro" in predicted["reason"]
    [after] = measured["candidates"]
    assert (after["concurrency"], after["fit"], after["fit_basis"]) == (
        4,
        "fits",
        "measured buffers",
    )
    assert "predicted only" not in measured["reason"]
    [refused] = measured["rejected"]  # 32 users, the fastest in all
    assert "at most 7 users fit" in refused["reason"]
    assert "weights and compute buffers as allocated" in refused["reason"]


def test_buffers_and_gpu_memory_are_an_offline_run_s_within_bounds(
    live_registry: LiveRegistry,
) -> None:
    body = _report("m4pro", buffers=BUFFERS).model_dump(mode="json")
    with live_registry.client(live_registry.token("m4pro")) as client:
        huge = body | {"run_id": str(uuid.uuid4())}
        huge["buffers"] = [{"kind": "kv", "device": "CPU", "bytes": 2**60}]
        unknown = body | {"run_id": str(uuid.uuid4())}
        unknown["buffers"] = [{"kind": "weights", "device": "CPU", "bytes": 1}]
        serving = make_serving_report(node="m4pro", points=[(1, 1.0, 1.0, 1.0)])
        served = serving.model_dump(mode="json") | {"buffers": body["buffers"]}
        assert post_report(client, body).status_code == 201
        refused = [post_report(client, b) for b in (huge, unknown, served)]
    assert [r.status_code for r in refused] == [422, 422, 422]
    assert "buffers and device_memory belong to offline runs" in refused[2].text
