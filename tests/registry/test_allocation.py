"""What llama.cpp allocated, as the registry keeps it: the KV-cache prediction checked on the
run and the node, placement's fit checked against the measured weights and compute buffers,
a GPU's memory in use, the report's schema version 4 and its way to an older registry, on
SQLite and PostgreSQL."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from fleetbench.agent.client import RegistryClient
from fleetbench.contract import wire
from tests.agent.flaky_registry import flaky_registry
from tests.factories import (
    ARTICLE_MODEL,
    ARTICLE_MODEL_INFO,
    LiveRegistry,
    columns_down_and_up,
    make_report,
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
    sent = _report("m4pro", schema_version=4, settings=SETTINGS, buffers=BUFFERS)
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
    sent = _report("h100", schema_version=5, buffers=BUFFERS, device_memory=DEVICE_MEMORY)
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
    assert json.loads(sent.model_dump_json())["schema_version"] == 1
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
    measured_run = _report("m4pro", schema_version=4, settings=SETTINGS, buffers=BUFFERS)
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


def test_buffers_came_with_schema_version_4_for_offline_runs(live_registry: LiveRegistry) -> None:
    body = _report("m4pro", schema_version=4, buffers=BUFFERS).model_dump(mode="json")
    with live_registry.client(live_registry.token("m4pro")) as client:
        older = post_report(client, body | {"schema_version": 1, "run_id": str(uuid.uuid4())})
        huge = body | {"run_id": str(uuid.uuid4())}
        huge["buffers"] = [{"kind": "kv", "device": "CPU", "bytes": 2**60}]
        unknown = body | {"run_id": str(uuid.uuid4())}
        unknown["buffers"] = [{"kind": "weights", "device": "CPU", "bytes": 1}]
        gpu = [d.model_dump(mode="json") for d in DEVICE_MEMORY]
        gpu_older = body | {"device_memory": gpu}  # version 4
        gpu_older["run_id"] = str(uuid.uuid4())
        assert post_report(client, body).status_code == 201
        refused = [post_report(client, b) for b in (huge, unknown, gpu_older)]
    assert older.status_code == 422
    assert "buffers came with schema version 4, for offline runs" in older.text
    assert [r.status_code for r in refused] == [422, 422, 422]
    assert "device_memory came with schema version 5, for offline runs" in refused[2].text


def test_a_run_with_buffers_reaches_a_registry_that_predates_them_without_them() -> None:
    sent = _report("m4pro", schema_version=4, settings=SETTINGS, buffers=BUFFERS)
    with flaky_registry() as older, RegistryClient(older.url, token="t") as client:
        older.newest_version = 3
        receipt = client.submit_run(sent)
    assert receipt.run_id == sent.run_id
    first, resent = older.bodies[:2]
    assert (first["schema_version"], resent["schema_version"]) == (4, 1)
    assert "buffers" in first and "buffers" not in resent
    assert "device_memory" not in first  # a version 4 report is written as before it
    assert resent["points"] == first["points"]


@pytest.mark.parametrize(
    ("newest", "sent_as"),
    [(4, [5, 4]), (3, [5, 4, 1])],
    ids=["registry-takes-buffers", "registry-takes-neither"],
)
def test_a_gpu_run_steps_down_to_the_newest_version_the_registry_takes(
    newest: int, sent_as: list[int]
) -> None:
    sent = _report(
        "h100", schema_version=5, settings=SETTINGS, buffers=BUFFERS, device_memory=DEVICE_MEMORY
    )
    with flaky_registry() as older, RegistryClient(older.url, token="t") as client:
        older.newest_version = newest
        receipt = client.submit_run(sent)
    assert receipt.run_id == sent.run_id
    assert [b["schema_version"] for b in older.bodies] == sent_as
    taken = older.bodies[-1]
    assert "device_memory" not in taken
    assert ("buffers" in taken) == (newest >= 4)
    assert taken["points"] == older.bodies[0]["points"]


def test_the_buffer_columns_go_with_a_downgrade_and_come_back(database_url: str) -> None:
    gone, back = columns_down_and_up(database_url, "0011", "runs", "latest_runs")
    added = {"buffers", "kv_predicted_bytes", "kv_allocated_bytes", "device_memory"}
    assert not added & gone[0] and "beside_kv_bytes" not in gone[1]
    assert added <= back[0] and "beside_kv_bytes" in back[1]
