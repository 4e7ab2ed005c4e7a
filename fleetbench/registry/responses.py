"""The answers besides success that the API's operations may give, declared once so that the
OpenAPI schema lists every status the registry sends (and the fuzzer holds it to that)."""

from __future__ import annotations

from typing import Any

__all__ = ["API_RESPONSES", "BAD_BODY", "NOT_FOUND", "TOO_LARGE", "refused"]

_DETAIL = {
    "application/json": {
        "schema": {
            "type": "object",
            "properties": {"detail": {"type": "string"}},
            "required": ["detail"],
        }
    }
}

_RETRY_AFTER = {
    "Retry-After": {
        "description": "seconds to wait before retrying",
        "schema": {"type": "integer", "minimum": 1},
    }
}

API_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {
        "description": "no token, or an unknown, revoked or expired one, all answered alike "
        "(for reads only while they are closed: FLEETBENCH_READ_TOKEN_REQUIRED)",
        "content": _DETAIL,
    },
    408: {
        "description": "a write's body did not arrive within FLEETBENCH_BODY_TIMEOUT_S",
        "content": _DETAIL,
    },
    403: {
        "description": "the token's scope does not allow this (a node token reports its "
        "node's runs; reading closed reads takes a reader or admin token; managing tokens "
        "and acknowledging regressions, an admin token)",
        "content": _DETAIL,
    },
    429: {
        "description": "too many refused tokens from this client address lately, or too many "
        "request bodies arriving at once with this token: retry after Retry-After seconds",
        "content": _DETAIL,
        "headers": _RETRY_AFTER,
    },
    503: {
        "description": "the registry is busy or its database unavailable: retry after "
        "Retry-After seconds",
        "content": _DETAIL,
        "headers": _RETRY_AFTER,
    },
}
NOT_FOUND: dict[int | str, dict[str, Any]] = {
    404: {"description": "no such node, model, run or regression", "content": _DETAIL}
}
BAD_BODY: dict[int | str, dict[str, Any]] = {
    400: {"description": "the body is not JSON (or not UTF-8)", "content": _DETAIL}
}


def refused(why: str) -> dict[int | str, dict[str, Any]]:
    """The 422 of a route whose rules go beyond the schema (errors.REFUSALS): its `detail`
    is a sentence saying `why`, or, for a request the schema refuses, FastAPI's list."""
    detail = {
        "anyOf": [
            {"type": "string"},
            {"type": "array", "items": {"$ref": "#/components/schemas/ValidationError"}},
        ]
    }
    schema = {"type": "object", "properties": {"detail": detail}, "required": ["detail"]}
    return {
        422: {
            "description": f"{why} (detail: a sentence), or a request the schema refuses "
            "(detail: a list naming each field)",
            "content": {"application/json": {"schema": schema}},
        }
    }


TOO_LARGE: dict[int | str, dict[str, Any]] = {
    413: {"description": "the body is larger than FLEETBENCH_MAX_REPORT_BYTES", "content": _DETAIL}
}
