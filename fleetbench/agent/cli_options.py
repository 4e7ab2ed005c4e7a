"""What the agent's commands share: the registry option, the process's settings read as a
command reads them (a bad value is one line naming the variable), comma lists of integers."""

from __future__ import annotations

from typing import Annotated

import typer

from fleetbench.agent.config import AgentSettings, SettingsError, load_settings
from fleetbench.agent.display import fail

__all__ = ["RegistryOption", "command_settings", "int_list"]

RegistryOption = Annotated[
    str | None,
    typer.Option("--registry", help="registry URL [env: FLEETBENCH_REGISTRY_URL]"),
]


def command_settings() -> AgentSettings:
    """FLEETBENCH_* settings; a bad value is a one-line error naming the variable."""
    try:
        return load_settings()
    except SettingsError as exc:
        raise fail(str(exc), code=2) from exc


def int_list(text: str, option: str, *, least: int = 0) -> tuple[int, ...]:
    """`1,2,4`: integers >= `least`, else a usage error naming `option`."""
    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise typer.BadParameter(
            f"{text!r} is not a comma list of integers", param_hint=option
        ) from exc
    if not values or any(v < least for v in values):
        raise typer.BadParameter(f"{text!r}: give integers >= {least}", param_hint=option)
    return values
