"""What a registry answers, and what nodes told it, reaches the agent's terminal and its log
escaped (fleetbench.printable): a GPU name, an error's detail, a plan's name holding escape
sequences or line breaks neither act on the terminal nor forge a line."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from fleetbench.agent.client import RegistryClient
from fleetbench.agent.spool import Spool
from fleetbench.contract.answers import (
    CapacityAnswer,
    CapacityClass,
    CapacityNode,
    CapacityRefusal,
    CompareAnswer,
    NotCompared,
)
from fleetbench.contract.plans import NodePlans
from tests.agent.hostile_server import by_path, hostile_server, json_reply
from tests.factories import agent, make_report

# clears the screen, retitles the window, rings, and starts a line of its own
HOSTILE = "H100\x1b[2J\x1b]0;owned\x07\nforged: all clear"
SHOWN = "H100\\x1b[2J\\x1b]0;owned\\x07\\nforged: all clear"


def _raw(text: str) -> list[str]:
    """What in `text` a terminal would act on, or a line it starts with the forged words."""
    controls = [c for c in ("\x1b", "\x07") if c in text]
    forged = [line for line in text.splitlines() if line.lstrip("│ ").startswith("forged")]
    return controls + forged


def test_capacity_shows_what_nodes_and_the_registry_wrote_escaped() -> None:
    answer = CapacityAnswer(
        model="nemo", users=4, min_tps_per_user=10, context_tokens=None, max_ttft_ms=None,
        kind="any", enough=False, nodes_needed=None, users_served=2, headroom_users=0,
        total_tps=40,
        plan=[CapacityNode(
            node="gpu-1", hardware_class=HOSTILE, users=2, per_user_tps=20, total_tps=40,
            source="offline", llama_cpp_build=1, measured_at=datetime(2026, 1, 1, tzinfo=UTC),
            age_days=1, run_id=uuid.uuid4(),
        )],
        per_class=[CapacityClass(
            hardware_class=HOSTILE, nodes_available=1, nodes_needed=None, users_served=2,
            total_tps=40,
        )],
        refused=[CapacityRefusal(node="gpu-2", reason=HOSTILE)],
        reason=HOSTILE,
    )  # fmt: skip
    with hostile_server(json_reply(200, answer.model_dump(mode="json"))) as registry:
        done = agent(
            "capacity", "--model", "nemo", "--users", "4", "--min-tps-per-user", "10",
            "--registry", registry.url,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert _raw(done.stdout + done.stderr) == []
    assert done.stdout.count(SHOWN) == 4  # the plan's class, the class's, a refusal, the reason


def test_a_registry_s_error_detail_is_shown_escaped() -> None:
    with hostile_server(json_reply(404, {"detail": HOSTILE})) as registry:
        done = agent(
            "capacity", "--model", "m", "--users", "1", "--min-tps-per-user", "1",
            "--registry", registry.url,
        )  # fmt: skip
    assert done.returncode == 2
    assert _raw(done.stderr) == []
    assert done.stderr == f"error: registry answered 404: {SHOWN}\n"


def test_status_and_flush_show_the_registry_s_reasons_escaped(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    spool = Spool(path)
    refused, waiting = make_report(), make_report()
    spool.add(refused)
    with (
        hostile_server(json_reply(422, {"detail": HOSTILE})) as registry,
        RegistryClient(registry.url) as client,
    ):
        spool.flush(client)  # refused: set aside with the registry's reason
    spool.add(waiting)
    with hostile_server(json_reply(401, {"detail": HOSTILE})) as registry:
        flushed = agent("flush", "--registry", registry.url, FLEETBENCH_SPOOL=str(path))
    status = agent("status", FLEETBENCH_SPOOL=str(path))
    assert flushed.returncode == 1
    assert flushed.stdout == (
        f"0 delivered, 0 rejected, 1 still waiting: registry answered 401: {SHOWN}\n"
    )
    assert status.returncode == 0, status.stderr
    assert _raw(status.stdout + status.stderr) == []
    assert status.stdout.count(SHOWN) == 2  # each run's last error


def test_compare_s_markdown_keeps_each_reason_on_its_line_escaped() -> None:
    answer = CompareAnswer(
        model="nemo", kind="offline", from_build="b1", to_build="b2", from_builds=["b1"],
        to_builds=[HOSTILE], verdict="unknown", reason=HOSTILE, min_change_pct=2,
        max_detectable_pct=5, classes=[], nodes_compared=0, nodes=[],
        not_compared=[NotCompared(node="gpu-1", hardware_class=None, reason=HOSTILE)],
    )  # fmt: skip
    with hostile_server(json_reply(200, answer.model_dump(mode="json"))) as registry:
        asked = ("compare", "--model", "nemo", "--from-build", "b1", "--to-build", "b2")
        markdown = agent(*asked, "--markdown", "--registry", registry.url)
        tables = agent(*asked, "--registry", registry.url)
    assert (markdown.returncode, tables.returncode) == (3, 3)  # unknown
    for done in (markdown, tables):
        assert _raw(done.stdout + done.stderr) == []
    lines = markdown.stdout.splitlines()
    assert lines[0] == f"## nemo: b1 -> {SHOWN} (offline)"
    assert lines[2] == f"**Verdict: unknown**: {SHOWN}"
    assert lines[-1] == f"- gpu-1: {SHOWN}"
    assert tables.stdout.splitlines()[-2:] == [
        f"not compared: gpu-1: {SHOWN}",
        f"verdict: unknown: {SHOWN}",
    ]


def test_a_plan_s_name_with_a_line_break_is_one_line_of_the_daemon_s_log(tmp_path: Path) -> None:
    name = "nightly\n2026-01-01 00:00:00,000 INFO fleetbench.daemon: forged: all clear"
    plans = NodePlans.model_validate(
        {
            "node": "edge",
            "plans": [
                {
                    "name": name,
                    "version": 1,
                    "created_at": "2026-01-01T00:00:00Z",
                    "model": {"path": "/models/nemo.gguf"},  # no folder allowed: skipped
                    "cron": "0 3 * * *",
                }
            ],
        }
    )
    registry_answers = by_path(
        {
            "/v1/agent/plans": json_reply(200, plans.model_dump(mode="json")),
            "/v1/agent/status": json_reply(200, {}),
        }
    )
    (tmp_path / "agent.toml").write_text("[agent]\njitter_s = 0\n")
    log = tmp_path / "daemon.log"
    with hostile_server(registry_answers) as registry, log.open("w") as written:
        inherited = {k: v for k, v in os.environ.items() if not k.startswith("FLEETBENCH_")}
        daemon = subprocess.Popen(
            [sys.executable, "-m", "fleetbench.agent.cli", "daemon", "--config",
             str(tmp_path / "agent.toml")],
            env={
                **inherited,
                "FLEETBENCH_NODE": "edge",
                "FLEETBENCH_REGISTRY_URL": registry.url,
                "FLEETBENCH_TOKEN": "t",
                "FLEETBENCH_SPOOL": str(tmp_path / "spool.db"),
                "FLEETBENCH_CACHE_DIR": str(tmp_path / "cache"),
            },
            stdout=written,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while "skipped" not in log.read_text() and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            daemon.terminate()
            daemon.wait(timeout=30)
    lines = log.read_text().splitlines()
    said = [line for line in lines if "forged" in line]
    assert len(said) == 1, lines
    assert said[0].endswith(
        "WARNING fleetbench.daemon: plan nightly\\n2026-01-01 00:00:00,000 INFO "
        "fleetbench.daemon: forged: all clear v1 skipped: /models/nemo.gguf is not in a "
        "directory this node lets plans load models from (agent.plan_model_dirs)"
    )
