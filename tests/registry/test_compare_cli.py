"""`fleetbench-agent compare` as a CI gate asks it: over HTTP with a reader token, against a
live registry whose reads are closed, on both databases; its exit statuses (and those of
`placement`, `capacity` and `fleetbench-registry compare`); the same tables and Markdown
from either command line; and no number of a table cut, in a 40-column terminal or a pipe."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fleetbench.registry.config import RegistrySettings
from tests.factories import (
    ARTICLE_MODEL,
    ARTICLE_TABLE,
    LiveRegistry,
    agent,
    free_port,
    make_report,
    post_report,
    running_registry,
)
from tests.registry.test_compare import (
    A100,
    FLEET,
    H100,
    NEW,
    OLD,
    gpu,
    h100_slower_at_8_and_up,
    seed,
)

GO_BUILD, FEW_RUNS_BUILD = 11600, 11700  # as fast as OLD; run once on each node
FRESH_MODEL = "Llama-3.1-8B-Q4_K_M"


@pytest.fixture
def gate(database_url: str) -> Iterator[tuple[LiveRegistry, str]]:
    """A registry whose reads are closed, and a reader token of it; its fleet ran OLD,
    NEW (12% slower on the H100s at B >= 8) and GO_BUILD three times each, FEW_RUNS_BUILD
    once."""
    settings = RegistrySettings(database_url=database_url, read_token_required=True)
    with running_registry(settings) as registry:
        runs = {OLD: 3, NEW: 3, GO_BUILD: 3, FEW_RUNS_BUILD: 1}
        seed(registry.engine, FLEET, runs, h100_slower_at_8_and_up)
        yield registry, registry.scoped_token("reader", name="ci")


def asked(to_build: int | str, model: str = ARTICLE_MODEL) -> tuple[str, ...]:
    return ("--model", model, "--from-build", f"b{OLD}", "--to-build", str(to_build))


def registry_cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`fleetbench-registry ARGS` on the database, its output in a pipe."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    return subprocess.run(
        [sys.executable, "-m", "fleetbench.registry.cli", *args],
        env=env | {"FLEETBENCH_DATABASE_URL": database_url},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_gate_exits_0_on_go_1_on_hold_3_on_unknown_2_for_no_such_model(
    gate: tuple[LiveRegistry, str],
) -> None:
    registry, reader = gate
    at = ("--registry", registry.url, "--token", reader)
    go = agent("compare", *asked(GO_BUILD), *at)
    assert go.returncode == 0, go.stderr
    assert go.stdout.splitlines()[-1].startswith("verdict: go: ")
    hold = agent("compare", *asked(NEW), *at)
    assert hold.returncode == 1, hold.stderr
    assert f"verdict: hold: {H100}: " in hold.stdout
    rows = [line for line in hold.stdout.splitlines() if line.startswith("│ h100-0 ")]
    assert len(rows) == 12 and sum("worse" in row for row in rows) == 6  # S_TG, S_PP at 8-32
    few = agent("compare", *asked(FEW_RUNS_BUILD), *at)
    assert few.returncode == 3, few.stderr
    assert "verdict: unknown: " in few.stdout and "fewer than 2 runs of each build" in few.stdout
    typo = agent("compare", *asked("b99999"), *at)
    assert typo.returncode == 3 and "no run of build 'b99999' is stored" in typo.stdout
    nope = agent("compare", *asked(NEW, model="nope"), *at)
    assert nope.returncode == 2
    assert nope.stderr.strip() == "error: registry answered 404: model 'nope' not found"
    assert nope.stdout == ""
    for question in (
        ("placement", "--model", "nope", "--min-tps-per-user", "10"),
        ("capacity", "--model", "nope", "--users", "4", "--min-tps-per-user", "10"),
    ):
        done = agent(*question, *at)
        assert (done.returncode, "404: model 'nope' not found" in done.stderr) == (2, True)
    both = agent("compare", *asked(NEW), *at, "--json", "--markdown")
    assert both.returncode == 2 and "give one of --json and --markdown" in both.stderr


def test_no_answer_is_4_whatever_the_question(gate: tuple[LiveRegistry, str]) -> None:
    """An outage or a refused token must not read as a verdict (1, 3) nor as go (0)."""
    registry, _ = gate
    placement = ("placement", "--model", ARTICLE_MODEL, "--min-tps-per-user", "10")
    without_token = agent("compare", *asked(NEW), "--registry", registry.url)
    assert without_token.returncode == 4
    assert "registry answered 401" in without_token.stderr
    assert "pass --token with a reader token" in without_token.stderr
    unknown_token = agent(*placement, "--registry", registry.url, "--token", "fbr_not-a-token")
    assert unknown_token.returncode == 4 and "registry answered 401" in unknown_token.stderr
    down = f"http://127.0.0.1:{free_port()}"
    for question in (("compare", *asked(NEW)), placement):
        done = agent(*question, "--registry", down)
        assert done.returncode == 4, done.stderr
        assert f"registry at {down}" in done.stderr and "unreachable" in done.stderr


def test_the_json_is_the_registry_s_answer_and_the_markdown_and_tables_match_the_registry_cli(
    gate: tuple[LiveRegistry, str], database_url: str
) -> None:
    registry, reader = gate
    at = ("--registry", registry.url, "--token", reader)
    with registry.client(reader) as client:
        params = {"model": ARTICLE_MODEL, "from_build": f"b{OLD}", "to_build": str(NEW)}
        served = client.get("/v1/compare", params=params | {"limit": 2})
    assert served.status_code == 200, served.text
    as_json = agent("compare", *asked(NEW), "--limit", "2", "--json", *at)
    assert as_json.returncode == 1, as_json.stderr  # hold, whatever the format
    assert json.loads(as_json.stdout) == served.json()
    assert [n["node"][:4] for n in served.json()["nodes"]] == ["h100", "h100"]

    markdown = agent("compare", *asked(NEW), "--markdown", *at)
    assert markdown.returncode == 1, markdown.stderr
    lines = markdown.stdout.splitlines()
    assert lines[0] == (
        f"## {ARTICLE_MODEL}: llama.cpp b{OLD} Metal -> llama.cpp b{NEW} Metal (offline)"
    )
    held = rf"\*\*Verdict: hold\*\*: {re.escape(H100)}: S_(TG|PP) at B=(8|16|32) .* 1\d\.\d% slower"
    assert re.match(held, lines[2]), lines[2]
    assert f"| {A100} | go | 3 |" in markdown.stdout
    rows = [line for line in lines if line.startswith("| h100-1 | S_TG |")]
    assert [row.split(" | ")[4] for row in rows] == ["1", "2", "4", "8", "16", "32"]
    # The operators' command prints the same, from the database: one renderer for both.
    from_database = registry_cli(database_url, "compare", *asked(NEW), "--markdown")
    assert (from_database.returncode, from_database.stdout) == (1, markdown.stdout)
    table = agent("compare", *asked(NEW), *at)
    from_database = registry_cli(database_url, "compare", *asked(NEW))
    assert (from_database.returncode, from_database.stdout) == (1, table.stdout)


def test_the_registry_cli_exits_4_when_its_database_cannot_be_read() -> None:
    unreachable = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nope"
    done = registry_cli(unreachable, "compare", *asked(NEW))
    assert done.returncode == 4
    assert "error: the database cannot be read: " in done.stderr and done.stdout == ""


_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def in_a_terminal(*args: str, columns: int) -> tuple[int, str]:
    """`fleetbench-agent ARGS` on a terminal `columns` wide (a pseudo-terminal, COLUMNS
    set): its exit status and what it showed, without colours."""
    main, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEETBENCH_")}
    process = subprocess.Popen(
        [sys.executable, "-m", "fleetbench.agent.cli", *args],
        stdin=secondary, stdout=secondary, stderr=secondary,
        env=env | {"COLUMNS": str(columns), "TERM": "xterm-256color"},
    )  # fmt: skip
    os.close(secondary)
    shown = bytearray()
    deadline = time.monotonic() + 120
    try:
        while time.monotonic() < deadline:
            if not select.select([main], [], [], 1)[0]:
                continue
            try:
                chunk = os.read(main, 65536)
            except OSError:  # EIO: the command has ended and closed the terminal
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(main)
    code = process.wait(timeout=30)
    return code, _ANSI.sub("", shown.decode()).replace("\r", "")


def figures(answer: dict[str, Any]) -> set[str]:
    """Each figure of each point of a comparison as its table prints it."""
    return {
        figure
        for node in answer["nodes"]
        for p in node["points"]
        for figure in (
            f"{p['from_value']:.2f}",
            f"{p['to_value']:.2f}",
            f"{p['ratio']:.3f}",
            f"{p['ratio_low']:.3f}-{p['ratio_high']:.3f}",  # the interval: 0.498-1.…, before
            f"{p['detectable_pct']:.1f}%",
        )
    }


@pytest.mark.parametrize("where", ["terminal", "pipe"])
def test_no_number_is_cut_at_40_columns(gate: tuple[LiveRegistry, str], where: str) -> None:
    registry, reader = gate
    at = ("--registry", registry.url, "--token", reader)
    for node in ("h100-0", "a100-0"):  # capacity plans on recent runs alone
        report = make_report(
            node=node,
            model=FRESH_MODEL,
            table=ARTICLE_TABLE,
            hardware=gpu(FLEET[node], node),
            started_at=datetime.now(UTC) - timedelta(hours=1),
        )
        with registry.client(registry.token(node)) as client:
            assert post_report(client, report).status_code == 201
    questions = {
        "compare": ("compare", *asked(NEW), *at),
        "placement": ("placement", "--model", ARTICLE_MODEL, "--min-tps-per-user", "10", *at),
        "capacity": ("capacity", "--model", FRESH_MODEL, "--users", "10",
                     "--min-tps-per-user", "15", *at),
    }  # fmt: skip
    answers = {
        name: json.loads(agent(*question, "--json").stdout) for name, question in questions.items()
    }
    expected = {
        "compare": figures(answers["compare"]),
        "placement": {
            f"{c[key]:.2f}"
            for c in answers["placement"]["candidates"]
            for key in ("per_user_tps", "total_tps", "prefill_tps")
            if c[key] is not None
        },
        "capacity": {f"{n['per_user_tps']:.2f}" for n in answers["capacity"]["plan"]}
        | {f"{c['total_tps']:.2f}" for c in answers["capacity"]["per_class"]},
    }
    assert len(expected["compare"]) > 100 and len(expected["placement"]) >= 6
    assert answers["capacity"]["plan"] and answers["capacity"]["per_class"]
    for name, question in questions.items():
        if where == "terminal":
            code, shown = in_a_terminal(*question, columns=40)
        else:
            done = agent(*question, COLUMNS="40")
            code, shown = done.returncode, done.stdout
        assert code == (1 if name == "compare" else 0), shown[-2000:]
        assert "…" not in shown, name
        missing = sorted(f for f in expected[name] if f not in shown)
        assert missing == [], (name, missing, shown[:3000])
        if where == "terminal":  # the table as wide as its figures, not the terminal's 40
            widest = max(len(line) for line in shown.splitlines())
            assert widest > 60, name
