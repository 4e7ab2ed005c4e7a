"""What both command lines share: a settings model's validation error as the usage error of
the option its field came from, one map each (field -> option) instead of a lookup per
command."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

import typer
from pydantic import BaseModel, ValidationError

__all__ = ["bad_parameter", "help_of", "options_of", "validated"]

SettingsT = TypeVar("SettingsT", bound=BaseModel)


def bad_parameter(
    exc: ValidationError, options: Mapping[str, str], *, otherwise: str
) -> typer.BadParameter:
    """The first problem of `exc` as a usage error naming its option (`options`: field ->
    option; `otherwise` for a rule across fields, or a field no option sets)."""
    problem = exc.errors(include_url=False)[0]
    field = str(problem["loc"][0]) if problem["loc"] else ""
    message = problem["msg"].removeprefix("Value error, ")
    return typer.BadParameter(message, param_hint=options.get(field, otherwise))


def validated(
    model: type[SettingsT],
    given: Mapping[str, object],
    options: Mapping[str, str],
    *,
    otherwise: str,
) -> SettingsT:
    """The model of the options given (None: not given, so the model's default holds), or
    the usage error naming the option its first problem came from."""
    try:
        return model.model_validate({k: v for k, v in given.items() if v is not None})
    except ValidationError as exc:
        raise bad_parameter(exc, options, otherwise=otherwise) from None


def options_of(model: type[BaseModel], renamed: Mapping[str, str]) -> dict[str, str]:
    """The option of each of the model's fields: `--field-name`, or its `renamed` name."""
    return {
        field: "--" + renamed.get(field, field).replace("_", "-") for field in model.model_fields
    }


def help_of(model: type[BaseModel], field: str, text: str = "") -> str:
    """An option's help: `text`, then the model field's default (`[default: 1,2,4,8]`;
    nothing for None), so the default is written once, in the model."""
    value = model.model_fields[field].get_default(call_default_factory=True)
    if value is None:
        return text
    shown = ",".join(map(str, value)) if isinstance(value, tuple) else str(value)
    return f"{text} [default: {shown}]".strip()
