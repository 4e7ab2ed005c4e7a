"""Admission: how many requests one registry process works on at once, and which it sheds.

Requests that use the database go through one of two lanes: reads (GET, HEAD, and OPTIONS,
which no route takes and whose body is never read) and writes (everything else), so that a
flood of reports never delays a dashboard. A lane admits at most its limit at once; beyond
that, up to `max_queued` wait their turn, first come first served, for at most `max_wait`
seconds. A request that finds the queue full, or waits too long, is
answered 503 with a Retry-After (with jitter, so shed clients do not return in step) without
touching the database: a fleet's agents retrying together after an outage get their answer in
milliseconds, and their spools try again later.

The connection pool and the worker threads are sized from the lanes' limits
(RegistrySettings.pool_size), so an admitted request never waits for a connection or a
thread: the jam in which every thread holds a connection and waits for another cannot form.
Pages, scripts and the API docs use no database and are not admitted; /healthz and /readyz
are not either, so that a busy registry still says it is ready (it has connections set
aside), nor /livez, which asks no database.

A write takes its slot only once its token is known valid and its whole body is in hand:
a request without a valid token is answered 401 before a byte of its body is read, and a
body must arrive within `body_timeout_s` (408 after), with at most `uploads_per_token`
bodies arriving at once per token (429 beyond); the token is checked again once the slot is
taken, so that one revoked meanwhile writes nothing. So connections that send a body slowly,
with or without a token, hold a socket and at most the body's bound in memory, never a
slot the fleet's reports need.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from fastapi.security.utils import get_authorization_scheme_param
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fleetbench.registry.body_limit import BODILESS_METHODS, json_answer
from fleetbench.registry.tokens import Principal

__all__ = ["Admission", "Lane", "LaneLimits", "UploadLimits", "client_address", "shed"]


@dataclass(frozen=True)
class LaneLimits:
    in_flight: int
    queued: int
    max_wait_s: float


class Lane:
    """At most `in_flight` holders at once; the others queue FIFO (bounded) or are refused.
    Used from one event loop only, so plain counters suffice."""

    def __init__(self, name: str, limits: LaneLimits) -> None:
        self.name = name
        self.limits = limits
        self.active = 0
        self._queue: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return len(self._queue)

    async def enter(self) -> bool:
        """True once admitted (then `leave` exactly once); False when refused."""
        if self.active < self.limits.in_flight and not self._queue:
            self.active += 1
            return True
        if len(self._queue) >= self.limits.queued:
            return False
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append(turn)
        try:
            await asyncio.wait_for(turn, self.limits.max_wait_s)
        except TimeoutError:
            self._give_up(turn)
            return False
        except asyncio.CancelledError:  # the client went away while waiting
            self._give_up(turn)
            raise
        return True

    def _give_up(self, turn: asyncio.Future[None]) -> None:
        if turn.done() and not turn.cancelled():
            self.leave()  # the turn came just as the wait ended: pass it on
            return
        turn.cancel()
        with contextlib.suppress(ValueError):  # leave() may have dropped it already
            self._queue.remove(turn)

    def leave(self) -> None:
        """Hands the slot to the first in the queue, or frees it."""
        while self._queue:
            turn = self._queue.popleft()
            if not turn.done():
                turn.set_result(None)  # the slot passes on: `active` is unchanged
                return
        self.active -= 1


def shed(lane: Lane, retry_after_s: int, on_shed: Callable[[str], None] | None) -> HTTPException:
    """The 503 of a request the lane sheds, its Retry-After with jitter (so that shed
    clients do not come back in step); `on_shed` is told of it (for /metrics)."""
    if on_shed is not None:
        on_shed(lane.name)
    retry_after = retry_after_s + random.randint(0, retry_after_s)
    detail = (
        f"the registry is busy ({lane.active} {lane.name}s in progress, {lane.waiting} "
        f"waiting): retry after {retry_after} s"
    )
    return HTTPException(503, detail=detail, headers={"Retry-After": str(retry_after)})


@dataclass(frozen=True)
class UploadLimits:
    body_timeout_s: float
    per_token: int


Authenticate = Callable[[str | None, str], Awaitable[Principal]]


class Admission:
    """Pure ASGI middleware: admits database requests through the read and write lanes and
    answers 503 for those it sheds. `authenticate(token, client address)` finds who a
    write speaks for (raising HTTPException to refuse); the route finds it in
    `request.state.principal`. `on_shed(lane)` is told of each shed (for /metrics)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        reads: Lane,
        writes: Lane,
        retry_after_s: int,
        authenticate: Authenticate,
        uploads: UploadLimits,
        on_shed: Callable[[str], None] | None = None,
    ) -> None:
        self.app = app
        self.reads = reads
        self.writes = writes
        self.retry_after_s = retry_after_s
        self.authenticate = authenticate
        self.uploads = uploads
        self.on_shed = on_shed
        self._uploading: Counter[int] = Counter()  # bodies arriving, by token id

    def lane(self, scope: Scope) -> Lane | None:
        path: str = scope["path"]
        if not (path.startswith("/v1/") or path == "/metrics"):
            return None
        return self.reads if scope["method"] in BODILESS_METHODS else self.writes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lane = self.lane(scope) if scope["type"] == "http" else None
        if lane is None:
            await self.app(scope, receive, send)
            return
        writing = lane is self.writes
        # a read's token is the route's to check (deps): only a write's is read here
        token, address = (_bearer(scope), client_address(scope)) if writing else (None, "")
        try:
            if writing:
                body = await self._body(await self.authenticate(token, address), receive)
                if body is None:  # the client went away
                    return
                receive = _replay(body, receive)
            if not await lane.enter():
                raise shed(lane, self.retry_after_s, self.on_shed)
        except HTTPException as exc:
            await json_answer(send, exc.status_code, exc.detail, exc.headers)
            return
        try:
            if writing:
                # Again, now that the body is in: a token revoked while it arrived (up to
                # body_timeout_s) is refused. From memory, as a rule: it was just found.
                try:
                    principal = await self.authenticate(token, address)
                except HTTPException as exc:
                    await json_answer(send, exc.status_code, exc.detail, exc.headers)
                    return
                scope.setdefault("state", {})["principal"] = principal
            await self.app(scope, receive, send)
        finally:
            lane.leave()

    async def _body(self, principal: Principal, receive: Receive) -> bytes | None:
        """The whole body, or None when the client disconnected; HTTPException 408 (too
        slow), 413 (too large: the size bound reads with us) or 429 (too many at once)."""
        token_id = principal.token_id
        if self._uploading[token_id] >= self.uploads.per_token:
            raise HTTPException(
                429,
                detail=f"this token has {self.uploads.per_token} request bodies arriving "
                "already: send one after another",
                headers={"Retry-After": str(self.retry_after_s)},
            )
        self._uploading[token_id] += 1
        chunks: list[bytes] = []
        try:
            async with asyncio.timeout(self.uploads.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None
                    chunks.append(message.get("body", b""))
                    if not message.get("more_body", False):
                        return b"".join(chunks)
        except TimeoutError:
            raise HTTPException(
                408,
                detail=f"the request body did not arrive within {self.uploads.body_timeout_s:g} s",
                headers={"Connection": "close"},
            ) from None
        finally:
            self._uploading[token_id] -= 1
            if not self._uploading[token_id]:
                del self._uploading[token_id]


def _bearer(scope: Scope) -> str | None:
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, token = get_authorization_scheme_param(value.decode("latin-1"))
            return token if scheme.lower() == "bearer" and token else None
    return None


def client_address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


def _replay(body: bytes, receive: Receive) -> Receive:
    """The body read already, then the connection's own messages (a disconnect)."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replayed
