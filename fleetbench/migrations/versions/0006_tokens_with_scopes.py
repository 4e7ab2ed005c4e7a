"""tokens: node, reader and admin tokens with a name, an expiry and a revocation; who
acknowledged a regression

node_tokens' rows move to tokens as node-scoped tokens, their digests unchanged, so every
agent's token keeps working.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 16:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("scope", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("node_id", sa.Integer(), nullable=True),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_tokens_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tokens")),
        sa.UniqueConstraint("token_sha256", name=op.f("uq_tokens_token_sha256")),
    )
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_tokens_node_id"), ["node_id"], unique=False)
    op.execute(
        "INSERT INTO tokens (id, scope, node_id, token_sha256, created_at)"
        " SELECT id, 'node', node_id, token_sha256, created_at FROM node_tokens"
    )
    if op.get_bind().dialect.name == "postgresql":  # the ids were copied, not drawn
        op.execute(
            "SELECT setval('tokens_id_seq', coalesce(max(id), 1), max(id) IS NOT NULL) FROM tokens"
        )
    with op.batch_alter_table("node_tokens", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_node_tokens_node_id"))
    op.drop_table("node_tokens")
    with op.batch_alter_table("regressions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("acknowledged_by", sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("regressions", schema=None) as batch_op:
        batch_op.drop_column("acknowledged_by")
    op.create_table(
        "node_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("token_sha256", sa.String(length=64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_node_tokens_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_node_tokens")),
        sa.UniqueConstraint("token_sha256", name=op.f("uq_node_tokens_token_sha256")),
    )
    with op.batch_alter_table("node_tokens", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_node_tokens_node_id"), ["node_id"], unique=False)
    op.execute(  # node tokens alone, and only those still valid: the others had no rights
        "INSERT INTO node_tokens (id, node_id, token_sha256, created_at)"
        " SELECT id, node_id, token_sha256, created_at FROM tokens"
        " WHERE scope = 'node' AND revoked_at IS NULL"
        " AND (expires_at IS NULL OR expires_at > CURRENT_TIMESTAMP)"
    )
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            "SELECT setval('node_tokens_id_seq', coalesce(max(id), 1), max(id) IS NOT NULL)"
            " FROM node_tokens"
        )
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_tokens_node_id"))
    op.drop_table("tokens")
