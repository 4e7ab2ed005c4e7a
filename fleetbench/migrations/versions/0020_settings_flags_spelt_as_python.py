"""The flags in build_point_sums' settings spelt `True`/`False`, as regression causes and
the comparisons before 0019 spelt them (0019 wrote `true`/`false`); every stamp's version
raised, so that registry processes holding the old spelling read the sums again

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-04 09:50:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The boolean settings, as the registry named them when this migration was written (a
# migration is a frozen copy); a settings label is `name=value` words, space-separated.
_FLAGS = ("kv_unified", "pp_shared", "tg_separate", "swa_full")


_sums = sa.table("build_point_sums", sa.column("settings", sa.String))
_stamps = sa.table("build_sums_stamps", sa.column("version", sa.Integer))


def _respell(spelling: dict[str, str]) -> None:
    settings: sa.ColumnElement[str] = _sums.c.settings
    for flag in _FLAGS:
        for old, new in spelling.items():
            settings = sa.func.replace(settings, f"{flag}={old}", f"{flag}={new}")
    op.execute(_sums.update().values(settings=settings))
    op.execute(_stamps.update().values(version=_stamps.c.version + 1))


def upgrade() -> None:
    _respell({"true": "True", "false": "False"})


def downgrade() -> None:
    _respell({"True": "true", "False": "false"})
