"""Request bodies over a size limit get 413, without the registry holding more than the
limit in memory."""

from __future__ import annotations

import json
from collections.abc import Mapping

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["BODILESS_METHODS", "BodySizeLimit", "json_answer"]

# Methods whose body, if one is sent, nothing in the registry reads.
BODILESS_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class BodySizeLimit:
    """Pure ASGI middleware. A declared Content-Length over `max_bytes` is answered 413 at
    once, before anything is read. Otherwise the body is counted as it is read (by
    registry.admission, once the token is found valid), and reading past the limit raises
    a 413: a chunked upload is cut off where it crosses the limit."""

    def __init__(self, app: ASGIApp, *, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in BODILESS_METHODS:
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._too_large(send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise HTTPException(413, detail=self._detail(), headers={"Connection": "close"})
            return message

        await self.app(scope, counted, send)

    def _detail(self) -> str:
        return f"request body is larger than the limit of {self.max_bytes} bytes"

    async def _too_large(self, send: Send) -> None:
        await json_answer(send, 413, self._detail(), {"Connection": "close"})


async def json_answer(
    send: Send, status: int, detail: str, headers: Mapping[str, str] | None = None
) -> None:
    """An answer `{"detail": ...}` sent from middleware, outside the app's error answers."""
    body = json.dumps({"detail": detail}).encode()
    extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in (headers or {}).items()]
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
