"""engine on accelerator: whether a run measured its node's GPU, and why not

Runs stored before are checked here, by the contract's rule (contract.accelerator) as it
stood at this revision, written out below so that a later change of the rule does not
change what this revision did: from their fingerprint, build and settings, once per
distinct combination of the three.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 23:30:00
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("engine_on_accelerator", sa.Boolean(), nullable=True))
        batch_op.add_column(sa.Column("accelerator_note", sa.Text(), nullable=True))
    with op.batch_alter_table("latest_runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("engine_on_accelerator", sa.Boolean(), nullable=True))
    _check_stored_runs()


def _check_stored_runs() -> None:
    bind = op.get_bind()
    runs = sa.table(
        "runs",
        sa.column("id", sa.Uuid()),
        sa.column("fingerprint_id", sa.Integer()),
        sa.column("build_id", sa.Integer()),
        sa.column("n_gpu_layers", sa.Integer()),
        sa.column("engine_on_accelerator", sa.Boolean()),
        sa.column("accelerator_note", sa.Text()),
    )
    builds = sa.table(
        "engine_builds", sa.column("id", sa.Integer()), sa.column("backend", sa.String())
    )
    prints = sa.table(
        "hardware_fingerprints", sa.column("id", sa.Integer()), sa.column("data", sa.JSON())
    )
    combinations = bind.execute(
        sa.select(runs.c.fingerprint_id, runs.c.build_id, runs.c.n_gpu_layers)
        .where(runs.c.fingerprint_id.is_not(None))
        .distinct()
    ).all()
    backend_of = dict(bind.execute(sa.select(builds.c.id, builds.c.backend)).all())
    data_of = dict(bind.execute(sa.select(prints.c.id, prints.c.data)).all())
    for fingerprint_id, build_id, n_gpu_layers in combinations:
        data, backend = data_of.get(fingerprint_id), backend_of.get(build_id)
        on, why = _on_accelerator(data, backend, n_gpu_layers)
        if on is None:
            continue
        layers = (
            runs.c.n_gpu_layers.is_(None)
            if n_gpu_layers is None
            else runs.c.n_gpu_layers == n_gpu_layers
        )
        bind.execute(
            sa.update(runs)
            .where(runs.c.fingerprint_id == fingerprint_id, runs.c.build_id == build_id, layers)
            .values(engine_on_accelerator=on, accelerator_note=why)
        )
    latest = sa.table(
        "latest_runs",
        sa.column("run_id", sa.Uuid()),
        sa.column("engine_on_accelerator", sa.Boolean()),
    )
    bind.execute(
        sa.update(latest).values(
            engine_on_accelerator=sa.select(runs.c.engine_on_accelerator)
            .where(runs.c.id == latest.c.run_id)
            .scalar_subquery()
        )
    )


def _accelerator_of(data: Any) -> str | None:
    probes = data.get("probes") if isinstance(data, dict) else None
    if not isinstance(probes, dict):
        return None
    for vendor, unnamed in (("nvidia", "an NVIDIA GPU"), ("amd", "an AMD GPU")):
        section = probes.get(vendor)
        gpus = section.get("gpus") if isinstance(section, dict) else None
        if isinstance(gpus, list) and gpus:
            name = gpus[0].get("name") if isinstance(gpus[0], dict) else None
            return str(name) if name else unnamed
    apple = probes.get("apple")
    chip = apple.get("chip") if isinstance(apple, dict) else None
    return f"{chip} GPU" if chip else None


def _on_accelerator(
    data: Any, backend: str | None, n_gpu_layers: int | None
) -> tuple[bool | None, str | None]:
    accelerator = _accelerator_of(data)
    if accelerator is None or backend is None:
        return None, None
    if backend.strip().upper() == "CPU":
        return False, (
            f"the engine ran on llama.cpp's CPU backend on a node with {accelerator}: "
            "install llama.cpp built for it (README, Installing)"
        )
    if n_gpu_layers == 0:
        return False, f"no layer was offloaded to {accelerator} (n_gpu_layers 0)"
    return True, None


def downgrade() -> None:
    with op.batch_alter_table("latest_runs", schema=None) as batch_op:
        batch_op.drop_column("engine_on_accelerator")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_column("accelerator_note")
        batch_op.drop_column("engine_on_accelerator")
