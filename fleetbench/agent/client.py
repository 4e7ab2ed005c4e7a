"""RegistryClient: the agent's only way to the registry. One attempt per call (connection
retries aside); retry policy belongs to the caller. httpx errors become ClientErrors, which
carry the registry's Retry-After when it sent one."""

from __future__ import annotations

import logging
import math
import time
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import Any

import httpx

from fleetbench.agent.errors import RegistryUnavailable, RequestRejected
from fleetbench.contract.answers import (
    CapacityAnswer,
    CompareAnswer,
    CompareKind,
    PlacementAnswer,
    PlacementKind,
    RunReceipt,
)
from fleetbench.contract.plans import KINDS, NodePlans, NodeStatus
from fleetbench.contract.wire import RunReport

__all__ = ["RegistryClient"]

log = logging.getLogger("fleetbench.client")

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)
# The longest Retry-After taken, as the spool's own backoff: a proxy's "come back next year"
# must not park a node's results for that long.
RETRY_AFTER_CAP_S = 3600.0


class RegistryClient:
    """
    with RegistryClient("http://127.0.0.1:8787", token="fbn_...") as client:
        receipt = client.submit_run(report)
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=timeout,
            transport=transport or httpx.HTTPTransport(retries=2),
        )

    def submit_run(self, report: RunReport) -> RunReceipt:
        """Sends the report. An older registry stores what it knows of it and names the
        fields it left out, which are logged: the run is stored all the same."""
        response = self._request(
            "POST",
            "/v1/runs",
            content=report.model_dump_json(),
            headers={"Content-Type": "application/json"},
        )
        receipt = RunReceipt.model_validate_json(response.content)
        if receipt.ignored_fields:
            log.warning(
                "registry at %s stored run %s without %s, which it does not know: "
                "upgrade it to keep them",
                self._http.base_url,
                report.run_id,
                ", ".join(receipt.ignored_fields),
            )
        return receipt

    def placement(
        self,
        *,
        model: str,
        min_tps_per_user: float,
        prompt_tokens: int | None = None,
        context_tokens: int | None = None,
        max_age_days: float | None = None,
        limit: int | None = None,
        kind: PlacementKind | None = None,
        max_ttft_ms: float | None = None,
    ) -> PlacementAnswer:
        optional = {
            "prompt_tokens": prompt_tokens,
            "context_tokens": context_tokens,
            "max_age_days": max_age_days,
            "limit": limit,
            "kind": kind,
            "max_ttft_ms": max_ttft_ms,
        }
        params: dict[str, Any] = {
            "model": model,
            "min_tps_per_user": min_tps_per_user,
            **{k: v for k, v in optional.items() if v is not None},
        }
        response = self._request("GET", "/v1/placement", params=params)
        return PlacementAnswer.model_validate_json(response.content)

    def capacity(
        self,
        *,
        model: str,
        users: int,
        min_tps_per_user: float,
        context_tokens: int | None = None,
        max_ttft_ms: float | None = None,
        kind: PlacementKind | None = None,
        max_age_days: float | None = None,
        reserve: list[str] | None = None,
    ) -> CapacityAnswer:
        optional = {
            "context_tokens": context_tokens,
            "max_ttft_ms": max_ttft_ms,
            "kind": kind,
            "max_age_days": max_age_days,
            "reserve": reserve or None,
        }
        params: dict[str, Any] = {
            "model": model,
            "users": users,
            "min_tps_per_user": min_tps_per_user,
            **{k: v for k, v in optional.items() if v is not None},
        }
        response = self._request("GET", "/v1/capacity", params=params)
        return CapacityAnswer.model_validate_json(response.content)

    def compare(
        self,
        *,
        model: str,
        from_build: str,
        to_build: str,
        kind: CompareKind | None = None,
        max_age_days: float | None = None,
        limit: int | None = None,
    ) -> CompareAnswer:
        optional = {"kind": kind, "max_age_days": max_age_days, "limit": limit}
        params: dict[str, Any] = {
            "model": model,
            "from_build": from_build,
            "to_build": to_build,
            **{k: v for k, v in optional.items() if v is not None},
        }
        response = self._request("GET", "/v1/compare", params=params)
        return CompareAnswer.model_validate_json(response.content)

    def plans(self, etag: str | None = None) -> tuple[str | None, NodePlans | None]:
        """This node's plans and their ETag; (etag, None) when they are unchanged since
        `etag` (a 304)."""
        headers = {"If-None-Match": etag} if etag else {}
        params = {"kind": list(KINDS)}  # every kind this agent runs
        response = self._request("GET", "/v1/agent/plans", headers=headers, params=params)
        tag = response.headers.get("ETag")
        if response.status_code == 304:
            return tag or etag, None
        return tag, NodePlans.model_validate_json(response.content)

    def report_status(self, status: NodeStatus) -> None:
        self._request(
            "PUT",
            "/v1/agent/status",
            content=status.model_dump_json(),
            headers={"Content-Type": "application/json"},
        )

    def healthy(self) -> bool:
        """Whether the registry answers `GET /healthz` with 200 {"status": "ok"} (its process
        and its database are up). Never raises: no answer is not healthy."""
        try:
            response = self._http.get("/healthz")
            body = response.json() if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            return False
        return isinstance(body, dict) and body.get("status") == "ok"

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise RegistryUnavailable(
                f"registry at {self._http.base_url} unreachable: {exc}"
            ) from exc
        retry_after = _retry_after(response.headers.get("Retry-After"))
        if response.status_code >= 500:
            raise RegistryUnavailable(
                f"registry answered {response.status_code}: {response.text[:500]}",
                status_code=response.status_code,
                retry_after=retry_after,
            )
        if response.status_code >= 400:
            raise RequestRejected(response.status_code, _detail(response), retry_after=retry_after)
        return response

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _retry_after(value: str | None) -> float | None:
    """Retry-After as seconds from now: delay-seconds or an HTTP date (RFC 9110 10.2.3).
    None when absent or unreadable."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return None
    return min(max(seconds, 0.0), RETRY_AFTER_CAP_S) if math.isfinite(seconds) else None


def _detail(response: httpx.Response) -> str:
    try:
        detail = response.json().get("detail", response.text)
    except ValueError:
        return response.text[:2000]
    if isinstance(detail, list):  # FastAPI's validation errors: name each field
        return "; ".join(
            f"{'.'.join(str(p) for p in item.get('loc', []))}: {item.get('msg')}" for item in detail
        )
    return str(detail)
