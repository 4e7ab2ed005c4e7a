"""The wire format's value types, bounded by what both of the registry's databases hold and
what its maths can take: the agent builds reports with them, the registry validates them and
its query parameters with them, so a value that passes is one the registry can store and
answer about (never a 5xx).

- text: no NUL (PostgreSQL refuses it) and no lone surrogate (not encodable as UTF-8);
  names are NFC-normalised and measured after that;
- integers: counts fit PostgreSQL's INTEGER (2^31 - 1), sizes its BIGINT;
- figures (seconds, tokens/s): finite, >= 0 and at most 10^12, so that sums, means and
  products of them stay finite;
- moments: with a zone, from 1970 to 2199, kept in UTC.
"""

from __future__ import annotations

import re
import unicodedata
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, AwareDatetime, BaseModel, Field

__all__ = [
    "INT32_MAX",
    "INT64_MAX",
    "MAX_FIGURE",
    "MAX_MEMORY_BYTES",
    "NAME_LENGTH",
    "WITHOUT_NUL",
    "Count",
    "Figure",
    "Int32",
    "Moment",
    "Name",
    "Sha256",
    "Text",
    "check_json",
    "inline_schema",
    "plain_text",
]

INT32_MAX = 2**31 - 1  # what the registry's INTEGER columns hold
INT64_MAX = 2**63 - 1  # BIGINT
MAX_FIGURE = 1e12
# A memory size the registry sums over a node's GPUs without leaving BIGINT: 1 PiB each.
MAX_MEMORY_BYTES = 2**50
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)

_UNSTORABLE = re.compile("[\x00\ud800-\udfff]")


def plain_text(value: str) -> str:
    """`value` unless it holds what no database stores: NUL or a lone surrogate."""
    found = _UNSTORABLE.search(value)
    if found is not None:
        raise ValueError(
            f"holds {'a NUL character' if found.group() == chr(0) else 'a lone surrogate'}"
            f" (U+{ord(found.group()):04X}) at position {found.start()}"
        )
    return value


def storable_text(value: str, max_length: int) -> str:
    """`value` made fit to send: what no database stores replaced by U+FFFD and the end cut
    off past `max_length` (for messages the agent did not write, such as an exception's)."""
    value = _UNSTORABLE.sub("\ufffd", value)
    return value if len(value) <= max_length else value[: max_length - 1] + "\u2026"


NAME_LENGTH = 200


def _normal_name(value: str) -> str:
    name = unicodedata.normalize("NFC", plain_text(value)).strip()
    if not 1 <= len(name) <= NAME_LENGTH:
        raise ValueError(
            f"must be 1 to {NAME_LENGTH} characters once normalised (NFC, trimmed), not {len(name)}"
        )
    return name


def _in_range(moment: datetime) -> datetime:
    # Compared before converting: a moment near year 1 or 9999 may not convert to UTC.
    if not EARLIEST <= moment <= LATEST:
        raise ValueError(f"must lie between {EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d}")
    return moment.astimezone(UTC)


# Checked by pydantic itself (a Rust regex; a lone surrogate is no valid string there), not by
# a Python call per text field: reports carry dozens of them.
WITHOUT_NUL = r"^[^\x00]*$"
Text = Annotated[str, Field(pattern=WITHOUT_NUL)]
Name = Annotated[str, Field(min_length=1, max_length=NAME_LENGTH), AfterValidator(_normal_name)]
"""A display name: NFC-normalised, trimmed, 1 to 200 characters after that."""

Int32 = Annotated[int, Field(ge=0, le=INT32_MAX)]
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]  # bytes, parameters
Figure = Annotated[float, Field(ge=0, le=MAX_FIGURE, allow_inf_nan=False)]
Moment = Annotated[AwareDatetime, AfterValidator(_in_range)]
"""A moment with its zone (naive times are ambiguous across a fleet), kept in UTC."""


def _lower_hex(value: str) -> str:
    return value.lower()


Sha256 = Annotated[str, Field(pattern=r"^[0-9a-fA-F]{64}$"), AfterValidator(_lower_hex)]


def check_json(value: Any, *, max_depth: int, max_items: int, where: str = "") -> None:
    """Raises ValueError unless `value` is plain JSON the registry can store and read back:
    at most `max_depth` levels and `max_items` values, text without NUL or lone
    surrogates, finite numbers, integers within BIGINT. Iterative: no recursion limit
    reached on a hostile document."""
    pending: list[tuple[Any, str, int]] = [(value, where or "$", 1)]
    items = 0
    while pending:
        item, path, depth = pending.pop()
        items += 1
        if items > max_items:
            raise ValueError(f"holds more than {max_items} values")
        if depth > max_depth:
            raise ValueError(f"{path}: nested deeper than {max_depth} levels")
        if isinstance(item, dict):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise ValueError(f"{path}: keys must be text")
                _json_text(key, path)
                pending.append((child, f"{path}.{key}", depth + 1))
        elif isinstance(item, list):
            pending.extend((child, f"{path}[{i}]", depth + 1) for i, child in enumerate(item))
        elif isinstance(item, str):
            _json_text(item, path)
        elif isinstance(item, bool) or item is None:
            continue
        elif isinstance(item, int):
            if not -INT64_MAX <= item <= INT64_MAX:
                raise ValueError(f"{path}: integer {item} is out of range")
        elif isinstance(item, float):
            if item != item or item in (float("inf"), float("-inf")):
                raise ValueError(f"{path}: must be plain JSON (no NaN or infinity)")
        else:
            raise ValueError(f"{path}: {type(item).__name__} is not JSON")


def _json_text(text: str, path: str) -> None:
    try:
        plain_text(text)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def inline_schema(model: type[BaseModel]) -> dict[str, Any]:
    """`model`'s JSON schema with every `$ref` to its `$defs` written out in place, so that
    it can stand inside another document (an OpenAPI field) on its own."""
    schema = model.model_json_schema()
    definitions = schema.pop("$defs", {})

    def resolve(node: Any) -> Any:
        if isinstance(node, dict):
            if "$ref" in node:
                target = definitions[node["$ref"].rsplit("/", 1)[-1]]
                return resolve({**target, **{k: v for k, v in node.items() if k != "$ref"}})
            return {key: resolve(value) for key, value in node.items()}
        if isinstance(node, list):
            return [resolve(item) for item in node]
        return node

    resolved: dict[str, Any] = resolve(schema)
    return resolved
