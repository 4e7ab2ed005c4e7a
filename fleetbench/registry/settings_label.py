"""What a run ran with, as one text: `n_ctx=4096 flash_attn=on kv_unified=True`, each
setting that is set, in RunSettings' order (a serving run: its server's shape). Regression
causes name it, and the build comparison's sums (registry.projections.build_sums) keep it
as a key, made in SQL from the runs' columns. Both spellings are here, side by side, and a
test holds them equal on both databases: they once disagreed (`true` against `True`)."""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import Boolean, ColumnElement, String, case, cast, func, literal

from fleetbench.contract import wire
from fleetbench.registry.models import Run

__all__ = [
    "SERVER_SHAPE",
    "SETTING_NAMES",
    "server_shape_label",
    "server_shape_label_sql",
    "settings_label",
    "settings_label_sql",
]

SETTING_NAMES = tuple(wire.RunSettings.model_fields)
# What of a server, besides its build, shapes its figures: runs compared must share it.
SERVER_SHAPE = ("kind", "slots", "ctx_per_slot", "n_ctx", "prompt_tokens", "gen_tokens")


def _label(parts: Iterable[tuple[str, object]]) -> str:
    return " ".join(f"{name}={value}" for name, value in parts if value is not None)


def _label_sql(parts: Iterable[tuple[str, ColumnElement[Any]]]) -> ColumnElement[str]:
    """SQL of _label: `name=value` for each value not NULL, space-separated."""
    pieces = [func.coalesce(literal(f" {name}=") + value, "") for name, value in parts]
    return func.ltrim(functools.reduce(operator.add, pieces))


def _as_text(column: ColumnElement[Any]) -> ColumnElement[str]:
    """A column as Python's str() spells its value (a flag `True`, not SQL's `true`)."""
    if isinstance(column.type, Boolean):
        return case((column.is_(True), "True"), (column.is_(False), "False"))
    return cast(column, String)


def settings_label(settings: Any) -> str:
    """`settings` has RunSettings' fields: a report's settings, or a run row."""
    return _label((name, getattr(settings, name)) for name in SETTING_NAMES)


def settings_label_sql() -> ColumnElement[str]:
    """settings_label of table runs' row, in SQL."""
    return _label_sql((name, _as_text(getattr(Run, name))) for name in SETTING_NAMES)


def server_shape_label(server: Mapping[str, Any]) -> str:
    """A serving run's server (wire.ServerIdentity as stored) as its shape."""
    return _label((name, server.get(name)) for name in SERVER_SHAPE)


def server_shape_label_sql() -> ColumnElement[str]:
    """server_shape_label of table runs' `server`, in SQL."""
    return _label_sql((name, Run.server[name].as_string()) for name in SERVER_SHAPE)
