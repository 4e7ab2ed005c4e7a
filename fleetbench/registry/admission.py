"""Admission: how many requests one registry process works on at once, and which it sheds.

Requests that use the database go through one of two lanes: reads (GET, HEAD) and writes
(everything else), so that a flood of reports never delays a dashboard. A lane admits at most
its limit at once; beyond that, up to `max_queued` wait their turn, first come first served,
for at most `max_wait` seconds. A request that finds the queue full, or waits too long, is
answered 503 with a Retry-After (with jitter, so shed clients do not return in step) without
touching the database: a fleet's agents retrying together after an outage get their answer in
milliseconds, and their spools try again later.

The connection pool and the worker threads are sized from the lanes' limits
(RegistrySettings.pool_size), so an admitted request never waits for a connection or a
thread: the jam in which every thread holds a connection and waits for another cannot form.
Pages, scripts and the API docs use no database and are not admitted; /healthz and /readyz
are not either, so that a busy registry still says it is ready (it has connections set
aside), nor /livez, which asks no database.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["Admission", "Lane", "LaneLimits"]

_READ_METHODS = frozenset({"GET", "HEAD"})


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


class Admission:
    """Pure ASGI middleware: admits database requests through the read and write lanes and
    answers 503 for those it sheds. `on_shed(lane)` is told of each (for /metrics)."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        reads: Lane,
        writes: Lane,
        retry_after_s: int,
        on_shed: Callable[[str], None] | None = None,
    ) -> None:
        self.app = app
        self.reads = reads
        self.writes = writes
        self.retry_after_s = retry_after_s
        self.on_shed = on_shed

    def lane(self, scope: Scope) -> Lane | None:
        path: str = scope["path"]
        if not (path.startswith("/v1/") or path == "/metrics"):
            return None
        return self.reads if scope["method"] in _READ_METHODS else self.writes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lane = self.lane(scope) if scope["type"] == "http" else None
        if lane is None:
            await self.app(scope, receive, send)
            return
        if not await lane.enter():
            if self.on_shed is not None:
                self.on_shed(lane.name)
            await self._shed(lane, send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            lane.leave()

    async def _shed(self, lane: Lane, send: Send) -> None:
        retry_after = self.retry_after_s + random.randint(0, self.retry_after_s)
        body = json.dumps(
            {
                "detail": f"the registry is busy ({lane.active} {lane.name}s in progress, "
                f"{lane.waiting} waiting): retry after {retry_after} s"
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 503,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", str(retry_after).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
