"""uvicorn's httptools protocol with a bound on a request's head (its request line and
headers), which llhttp lacks: it buffers a header of any size, so one client could make the
registry hold megabytes per connection. Past the bound the request is answered 431 and the
connection closed (registry.http_server sets the bound). Checking costs a few Python calls a
request: /livez answered as many requests a second as with uvicorn's own protocol, and h11,
which has a bound, about a fifth fewer."""

from __future__ import annotations

import asyncio

from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

__all__ = ["BoundedHeadProtocol"]

DEFAULT_MAX_HEAD_BYTES = 64 * 1024
_TOO_LARGE = b"Request header fields too large"


class BoundedHeadProtocol(HttpToolsProtocol):
    """The bound is the config's h11_max_incomplete_event_size, h11's name for the same
    thing. The bytes counted are those of the reads after which a head is incomplete: a head
    is refused within one read of passing the bound (asyncio reads 256 KiB at most), or two
    where it began in the read that ended the body before it."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, object],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        self.max_head_bytes = config.h11_max_incomplete_event_size or DEFAULT_MAX_HEAD_BYTES
        self._in_head = False
        self._in_body = False
        self._head_bytes = 0

    def on_message_begin(self) -> None:
        self._in_head = True
        self._head_bytes = 0
        super().on_message_begin()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._in_body = True
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._in_body = False
        super().on_message_complete()

    def data_received(self, data: bytes) -> None:
        # Not counted: a read that ends a request's body and begins the next one's head
        # (pipelining), which is not all head.
        ending_a_body = self._in_body
        super().data_received(data)
        if not self._in_head or ending_a_body or self.transport.is_closing():
            return
        self._head_bytes += len(data)
        if self._head_bytes > self.max_head_bytes:
            self._refuse_head()

    def _refuse_head(self) -> None:
        self.logger.warning("a request head over %d bytes: answered 431", self.max_head_bytes)
        if self.cycle is None or self.cycle.response_complete:
            # not while an answer to the request before is being written: it would be cut
            default = b"".join(
                n + b": " + v + b"\r\n" for n, v in self.server_state.default_headers
            )
            self.transport.write(
                STATUS_LINE[431]
                + default
                + b"content-type: text/plain; charset=utf-8\r\n"
                + b"content-length: %d\r\n" % len(_TOO_LARGE)
                + b"connection: close\r\n\r\n"
                + _TOO_LARGE
            )
        self.transport.close()
