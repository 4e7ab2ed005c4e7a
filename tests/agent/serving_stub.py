"""An OpenAI-compatible server on loopback that behaves as a real one does under load, with
numbers a test can predict: `slots` requests decode at once, each a token every
`token_interval_s`, the rest queue for a slot (their first token waits: TTFT grows past the
slots, as llama-server's does); past `refuse_over` requests in flight it answers 503, as a
server shedding load does; after `die_after` requests it stops answering altogether. With a
`version` it says it is vLLM (GET /version), and with `others_in_flight` its Prometheus
/metrics count that many requests of others, as vLLM's do."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["StubServer", "stub_server"]


@dataclass
class StubServer:
    url: str
    slots: int
    token_interval_s: float
    refuse_over: int | None = None
    die_after: int | None = None
    version: str | None = None
    others_in_flight: int | None = None
    props: object = None  # what GET /props answers, as JSON (None: 404)
    requests: int = 0
    in_flight: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *_: object) -> None:
        pass

    def do_GET(self) -> None:
        stub: StubServer = self.server.stub  # type: ignore[attr-defined]
        if self.path == "/props" and stub.props is not None:
            self._answer(json.dumps(stub.props).encode(), "application/json")
        elif self.path == "/version" and stub.version is not None:
            self._answer(json.dumps({"version": stub.version}).encode(), "application/json")
        elif self.path == "/metrics" and stub.others_in_flight is not None:
            gauge = (
                "# HELP vllm:num_requests_running Number of requests in model execution.\n"
                "# TYPE vllm:num_requests_running gauge\n"
                f'vllm:num_requests_running{{model_name="m"}} {stub.others_in_flight}.0\n'
            )
            self._answer(gauge.encode(), "text/plain; version=0.0.4")
        else:
            self._answer(b"", "text/plain", status=404)

    def _answer(self, body: bytes, kind: str, status: int = 200) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        stub: StubServer = self.server.stub  # type: ignore[attr-defined]
        slots: threading.Semaphore = self.server.slot_semaphore  # type: ignore[attr-defined]
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
        with stub.lock:
            stub.requests += 1
            number = stub.requests
            stub.in_flight += 1
            refused = stub.refuse_over is not None and stub.in_flight > stub.refuse_over
        left = False

        def leave() -> None:
            # Before the last bytes of the answer: a client that has them may send its next
            # request at once, and it must not find this one still counted.
            nonlocal left
            if not left:
                with stub.lock:
                    stub.in_flight -= 1
                left = True

        try:
            if stub.die_after is not None and number > stub.die_after:
                leave()
                threading.Thread(target=_die, args=(self.server,), daemon=True).start()
                self.close_connection = True  # no answer: the connection just closes
                return
            if refused:
                leave()
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            with slots:  # queued until a slot is free: the wait shows in the first token
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for count in range(1, body["max_tokens"] + 1):
                    time.sleep(stub.token_interval_s)
                    event = {"choices": [{"text": "a"}], "usage": {"completion_tokens": count}}
                    if count == body["max_tokens"]:
                        leave()
                    self._chunk(f"data: {json.dumps(event)}\n\n".encode())
            self._chunk(b"data: [DONE]\n\n")
            self._chunk(b"")
        finally:
            leave()

    def _chunk(self, data: bytes) -> None:
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: object, client_address: object) -> None:
        # A client that gave up on a stream (a timeout of its own) closed the connection
        # this server was still writing to: what the test wants, not an error to print.
        pass


def _die(server: ThreadingHTTPServer) -> None:
    """Stops accepting: new connections are refused from now on."""
    server.shutdown()
    server.server_close()


@contextmanager
def stub_server(
    *,
    slots: int,
    token_interval_s: float = 0.005,
    refuse_over: int | None = None,
    die_after: int | None = None,
    version: str | None = None,
) -> Iterator[StubServer]:
    server = _Server(("127.0.0.1", 0), _Handler)
    stub = StubServer(
        f"http://127.0.0.1:{server.server_address[1]}",
        slots,
        token_interval_s,
        refuse_over,
        die_after,
        version,
    )
    server.stub = stub  # type: ignore[attr-defined]
    server.slot_semaphore = threading.Semaphore(slots)  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield stub
    finally:
        server.shutdown()
        server.server_close()
