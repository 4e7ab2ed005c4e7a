"""Tokens: who may do what, and their lifecycle.

Three scopes. A **node** token reports its node's runs; a **reader** token reads everything
(every GET, /metrics, the dashboard) when reads are closed; an **admin** token also manages
tokens and acknowledges regressions. A token is created with an optional name and expiry,
listed without its secret, revoked, or rotated: the new one takes the old one's scope, node
and name, and the old one keeps working for a grace period, so an agent with runs in its
spool delivers them whichever it holds. Keyword-only functions like registry.crud: they
flush, never commit.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal, Protocol

from sqlalchemy import bindparam, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from fleetbench.registry.db import write_transaction
from fleetbench.registry.models import Node, Token, TokenEpoch, table_of

__all__ = [
    "PREFIXES",
    "AlreadyRotated",
    "AuthenticatedNode",
    "Principal",
    "Scope",
    "TokenRefused",
    "TokenState",
    "authenticate",
    "create_node_token",
    "create_token",
    "display_name",
    "expiry_after",
    "list_tokens",
    "node_rule",
    "revoke_token",
    "rotate_token",
    "token_digest",
    "token_epoch",
    "token_state",
]

log = logging.getLogger("fleetbench.registry")

Scope = Literal["node", "reader", "admin"]
# Recognisable in a leaked config or a log line (secret scanners match on prefixes).
PREFIXES: dict[str, str] = {"node": "fbn_", "reader": "fbr_", "admin": "fba_"}
# last_used_at is written at most this often per token and process: a write per request
# would cost more than the request.
_USED_EVERY = timedelta(minutes=10)


@dataclass(frozen=True)
class Principal:
    """Who a valid token speaks for."""

    token_id: int
    scope: Scope
    name: str  # what lists and acknowledgements call it
    node_id: int | None  # a node token's node
    node_name: str | None
    expires_at: datetime | None

    def valid_at(self, now: datetime) -> bool:
        return self.expires_at is None or now < self.expires_at


@dataclass(frozen=True)
class AuthenticatedNode:
    """The node a node token belongs to."""

    id: int
    name: str


class TokenRefused(Exception):
    """The token does not authenticate: unknown, revoked or expired (the message says; the
    caller is told none of it, registry.authentication)."""


class AlreadyRotated(Exception):
    """The token was rotated before: its replacement is the one to rotate."""

    def __init__(self, token_id: int, replaced_by: int) -> None:
        super().__init__(
            f"token {token_id} was rotated before, into token {replaced_by}: rotate that one"
        )


def _now() -> datetime:
    return datetime.now(UTC)


def token_digest(token: str) -> str:
    """What is stored of a token (its SHA-256) and what it is looked up by."""
    return hashlib.sha256(token.encode()).hexdigest()


def display_name(name: str | None, scope: str, token_id: int) -> str:
    """What acknowledgements, plans and rollouts say a token did: its name and id (two
    tokens may share a name), else its scope and id; at most 200 characters, what the
    columns that keep it hold."""
    return f"{name[:170]} (token {token_id})" if name else f"{scope} token {token_id}"


class _Lifetime(Protocol):
    @property
    def revoked_at(self) -> datetime | None: ...
    @property
    def expires_at(self) -> datetime | None: ...


TokenState = Literal["active", "expired", "revoked"]


def token_state(token: _Lifetime, now: datetime | None = None) -> TokenState:
    """Whether a token (a row, or its columns as read) still authenticates."""
    if token.revoked_at is not None:
        return "revoked"
    if token.expires_at is not None and token.expires_at <= (now or _now()):
        return "expired"
    return "active"


def create_token(
    session: Session,
    *,
    scope: Scope,
    node_name: str | None = None,
    labels: dict[str, str] | None = None,
    name: str | None = None,
    expires_at: datetime | None = None,
) -> tuple[Token, str]:
    """A new token and its secret (stored only hashed). A node token needs its node, made
    if it does not exist (with `labels` added); other scopes take none (ValueError)."""
    if (problem := node_rule(scope, node_name)) is not None:
        raise ValueError(problem)
    node = None
    if node_name is not None:
        node = session.scalars(select(Node).where(Node.name == node_name)).one_or_none()
        if node is None:
            node = Node(name=node_name, labels=labels or {}, created_at=_now())
            session.add(node)
        elif labels:
            node.labels = {**node.labels, **labels}
    secret = PREFIXES[scope] + secrets.token_urlsafe(32)
    token = Token(
        scope=scope,
        name=name,
        node=node,
        token_sha256=token_digest(secret),
        created_at=_now(),
        expires_at=expires_at,
    )
    session.add(token)
    session.flush()
    return token, secret


def node_rule(scope: str, node_name: str | None) -> str | None:
    """Why a token of `scope` cannot name (or lack) that node, or None when it may."""
    if (scope == "node") != (node_name is not None):
        return "a node token needs its node; reader and admin tokens take none"
    return None


def expiry_after(days: float | None) -> datetime | None:
    return _now() + timedelta(days=days) if days else None


def create_node_token(session: Session, *, node_name: str, labels: dict[str, str]) -> str:
    """A new node token's secret (the node created if needed)."""
    return create_token(session, scope="node", node_name=node_name, labels=labels)[1]


_TOKENS, _NODES = table_of(Token), table_of(Node)
# Built once: every request that carries a token the process has not seen lately runs it.
_BY_DIGEST = (
    select(_TOKENS, _NODES.c.name.label("node_name"))
    .outerjoin(_NODES, _NODES.c.id == _TOKENS.c.node_id)
    .where(_TOKENS.c.token_sha256 == bindparam("digest"))
)
_USED = (
    update(_TOKENS)
    .where(_TOKENS.c.id == bindparam("token_id"))
    .values(last_used_at=bindparam("at"))
)


def authenticate(session: Session, digest: str, now: datetime | None = None) -> Principal:
    """Who the token with this digest speaks for; raises TokenRefused. Notes its use (at
    most every few minutes), committing the session it is given."""
    now = now or _now()
    row = session.connection().execute(_BY_DIGEST, {"digest": digest}).one_or_none()
    if row is None:
        raise TokenRefused("unknown token")
    if (state := token_state(row, now)) != "active":
        raise TokenRefused(
            "this token was revoked" if state == "revoked" else "this token has expired"
        )
    if row.last_used_at is None or now - row.last_used_at > _USED_EVERY:
        try:
            with write_transaction(session):
                session.connection().execute(_USED, {"token_id": row.id, "at": now})
                session.commit()
        except SQLAlchemyError as exc:  # noting the use is no reason to refuse the token
            log.warning("token %d: its last use not noted: %s", row.id, exc)
    return Principal(
        token_id=row.id,
        scope=row.scope,
        name=display_name(row.name, row.scope, row.id),
        node_id=row.node_id,
        node_name=row.node_name,
        expires_at=row.expires_at,
    )


_EPOCH = select(TokenEpoch.epoch).where(TokenEpoch.id == 1)


def token_epoch(session: Session) -> int:
    """The token epoch: what every revoke and rotation raises (its one row is the
    migration's)."""
    return session.scalar(_EPOCH) or 0


def _raise_epoch(session: Session) -> None:
    session.execute(update(TokenEpoch).where(TokenEpoch.id == 1).values(epoch=TokenEpoch.epoch + 1))


def list_tokens(session: Session) -> list[Token]:
    return list(session.scalars(select(Token).order_by(Token.id)))


def revoke_token(session: Session, *, token_id: int) -> Token | None:
    """Revokes the token (None: no such token); revoking it again changes nothing. Every
    registry process refuses it within a second (registry.authentication)."""
    token = session.get(Token, token_id)
    if token is not None and token.revoked_at is None:
        token.revoked_at = _now()
        _raise_epoch(session)
        session.flush()
    return token


def rotate_token(
    session: Session, *, token_id: int, grace: timedelta
) -> tuple[Token, Token, str] | None:
    """A new token in place of `token_id` (the old one, the new one, its secret); the old
    one authenticates for `grace` more at most. None: no such token, or it no longer
    authenticates (a revoked or expired token is replaced by creating one). Raises
    AlreadyRotated for a token in its grace: rotating it again would leave three live."""
    old = session.get(Token, token_id)
    if old is None or token_state(old) != "active":
        return None
    if old.replaced_by_id is not None:
        raise AlreadyRotated(old.id, old.replaced_by_id)
    kept = old.expires_at  # the new token lives no longer than the old one would have
    ends = _now() + grace
    old.expires_at = min(kept, ends) if kept else ends
    new, secret = create_token(
        session,
        scope=old.scope,  # type: ignore[arg-type]
        node_name=old.node.name if old.node else None,
        name=old.name,
        expires_at=kept,
    )
    old.replaced_by_id = new.id
    _raise_epoch(session)  # the old token's new expiry, in every process's memory at once
    session.flush()
    return old, new, secret
