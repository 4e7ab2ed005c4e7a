"""FastAPI dependencies: the database session, the settings and node authentication."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Annotated

from fastapi import Depends, HTTPException, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session

from registry import crud
from registry.config import RegistrySettings
from registry.db import begin_write
from registry.models import Model, Node

__all__ = ["NodeAuth", "ReadAccess", "SessionDep", "SettingsDep", "models_or_404", "node_or_404"]

_bearer = HTTPBearer(
    auto_error=False, description="a node token from `fleetbench-registry token create`"
)


def _session(request: Request) -> Iterator[Session]:
    with request.app.state.sessions() as session:
        if request.method not in ("GET", "HEAD"):
            begin_write(session)
        yield session


def _settings(request: Request) -> RegistrySettings:
    settings: RegistrySettings = request.app.state.settings
    return settings


SessionDep = Annotated[Session, Depends(_session)]
SettingsDep = Annotated[RegistrySettings, Depends(_settings)]
_Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


def _authenticated_node(session: SessionDep, credentials: _Credentials) -> Node:
    if credentials is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="a node token is required: Authorization: Bearer <token>",
            headers={"WWW-Authenticate": "Bearer"},
        )
    node = crud.node_for_token(session, credentials.credentials)
    if node is None:
        raise HTTPException(
            status.HTTP_401_UNAUTHORIZED,
            detail="unknown token",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return node


def _read_access(settings: SettingsDep, session: SessionDep, credentials: _Credentials) -> None:
    if settings.read_token_required:
        _authenticated_node(session, credentials)


NodeAuth = Annotated[Node, Depends(_authenticated_node)]
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
