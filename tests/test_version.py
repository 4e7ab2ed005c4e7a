"""One version, the package's: both command lines, the registry's /healthz and its API
schema say what the installed distribution's metadata says."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import httpx
import pytest

from tests.factories import LiveRegistry

INSTALLED = importlib.metadata.version("fleetbench")


@pytest.mark.parametrize(
    "module, program",
    [
        ("fleetbench.agent.cli", "fleetbench-agent"),
        ("fleetbench.registry.cli", "fleetbench-registry"),
    ],
)
def test_each_command_line_says_the_installed_version(module: str, program: str) -> None:
    said = subprocess.run(
        [sys.executable, "-m", module, "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert said.returncode == 0, said.stderr
    assert said.stdout == f"{program} {INSTALLED}\n"


def test_the_registry_says_it_in_healthz_and_its_schema(live_registry: LiveRegistry) -> None:
    health = httpx.get(f"{live_registry.url}/healthz").json()
    schema = httpx.get(f"{live_registry.url}/openapi.json").json()
    assert health == {"status": "ok", "version": INSTALLED}
    assert schema["info"]["version"] == INSTALLED
    assert INSTALLED == "0.1.0"  # pyproject.toml's: the release this is
