"""The test tiers: `scripts/test.sh --fast` selects by the marks tests/conftest.py gives, and
what it selects must need no service. The collection runs in a process of its own with
this module as a plugin, which writes what each test uses and is marked with."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parent.parent
_DUMP = "FLEETBENCH_TEST_TIERS_DUMP"
# What each fixture needs: none of them may reach the fast tier.
NEEDS = {
    "postgres_database_url": "PostgreSQL",
    "live_registry": "a registry served on loopback",
    "browser": "Chromium",
    "dashboard": "Chromium",
    "tiny_llama": "llama.cpp",
    "gemma": "llama.cpp and a real model",
    "batched_bench": "a llama.cpp binary",
    "llama_server": "a llama.cpp binary",
    "release_llama_server": "a llama.cpp binary",
    "release_batched_bench": "a llama.cpp binary",
}


def _fast_marks() -> str:
    [marks] = re.findall(r'^FAST_MARKS="(.+)"$', (ROOT / "scripts/test.sh").read_text(), re.M)
    return marks


def pytest_collection_finish(session: pytest.Session) -> None:
    """As a plugin (`-p tests.test_tiers`): the tests selected, each with its fixtures,
    parameters and marks, written where the variable says."""
    if _DUMP not in os.environ:
        return
    tests = {
        item.nodeid: {
            "fixtures": sorted(getattr(item, "fixturenames", ())),
            "params": [str(v) for v in _params(item).values()],
            "marks": sorted({mark.name for mark in item.iter_markers()}),
        }
        for item in session.items
    }
    Path(os.environ[_DUMP]).write_text(json.dumps(tests))


def _params(item: pytest.Item) -> dict[str, object]:
    callspec = getattr(item, "callspec", None)
    return dict(callspec.params) if callspec is not None else {}


def _collected(tmp_path: Path, *args: str) -> dict[str, dict[str, Any]]:
    dump = tmp_path / "collected.json"
    # as scripts/test.sh --fast runs: no PostgreSQL named, nor this run's pytest settings
    environment = {
        k: v
        for k, v in os.environ.items()
        if k != "FLEETBENCH_TEST_POSTGRES_URL" and not k.startswith("PYTEST_")
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "tests.test_tiers",
         "-p", "no:cacheprovider", *args],
        cwd=ROOT, env={**environment, _DUMP: str(dump)}, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    collected: dict[str, dict[str, Any]] = json.loads(dump.read_text())
    return collected


def test_the_fast_run_leaves_out_every_marker_pyproject_declares() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]
    markers = {line.split(":")[0] for line in declared["ini_options"]["markers"]}
    assert {"postgres", "server", "engine", "browser", "install", "slow", "alone"} <= markers
    left_out = re.fullmatch(r"not \((\w+(?: or \w+)*)\)", _fast_marks())
    assert left_out, _fast_marks()
    assert set(left_out.group(1).split(" or ")) == markers


def test_the_fast_tier_is_hundreds_of_tests_none_needing_a_service(tmp_path: Path) -> None:
    everything = _collected(tmp_path)
    fast = _collected(tmp_path, "-m", _fast_marks())
    assert set(fast) < set(everything)
    # the tiers are told apart: each mark is on some tests, the postgresql cases among them
    marked = {mark for test in everything.values() for mark in test["marks"]}
    assert {"postgres", "server", "engine", "browser", "install", "slow"} <= marked
    postgresql = [t for t, test in everything.items() if "postgresql" in test["params"]]
    assert len(postgresql) > 100
    assert [t for t in postgresql if "postgres" not in everything[t]["marks"]] == []
    for test_id, test in fast.items():
        assert "postgresql" not in test["params"], test_id
        assert not NEEDS.keys() & set(test["fixtures"]), (test_id, test["fixtures"])
        assert not test_id.startswith("tests/test_install_extras.py"), test_id
        # a module whose every test starts processes (registries, a flush killed)
        assert not test_id.startswith("tests/registry/test_processes.py"), test_id
        assert not test_id.startswith("tests/agent/test_spool_killed.py"), test_id
        # the dashboard's tests without a browser are the pages served
        assert not test_id.startswith("tests/web/") or "test_pages_served" in test_id
    # the sqlite case of a test run on both databases stays fast when nothing else is needed
    assert any("sqlite" in test["params"] for test in fast.values())
    assert len(fast) > 300
