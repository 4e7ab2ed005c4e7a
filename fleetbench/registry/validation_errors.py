"""422 answers that name the field and can always be written as JSON."""

from __future__ import annotations

import math
from typing import Any

from fastapi import Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

__all__ = ["validation_error_handler"]


async def validation_error_handler(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = [_printable(error) for error in exc.errors()]
    return JSONResponse(status_code=422, content={"detail": jsonable_encoder(errors)})


def _printable(error: Any) -> dict[str, Any]:
    """FastAPI's default handler echoes the offending input, which fails for NaN or
    infinity (not JSON) or a lone surrogate (not UTF-8), and can be the whole report: keep
    scalars only, as text if need be."""
    printable = {k: _text(v) for k, v in error.items() if k not in ("input", "ctx", "url")}
    value = error.get("input")
    if isinstance(value, float) and not math.isfinite(value):
        printable["input"] = str(value)
    elif isinstance(value, str):
        printable["input"] = _text(value)
    elif isinstance(value, int | float | bool) or value is None:
        printable["input"] = value
    if "ctx" in error:
        printable["ctx"] = {k: _text(str(v)) for k, v in error["ctx"].items()}
    return printable


def _text(value: Any) -> Any:
    """`value`, with what UTF-8 cannot carry (lone surrogates) written as escapes."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, list | tuple):
        return [_text(item) for item in value]
    return value
