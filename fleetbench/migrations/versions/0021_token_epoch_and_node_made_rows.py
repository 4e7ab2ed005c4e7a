"""The token epoch every revoke and rotation raises, and the token a rotation made; the node
that made each build, model and facts row; a model's digest identity with its name

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-07 08:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_MADE_BY_NODE = ("engine_builds", "models", "model_facts")
_models = sa.table(
    "models",
    sa.column("id", sa.Integer),
    sa.column("identity", sa.String),
    sa.column("name_key", sa.String),
    sa.column("sha256", sa.String),
)


def upgrade() -> None:
    epoch = op.create_table(
        "token_epoch",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_token_epoch")),
    )
    op.bulk_insert(epoch, [{"id": 1, "epoch": 0}])
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.add_column(sa.Column("replaced_by_id", sa.Integer(), nullable=True))
        batch_op.create_foreign_key(
            batch_op.f("fk_tokens_replaced_by_id_tokens"), "tokens", ["replaced_by_id"], ["id"]
        )
    for table in _MADE_BY_NODE:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("created_by_node_id", sa.Integer(), nullable=True))
            batch_op.create_index(
                batch_op.f(f"ix_{table}_created_by_node_id"), ["created_by_node_id"]
            )
            batch_op.create_foreign_key(
                batch_op.f(f"fk_{table}_created_by_node_id_nodes"),
                "nodes",
                ["created_by_node_id"],
                ["id"],
                ondelete="SET NULL",
            )
    op.execute(
        _models.update()
        .where(_models.c.sha256.is_not(None))
        .values(identity="sha256:" + _models.c.sha256 + ":" + _models.c.name_key)
    )


def downgrade() -> None:
    # One row per digest takes the old identity back; a digest's other names keep theirs
    # (rows the old code never matches, but nothing is lost).
    same = _models.alias("same_digest")
    first = (
        sa.select(sa.func.min(same.c.id)).where(same.c.sha256 == _models.c.sha256).scalar_subquery()
    )
    op.execute(
        _models.update()
        .where(_models.c.sha256.is_not(None), _models.c.id == first)
        .values(identity="sha256:" + _models.c.sha256)
    )
    for table in reversed(_MADE_BY_NODE):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_constraint(
                batch_op.f(f"fk_{table}_created_by_node_id_nodes"), type_="foreignkey"
            )
            batch_op.drop_index(batch_op.f(f"ix_{table}_created_by_node_id"))
            batch_op.drop_column("created_by_node_id")
    with op.batch_alter_table("tokens", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("fk_tokens_replaced_by_id_tokens"), type_="foreignkey")
        batch_op.drop_column("replaced_by_id")
    op.drop_table("token_epoch")
