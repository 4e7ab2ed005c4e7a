"""RegistryClient: the agent's only way to the registry. One attempt per call (connection
retries aside); retry policy belongs to the caller. httpx errors become ClientErrors, which
carry the registry's Retry-After when it sent one. Each request ends by a deadline and
reads no more of the answer than a limit, follows no redirect, and takes nothing but the
answer it expects: what a proxy or a wrong URL answers instead is an UnexpectedAnswer
saying what came (bounded_http)."""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from types import TracebackType
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from fleetbench.agent.bounded_http import (
    AnswerTooLarge,
    DeadlineClock,
    DeadlinePassed,
    deadline_transport,
    read_bounded,
)
from fleetbench.agent.errors import (
    ClientError,
    RegistryUnavailable,
    RequestRejected,
    UnexpectedAnswer,
    validation_problems,
)
from fleetbench.contract.answers import (
    CapacityAnswer,
    CapacityMinimise,
    CompareAnswer,
    CompareKind,
    PlacementAnswer,
    PlacementKind,
    PlacementOrder,
    RegressionsPublic,
    RunReceipt,
)
from fleetbench.contract.plans import KINDS, NodePlans, NodeStatus
from fleetbench.contract.wire import RunReport

__all__ = ["RegistryClient"]

log = logging.getLogger("fleetbench.client")

DEFAULT_TIMEOUT = httpx.Timeout(30.0, connect=5.0)  # each wait
DEADLINE_S = 60.0  # a whole request, its answer read to the end
# The most of an answer read: a receipt, a status or an error is a few hundred bytes; the
# plans and the questions' answers list up to thousands of rows (a node's 1000 plans, a
# compare of a whole fleet) and take LARGE_ANSWER_BYTES. Past it no registry answered.
ANSWER_BYTES = 2**20
LARGE_ANSWER_BYTES = 32 * 2**20
_ERROR_BYTES = 64 * 2**10  # of a 4xx or 5xx answer: its detail, shown cut to 2000 characters
# The longest Retry-After taken, as the spool's own backoff: a proxy's "come back next year"
# must not park a node's results for that long.
RETRY_AFTER_CAP_S = 3600.0


Answer = TypeVar("Answer", bound=BaseModel)


@dataclass(frozen=True)
class _Answer:
    """An answer of the registry's, read."""

    status_code: int
    headers: httpx.Headers
    content: bytes

    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)


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
        deadline_s: float = DEADLINE_S,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._deadline_s = deadline_s
        self._clock = DeadlineClock()  # a transport given (a test's) has no sockets to cut
        if transport is None:
            transport, self._clock = deadline_transport(retries=2)
        self._http = httpx.Client(
            base_url=base_url.rstrip("/"),
            headers=headers,
            timeout=timeout,
            transport=transport,
            follow_redirects=False,  # httpx's default, said: a 3xx is an UnexpectedAnswer
        )

    def submit_run(self, report: RunReport) -> RunReceipt:
        """Sends the report. An older registry stores what it knows of it and names the
        fields it left out, which are logged: the run is stored all the same."""
        answer = self._request(
            "POST",
            "/v1/runs",
            content=report.model_dump_json(),
            headers={"Content-Type": "application/json"},
        )
        receipt = self._read(answer, RunReceipt)
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
        order: PlacementOrder | None = None,
    ) -> PlacementAnswer:
        return self._question(
            "/v1/placement",
            PlacementAnswer,
            model=model,
            min_tps_per_user=min_tps_per_user,
            prompt_tokens=prompt_tokens,
            context_tokens=context_tokens,
            max_age_days=max_age_days,
            limit=limit,
            kind=kind,
            max_ttft_ms=max_ttft_ms,
            order=order,
        )

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
        minimise: CapacityMinimise | None = None,
    ) -> CapacityAnswer:
        return self._question(
            "/v1/capacity",
            CapacityAnswer,
            model=model,
            users=users,
            min_tps_per_user=min_tps_per_user,
            context_tokens=context_tokens,
            max_ttft_ms=max_ttft_ms,
            kind=kind,
            max_age_days=max_age_days,
            reserve=reserve or None,
            minimise=minimise,
        )

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
        return self._question(
            "/v1/compare",
            CompareAnswer,
            model=model,
            from_build=from_build,
            to_build=to_build,
            kind=kind,
            max_age_days=max_age_days,
            limit=limit,
        )

    def regressions(
        self,
        *,
        node: str | None = None,
        model: str | None = None,
        min_change: float | None = None,
        include_improvements: bool = False,
        include_acknowledged: bool = False,
        limit: int | None = None,
    ) -> RegressionsPublic:
        return self._question(
            "/v1/regressions",
            RegressionsPublic,
            node=node,
            model=model,
            min_change=min_change,
            include_improvements=include_improvements or None,
            include_acknowledged=include_acknowledged or None,
            limit=limit,
        )

    def _question(self, path: str, answer_type: type[Answer], **asked: Any) -> Answer:
        """A question's answer: its parameters given (those left None, not sent)."""
        params = {name: value for name, value in asked.items() if value is not None}
        answer = self._request("GET", path, params=params, limit=LARGE_ANSWER_BYTES)
        return self._read(answer, answer_type)

    def plans(self, etag: str | None = None) -> tuple[str | None, NodePlans | None]:
        """This node's plans and their ETag; (etag, None) when they are unchanged since
        `etag` (a 304)."""
        headers = {"If-None-Match": etag} if etag else {}
        params = {"kind": list(KINDS)}  # every kind this agent runs
        answer = self._request(
            "GET", "/v1/agent/plans", headers=headers, params=params, limit=LARGE_ANSWER_BYTES
        )
        tag = answer.headers.get("ETag")
        if answer.status_code == 304:
            return tag or etag, None
        return tag, self._read(answer, NodePlans)

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
            body = self._request("GET", "/healthz").json()
        except (ClientError, ValueError):
            return False
        return isinstance(body, dict) and body.get("status") == "ok"

    def _request(
        self, method: str, path: str, *, limit: int = ANSWER_BYTES, **kwargs: Any
    ) -> _Answer:
        """The registry's answer, read whole (at most `limit` bytes) by the deadline: a 2xx,
        or a 304; anything else raises a ClientError saying what came."""
        deadline = time.monotonic() + self._deadline_s
        self._clock.deadline = deadline
        try:
            with self._http.stream(method, path, **kwargs) as response:
                status, headers = response.status_code, response.headers
                if status >= 400:  # its detail alone is shown, cut short
                    body = read_bounded(response, _ERROR_BYTES, deadline, cut=True)
                elif status >= 300 and status != 304:
                    raise UnexpectedAnswer(
                        f"{self._who} answered {status}, a redirect to "
                        f"{headers.get('Location', 'nowhere')}: the agent follows "
                        "none; give the registry's own URL",
                        status_code=status,
                    )
                else:
                    body = read_bounded(response, limit, deadline)
        except AnswerTooLarge as exc:
            raise UnexpectedAnswer(
                f"{self._who} answered {status} with {exc}, more than any answer "
                "of a registry's to this",
                status_code=status,
            ) from exc
        except (httpx.TransportError, DeadlinePassed) as exc:
            if time.monotonic() >= deadline:
                raise RegistryUnavailable(
                    f"{self._who} did not answer in {self._deadline_s:g} s"
                ) from exc
            raise RegistryUnavailable(f"{self._who} unreachable: {exc}") from exc
        finally:
            self._clock.deadline = None
        answer = _Answer(status, headers, body)
        retry_after = _retry_after(answer.headers.get("Retry-After"))
        if answer.status_code >= 500:
            raise RegistryUnavailable(
                f"registry answered {answer.status_code}: {answer.text()[:500]}",
                status_code=answer.status_code,
                retry_after=retry_after,
            )
        if answer.status_code >= 400:
            raise RequestRejected(answer.status_code, _detail(answer), retry_after=retry_after)
        return answer

    @property
    def _who(self) -> str:
        return f"registry at {self._http.base_url}"

    def _read(self, answer: _Answer, model: type[Answer]) -> Answer:
        """The answer as `model`, or an UnexpectedAnswer naming what came instead (a proxy's
        page, a registry of another version)."""
        try:
            return model.model_validate_json(answer.content)
        except ValidationError as exc:
            kind = answer.headers.get("Content-Type", "no Content-Type")
            raise UnexpectedAnswer(
                f"{self._who} answered {answer.status_code} with {kind} in a shape unknown "
                f"here, not a {model.__name__} ({validation_problems(exc)}); is that the "
                "registry's URL?",
                status_code=answer.status_code,
            ) from exc

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


def _detail(answer: _Answer) -> str:
    try:
        detail = answer.json().get("detail", answer.text())
    except (ValueError, AttributeError):  # not JSON, or JSON but no object
        return answer.text()[:2000]
    if isinstance(detail, list):  # FastAPI's validation errors: name each field
        return "; ".join(
            f"{'.'.join(str(p) for p in item.get('loc', []))}: {item.get('msg')}"
            if isinstance(item, dict)
            else str(item)
            for item in detail
        )
    return str(detail)
