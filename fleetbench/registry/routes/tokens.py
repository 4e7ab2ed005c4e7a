"""Tokens for admins: create, list, revoke, rotate (registry.tokens)."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, status

from fleetbench.registry import tokens
from fleetbench.registry.db import write_transaction
from fleetbench.registry.deps import AdminAuth, ProcessDep, SessionDep
from fleetbench.registry.models import Token
from fleetbench.registry.params import INT32_MAX
from fleetbench.registry.responses import BAD_BODY, NOT_FOUND, TOO_LARGE
from fleetbench.registry.schemas import (
    Rotation,
    TokenCreated,
    TokenPublic,
    TokenRequest,
    TokensPublic,
    token_public,
)

router = APIRouter(prefix="/tokens", tags=["tokens"])

TokenId = Annotated[int, Path(ge=1, le=INT32_MAX)]
BODY = {**BAD_BODY, **TOO_LARGE}
ROTATED: dict[int | str, dict[str, Any]] = {
    409: {"description": "the token was rotated before: rotate its replacement"}
}


def _created(token: Token, secret: str) -> TokenCreated:
    return TokenCreated(**token_public(token).model_dump(), token=secret)


@router.get("", response_model=TokensPublic)
def list_tokens(session: SessionDep, _: AdminAuth) -> TokensPublic:
    """Every token, without its secret."""
    rows = [token_public(t) for t in tokens.list_tokens(session)]
    return TokensPublic(data=rows, count=len(rows))


@router.post("", response_model=TokenCreated, status_code=201, responses=BODY)
def create_token(body: TokenRequest, session: SessionDep, _: AdminAuth) -> TokenCreated:
    """A new token; its secret is in this answer only."""
    with write_transaction(session):
        token, secret = tokens.create_token(
            session,
            scope=body.scope,
            node_name=body.node,
            name=body.name,
            expires_at=tokens.expiry_after(body.expires_in_days),
        )
        created = _created(token, secret)
        session.commit()
    return created


@router.post("/{token_id}/revoke", response_model=TokenPublic, responses=NOT_FOUND)
def revoke_token(
    token_id: TokenId, process: ProcessDep, session: SessionDep, _: AdminAuth
) -> TokenPublic:
    """Revokes a token: refused at once by this process, by every other within a second."""
    with write_transaction(session):
        token = tokens.revoke_token(session, token_id=token_id)
        if token is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no token {token_id}")
        public = token_public(token)
        session.commit()
    # nothing this process found valid stands; the others learn it from the token epoch
    # within a second (registry.authentication)
    process.known_tokens.forget_all()
    return public


@router.post(
    "/{token_id}/rotate", response_model=TokenCreated, responses={**NOT_FOUND, **ROTATED, **BODY}
)
def rotate_token(
    token_id: TokenId, body: Rotation, process: ProcessDep, session: SessionDep, _: AdminAuth
) -> TokenCreated:
    """A new token of the same scope, node and name; the old one keeps working for
    `grace_hours`, so runs spooled with it are still delivered. A token is rotated once
    (409 again: rotate its replacement)."""
    with write_transaction(session):
        try:
            rotated = tokens.rotate_token(
                session, token_id=token_id, grace=timedelta(hours=body.grace_hours)
            )
        except tokens.AlreadyRotated as exc:
            raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from None
        if rotated is None:
            raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"no active token {token_id}")
        created = _created(rotated[1], rotated[2])
        session.commit()
    # nothing this process found valid stands; the others learn it from the token epoch
    # within a second (registry.authentication)
    process.known_tokens.forget_all()
    return created
