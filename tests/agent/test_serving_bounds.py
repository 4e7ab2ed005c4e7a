"""The load generator against a served model's server that answers as none should: a
redirect to another address (never followed: the node's load goes where its operator
allowed, nowhere else), an error answer of 512 MiB (read no further than a bound), a stream
claiming millions of tokens for a request of a few (an error, not millions of timestamps).
What the agent asks the server of itself is bounded alike."""

from __future__ import annotations

import asyncio

from fleetbench.agent.serving.dialects import OPENAI
from fleetbench.agent.serving.load import Limits, Load, run_level
from fleetbench.agent.serving.servers import ServerInfo, identify_at
from fleetbench.agent.serving.stats import RequestRecord
from tests.agent.hostile_server import (
    MIB,
    Reply,
    endless,
    hostile_server,
    json_reply,
    redirect_to,
    reply_with,
)

GEN_TOKENS = 4


def _level(url: str, requests: int = 2) -> list[RequestRecord]:
    """A level of one user's `requests` requests (and its warm-up request) at `url`."""
    records, _, _ = asyncio.run(
        run_level(
            url,
            OPENAI,
            lambda: "a prompt",
            concurrency=1,
            load=Load(requests=requests),
            gen_tokens=GEN_TOKENS,
            model="m",
            limits=Limits(connect_s=2, first_token_s=2, request_s=10),
        )
    )
    return records


def test_the_load_follows_no_redirect_to_another_address() -> None:
    internal_answer: Reply = json_reply(200, {"internal": "secret"})
    with hostile_server(internal_answer) as internal:
        with hostile_server(redirect_to(internal.url + "/v1/completions")) as served:
            records = _level(served.url)
        assert internal.requests == []
    assert [r.error for r in records] == ["http 307", "http 307"]
    assert served.requests == ["POST /v1/completions"] * 3  # the warm-up's too


def test_an_error_answer_is_read_no_further_than_a_bound() -> None:
    with hostile_server(endless(500, mib=512)) as served:
        records = _level(served.url, requests=1)
        assert served.sent < 128 * MIB  # of 1 GiB answered to the two requests
    assert [r.error for r in records] == ["http 500"]


def test_a_stream_counting_more_tokens_than_asked_for_is_an_error() -> None:
    event = b'data: {"choices": [{"text": "x"}], "usage": {"completion_tokens": 5000000}}\n\n'
    with hostile_server(reply_with(200, "text/event-stream", event + b"data: [DONE]\n\n")) as s:
        [record] = _level(s.url, requests=1)
    assert (record.error, record.tokens) == ("more tokens than asked for", 0)


def test_what_the_server_says_of_itself_is_read_no_further_than_a_bound() -> None:
    with hostile_server(endless(200, mib=512)) as served:
        said = identify_at(served.url)
        asked = len(served.requests)
        assert served.sent < asked * 32 * MIB  # of 512 MiB answered to each question
    assert said == ServerInfo(kind="openai-compatible")  # nothing it said is known
    assert asked == 3  # /props, /version, /api/version
