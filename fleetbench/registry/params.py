"""Query and path parameters, bounded by what the databases and the questions' maths take:
any value a request's parameters pass is answered, never a 5xx (the wire format's own
bounds, fleetbench.contract.bounds, cover the bodies)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import Path, Query
from pydantic import AfterValidator, BeforeValidator

from fleetbench.contract.bounds import INT32_MAX, MAX_FIGURE, NAME_LENGTH, WITHOUT_NUL

__all__ = [
    "INT32_MAX",
    "MAX_AGE_DAYS",
    "MAX_FIGURE",
    "MAX_TOKENS",
    "ModelQuery",
    "NodePath",
    "NodeQuery",
    "SinceQuery",
]

MAX_TOKENS = INT32_MAX
MAX_AGE_DAYS = 36_500.0  # a century: `now - max_age` stays a date
_EARLIEST = datetime(1, 1, 2, tzinfo=UTC)
_LATEST = datetime(9999, 12, 30, tzinfo=UTC)


def _iso_text(value: object) -> object:
    """Only ISO 8601 text is a moment here (pydantic would also read a number of seconds,
    which the schema does not promise)."""
    if isinstance(value, str):
        try:
            datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError("must be an ISO 8601 date or date-time") from None
    return value


def _moment(value: datetime) -> datetime:
    """Naive moments are UTC; the range keeps every conversion and comparison a date."""
    zoned = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    if not _EARLIEST <= zoned <= _LATEST:
        raise ValueError(f"must lie between {_EARLIEST:%Y-%m-%d} and {_LATEST:%Y-%m-%d}")
    return zoned.astimezone(UTC)


ModelQuery = Annotated[
    str,
    Query(
        min_length=1,
        max_length=NAME_LENGTH,
        pattern=WITHOUT_NUL,
        description="display name or GGUF sha256",
    ),
]
NodeQuery = Annotated[str, Query(min_length=1, max_length=NAME_LENGTH, pattern=WITHOUT_NUL)]
NodePath = Annotated[str, Path(min_length=1, max_length=NAME_LENGTH, pattern=WITHOUT_NUL)]
SinceQuery = Annotated[datetime, BeforeValidator(_iso_text), AfterValidator(_moment)]
