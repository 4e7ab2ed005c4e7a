"""allocated buffers: what llama.cpp allocated for a run, against the KV-cache prediction

Runs stored before carry no buffers (agents before schema version 4 did not send them):
their columns stay empty rather than guessed.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 01:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("buffers", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("kv_predicted_bytes", sa.BigInteger(), nullable=True))
        batch_op.add_column(sa.Column("kv_allocated_bytes", sa.BigInteger(), nullable=True))
    with op.batch_alter_table("latest_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("beside_kv_bytes", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("latest_runs", schema=None) as batch_op:
        batch_op.drop_column("beside_kv_bytes")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("kv_allocated_bytes")
        batch_op.drop_column("kv_predicted_bytes")
        batch_op.drop_column("buffers")
