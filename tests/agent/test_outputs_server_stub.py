"""Reading a llama-server's output fingerprint (agent.serving.outputs) from answers a real
server does not give on demand: a probability that is no number, a build that names tokens
by text only, slots too small for the text, other clients' requests arriving meanwhile, a
server that stops answering. A small server on loopback speaks llama-server's protocol
(/props, /slots, /v1/models, /tokenize, /completion streamed for the levels and not for the
fingerprint), answering as the test's `mode` says; the answers' shapes are b11434's
(tools/server/server-task.cpp: `completion_probabilities[].top_logprobs[]` with `id` and
`logprob`, null where nlohmann's JSON has no number)."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from fleetbench.agent.serving.outputs import NoFingerprint, server_fingerprint
from fleetbench.agent.serving.servers import server_client
from fleetbench.agent.serving.sweep import serve_sweep
from fleetbench.contract.serve_spec import ServeSpec

TEXT = list(range(1, 11))  # the reference text as this server tokenizes it: 9 positions


class _Stub(BaseHTTPRequestHandler):
    server: _StubServer

    def log_message(self, *_: object) -> None:
        pass

    def _json(self, body: object, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        stub = self.server
        if self.path == "/props":
            self._json({"build_info": "b11434-0000000", "total_slots": 2})
        elif self.path == "/slots":
            busy = stub.mode == "others" and stub.completions >= 3
            slot = {"n_ctx": 4 if stub.mode == "small" else 512, "is_processing": False}
            self._json([slot, {**slot, "is_processing": busy}])
        elif self.path == "/v1/models":
            self._json({"data": [{"meta": {"n_vocab": 100}}]})
        else:
            self._json({"error": "not found"}, 404)

    def do_POST(self) -> None:
        stub = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            self._json({"tokens": TEXT if body.get("add_special") else [7] * 50})
        elif self.path == "/completion" and body.get("stream"):
            self._stream(body["n_predict"])
        elif self.path == "/completion":
            stub.completions += 1
            self._json(*stub.answer(len(body["prompt"])))
        else:
            self._json({"error": "not found"}, 404)

    def _stream(self, tokens: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for n in range(1, tokens + 1):
            self.wfile.write(f'data: {{"content": "a", "tokens_predicted": {n}}}\n\n'.encode())
        done = {"content": "", "stop": True, "tokens_predicted": tokens}
        self.wfile.write(f"data: {json.dumps(done)}\n\n".encode())


class _StubServer(ThreadingHTTPServer):
    def __init__(self, mode: str) -> None:
        super().__init__(("127.0.0.1", 0), _Stub)
        self.mode = mode
        self.completions = 0

    def answer(self, prompt: int) -> tuple[dict[str, Any], int]:
        """The top two tokens after `prompt` tokens: `prompt` at 0.5, 99 at 0.25."""
        if self.mode == "failing" and prompt > 2:
            return {"error": {"message": "the slot is gone"}}, 500
        if self.mode == "old":  # before ids and log-probabilities were given
            return {"completion_probabilities": [{"probs": [{"tok_str": "a", "prob": 0.5}]}]}, 200
        second = None if self.mode == "nan" and prompt == 4 else math.log(0.25)
        top = [{"id": prompt, "logprob": math.log(0.5)}, {"id": 99, "logprob": second}]
        return {"completion_probabilities": [{"top_logprobs": top}]}, 200


@pytest.fixture
def stub(request: pytest.FixtureRequest) -> Iterator[tuple[str, _StubServer]]:
    server = _StubServer(request.param)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", server
    finally:
        server.shutdown()
        server.server_close()


def _taken(url: str, **kwargs: Any) -> Any:
    with server_client(url) as client:
        return server_fingerprint(client, **kwargs)


@pytest.mark.parametrize("stub", ["ok"], indirect=True)
def test_each_position_is_read_with_the_rest_of_its_probability(stub: tuple[str, Any]) -> None:
    taken = _taken(stub[0])
    assert (taken.n_vocab, len(taken.ids), taken.non_finite) == (100, 9, 0)
    assert taken.ids[0] == [1, 99] and taken.ids[8] == [9, 99]  # the prompt's length, then 99
    assert taken.logprobs[0] == [round(math.log(0.5), 5), round(math.log(0.25), 5)]
    assert taken.rest[0] == round(math.log(0.25), 5)  # 1 - 0.5 - 0.25


@pytest.mark.parametrize("stub", ["nan"], indirect=True)
def test_a_probability_that_is_no_number_counts_its_position(stub: tuple[str, Any]) -> None:
    taken = _taken(stub[0])
    assert taken.non_finite == 1
    assert taken.logprobs[3] == [round(math.log(0.5), 5), -1e4]  # after 4 tokens
    assert taken.rest[3] == round(math.log(0.5), 5)


@pytest.mark.parametrize(
    ("stub", "why"),
    [
        ("old", "gave no top_logprobs with token ids"),
        ("small", "slots hold 4 tokens, fewer than the reference text's 10"),
        ("failing", "the server answered no completion after 3 tokens"),
        ("others", "another client's requests were served while it was taken"),
    ],
    indirect=["stub"],
)
def test_a_server_that_cannot_give_it_says_why(stub: tuple[str, Any], why: str) -> None:
    with pytest.raises(NoFingerprint, match=why):
        _taken(stub[0], shared=True)


@pytest.mark.parametrize("stub", ["ok"], indirect=True)
def test_a_server_slower_than_the_budget_is_given_up_on(stub: tuple[str, Any]) -> None:
    with pytest.raises(NoFingerprint, match="0 positions took over 0 s: given up"):
        _taken(stub[0], budget_s=0)


@pytest.mark.parametrize("stub", ["failing"], indirect=True)
def test_a_sweep_whose_fingerprint_fails_keeps_its_points_and_warns(
    stub: tuple[str, Any],
) -> None:
    spec = ServeSpec(concurrency=(1,), prompt_tokens=4, gen_tokens=2, requests=2)
    outcome = serve_sweep(stub[0], "m", spec)
    assert outcome.server.kind == "llama-server" and len(outcome.points) == 1
    assert outcome.outputs is None
    assert "no output fingerprint: the server answered no completion after 3 tokens" in (
        outcome.warnings
    )
