"""`fleetbench-agent import` and `placement` as a user runs them, against a live registry."""

from __future__ import annotations

import importlib.metadata
import json
import re
import subprocess
from pathlib import Path

from fleetbench.contract.wire import SCHEMA_VERSION
from fleetbench.registry.config import RegistrySettings
from tests.agent.tiny_gguf import write_tiny_gguf
from tests.factories import ARTICLE_MODEL, FIXTURES, LiveRegistry, agent, running_registry
from tests.model_headers import write_mistral_nemo_q4_k_m

ROOT = Path(__file__).parent.parent
ARTICLE_EXAMPLE = ROOT / "examples" / "m4pro-mistral-nemo-q4km.md"


def import_file(
    path: Path, *options: str, node: str = "m4pro", model: str = ARTICLE_MODEL, **env: str
) -> subprocess.CompletedProcess[str]:
    return agent("import", str(path), "--node", node, "--model", model, *options, **env)


def test_import_article_table_then_placement(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    imported = import_file(ARTICLE_EXAMPLE, "--registry", live_registry.url, "--token", token)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.startswith("created: run ")
    assert "133.65" in imported.stderr and "16.71" in imported.stderr  # the curve shown

    env = {"FLEETBENCH_REGISTRY_URL": live_registry.url, "FLEETBENCH_TOKEN": token}
    again = import_file(ARTICLE_EXAMPLE, **env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("already stored: run ")
    assert live_registry.count("runs") == 1
    with live_registry.client() as client:
        [run] = client.get("/v1/runs").json()["data"]
    assert run["agent"] == f"fleetbench-agent {importlib.metadata.version('fleetbench')}"

    question = ("placement", "--model", ARTICLE_MODEL, "--min-tps-per-user", "15")
    answer = agent(*question, "--json", "--registry", live_registry.url)
    assert answer.returncode == 0, answer.stderr
    [candidate] = json.loads(answer.stdout)["candidates"]
    assert (candidate["node"], candidate["concurrency"], candidate["total_tps"]) == (
        "m4pro",
        8,
        133.65,
    )
    assert candidate["llama_cpp_build"] == 11429
    table = agent(*question, **env)
    assert "m4pro" in table.stdout and "133.65" in table.stdout
    # read in a pipe: every figure and heading whole, as wide as the table needs
    assert "\u2026" not in table.stdout and "\u2026" not in imported.stderr
    assert "285.83" in table.stdout and "16.71" in table.stdout and "prefill" in table.stdout
    assert re.search(r"\b\d{4}-\d{2}-\d{2}\b", table.stdout)  # the date measured, whole
    assert "ms/token/user" in imported.stderr and "prefill t/s" in imported.stderr
    # an imported table carries no architecture numbers: fit cannot be checked, and says so
    unchecked = agent(*question, "--context-tokens", "8000", **env)
    assert unchecked.returncode == 0, unchecked.stderr
    assert "fit not checked" in unchecked.stdout
    # the widest table: whole in a pipe too, never "prefi…" or "133.…"
    assert "\u2026" not in unchecked.stdout
    assert "prefill" in unchecked.stdout and "measured" in unchecked.stdout
    assert "285.83" in unchecked.stdout and "133.65" in unchecked.stdout


def test_import_several_tables_and_a_model_file(
    live_registry: LiveRegistry, tmp_path: Path
) -> None:
    token = live_registry.token("rtx4090")
    model_file = write_tiny_gguf(tmp_path / "llama-3.1-8b-Q4_K_M.gguf")
    result = import_file(
        FIXTURES / "report-two-builds.md",
        "--model-file",
        str(model_file),
        node="rtx4090",
        model="Llama-3.1-8B-Q4_K_M",
        FLEETBENCH_REGISTRY_URL=live_registry.url,
        FLEETBENCH_TOKEN=token,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("created: run ") == 2
    with live_registry.client() as client:
        runs = client.get("/v1/runs", params={"node": "rtx4090"}).json()["data"]
        [model] = client.get("/v1/models").json()["data"]
    assert sorted(r["engine"]["build_number"] for r in runs) == [6400, 6527]
    assert model["name"] == "Llama-3.1-8B-Q4_K_M"
    assert model["n_layer"] == 18 and model["quantization"] == "Q4_K_M"
    assert len(model["sha256"]) == 64


def test_import_without_a_table_reports_nothing(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    result = import_file(
        FIXTURES / "no-table.txt", "--registry", live_registry.url, "--token", token
    )
    assert result.returncode == 1
    assert "no-table.txt: no llama-batched-bench table found" in result.stderr
    assert live_registry.count("runs") == 0


def test_import_errors_are_clear(live_registry: LiveRegistry, tmp_path: Path) -> None:
    no_token = import_file(ARTICLE_EXAMPLE, "--registry", live_registry.url)
    assert no_token.returncode == 2
    assert "no registry token" in no_token.stderr

    missing = import_file(tmp_path / "absent.log", "--token", "t")
    assert missing.returncode == 1
    assert "absent.log" in missing.stderr

    token = live_registry.token("m4pro")
    wrong_node = import_file(
        ARTICLE_EXAMPLE, "--registry", live_registry.url, "--token", token, node="other"
    )
    assert wrong_node.returncode == 1
    assert "registry answered 403" in wrong_node.stderr

    assert live_registry.count("runs") == 0


def test_an_import_while_the_registry_is_down_is_delivered_later(
    live_registry: LiveRegistry, tmp_path: Path
) -> None:
    """Through the spool, as sweeps go: queued, said so (exit 1), and `flush` delivers it."""
    token = live_registry.token("m4pro")
    state = {"XDG_STATE_HOME": str(tmp_path / "state"), "FLEETBENCH_TOKEN": token}
    down = import_file(ARTICLE_EXAMPLE, "--registry", "http://127.0.0.1:9", **state)
    assert down.returncode == 1
    assert "unreachable" in down.stderr and "queued in" in down.stderr
    assert "fleetbench-agent flush" in down.stderr
    assert live_registry.count("runs") == 0
    status = agent("status", "--json", **state)
    [queued] = json.loads(status.stdout)
    assert queued["state"] == "queued"

    flushed = agent("flush", "--registry", live_registry.url, **state)
    assert flushed.returncode == 0, flushed.stderr
    assert flushed.stdout.startswith("1 delivered, 0 rejected, 0 still waiting")
    assert live_registry.count("runs") == 1
    assert live_registry.count("run_points") == 6


def test_dry_run_prints_reports_and_sends_nothing() -> None:
    result = import_file(
        FIXTURES / "batched-bench.jsonl", "--dry-run", "--measured-at", "2026-11-01T00:00:00Z"
    )
    assert result.returncode == 0, result.stderr
    [report] = json.loads(result.stdout)
    assert report["schema_version"] == SCHEMA_VERSION
    assert report["source"] == "import"
    assert report["started_at"] == "2026-11-01T00:00:00Z"
    assert [p["b"] for p in report["points"]] == [1, 2, 4]


def test_import_of_an_invalid_row_names_the_line_and_sends_nothing(
    live_registry: LiveRegistry, tmp_path: Path
) -> None:
    token = live_registry.token("m4pro")
    bad = tmp_path / "bad.md"
    bad.write_text(
        ARTICLE_EXAMPLE.read_text().replace("| 512 | 128 | 4 | 2560 |", "| 512 | 128 | 0 | 2560 |")
    )
    result = import_file(bad, "--registry", live_registry.url, "--token", token)
    assert result.returncode == 1
    assert "bad.md: line 15: b: Input should be greater than or equal to 1" in result.stderr
    assert live_registry.count("runs") == 0


def test_reimport_with_another_time_is_refused_not_duplicated(
    live_registry: LiveRegistry, tmp_path: Path
) -> None:
    """One spool, as a user has: importing again is a harmless retry; another measurement
    time is refused, in the spool or by the registry, and the right time then goes in."""
    token = live_registry.token("m4pro")
    common = ("--registry", live_registry.url, "--token", token)
    spool = {"XDG_STATE_HOME": str(tmp_path / "state")}
    first = import_file(ARTICLE_EXAMPLE, *common, "--measured-at", "2026-10-16T12:00:00Z", **spool)
    again = import_file(ARTICLE_EXAMPLE, *common, "--measured-at", "2026-10-16T12:00:00Z", **spool)
    moved = import_file(ARTICLE_EXAMPLE, *common, "--measured-at", "2026-11-01T08:00:00Z", **spool)
    assert first.returncode == 0, first.stderr
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("already stored: run ")
    assert moved.returncode == 1
    assert "imported before with another measurement time" in moved.stderr
    assert "Traceback" not in moved.stderr

    other = {"XDG_STATE_HOME": str(tmp_path / "elsewhere")}  # a copy whose mtime is today
    copied = import_file(ARTICLE_EXAMPLE, *common, **other)
    assert copied.returncode == 1
    assert "registry answered 409" in copied.stderr and "--measured-at" in copied.stderr
    fixed = import_file(ARTICLE_EXAMPLE, *common, "--measured-at", "2026-10-16T12:00:00Z", **other)
    assert fixed.returncode == 0, fixed.stderr
    assert fixed.stdout.startswith("already stored: run ")
    assert live_registry.count("runs") == 1


def test_a_table_with_a_bad_row_does_not_keep_the_others_out(live_registry: LiveRegistry) -> None:
    token = live_registry.token("m4pro")
    result = import_file(
        FIXTURES / "import" / "one-bad-row-two-tables.md",
        "--registry",
        live_registry.url,
        "--token",
        token,
    )
    assert result.returncode == 1
    assert "one-bad-row-two-tables.md: line 3: s_tg:" in result.stderr
    assert "that table is left out" in result.stderr
    assert result.stdout.startswith("created: run ") and result.stdout.count("created") == 1
    assert live_registry.count("runs") == 1 and live_registry.count("run_points") == 2


def test_a_column_its_author_added_is_read_past_with_a_warning(tmp_path: Path) -> None:
    table = tmp_path / "posted.md"
    table.write_text(
        "| PP | TG | B | S_TG t/s | GPU temp |\n|---|---|---|---|---|\n"
        "| 512 | 128 | 1 | 28.30 | 61 C |\n| 512 | 128 | 8 | 133.65 | 70 C |\n"
    )
    done = import_file(table, "--dry-run")
    assert done.returncode == 0, done.stderr
    assert f"warning: {table}: line 1: column(s) 'GPU temp' read past" in done.stderr
    [report] = json.loads(done.stdout)
    assert [(p["b"], p["s_tg"]) for p in report["points"]] == [(1, 28.3), (8, 133.65)]


def test_a_table_made_with_tgs_is_never_offered_as_concurrent_users(
    live_registry: LiveRegistry,
) -> None:
    """`-tgs` decodes each sequence alone, one after another: its B = 4 row measured one
    user at a time (S_TG 49.62 for all four: 12.4 each, had they run at once). Output of
    llama-batched-bench of the llama.cpp llama-cpp-python 0.3.36 vendors (build 1, commit
    0c1e570) on this project's 2-core VM, Gemma 3 270M Q4_K_M, `-c 2048 -b 2048 -ub 512
    -npp 64 -ntg 16 -npl 1,2,4 -tgs -t 2`, 2026-12-07."""
    token = live_registry.token("vm")
    model = "gemma-3-270m-Q4_K_M"
    imported = import_file(
        FIXTURES / "batched-bench-tgs.log", "--registry", live_registry.url, "--token", token,
        node="vm", model=model,
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    with live_registry.client() as client:
        [run] = client.get("/v1/runs").json()["data"]
        detail = client.get(f"/v1/runs/{run['id']}").json()
        asked = {"model": model, "min_tps_per_user": 10}
        placement = client.get("/v1/placement", params=asked).json()
        capacity = client.get("/v1/capacity", params={**asked, "users": 4}).json()
    assert detail["settings"]["tg_separate"] is True
    assert [p["b"] for p in detail["points"]] == [1, 2, 4]  # kept, and shown
    [candidate] = placement["candidates"]
    assert (candidate["concurrency"], candidate["per_user_tps"]) == (1, 49.82)
    assert (capacity["enough"], capacity["users_served"]) == (False, 1)


def test_placement_where_reads_are_closed_takes_a_reader_token(database_url: str) -> None:
    settings = RegistrySettings(database_url=database_url, read_token_required=True)
    with running_registry(settings) as registry:
        token = registry.token("m4pro")
        env = {"FLEETBENCH_REGISTRY_URL": registry.url, "FLEETBENCH_TOKEN": token}
        assert import_file(ARTICLE_EXAMPLE, **env).returncode == 0
        question = ("placement", "--model", ARTICLE_MODEL, "--min-tps-per-user", "15", "--json")
        refused = agent(*question, **env)  # the node's token reports; it does not read
        assert refused.returncode == 4  # no answer: not 0 (an answer) nor 2 (no such model)
        assert "pass --token with a reader token" in refused.stderr
        answered = agent(*question, "--token", registry.scoped_token("reader"), **env)
    assert answered.returncode == 0, answered.stderr
    assert [c["concurrency"] for c in json.loads(answered.stdout)["candidates"]] == [8]


def test_dry_run_says_where_each_table_starts_and_what_it_passed_over() -> None:
    """ggml-org/llama.cpp PR #16894's output: one batched-bench table, llama-bench's after."""
    result = import_file(
        FIXTURES / "import" / "bench-models-pr-16894.md",
        "--dry-run",
        "--measured-at",
        "2025-10-31T00:00:00Z",
    )
    assert result.returncode == 0, result.stderr
    assert (
        "bench-models-pr-16894.md: line 7: 6 rows, B 1..4; settings: n_ctx=20480 n_batch=2048 "
        "n_ubatch=2048 flash_attn=on pp_shared=False n_gpu_layers=-1 n_threads=16 "
        "n_threads_batch=16; build: none printed" in result.stderr
    )
    assert (
        "bench-models-pr-16894.md: line 18: a llama-bench table, not llama-batched-bench's: "
        "passed over" in result.stderr
    )
    [report] = json.loads(result.stdout)
    assert [p["s_tg"] for p in report["points"]][:3] == [79.04, 136.37, 224.52]


def test_a_crashed_run_is_stored_as_failed_with_its_reason(live_registry: LiveRegistry) -> None:
    """ggml-org/llama.cpp issue #13553: the header printed, then no rows."""
    token = live_registry.token("m4pro")
    log = FIXTURES / "import" / "no-rows-issue-13553.log"
    dry = import_file(log, "--dry-run", "--measured-at", "2025-05-15T00:00:00Z")
    assert dry.returncode == 0, dry.stderr
    assert "line 2: failed run: the table has no rows" in dry.stderr
    assert "settings: n_ctx=4096 n_batch=2048" in dry.stderr

    result = import_file(log, "--registry", live_registry.url, "--token", token)
    assert result.returncode == 0, result.stderr
    assert "run 1/1 (line 2): failed: the table has no rows" in result.stderr
    assert result.stdout.startswith("created: run ")
    with live_registry.client() as client:
        [run] = client.get("/v1/runs", params={"node": "m4pro"}).json()["data"]
        detail = client.get(f"/v1/runs/{run['id']}").json()
    assert run["status"] == "failed"
    assert detail["error"] == (
        "the table has no rows: the run stopped before its first row and printed no error"
    )
    assert detail["settings"]["n_ctx"] == 4096 and detail["points"] == []
    assert live_registry.count("run_points") == 0


def test_the_article_table_against_its_chips_bandwidth(
    live_registry: LiveRegistry, tmp_path: Path
) -> None:
    """The article's M4 Pro table imported with a header of Mistral NeMo 12B Q4_K_M's
    published tensors (no weights) and the chip it was measured on: each point's MBU
    against Apple's 273 GB/s."""
    header = write_mistral_nemo_q4_k_m(tmp_path / "nemo.gguf")
    token = live_registry.token("m4pro")
    imported = import_file(
        ARTICLE_EXAMPLE,
        "--model-file",
        str(header),
        "--device",
        "apple  m4 pro",  # as typed: stored as Apple spells it
        "--registry",
        live_registry.url,
        "--token",
        token,
    )
    assert imported.returncode == 0, imported.stderr
    with live_registry.client() as client:
        [listed] = client.get("/v1/runs").json()["data"]
        run = client.get(f"/v1/runs/{listed['id']}").json()
        nodes = client.get("/v1/nodes").json()["data"]
    assert (run["bandwidth"]["bytes_per_s"], run["bandwidth"]["source"]) == (273e9, "table")
    mbu = [point["mbu"] for point in run["points"]]
    assert 0.7 <= mbu[0] <= 0.85
    assert mbu[0] > mbu[1] > mbu[2] and mbu[-1] < mbu[-2] < mbu[2]
    assert [n["hardware"] for n in nodes] == ["Apple M4 Pro"]
    # placement's table says how much of the chip's bandwidth the offered point used
    placed = agent(
        "placement", "--model", ARTICLE_MODEL, "--min-tps-per-user", "15",
        "--registry", live_registry.url,
    )  # fmt: skip
    assert placed.returncode == 0, placed.stderr
    [row] = [line for line in placed.stdout.splitlines() if line.startswith("│ m4pro")]
    cells = [cell.strip() for cell in row.strip("│").split("│")]
    assert (cells[1], cells[8]) == ("8", f"{mbu[3]:.0%}")
