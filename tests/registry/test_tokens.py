"""The token lifecycle (registry.tokens): create, list, revoke and rotate from the CLI and
the admin API; a rotation strands no run in an agent's spool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx

from fleetbench.agent.client import RegistryClient
from fleetbench.agent.spool import Spool
from fleetbench.registry.config import RegistrySettings
from tests.factories import LiveRegistry, make_report, post_report, running_registry

REGISTRY = [sys.executable, "-m", "fleetbench.registry.cli"]


def test_a_rotated_token_strands_no_spooled_run(
    live_registry: LiveRegistry, tmp_path: Path
) -> None:
    """Rotated, the old token delivers through its grace period; revoked, the agent's runs
    wait in its spool (401 is retried) until it holds the new token, then go."""
    old = live_registry.token("gpu-07")
    admin = live_registry.client(live_registry.scoped_token("admin", "ops"))
    [listed] = [t for t in admin.get("/v1/tokens").json()["data"] if t["node"] == "gpu-07"]
    assert "token" not in listed and listed["state"] == "active"
    rotated = admin.post(f"/v1/tokens/{listed['id']}/rotate", json={"grace_hours": 2})
    assert rotated.status_code == 200, rotated.text
    new = rotated.json()["token"]
    assert (rotated.json()["scope"], rotated.json()["node"]) == ("node", "gpu-07")

    spool = Spool(tmp_path / "spool.db")
    spool.add(make_report(node="gpu-07"))
    with RegistryClient(live_registry.url, token=old) as client:
        assert spool.flush(client).delivered == 1  # within the grace period
    assert admin.post(f"/v1/tokens/{listed['id']}/revoke").status_code == 200
    spool.add(make_report(node="gpu-07"))
    with RegistryClient(live_registry.url, token=old) as client:
        refused = spool.flush(client, every_queued=True)
    assert (refused.delivered, refused.deferred, refused.rejected) == (0, 1, 0)
    assert "401: a valid token is required" in (refused.waiting_reason or "")
    with RegistryClient(live_registry.url, token=new) as client:
        assert spool.flush(client, every_queued=True).delivered == 1
    assert live_registry.count("runs") == 2
    states = {t["id"]: t["state"] for t in admin.get("/v1/tokens").json()["data"]}
    assert states[listed["id"]] == "revoked" and states[rotated.json()["id"]] == "active"
    admin.close()


def _cli(database_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FLEETBENCH_DATABASE_URL": database_url, "COLUMNS": "300"}
    return subprocess.run(
        [*REGISTRY, "token", *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_the_cli_creates_lists_rotates_and_revokes_tokens(database_url: str) -> None:
    made = _cli(database_url, "create", "--scope", "reader", "--name", "grafana")
    assert made.returncode == 0, made.stderr
    secret = made.stdout.strip()
    assert secret.startswith("fbr_") and "reader token 'grafana (token 1)' created" in made.stderr
    [listed] = json.loads(_cli(database_url, "list", "--json").stdout)
    assert (listed["scope"], listed["name"], listed["node"], listed["state"]) == (
        "reader", "grafana", None, "active",
    )  # fmt: skip
    assert secret not in _cli(database_url, "list").stdout

    rotated = _cli(database_url, "rotate", str(listed["id"]), "--grace-hours", "0")
    assert rotated.returncode == 0, rotated.stderr
    assert rotated.stdout.strip().startswith("fbr_") and rotated.stdout.strip() != secret
    revoked = _cli(database_url, "revoke", str(listed["id"] + 1))
    assert revoked.returncode == 0, revoked.stderr
    states = [
        (t["name"], t["state"]) for t in json.loads(_cli(database_url, "list", "--json").stdout)
    ]
    assert states == [("grafana", "expired"), ("grafana", "revoked")]

    for wrong, why in (
        (("--scope", "reader", "--node", "gpu-07"), "a node token needs its node"),
        (("--name", "x"), "a node token needs its node"),
        (("--scope", "root"), "Input should be 'node', 'reader' or 'admin'"),
        (("--node", "n" * 201), "at most 200 characters"),
        (("--node", "gpu-07", "--expires-days", "1e9"), "less than or equal to 36500"),
    ):
        refused = _cli(database_url, "create", *wrong)
        assert refused.returncode == 2 and why in refused.stderr, refused.stderr
    missing = _cli(database_url, "revoke", "999")
    assert missing.returncode == 1 and "no token 999" in missing.stderr


def test_refused_tokens_are_limited_per_client_address(database_url: str) -> None:
    """Past the limit, an address's refused tokens are answered 429 with Retry-After;
    valid tokens from it, and tokens from another address, go on."""
    settings = RegistrySettings(database_url=database_url, auth_failures_per_minute=5)
    with running_registry(settings) as registry:
        good = registry.token("gpu-07")
        with registry.client(good) as client:
            assert post_report(client, make_report(node="gpu-07")).status_code == 201
        with registry.client("fbn_guess") as guesser:
            answers = [post_report(guesser, make_report()).status_code for _ in range(7)]
            limited = post_report(guesser, make_report())
        assert answers == [401] * 5 + [429] * 2
        assert 1 <= int(limited.headers["Retry-After"]) <= 60
        with registry.client(good) as client:  # known valid lately: not held up
            assert post_report(client, make_report(node="gpu-07")).status_code == 201
        with registry.client(registry.token("gpu-08")) as client:  # valid, never seen
            assert post_report(client, make_report(node="gpu-08")).status_code == 201
        elsewhere = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(base_url=registry.url, transport=elsewhere) as other:
            other.headers["Authorization"] = "Bearer fbn_guess"
            assert post_report(other, make_report()).status_code == 401
