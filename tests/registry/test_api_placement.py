"""GET /v1/placement over a real server and database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from fleetbench.contract import wire
from fleetbench.registry.config import RegistrySettings
from tests.factories import (
    ARTICLE_MODEL,
    ARTICLE_MODEL_INFO,
    ARTICLE_TABLE,
    LiveRegistry,
    make_report,
    post_report,
    running_registry,
)

SHA = "c0ffee" + "0" * 58


def _ask(registry: LiveRegistry, **params: object) -> tuple[int, dict[str, object]]:
    with registry.client() as client:
        response = client.get("/v1/placement", params=params)  # type: ignore[arg-type]
    return response.status_code, response.json()


def test_article_table_answers_m4pro_at_8(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    with live_registry.client(token) as client:
        assert post_report(client, make_report()).status_code == 201
    status, answer = _ask(live_registry, model=ARTICLE_MODEL, min_tps_per_user=15)
    assert status == 200
    assert answer["model"] == ARTICLE_MODEL
    assert answer["min_tps_per_user"] == 15
    [candidate] = answer["candidates"]  # type: ignore[misc]
    assert candidate["node"] == "m4pro"
    assert candidate["concurrency"] == 8
    assert candidate["per_user_tps"] == pytest.approx(16.71, abs=0.01)
    assert candidate["total_tps"] == 133.65
    assert candidate["prefill_tps"] == 285.83
    assert candidate["llama_cpp_build"] == 11429
    assert candidate["measured_at"] == "2026-10-16T12:00:00Z"


@pytest.mark.parametrize(
    "spelling", [ARTICLE_MODEL.lower(), f"{ARTICLE_MODEL}.gguf", f"{ARTICLE_MODEL.upper()}.GGUF"]
)
def test_model_matches_case_insensitive_with_or_without_gguf(
    live_registry: LiveRegistry, spelling: str
) -> None:
    token = live_registry.token("m4pro")
    with live_registry.client(token) as client:
        assert post_report(client, make_report()).status_code == 201
    status, answer = _ask(live_registry, model=spelling, min_tps_per_user=15)
    assert status == 200
    assert [c["concurrency"] for c in answer["candidates"]] == [8]  # type: ignore[union-attr]


def test_model_matches_by_sha256(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    report = make_report().model_copy(update={"model": wire.ModelInfo(name="nemo", sha256=SHA)})
    with live_registry.client(token) as client:
        assert post_report(client, report).status_code == 201
    status, answer = _ask(live_registry, model=SHA.upper(), min_tps_per_user=15)
    assert status == 200
    assert [c["node"] for c in answer["candidates"]] == ["m4pro"]  # type: ignore[union-attr]


def test_unknown_model_is_404(live_registry: LiveRegistry) -> None:
    status, answer = _ask(live_registry, model="no-such-model", min_tps_per_user=1)
    assert status == 404
    assert "no-such-model" in answer["detail"]  # type: ignore[operator]


def test_uses_each_nodes_latest_successful_run(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    older = datetime(2026, 10, 1, tzinfo=UTC)
    newer = datetime(2026, 11, 1, tzinfo=UTC)
    slower = [(b, s_pp, s_tg * 0.5) for b, s_pp, s_tg in ARTICLE_TABLE]
    failed = make_report(
        started_at=newer + timedelta(days=1), status="failed", points=[], error="out of memory"
    )
    with live_registry.client(token) as client:
        assert post_report(client, make_report(started_at=older)).status_code == 201
        assert post_report(client, make_report(started_at=newer, table=slower)).status_code == 201
        assert post_report(client, failed).status_code == 201
    _status, answer = _ask(live_registry, model=ARTICLE_MODEL, min_tps_per_user=10)
    # the newer, slower run: 14.15 per user at B=1, 10.53 at B=2 -> 2; the older one gave 16
    [candidate] = answer["candidates"]  # type: ignore[misc]
    assert (candidate["concurrency"], candidate["measured_at"][:10]) == (2, "2026-11-01")


def test_several_nodes_sorted_by_total(live_registry: LiveRegistry) -> None:
    fast = [(1, 900.0, 60.0), (8, 900.0, 320.0), (16, 900.0, 400.0)]
    for node, table in (("m4pro", ARTICLE_TABLE), ("h100-01", fast)):
        token = live_registry.token(node)
        with live_registry.client(token) as client:
            assert post_report(client, make_report(node=node, table=table)).status_code == 201
    _, answer = _ask(live_registry, model=ARTICLE_MODEL, min_tps_per_user=15)
    assert [(c["node"], c["concurrency"]) for c in answer["candidates"]] == [  # type: ignore[union-attr]
        ("h100-01", 16),
        ("m4pro", 8),
    ]


def test_limit_lists_the_best_and_count_says_how_many_qualify(
    live_registry: LiveRegistry,
) -> None:
    for number in range(5):
        node = f"gpu-{number}"
        token = live_registry.token(node)
        table = [(b, 900.0, (20 + number) * b) for b in (1, 2, 4)]  # 20+n per user at any B
        with live_registry.client(token) as client:
            assert post_report(client, make_report(node=node, table=table)).status_code == 201
    _, top2 = _ask(live_registry, model=ARTICLE_MODEL, min_tps_per_user=15, limit=2)
    _, everything = _ask(live_registry, model=ARTICLE_MODEL, min_tps_per_user=15)
    assert [(c["node"], c["concurrency"]) for c in top2["candidates"]] == [  # type: ignore[union-attr]
        ("gpu-4", 4),
        ("gpu-3", 4),
    ]
    assert top2["count"] == everything["count"] == 5
    assert "the 2 with the highest total throughput are listed" in top2["reason"]  # type: ignore[operator]
    assert len(everything["candidates"]) == 5  # type: ignore[arg-type]


def test_none_qualifies_is_200_with_reason(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    with live_registry.client(token) as client:
        assert post_report(client, make_report()).status_code == 201
    status, answer = _ask(live_registry, model=ARTICLE_MODEL, min_tps_per_user=40)
    assert status == 200
    assert answer["candidates"] == []
    assert "best available is m4pro at concurrency 1 with 28.30" in answer["reason"]  # type: ignore[operator]


def test_prompt_tokens_and_max_age(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    recent = datetime.now(UTC) - timedelta(days=2)
    with live_registry.client(token) as client:
        long_prompts = make_report(pp=4096, started_at=recent)
        assert post_report(client, long_prompts).status_code == 201
    _, fits = _ask(live_registry, model=ARTICLE_MODEL, min_tps_per_user=15, prompt_tokens=2048)
    _, too_long = _ask(live_registry, model=ARTICLE_MODEL, min_tps_per_user=15, prompt_tokens=8192)
    _, fresh = _ask(live_registry, model=ARTICLE_MODEL, min_tps_per_user=15, max_age_days=7)
    _, stale = _ask(live_registry, model=ARTICLE_MODEL, min_tps_per_user=15, max_age_days=1)
    assert [c["prompt_tokens"] for c in fits["candidates"]] == [4096]  # type: ignore[union-attr]
    assert too_long["candidates"] == []
    assert "longest measured is 4096" in too_long["reason"]  # type: ignore[operator]
    assert len(fresh["candidates"]) == 1  # type: ignore[arg-type]
    assert stale["candidates"] == []
    assert "in the last 1 days" in stale["reason"]  # type: ignore[operator]


@pytest.mark.parametrize(
    "params",
    [
        {"model": ARTICLE_MODEL},
        {"model": ARTICLE_MODEL, "min_tps_per_user": -1},
        {"model": ARTICLE_MODEL, "min_tps_per_user": "fast"},
        {"model": ARTICLE_MODEL, "min_tps_per_user": 5, "prompt_tokens": -3},
        {"model": ARTICLE_MODEL, "min_tps_per_user": 5, "limit": 0},
    ],
)
def test_bad_placement_queries_are_422(
    live_registry: LiveRegistry, params: dict[str, object]
) -> None:
    status, _ = _ask(live_registry, **params)
    assert status == 422


def test_partial_latest_run_counts(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    partial = make_report(
        table=ARTICLE_TABLE[:4],
        status="partial",
        failures=[wire.FailedPoint(pp=512, tg=128, b=16, reason="failed to find a memory slot")],
        started_at=datetime(2026, 11, 2, tzinfo=UTC),
    )
    with live_registry.client(token) as client:
        assert post_report(client, make_report()).status_code == 201
        assert post_report(client, partial).status_code == 201
    _, answer = _ask(live_registry, model=ARTICLE_MODEL, min_tps_per_user=6)
    [candidate] = answer["candidates"]  # type: ignore[misc]
    # the older complete run reached B=32 at 6.05/user; the latest stopped at B=8
    assert (candidate["concurrency"], candidate["run_id"]) == (8, str(partial.run_id))


def test_reason_with_long_enough_prompts_that_are_too_slow(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    with live_registry.client(token) as client:
        assert post_report(client, make_report(pp=4096)).status_code == 201
    _, answer = _ask(live_registry, model=ARTICLE_MODEL, min_tps_per_user=40, prompt_tokens=1024)
    assert answer["candidates"] == []
    assert "best available is m4pro at concurrency 1 with 28.30" in answer["reason"]  # type: ignore[operator]
    assert "prompt 4096 tokens" in answer["reason"]  # type: ignore[operator]


def test_placement_with_reads_closed_needs_a_token(database_url: str) -> None:
    settings = RegistrySettings(database_url=database_url, read_token_required=True)
    with running_registry(settings) as registry:
        with registry.client(registry.token("m4pro")) as client:
            assert post_report(client, make_report()).status_code == 201
        with registry.client(registry.scoped_token("reader")) as client:
            answer = client.get(
                "/v1/placement", params={"model": ARTICLE_MODEL, "min_tps_per_user": 15}
            )
    assert answer.status_code == 200
    assert [c["concurrency"] for c in answer.json()["candidates"]] == [8]


NEMO = ARTICLE_MODEL_INFO.model_copy(update={"sha256": SHA})
M4PRO_24GB = wire.HardwareFingerprint(
    hash="a" * 64,
    data={"probes": {"apple": {"chip": "Apple M4 Pro", "memory_bytes": 24 * 2**30}}},
)


def _report_article_with_architecture(registry: LiveRegistry) -> None:
    token = registry.token("m4pro")
    with registry.client(token) as client:
        sent = make_report(model=NEMO, hardware=M4PRO_24GB)
        assert post_report(client, sent).status_code == 201


def test_context_tokens_reject_concurrencies_whose_kv_cache_does_not_fit(
    live_registry: LiveRegistry,
) -> None:
    _report_article_with_architecture(live_registry)
    # 32 users reach 6.05 tokens/s each, but 32 x 8,000 tokens of KV cache, each user's share
    # padded to 8,192 cells in a stream of its own (llama.cpp b6975+), is 40 GiB
    status, answer = _ask(
        live_registry, model=ARTICLE_MODEL, min_tps_per_user=6, context_tokens=8000
    )
    assert status == 200
    assert answer["context_tokens"] == 8000
    [rejected] = answer["rejected"]  # type: ignore[misc]
    assert (rejected["node"], rejected["concurrency"]) == ("m4pro", 32)
    assert rejected["kv_cache_gib"] == pytest.approx(40.00, abs=0.01)
    assert "at most 8 users fit" in rejected["reason"]
    [candidate] = answer["candidates"]  # type: ignore[misc]
    assert candidate["concurrency"] == 8  # the largest measured B <= 8
    assert candidate["fit"] == "fits"
    assert candidate["kv_cache_gib"] == pytest.approx(8 * 8192 * 160 * 1024 / 2**30)
    assert candidate["past_knee"] is False
    assert "refused" in answer["reason"]  # type: ignore[operator]


def test_one_long_conversation_fits_and_reports_its_kv_cache(live_registry: LiveRegistry) -> None:
    _report_article_with_architecture(live_registry)
    status, answer = _ask(
        live_registry, model=ARTICLE_MODEL, min_tps_per_user=25, context_tokens=20480
    )
    assert status == 200
    [candidate] = answer["candidates"]  # type: ignore[misc]
    assert candidate["concurrency"] == 1
    assert candidate["kv_cache_gib"] == pytest.approx(3.125)
    assert candidate["fit"] == "fits"
    assert answer["rejected"] == []


def test_nothing_fits_when_one_user_is_too_many(live_registry: LiveRegistry) -> None:
    _report_article_with_architecture(live_registry)
    status, answer = _ask(
        live_registry, model=ARTICLE_MODEL, min_tps_per_user=6, context_tokens=200_000
    )
    assert status == 200
    assert answer["candidates"] == []
    [rejected] = answer["rejected"]  # type: ignore[misc]
    assert "not even one user fits" in rejected["reason"]
    assert str(answer["reason"]).startswith(
        "no node meets 6 tokens/s per user on Mistral-Nemo-Instruct-2407-Q4_K_M with 200000 "
        "tokens of context per user: the KV cache of every concurrency fast enough would not fit"
    )


@pytest.mark.parametrize(
    ("model_changes", "settings_changes"),
    [
        ({"head_dim_k": None, "head_dim_v": None}, {}),  # layers and heads, no head sizes
        ({"n_layer": 0}, {}),
        ({}, {"cache_type_k": "q8_K"}),  # a cache type the KV maths does not know
    ],
)
def test_models_the_kv_maths_cannot_size_are_answered_unchecked(
    live_registry: LiveRegistry,
    model_changes: dict[str, object],
    settings_changes: dict[str, object],
) -> None:
    token = live_registry.token("m4pro")
    with live_registry.client(token) as client:
        sent = make_report(
            model=NEMO.model_copy(update=model_changes),
            hardware=M4PRO_24GB,
            settings=wire.RunSettings(**settings_changes),  # type: ignore[arg-type]
        )
        assert post_report(client, sent).status_code == 201
    for context in (None, 8000):
        params = {"context_tokens": context} if context else {}
        status, answer = _ask(live_registry, model=ARTICLE_MODEL, min_tps_per_user=6, **params)
        assert status == 200, answer
        [candidate] = answer["candidates"]  # type: ignore[misc]
        assert candidate["concurrency"] == 32
        assert candidate["kv_cache_gib"] is None and candidate["fit"] == "not checked"


def test_fit_not_checked_without_architecture_numbers(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    with live_registry.client(token) as client:
        assert post_report(client, make_report(hardware=M4PRO_24GB)).status_code == 201
    status, answer = _ask(
        live_registry, model=ARTICLE_MODEL, min_tps_per_user=6, context_tokens=8000
    )
    assert status == 200
    [candidate] = answer["candidates"]  # type: ignore[misc]
    assert candidate["concurrency"] == 32 and candidate["past_knee"] is True
    assert candidate["fit"] == "not checked" and candidate["kv_cache_gib"] is None
    assert "KV-cache fit unknown for 1 node(s) (m4pro: the model's architecture" in str(
        answer["reason"]
    )
