"""Every request the OpenAPI schema admits, and many it does not, against a live registry on
both databases: schemathesis generates them from /openapi.json and runs every check it has
(no 5xx; answers conforming to the schema in status, content type, headers and body; invalid
input refused; valid input accepted; auth enforced where the schema says so).

Bounded: a fixed number of examples per operation and mode (valid, invalid), derandomized
(a fixed seed), so that CI finds the same cases each time; bench/fuzz.py runs more.

One configuration, explained: a report the schema admits may still break a rule across its
fields that JSON Schema cannot state (RunReport's description lists them: S_TG against
T_TG, status against contents, ...), and is answered 422 naming the field; so here 422
counts as valid data accepted (as 404, 409 already do)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks

from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.main import create_app
from tests.databases import fresh_database, migrate
from tests.factories import (
    ARTICLE_MODEL_INFO,
    LiveRegistry,
    make_report,
    post_report,
    running_registry,
)

FUZZ_NODE = "fuzz-node"
EXAMPLES = int(
    os.environ.get("FLEETBENCH_FUZZ_EXAMPLES", "40")
)  # per operation and generation mode

load_all_checks()
ALL_CHECKS = CHECKS.get_all()


def _generated(operation: schemathesis.APIOperation) -> list[GenerationMode]:
    """Invalid input can be made only for an operation that takes some."""
    takes_input = bool(operation.path_parameters or operation.query or operation.body)
    return [GenerationMode.POSITIVE, *([GenerationMode.NEGATIVE] if takes_input else [])]


CASES = sorted(
    (result.ok().label, mode)
    for result in schemathesis.openapi.from_dict(create_app().openapi()).get_all_operations()
    for mode in _generated(result.ok())
)


def registry_schema(url: str) -> schemathesis.BaseSchema:
    schema = schemathesis.openapi.from_url(f"{url}/openapi.json")
    schema.config.checks.positive_data_acceptance.expected_statuses = [
        "2xx",
        "401",
        "403",
        "404",
        "409",
        "422",
    ]
    return schema


# Query parameters an operation does not know are ignored, not refused, where agents call:
# a newer agent may ask with parameters an older registry predates, and must still get its
# plans. Schemathesis calls an unknown parameter invalid
# data, so the check that invalid data is refused does not run there; every other does.
TAKES_UNKNOWN_QUERY_PARAMETERS = {"GET /v1/agent/plans"}


# HTTP's framing is the client's to write: a Content-Length the generator made up (`=@`)
# makes a message no HTTP server parses, answered 400 by uvicorn before the registry sees
# it. Dropped from the generated headers; every other header is sent as generated.
FRAMING_HEADERS = {"content-length", "transfer-encoding", "host", "connection"}


def _checks(label: str, mode: GenerationMode) -> list[Any]:
    if mode is GenerationMode.NEGATIVE and label in TAKES_UNKNOWN_QUERY_PARAMETERS:
        return [c for c in ALL_CHECKS if c.__name__ != "negative_data_rejection"]
    return list(ALL_CHECKS)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def fuzzed(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    migrated_sqlite_file: Path,
) -> Iterator[tuple[LiveRegistry, str, schemathesis.BaseSchema]]:
    """One registry per database for every operation, with a node's run to find, its token
    and the schema it serves. Each answer is checked on its own, so the operations share it
    (and what the others left in it, as a registry's callers do)."""
    with fresh_database(request.param, tmp_path_factory.mktemp("fuzz")) as empty:
        url = migrate(empty, migrated_sqlite_file)
        # No limit on refused tokens: every operation's checks send some from this address,
        # and their sum would soon be answered 429 (the limit has its own tests).
        settings = RegistrySettings(database_url=url, auth_failures_per_minute=0)
        with running_registry(settings) as registry:
            token = registry.token(FUZZ_NODE)
            with registry.client(token) as client:
                report = make_report(node=FUZZ_NODE, model=ARTICLE_MODEL_INFO)
                response = post_report(client, report)
                assert response.status_code == 201, response.text
            yield registry, token, registry_schema(registry.url)


@pytest.mark.parametrize(("label", "mode"), CASES, ids=[f"{op} {m.value}" for op, m in CASES])
def test_every_request_is_answered_as_the_schema_says_never_with_a_server_error(
    fuzzed: tuple[LiveRegistry, str, schemathesis.BaseSchema], label: str, mode: GenerationMode
) -> None:
    _, token, schema = fuzzed
    operation = schema.find_operation_by_label(label)
    assert operation is not None, label
    headers = {"Authorization": f"Bearer {token}"}

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def answered_as_the_schema_says(case: schemathesis.Case) -> None:
        for name in [n for n in case.headers or {} if n.lower() in FRAMING_HEADERS]:
            del case.headers[name]
        case.call_and_validate(headers=headers, checks=_checks(label, mode))

    try:
        answered_as_the_schema_says()
    except Unsatisfiable:
        # No invalid value of this operation can be sent at all (a path parameter whose
        # only constraints an HTTP path cannot break): nothing to refuse.
        assert mode is GenerationMode.NEGATIVE, label
