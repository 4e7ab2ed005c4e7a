"""FastAPI dependencies: the database session, the settings, and who a token speaks for
(registry.tokens: node, reader, admin).

Each request holds at most one database connection at a time (registry.admission sizes the
pool by that): authentication uses its own short session and gives its connection back
before the route's session takes one, and a session takes a connection only at its first
query.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from fleetbench.registry import crud
from fleetbench.registry.admission import client_address
from fleetbench.registry.authentication import Authenticator
from fleetbench.registry.config import RegistrySettings
from fleetbench.registry.models import Model, Node
from fleetbench.registry.state import ProcessState
from fleetbench.registry.tokens import AuthenticatedNode, Principal

__all__ = [
    "READ_SCHEME",
    "AdminAuth",
    "NodeAuth",
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


async def _process(request: Request) -> ProcessState:
    process: ProcessState = request.app.state.process
    return process


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


async def _principal(request: Request, token: str | None) -> Principal:
    """The token's principal, or 401: as registry.admission (for a write) or another of
    the route's dependencies found it, else from the process's authenticator."""
    admitted: Principal | None = getattr(request.state, "principal", None)
    if admitted is not None:
        return admitted
    authenticator: Authenticator = request.app.state.authenticator
    found = await authenticator.principal(token, client_address(request.scope))
    request.state.principal = found  # a second dependency of the route asks no more
    return found


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


async def _node(request: Request, credentials: _Credentials) -> AuthenticatedNode:
    return _as_node(await _principal(request, _bearer_token(credentials)))


def _reads(principal: Principal) -> bool:
    """Whether the token reads everything: a reader's or an admin's."""
    return principal.scope in ("reader", "admin")


def _may_read(principal: Principal) -> None:
    if not _reads(principal):
        raise _forbidden(principal, "a reader or admin token (reads are closed)")


async def _read_access(
    request: Request, settings: SettingsDep, credentials: _ReadCredentials
) -> None:
    if not settings.read_token_required:
        return
    _may_read(await _principal(request, _bearer_token(credentials)))


NodeAuth = Annotated[AuthenticatedNode, Depends(_node)]


async def _paths_shown(request: Request, credentials: _ReadCredentials) -> bool:
    """Whether the request holds a reader or admin token: what a node's insides (paths,
    URLs) are shown to. A token that is not valid is as none, as on every open read
    (while reads are closed, ReadAccess has refused it already)."""
    if credentials is None:
        return False
    try:
        principal = await _principal(request, credentials.credentials)
    except HTTPException as refused:
        if refused.status_code != status.HTTP_401_UNAUTHORIZED:
            raise
        return False
    return _reads(principal)


PathsShown = Annotated[bool, Depends(_paths_shown)]
AdminAuth = Annotated[Principal, Depends(_admin)]
ReadAccess = Depends(_read_access)


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
