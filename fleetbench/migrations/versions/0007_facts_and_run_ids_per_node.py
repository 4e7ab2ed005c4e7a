"""model facts kept per set reported (each run names its own); run ids scoped per node

Each model's facts (file size, architecture) move from `models` to `model_facts`, one row
per distinct set reported, and every run and latest run names the set it came with: so far
one set per model, the one the first report filled, which every run of it gets here. A
run's id becomes its node's own (`reported_id`, unique per node); `id` stays the registry's.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 18:00:00
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

FACTS = (
    ("quantization", sa.String(length=64)),
    ("n_params", sa.BigInteger()),
    ("file_size", sa.BigInteger()),
    ("n_layer", sa.Integer()),
    ("n_head_kv", sa.Integer()),
    ("head_dim_k", sa.Integer()),
    ("head_dim_v", sa.Integer()),
    ("n_ctx_train", sa.Integer()),
    ("sliding_window", sa.Integer()),
    ("n_swa_layers", sa.Integer()),
)
NAMES = [name for name, _ in FACTS]


def _identity(facts: dict[str, object]) -> str:
    # As ingest digests a report's facts (registry.ingest.rows.build_identity); a row that
    # came out different would only be stored once more by the next report.
    return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def upgrade() -> None:
    op.create_table(
        "model_facts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("model_id", sa.Integer(), nullable=False),
        sa.Column("identity", sa.String(length=64), nullable=False),
        *(sa.Column(name, kind, nullable=True) for name, kind in FACTS),
        sa.ForeignKeyConstraint(
            ["model_id"],
            ["models.id"],
            name=op.f("fk_model_facts_model_id_models"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_model_facts")),
        sa.UniqueConstraint("model_id", "identity", name=op.f("uq_model_facts_model_id")),
    )
    bind = op.get_bind()
    columns = ", ".join(NAMES)
    known = " OR ".join(f"{name} IS NOT NULL" for name in NAMES)
    rows = bind.execute(sa.text(f"SELECT id, {columns} FROM models WHERE {known}")).all()
    if rows:
        values = ", ".join(f":{name}" for name in NAMES)
        bind.execute(
            sa.text(
                f"INSERT INTO model_facts (model_id, identity, {columns})"
                f" VALUES (:model_id, :identity, {values})"
            ),
            [
                {"model_id": row[0], "identity": _identity(facts), **facts}
                for row in rows
                for facts in [dict(zip(NAMES, row[1:], strict=True))]
            ],
        )
    facts_of_model = "(SELECT f.id FROM model_facts f WHERE f.model_id = {table}.model_id)"
    for table in ("runs", "latest_runs"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column("facts_id", sa.Integer(), nullable=True))
            batch_op.create_foreign_key(
                batch_op.f(f"fk_{table}_facts_id_model_facts"), "model_facts", ["facts_id"], ["id"]
            )
        op.execute(f"UPDATE {table} SET facts_id = {facts_of_model.format(table=table)}")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("reported_id", sa.Uuid(), nullable=True))
    op.execute("UPDATE runs SET reported_id = id")
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.alter_column("reported_id", existing_type=sa.Uuid(), nullable=False)
        batch_op.create_unique_constraint(batch_op.f("uq_runs_node_id"), ["node_id", "reported_id"])
    with op.batch_alter_table("models", schema=None) as batch_op:
        for name in NAMES:
            batch_op.drop_column(name)


def downgrade() -> None:
    with op.batch_alter_table("models", schema=None) as batch_op:
        for name, kind in FACTS:
            batch_op.add_column(sa.Column(name, kind, nullable=True))
    # Each model gets back one set of facts: the one most of its latest runs came with.
    for name in NAMES:
        op.execute(
            f"UPDATE models SET {name} = (SELECT f.{name} FROM model_facts f"
            " LEFT JOIN latest_runs l ON l.facts_id = f.id WHERE f.model_id = models.id"
            " GROUP BY f.id ORDER BY count(l.node_id) DESC, f.id LIMIT 1)"
        )
    with op.batch_alter_table("runs", schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f("uq_runs_node_id"), type_="unique")
        batch_op.drop_column("reported_id")
    for table in ("latest_runs", "runs"):
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_constraint(
                batch_op.f(f"fk_{table}_facts_id_model_facts"), type_="foreignkey"
            )
            batch_op.drop_column("facts_id")
    op.drop_table("model_facts")
