"""min detectable change and knee moves: what each latest point's S_TG series can see

Filled by the regression check of the next run of each series: a node's points show
"unknown" until it reports again. The knee's moves (regressions of metric `knee`) need no
column; the downgrade drops them, which code before it cannot show.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02 01:45:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("latest_points", schema=None) as batch_op:
        batch_op.add_column(sa.Column("min_detectable_change", sa.Double(), nullable=True))


def downgrade() -> None:
    op.execute("DELETE FROM regressions WHERE metric = 'knee'")
    with op.batch_alter_table("latest_points", schema=None) as batch_op:
        batch_op.drop_column("min_detectable_change")
