"""Who may do what: every operation of the OpenAPI schema and every dashboard page, asked by
each kind of caller, with reads open and closed, each cell asserted.

Callers: no token, an unknown one, an expired one, a revoked one, node A's, node B's, a
reader's, an admin's. Rules (registry.tokens): reads are open unless closed, then take a
reader or admin token; a node token reports its own node's runs, pulls its own plans and
says how they fare, and nothing else; tokens, acknowledgements and writing plans take an
admin token; /healthz and the pages are open to all (the pages
ask for a token when the data they load needs one)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from sqlalchemy.orm import Session

from fleetbench.contract.plans import PlanBody
from fleetbench.registry import plans, tokens
from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.db import session_factory
from fleetbench.registry.main import create_app
from tests.factories import ARTICLE_MODEL, JSON, LiveRegistry, make_report, running_registry

CALLERS = ("none", "unknown", "expired", "revoked", "node A", "node B", "reader", "admin")
NOT_AUTHENTICATED = {"none", "unknown", "expired", "revoked"}
PAGES = ["/", "/placement", "/capacity", "/compare", "/regressions", "/series", "/curves", "/plans",
         "/nodes/node-a", "/docs"]  # fmt: skip


@dataclass(frozen=True)
class Ask:
    method: str
    path: str  # the schema's, {placeholders} filled from the fleet
    params: dict[str, Any] | None = None
    body: Callable[[], Any] | None = None
    done: int = 200  # the answer once allowed


# One request per operation of the schema (test_every_operation_is_asked checks it).
ASKS = [
    Ask("GET", "/healthz"),
    Ask("GET", "/livez"),
    Ask("GET", "/readyz"),
    Ask("GET", "/metrics"),
    Ask("POST", "/v1/runs", body=lambda: make_report(node="node-a").model_dump(mode="json"),
        done=201),
    Ask("GET", "/v1/runs"),
    Ask("GET", "/v1/runs/{run_id}"),
    Ask("GET", "/v1/runs/{run_id}/export"),
    Ask("GET", "/v1/nodes"),
    Ask("GET", "/v1/nodes/{name}"),
    Ask("GET", "/v1/models"),
    Ask("GET", "/v1/placement", {"model": ARTICLE_MODEL, "min_tps_per_user": 15}),
    Ask("GET", "/v1/capacity", {"model": ARTICLE_MODEL, "users": 8, "min_tps_per_user": 15}),
    Ask("GET", "/v1/compare", {"model": ARTICLE_MODEL, "from_build": "b1", "to_build": "b2"}),
    Ask("GET", "/v1/rollouts"),
    Ask("POST", "/v1/rollouts", body=lambda: {"model": "nope", "from_build": "1", "to_build": "2"},
        done=404),  # no such model: past the gate, it is looked up
    Ask("DELETE", "/v1/rollouts/{rollout_id}", done=404),
    Ask("GET", "/v1/regressions"),
    Ask("POST", "/v1/regressions/{regression_id}/acknowledge", body=lambda: {"note": "ok"},
        done=404),  # no regression has that id: past the gate, it is looked up
    Ask("GET", "/v1/curves", {"node": "node-a", "model": ARTICLE_MODEL}),
    Ask("GET", "/v1/series", {"node": "node-a", "model": ARTICLE_MODEL, "pp": 512, "tg": 128,
                              "b": 8}),
    Ask("GET", "/v1/tokens"),
    Ask("POST", "/v1/tokens", body=lambda: {"scope": "reader", "name": "grafana"}, done=201),
    # rotated first: the old token works through its grace, and is revoked next
    Ask("POST", "/v1/tokens/{token_id}/rotate", body=lambda: {"grace_hours": 1}),
    Ask("POST", "/v1/tokens/{token_id}/revoke"),
    Ask("GET", "/v1/plans"),
    Ask("GET", "/v1/plans/{name}/versions"),
    # a new body each time: each allowed call saves a version
    Ask("PUT", "/v1/plans/{name}", body=lambda: {**PLAN, "nodes": [str(uuid.uuid4())]},
        done=201),
    Ask("DELETE", "/v1/plans/{name}"),
    Ask("POST", "/v1/plans/sweep-now/{name}", done=202),
    Ask("GET", "/v1/prices"),
    Ask("PUT", "/v1/prices", body=lambda: {"hardware_class": "NVIDIA L4", "usd_per_hour": 0.8}),
    Ask("DELETE", "/v1/prices", {"hardware_class": "never priced"},
        done=404),  # no price for that class: past the gate, it is looked up
    Ask("GET", "/v1/agent/plans"),
    Ask("PUT", "/v1/agent/status", body=lambda: {"local_sweeps": 1}, done=204),
]  # fmt: skip

PLAN = {"model": {"path": "/models/nemo.gguf"}, "cron": "0 3 * * *"}


def expected(ask: Ask, caller: str, *, reads_closed: bool) -> int:
    if ask.path in ("/healthz", "/livez", "/readyz"):
        return 200
    if ask.path == "/v1/runs" and ask.method == "POST":
        gate = "node A"
    elif ask.path.startswith("/v1/agent/"):
        gate = "node"
    elif (
        ask.path.startswith(("/v1/tokens", "/v1/plans/sweep-now"))
        or ask.path.endswith("/acknowledge")
        or (
            ask.path.startswith(("/v1/plans", "/v1/rollouts", "/v1/prices")) and ask.method != "GET"
        )
    ):
        gate = "admin"
    elif not reads_closed:
        return ask.done
    else:
        gate = "reader"
    if caller in NOT_AUTHENTICATED:
        return 401
    allowed = {
        "node A": {"node A"},
        "node": {"node A", "node B"},
        "admin": {"admin"},
        "reader": {"reader", "admin"},
    }[gate]
    return ask.done if caller in allowed else 403


def _fleet(registry: LiveRegistry) -> tuple[dict[str, str | None], dict[str, str]]:
    """The callers' tokens, and the values the paths take: node A's run, a token to
    revoke and rotate, a regression id nobody has."""
    node_a, node_b = registry.token("node-a"), registry.token("node-b")
    report = make_report(node="node-a")
    with registry.client(node_a) as client:
        assert client.post("/v1/runs", json=report.model_dump(mode="json")).status_code == 201
    with session_factory(registry.engine)() as session:
        expired = _secret(session, expires_at=datetime.now(UTC) - timedelta(minutes=1))
        revoked_token, revoked = tokens.create_token(session, scope="node", node_name="node-c")
        tokens.revoke_token(session, token_id=revoked_token.id)
        victim, _ = tokens.create_token(session, scope="reader", name="rotated, then revoked")
        plans.save_plan(
            session, "node-a", PlanBody.model_validate(PLAN), by="test", max_points=1024
        )
        session.commit()
    callers: dict[str, str | None] = {
        "none": None,
        "unknown": "fbn_" + "x" * 43,
        "expired": expired,
        "revoked": revoked,
        "node A": node_a,
        "node B": node_b,
        "reader": registry.scoped_token("reader"),
        "admin": registry.scoped_token("admin"),
    }
    values = {
        "run_id": str(report.run_id),
        "name": "node-a",
        "regression_id": "2147483000",
        "rollout_id": "2147483000",
        "token_id": str(victim.id),
    }
    return callers, values


def _secret(session: Session, *, expires_at: datetime) -> str:
    return tokens.create_token(session, scope="node", node_name="node-e", expires_at=expires_at)[1]


def test_every_operation_is_asked() -> None:
    schema = create_app(RegistrySettings(database_url="sqlite://")).openapi()
    operations = {(m.upper(), p) for p, ops in schema["paths"].items() for m in ops}
    assert operations == {(a.method, a.path) for a in ASKS}


@pytest.mark.parametrize("reads_closed", [False, True], ids=["reads open", "reads closed"])
def test_each_caller_gets_what_its_token_allows(database_url: str, reads_closed: bool) -> None:
    # more refused tokens than the default limit allows one address (test_tokens tests it)
    settings = RegistrySettings(
        database_url=database_url, read_token_required=reads_closed, auth_failures_per_minute=0
    )
    got: dict[tuple[str, str, str], int] = {}
    want: dict[tuple[str, str, str], int] = {}
    # one client for every ask: a client of its own per request costs an SSL context each
    with running_registry(settings) as registry, httpx.Client(timeout=30) as http:
        callers, values = _fleet(registry)
        for ask in ASKS:
            for caller, token in callers.items():
                headers = {**JSON, **({"Authorization": f"Bearer {token}"} if token else {})}
                response = http.request(
                    ask.method,
                    registry.url + ask.path.format(**values),
                    params=ask.params,
                    json=ask.body() if ask.body else None,
                    headers=headers,
                )
                got[(ask.method, ask.path, caller)] = response.status_code
                want[(ask.method, ask.path, caller)] = expected(
                    ask, caller, reads_closed=reads_closed
                )
                if response.status_code == 429:
                    pytest.fail(f"rate-limited at {ask.method} {ask.path} as {caller}")
        for page in PAGES:
            for caller, token in callers.items():
                headers = {"Authorization": f"Bearer {token}"} if token else {}
                page_status = http.get(registry.url + page, headers=headers).status_code
                got[("GET", page, caller)], want[("GET", page, caller)] = page_status, 200
    wrong = {cell: (got[cell], want[cell]) for cell in want if got[cell] != want[cell]}
    assert wrong == {}, "(got, expected) by (method, path, caller)"
    assert len(want) == (len(ASKS) + len(PAGES)) * len(CALLERS)


def test_the_schema_says_which_operations_need_a_token_with_reads_open() -> None:
    schema = create_app(RegistrySettings(database_url="sqlite://")).openapi()
    security = {
        (m.upper(), p): op.get("security")
        for p, ops in schema["paths"].items()
        for m, op in ops.items()
    }
    assert security[("GET", "/v1/nodes")] == [{"ReadBearer": []}, {}]  # reads open: optional
    assert security[("GET", "/v1/plans")] == [{"ReadBearer": []}, {}]
    assert security[("GET", "/v1/tokens")] == [{"HTTPBearer": []}]  # admins only, always
    assert security[("GET", "/v1/agent/plans")] == [{"HTTPBearer": []}]  # node tokens only
    assert security[("POST", "/v1/runs")] == [{"HTTPBearer": []}]
    closed = create_app(RegistrySettings(database_url="sqlite://", read_token_required=True))
    [[scheme]] = closed.openapi()["paths"]["/v1/nodes"]["get"]["security"]
    assert scheme == "ReadBearer"
