"""The registry client against what may answer in a registry's place (a proxy's sign-in page,
a redirect, an answer trickled a byte at a time, one of 512 MiB): each is a ClientError
saying what came, by the request's deadline, without reading more than a bound; and
`import` and `flush` keep the run spooled, say why, and go on."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from fleetbench.agent.client import RegistryClient
from fleetbench.agent.errors import ClientError, RegistryUnavailable
from fleetbench.agent.spool import Spool
from tests.agent.flaky_registry import flaky_registry
from tests.agent.hostile_server import (
    MIB,
    Reply,
    endless,
    hostile_server,
    page,
    redirect_to,
    trickle,
)
from tests.factories import agent, make_report

FIXTURES = Path(__file__).parents[1] / "fixtures"


def test_a_page_in_place_of_the_answer_is_a_client_error_saying_what_came() -> None:
    with (
        hostile_server(page) as proxy,
        RegistryClient(proxy.url, token="t") as client,
        pytest.raises(ClientError) as raised,
    ):
        client.submit_run(make_report())
    assert isinstance(raised.value, RegistryUnavailable)  # tried again later
    assert str(raised.value) == (
        f"registry at {proxy.url} answered 200 with text/html in a shape unknown here, not a "
        "RunReceipt (Invalid JSON: expected value at line 1 column 1); is that the registry's URL?"
    )


def test_a_redirect_is_not_followed_and_says_where_it_led() -> None:
    with flaky_registry() as elsewhere:
        target = elsewhere.url + "/v1/runs"
        with (
            hostile_server(redirect_to(target)) as proxy,
            RegistryClient(proxy.url) as client,
            pytest.raises(ClientError) as raised,
        ):
            client.submit_run(make_report())
        assert elsewhere.posted == []
    assert str(raised.value) == (
        f"registry at {proxy.url} answered 307, a redirect to {target}: the agent follows "
        "none; give the registry's own URL"
    )
    assert proxy.requests == ["POST /v1/runs"]


@pytest.mark.parametrize("where", ["headers", "body"])
def test_an_answer_trickled_a_byte_at_a_time_ends_at_the_request_s_deadline(where: str) -> None:
    deadline_s = 2.0
    with hostile_server(trickle(every_s=0.3, in_headers=where == "headers")) as slow:
        started = time.monotonic()
        with (
            RegistryClient(slow.url, deadline_s=deadline_s) as client,
            pytest.raises(ClientError) as raised,
        ):
            client.plans()
        took = time.monotonic() - started
        assert slow.sent >= 3  # it was answering, slowly, all along
    assert str(raised.value) == f"registry at {slow.url} did not answer in 2 s"
    assert isinstance(raised.value, RegistryUnavailable) and raised.value.status_code is None
    assert took < 3 * deadline_s


@pytest.mark.parametrize(
    ("status", "ask", "said"),
    [
        (200, "plans", "answered 200 with an answer of more than 32 MiB"),
        (200, "submit_run", "answered 200 with an answer of more than 1 MiB"),
        (502, "submit_run", "registry answered 502: "),  # its error, cut short
    ],
)
def test_an_answer_past_its_bound_is_not_read_to_its_end(status: int, ask: str, said: str) -> None:
    with hostile_server(endless(status, mib=512)) as huge, RegistryClient(huge.url) as client:
        with pytest.raises(ClientError) as raised:
            if ask == "plans":
                client.plans()
            else:
                client.submit_run(make_report())
        assert huge.sent < 128 * MIB  # what the bound, and the sockets' buffers, took
    assert said in str(raised.value)
    assert isinstance(raised.value, RegistryUnavailable) and raised.value.status_code == status


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (page, "answered 200 with text/html in a shape unknown here, not a RunReceipt"),
        (redirect_to("http://127.0.0.1:9/v1/runs"), "answered 307, a redirect to http://127.0"),
    ],
)
def test_flush_keeps_the_runs_spooled_and_says_why(
    tmp_path: Path, answer: Reply, said: str
) -> None:
    path = tmp_path / "spool.db"
    spool = Spool(path)
    for _ in range(3):
        spool.add(make_report())
    with hostile_server(answer) as proxy:
        done = agent("flush", "--registry", proxy.url, FLEETBENCH_SPOOL=str(path))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert done.stdout.startswith(
        f"0 delivered, 0 rejected, 3 still waiting: registry at {proxy.url} {said}"
    )
    assert spool.counts() == {"queued": 3, "delivered": 0, "rejected": 0}


def test_import_keeps_each_run_spooled_and_says_why(tmp_path: Path) -> None:
    path = tmp_path / "spool.db"
    with hostile_server(page) as proxy:
        done = agent(
            "import",
            str(FIXTURES / "import" / "one-bad-row-two-tables.md"),
            "--node",
            "m4pro",
            "--model",
            "nemo",
            "--registry",
            proxy.url,
            "--token",
            "t",
            FLEETBENCH_SPOOL=str(path),
        )
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    not_stored = [line for line in done.stderr.splitlines() if " not stored: " in line]
    assert len(not_stored) == len(Spool(path).runs()) >= 1  # every run, not the first alone
    for line in not_stored:
        assert f"registry at {proxy.url} answered 200 with text/html" in line
        assert line.endswith(
            f"it is queued in {path}: import again when the registry answers, or "
            "`fleetbench-agent flush` with that node's token"
        )
    assert Spool(path).counts()["queued"] == len(not_stored)
