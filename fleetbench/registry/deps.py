"""FastAPI dependencies: the database session, the settings and node authentication.

Each request holds at most one database connection at a time (registry.admission sizes the
pool by that): authentication uses its own short session and gives its connection back
before the route's session takes one, and a session takes a connection only at its first
query.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from typing import Annotated, Any

from fastapi import Depends, HTTPException, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from fleetbench.registry import crud
from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.crud import AuthenticatedNode
from fleetbench.registry.models import Model, Node

__all__ = [
    "AuthenticateFirst",
    "AuthenticatedFirst",
    "KnownTokens",
    "NodeAuth",
    "ReadAccess",
    "SessionDep",
    "SettingsDep",
    "models_or_404",
    "node_or_404",
]

_bearer = HTTPBearer(
    auto_error=False, description="a node token from `fleetbench-registry token create`"
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


SessionDep = Annotated[Session, Depends(_session)]
SettingsDep = Annotated[RegistrySettings, Depends(_settings)]
_Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


class KnownTokens:
    """Tokens found valid in the last `ttl` seconds (at most `size` of them), by digest.
    Nearly every request of a fleet's agents carries a token; looking each up costs a
    connection checkout and two round trips, a third of a report's database work."""

    def __init__(self, *, ttl: float = 30.0, size: int = 10_000) -> None:
        self.ttl = ttl
        self.size = size
        self._found: OrderedDict[str, tuple[float, AuthenticatedNode]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, digest: str) -> AuthenticatedNode | None:
        with self._lock:
            found = self._found.get(digest)
            if found is None or time.monotonic() - found[0] > self.ttl:
                return None
            return found[1]

    def put(self, digest: str, node: AuthenticatedNode) -> None:
        with self._lock:
            self._found[digest] = (time.monotonic(), node)
            self._found.move_to_end(digest)
            while len(self._found) > self.size:
                self._found.popitem(last=False)


def _authenticate(request: Request, token: str | None) -> AuthenticatedNode:
    """The token's node, or 401: from the tokens known lately, else one short session."""
    if token is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="a node token is required: Authorization: Bearer <token>",
            headers={"WWW-Authenticate": "Bearer"},
        )
    known: KnownTokens = request.app.state.known_tokens
    digest = crud.token_digest(token)
    node = known.get(digest)
    if node is not None:
        return node
    with request.app.state.sessions() as session:
        node = crud.node_for_token(session, token)
    if node is not None:
        known.put(digest, node)
    if node is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="unknown token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return node


def _authenticated_node(request: Request, credentials: _Credentials) -> AuthenticatedNode:
    token = credentials.credentials if credentials is not None else None
    return _authenticate(request, token)


async def _authenticated_first(request: Request, _: _Credentials) -> AuthenticatedNode:
    """The node AuthenticateFirst found (`_` keeps the bearer scheme in the OpenAPI)."""
    node: AuthenticatedNode = request.state.node
    return node


async def _read_access(request: Request, settings: SettingsDep, credentials: _Credentials) -> None:
    if not settings.read_token_required:
        return
    token = credentials.credentials if credentials is not None else None
    known: KnownTokens = request.app.state.known_tokens
    if token is not None and known.get(crud.token_digest(token)) is not None:
        return
    await run_in_threadpool(_authenticate, request, token)


NodeAuth = Annotated[AuthenticatedNode, Depends(_authenticated_node)]
AuthenticatedFirst = Annotated[AuthenticatedNode, Depends(_authenticated_first)]
"""NodeAuth for routes of AuthenticateFirst: the node it found, at no further cost."""
ReadAccess = Depends(_read_access)


class AuthenticateFirst(APIRoute):
    """A route whose token is checked before its body is read: a request without a valid
    token costs the registry a header and one index probe, never the upload of a report.
    The route takes the node with AuthenticatedFirst."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def authenticated(request: Request) -> Response:
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            credentials = token.strip() if scheme.lower() == "bearer" and token.strip() else None
            known: KnownTokens = request.app.state.known_tokens
            node = known.get(crud.token_digest(credentials)) if credentials else None
            if node is None:  # look it up, on a thread (a database round trip)
                node = await run_in_threadpool(_authenticate, request, credentials)
            request.state.node = node
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
