"""FastAPI dependencies: the database session, the settings, and who a token speaks for
(registry.tokens: node, reader, admin).

Each request holds at most one database connection at a time (registry.admission sizes the
pool by that): authentication uses its own short session and gives its connection back
before the route's session takes one, and a session takes a connection only at its first
query.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from sqlalchemy.orm import Session

from fleetbench.registry import crud, tokens
from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.models import Model, Node
from fleetbench.registry.state import ProcessState
from fleetbench.registry.tokens import AuthenticatedNode, Principal

__all__ = [
    "READ_SCHEME",
    "AdminAuth",
    "AuthenticateFirst",
    "AuthenticatedFirst",
    "FailedLogins",
    "ProcessDep",
    "ReadAccess",
    "SessionDep",
    "SettingsDep",
    "models_or_404",
    "node_or_404",
]

_bearer = HTTPBearer(
    auto_error=False,
    description="a token from `fleetbench-registry token create`: node, reader or admin",
)


async def _session(request: Request) -> AsyncIterator[Session]:
    """A session for the route; it takes a connection at its first query (on the route's
    thread). Made and closed here, on the event loop, so that a read costs the route's one
    trip to a worker thread and not three; closing one that holds a connection (a rollback)
    goes to a thread."""
    session: Session = request.app.state.sessions()
    try:
        yield session
    finally:
        if session.in_transaction():
            await run_in_threadpool(session.close)
        else:
            session.close()


async def _settings(request: Request) -> RegistrySettings:
    settings: RegistrySettings = request.app.state.settings
    return settings


def _process_of(request: Request) -> ProcessState:
    process: ProcessState = request.app.state.process
    return process


async def _process(request: Request) -> ProcessState:
    return _process_of(request)


SessionDep = Annotated[Session, Depends(_session)]
SettingsDep = Annotated[RegistrySettings, Depends(_settings)]
ProcessDep = Annotated[ProcessState, Depends(_process)]
_Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
# The same bearer token under its own name in the schema, so that the schema can say reads
# take it only while they are closed (registry.main).
READ_SCHEME = "ReadBearer"
_read_bearer = HTTPBearer(
    auto_error=False,
    scheme_name=READ_SCHEME,
    description="a reader or admin token; needed only while reads are closed "
    "(FLEETBENCH_READ_TOKEN_REQUIRED)",
)
_ReadCredentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_read_bearer)]


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


def _refused(detail: str) -> HTTPException:
    return HTTPException(
        status.HTTP_401_UNAUTHORIZED, detail=detail, headers={"WWW-Authenticate": "Bearer"}
    )


async def _principal(request: Request, token: str | None) -> Principal:
    """The token's principal, or 401: from the tokens known lately (on the event loop),
    else one short session on a thread (a database round trip)."""
    if token is None:
        raise _refused("a token is required: Authorization: Bearer <token>")
    digest = tokens.token_digest(token)
    known = _process_of(request).known_tokens
    principal = known.get(digest)
    if principal is None:
        principal = await run_in_threadpool(_look_up, request, digest)
        known.put(digest, principal)
    return principal


def _look_up(request: Request, digest: str) -> Principal:
    try:
        with request.app.state.sessions() as session:
            principal = tokens.authenticate(session, digest)
    except tokens.TokenRefused as exc:
        failed: FailedLogins = request.app.state.failed_logins
        address = request.client.host if request.client else "unknown"
        failed.refused(address)
        if (wait := failed.wait_s(address)) is not None:
            raise HTTPException(
                status.HTTP_429_TOO_MANY_REQUESTS,
                detail="too many refused tokens from this address: try again later",
                headers={"Retry-After": str(max(1, math.ceil(wait)))},
            ) from None
        raise _refused(str(exc)) from None
    return principal


def _bearer_token(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    return credentials.credentials if credentials is not None else None


def _forbidden(principal: Principal, needed: str) -> HTTPException:
    return HTTPException(
        status.HTTP_403_FORBIDDEN,
        detail=f"this needs {needed}; {principal.name!r} is a {principal.scope} token",
    )


def _as_node(principal: Principal) -> AuthenticatedNode:
    if principal.scope != "node" or principal.node_id is None or principal.node_name is None:
        raise _forbidden(principal, "a node token")
    return AuthenticatedNode(principal.node_id, principal.node_name)


async def _admin(request: Request, credentials: _Credentials) -> Principal:
    principal = await _principal(request, _bearer_token(credentials))
    if principal.scope != "admin":
        raise _forbidden(principal, "an admin token")
    return principal


async def _authenticated_first(request: Request, _: _Credentials) -> AuthenticatedNode:
    """The node AuthenticateFirst found (`_` keeps the bearer scheme in the OpenAPI)."""
    node: AuthenticatedNode = request.state.node
    return node


def _may_read(principal: Principal) -> None:
    if principal.scope not in ("reader", "admin"):
        raise _forbidden(principal, "a reader or admin token (reads are closed)")


async def _read_access(
    request: Request, settings: SettingsDep, credentials: _ReadCredentials
) -> None:
    if not settings.read_token_required:
        return
    _may_read(await _principal(request, _bearer_token(credentials)))


AuthenticatedFirst = Annotated[AuthenticatedNode, Depends(_authenticated_first)]
"""The node a route of AuthenticateFirst found, at no further cost."""
AdminAuth = Annotated[Principal, Depends(_admin)]
ReadAccess = Depends(_read_access)


class AuthenticateFirst(APIRoute):
    """A route whose token is checked before its body is read: a request without a valid
    token costs the registry a header and one index probe, never the upload of a report.
    The route takes the node with AuthenticatedFirst."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def authenticated(request: Request) -> Response:
            scheme, token = get_authorization_scheme_param(request.headers.get("authorization"))
            bearer = token if scheme.lower() == "bearer" and token else None
            request.state.node = _as_node(await _principal(request, bearer))
            return await handler(request)

        return authenticated


def node_or_404(session: Session, name: str) -> Node:
    node = crud.find_node(session, name)
    if node is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"node {name!r} not found")
    return node


def models_or_404(session: Session, model: str) -> Sequence[Model]:
    """The models a display name or sha256 names (several files may share a name)."""
    models = crud.find_models(session, model)
    if not models:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"model {model!r} not found")
    return models
