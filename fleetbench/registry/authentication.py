"""Who a request's token speaks for: checked before anything else of a request is read
(registry.admission for writes, registry.deps for reads), with the tokens found valid
lately kept in the process.

A revoke is refused by every process within a second. Revoking or rotating a token raises
the registry's token epoch (table token_epoch) in the same transaction; each serving
process reads the epoch four times a second (one row) and forgets every token it holds
when it moved. A token found valid is taken from memory only while the epoch was read
less than `fresh_s` ago, so a process whose reads stall looks tokens up instead; and a
look-up that began before the epoch moved cannot put its answer back.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime

from fastapi import HTTPException, status
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.orm import Session, sessionmaker

from fleetbench.registry import tokens
from fleetbench.registry.admission import Lane, shed
from fleetbench.registry.errors import DATABASE_UNAVAILABLE, database_unavailable
from fleetbench.registry.tokens import Principal

__all__ = ["REFUSED", "Authenticator", "EpochWatch", "FailedLogins", "KnownTokens", "refused"]

log = logging.getLogger("fleetbench.registry")

# One message whatever the reason (none, unknown, revoked, expired): a caller holding an
# old token learns nothing of its history; an admin sees the reason in `token list`.
REFUSED = "a valid token is required: Authorization: Bearer <token>"


def refused() -> HTTPException:
    return HTTPException(
        status.HTTP_401_UNAUTHORIZED, detail=REFUSED, headers={"WWW-Authenticate": "Bearer"}
    )


class KnownTokens:
    """Tokens found valid (at most `size`), by digest, trusted while the token epoch was
    read within `fresh_s` seconds, and each for `ttl_s` at most: a token changed without a
    revoke (by hand in the database, a restored backup) is read again within a minute.
    `generation` names what the entries were found under: the epoch read last and the
    revokes made in this process."""

    def __init__(self, *, size: int = 10_000, fresh_s: float = 0.75, ttl_s: float = 60) -> None:
        self.size = size
        self.fresh_s = fresh_s
        self.ttl_s = ttl_s
        self._found: OrderedDict[str, tuple[float, Principal]] = OrderedDict()
        self._epoch: int | None = None
        self._forgotten = 0
        self._read_at: float | None = None  # when the last epoch read that answered began
        self._lock = threading.Lock()

    @property
    def generation(self) -> tuple[int | None, int]:
        return self._epoch, self._forgotten

    def get(self, digest: str) -> Principal | None:
        now = time.monotonic()
        with self._lock:
            if self._read_at is None or now - self._read_at > self.fresh_s:
                return None
            found = self._found.get(digest)
        if found is None or now - found[0] > self.ttl_s:
            return None
        return found[1] if found[1].valid_at(datetime.now(UTC)) else None

    def put(self, digest: str, principal: Principal, generation: tuple[int | None, int]) -> None:
        """Keeps what a look-up found, unless a revoke happened since it began."""
        with self._lock:
            if generation != self.generation:
                return
            self._found[digest] = (time.monotonic(), principal)
            self._found.move_to_end(digest)
            while len(self._found) > self.size:
                self._found.popitem(last=False)

    def forget_all(self) -> None:
        """A token was revoked here: nothing found before stands."""
        with self._lock:
            self._forgotten += 1
            self._found.clear()

    def epoch_read(self, epoch: int, began_at: float) -> None:
        with self._lock:
            if epoch != self._epoch:
                self._epoch = epoch
                self._found.clear()
            self._read_at = began_at if self._read_at is None else max(self._read_at, began_at)


class EpochWatch:
    """A thread reading the token epoch every `every_s` seconds into `known`."""

    def __init__(
        self, sessions: sessionmaker[Session], known: KnownTokens, *, every_s: float = 0.25
    ) -> None:
        self._sessions = sessions
        self._known = known
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="token-epoch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        failing = False
        while not self._stop.is_set():
            began = time.monotonic()
            try:
                with self._sessions() as session:
                    epoch = tokens.token_epoch(session)
            except SQLAlchemyError as exc:  # tokens are looked up until it answers again
                if not failing:
                    log.warning("the token epoch cannot be read (%s): tokens looked up", exc)
                failing = True
            else:
                failing = False
                self._known.epoch_read(epoch, began)
            self._stop.wait(self._every_s)


class FailedLogins:
    """Refused tokens by client address over the last `window` seconds. Past `limit`, that
    address's refused tokens are answered 429 with Retry-After (until the oldest refusal
    leaves the window) instead of 401; a valid token is never held up, so an agent sharing
    a NAT or a proxy with a misconfigured one keeps reporting, and an admin can still
    revoke a leaked token."""

    def __init__(self, *, limit: int, window: float = 60.0, size: int = 10_000) -> None:
        self.limit = limit
        self.window = window
        self.size = size
        self._refused: OrderedDict[str, list[float]] = OrderedDict()
        self._lock = threading.Lock()

    def wait_s(self, address: str) -> float | None:
        """Seconds until `address` may try again, or None if it may now."""
        if not self.limit:
            return None
        now = time.monotonic()
        with self._lock:
            times = [t for t in self._refused.get(address, []) if now - t < self.window]
            if times:
                self._refused[address] = times
            else:
                self._refused.pop(address, None)
            return self.window - (now - times[0]) if len(times) > self.limit else None

    def refused(self, address: str) -> None:
        if not self.limit:
            return
        with self._lock:
            times = self._refused.setdefault(address, [])
            times.append(time.monotonic())
            del times[: -(self.limit + 1)]  # what the decision needs, whatever the rate
            self._refused.move_to_end(address)
            while len(self._refused) > self.size:
                self._refused.popitem(last=False)


class Authenticator:
    """Tokens to principals: from memory when it may be trusted, else one short session on
    a worker thread, admitted through `lane`: a flood of unknown tokens on writes waits
    there, never among the writes; on reads it waits there holding the read's slot."""

    def __init__(
        self,
        sessions: sessionmaker[Session],
        known: KnownTokens,
        failed: FailedLogins,
        *,
        lane: Lane,
        retry_after_s: int,
        on_shed: Callable[[str], None] | None = None,
    ) -> None:
        self._sessions = sessions
        self.known = known
        self.failed = failed
        self.lane = lane
        self._retry_after_s = retry_after_s
        self._on_shed = on_shed

    async def principal(self, token: str | None, address: str) -> Principal:
        """The token's principal; raises HTTPException 401, 429 or 503."""
        if token is None:
            raise refused()
        digest = tokens.token_digest(token)
        found = self.known.get(digest)
        if found is not None:
            return found
        if not await self.lane.enter():
            raise shed(self.lane, self._retry_after_s, self._on_shed)
        try:
            generation = self.known.generation  # before the look-up: see KnownTokens.put
            found = await run_in_threadpool(self._look_up, digest, address)
        finally:
            self.lane.leave()
        self.known.put(digest, found, generation)
        return found

    def _look_up(self, digest: str, address: str) -> Principal:
        """(A write's look-up runs before any route, outside the app's error answers: a
        database that cannot answer is said here as registry.errors says it.)"""
        try:
            with self._sessions() as session:
                return tokens.authenticate(session, digest)
        except (DBAPIError, PoolTimeout) as exc:
            if isinstance(exc, DBAPIError) and not database_unavailable(exc):
                raise
            log.warning("a token not looked up: database unavailable: %s", exc)
            raise HTTPException(
                status.HTTP_503_SERVICE_UNAVAILABLE,
                detail=DATABASE_UNAVAILABLE,
                headers={"Retry-After": str(self._retry_after_s)},
            ) from None
        except tokens.TokenRefused:
            self.failed.refused(address)
            if (wait := self.failed.wait_s(address)) is not None:
                raise HTTPException(
                    status.HTTP_429_TOO_MANY_REQUESTS,
                    detail="too many refused tokens from this address: try again later",
                    headers={"Retry-After": str(max(1, math.ceil(wait)))},
                ) from None
            raise refused() from None
