"""What the agent's commands share: the registry and token options, the process's settings
read as a command reads them (a bad value is one line naming the variable), comma lists of
integers."""

from __future__ import annotations

from typing import Annotated

import typer
from pydantic import SecretStr

from fleetbench.agent.config import AgentSettings, SettingsError, load_settings
from fleetbench.agent.display import fail

__all__ = ["NodeTokenOption", "RegistryOption", "command_settings", "int_list"]

RegistryOption = Annotated[
    str | None,
    typer.Option("--registry", help="registry URL [env: FLEETBENCH_REGISTRY_URL]"),
]


NodeTokenOption = Annotated[
    str | None, typer.Option("--token", help="the node's token [env: FLEETBENCH_TOKEN]")
]


def command_settings(token: str | None = None) -> AgentSettings:
    """FLEETBENCH_* settings; a bad value is a one-line error naming the variable. `token`
    (the command's --token) in place of the settings' token or token file."""
    try:
        settings = load_settings()
    except SettingsError as exc:
        raise fail(str(exc), code=2) from exc
    if token is None:
        return settings
    return settings.model_copy(update={"token": SecretStr(token), "token_file": None})


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
