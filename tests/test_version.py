"""One version, the package's: both command lines, the registry's /healthz and its API
schema say what the installed distribution's metadata says, and so does every report's
agent identity, which the registry keeps with the run."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import httpx
import pytest

from fleetbench.agent.fingerprint import THIS_AGENT
from fleetbench.contract.wire import AgentIdentity
from tests.factories import LiveRegistry, make_report, post_report

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


def test_a_report_says_its_agent_and_a_retry_from_an_upgraded_agent_is_the_same_run(
    live_registry: LiveRegistry,
) -> None:
    assert AgentIdentity(name="fleetbench-agent", version=INSTALLED) == THIS_AGENT
    report = make_report(node="m4pro", agent=THIS_AGENT)
    upgraded = report.model_copy(update={"agent": AgentIdentity(version="0.2.0")})
    with live_registry.client(live_registry.token("m4pro")) as client:
        assert post_report(client, report).status_code == 201
        retried = post_report(client, upgraded)
        assert retried.status_code == 200, retried.text  # the same run, not a conflict
        stored = client.get(f"/v1/runs/{report.run_id}").json()
        unsaid = post_report(client, make_report(node="m4pro"))
        assert unsaid.status_code == 201
        without = client.get(f"/v1/runs/{unsaid.json()['run_id']}").json()
    assert stored["agent"] == f"fleetbench-agent {INSTALLED}"  # the first delivery's
    assert without["agent"] is None
