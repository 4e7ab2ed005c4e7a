"""Each hardware class's price per hour, as an admin set it (table hardware_prices), and each
run's hardware class, by which placement prices a candidate and capacity groups its nodes."""

from __future__ import annotations

import uuid
from collections.abc import Collection, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from fleetbench.registry.models import HardwareFingerprint, HardwarePrice, Run
from fleetbench.registry.state import Bounded

__all__ = ["classes_of_runs", "list_prices", "prices_of", "remove_price", "set_price"]


def list_prices(session: Session) -> Sequence[HardwarePrice]:
    return session.scalars(select(HardwarePrice).order_by(HardwarePrice.hardware_class)).all()


def set_price(
    session: Session, *, hardware_class: str, usd_per_hour: float, set_by: str | None
) -> HardwarePrice:
    """Sets (or replaces) the class's price, in one upsert: two admins setting one class at
    once each succeed, the later one's price kept. The caller commits."""
    dialect = session.get_bind().dialect.name
    insert_for: Any = postgresql.insert if dialect == "postgresql" else sqlite.insert
    values = {"usd_per_hour": usd_per_hour, "set_at": datetime.now(UTC), "set_by": set_by}
    upsert = insert_for(HardwarePrice).values(hardware_class=hardware_class, **values)
    session.execute(upsert.on_conflict_do_update(index_elements=["hardware_class"], set_=values))
    row = session.get(HardwarePrice, hardware_class, populate_existing=True)
    assert row is not None  # (just written, in this transaction)
    return row


def remove_price(session: Session, hardware_class: str) -> bool:
    """Removes the class's price; False where it had none (or another admin removed it
    first). The caller commits."""
    removed = session.connection().execute(
        delete(HardwarePrice).where(HardwarePrice.hardware_class == hardware_class)
    )
    return removed.rowcount > 0


def classes_of_runs(
    session: Session, run_ids: Collection[uuid.UUID], held: Bounded[uuid.UUID, str]
) -> dict[uuid.UUID, str]:
    """The hardware class of each run's fingerprint (runs without one are left out); those
    `held` (the process's: a run's hardware never changes) not read again, so that a
    question over 1,000 nodes reads only the runs it has not seen."""
    found = {run_id: named for run_id in run_ids if (named := held.get(run_id)) is not None}
    missing = [run_id for run_id in run_ids if run_id not in found]
    if missing:
        for run_id, named in session.execute(
            select(Run.id, HardwareFingerprint.hardware_class)
            .join(HardwareFingerprint, HardwareFingerprint.id == Run.fingerprint_id)
            .where(Run.id.in_(missing))
        ):
            if named is not None:  # (a class not known yet may be later: not kept)
                held.put(run_id, named)
                found[run_id] = named
    return found


def prices_of(session: Session, classes: Collection[str]) -> dict[str, float]:
    """The price per hour of each of these classes that has one."""
    if not classes:
        return {}
    rows = session.execute(
        select(HardwarePrice.hardware_class, HardwarePrice.usd_per_hour).where(
            HardwarePrice.hardware_class.in_(list(classes))
        )
    ).all()
    return dict(rows)
