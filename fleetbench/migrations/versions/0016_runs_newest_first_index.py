"""runs: each node's model's runs indexed newest first, as RUN_NEWEST_FIRST orders them
(started, received, then the smaller id), replacing the index without the id

The regression judge, the curves and placement read a node's newest runs of a model with a
LIMIT; without the id in the index PostgreSQL sorted every run of the node's model to break
ties, which grew with the history (bench/load.py --history 100000: seconds per judgement).
The index is built with the table locked for writes: on a registry with millions of runs,
run the upgrade when reports can wait (agents spool them meanwhile).

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03 09:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_node_model_started")
        batch_op.create_index(
            "ix_runs_node_model_newest",
            ["node_id", "model_id", sa.text("started_at DESC"), sa.text("received_at DESC"), "id"],
            unique=False,
        )


def downgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_index("ix_runs_node_model_newest")
        batch_op.create_index(
            "ix_runs_node_model_started",
            ["node_id", "model_id", "started_at", "received_at"],
            unique=False,
        )
