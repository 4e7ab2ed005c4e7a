"""The closed loop: exactly C streaming requests in flight until the level's requests are
sent, each timestamped token by token. Every wait is bounded (connect, first token, each
read, the whole request), so a server that stops answering ends the level, never the agent."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from fleetbench.agent.serving.dialects import Dialect
from fleetbench.agent.serving.stats import RequestRecord

__all__ = ["Limits", "run_level"]

Prompt = list[int] | str


@dataclass(frozen=True)
class Limits:
    connect_s: float = 5.0
    first_token_s: float = 60.0  # also the longest wait between two events of a stream
    request_s: float = 600.0


def _arrived(record: RequestRecord, new: int, now: float) -> None:
    """`new` tokens came in one event at `now`: the first event's all at once (that is the
    first token's time), a later event's spread evenly since the token before."""
    if not record.token_times:
        record.token_times.extend([now] * new)
        return
    last = record.token_times[-1]
    record.token_times.extend(last + (now - last) * i / new for i in range(1, new + 1))


async def _request(
    client: httpx.AsyncClient,
    dialect: Dialect,
    prompt: Prompt,
    *,
    gen_tokens: int,
    model: str,
    limits: Limits,
) -> RequestRecord:
    """One request, never raising: what went wrong is the record's error. A kept-alive
    connection the server closed meanwhile is replaced once, as any client does."""
    for attempt in (1, 2):
        try:
            return await _attempt(client, dialect, prompt, gen_tokens, model, limits)
        except _StaleConnection:
            if attempt == 2:
                break
    return RequestRecord(sent=time.perf_counter(), error="stream cut off")


class _StaleConnection(Exception):
    """The server closed a kept-alive connection before answering on it."""


async def _attempt(
    client: httpx.AsyncClient,
    dialect: Dialect,
    prompt: Prompt,
    gen_tokens: int,
    model: str,
    limits: Limits,
) -> RequestRecord:
    record = RequestRecord(sent=time.perf_counter())
    body = dialect.body(prompt, gen_tokens, model)
    finished = answered = False
    try:
        async with asyncio.timeout(limits.request_s):
            async with client.stream("POST", dialect.path, json=body) as response:
                answered = True
                if response.status_code != 200:
                    await response.aread()
                    record.error = f"http {response.status_code}"
                    return record
                # Read to the end of the stream, past its last event: a connection left
                # mid-response is closed, and the next request would pay a new one.
                async for line in response.aiter_lines():
                    if finished or not line.startswith("data:"):
                        continue
                    event = dialect.read(line[5:].strip())
                    now = time.perf_counter()
                    if event.error is not None:
                        record.error = f"server error: {event.error}"[:200]
                        return record
                    seen = len(record.token_times)
                    new = max(0, event.count - seen) if event.count is not None else int(event.text)
                    if new:
                        _arrived(record, new, now)
                    if event.done:
                        finished, record.done = True, now
    except httpx.ConnectError:
        record.error = "refused"
    except (httpx.TimeoutException, TimeoutError):
        record.error = None if finished else "timeout"
    except (httpx.RemoteProtocolError, httpx.ReadError) as exc:
        if not answered and not isinstance(exc, httpx.ReadError):
            raise _StaleConnection from exc
        record.error = None if finished else "stream cut off"  # after the end: no matter
    except httpx.HTTPError as exc:
        record.error = None if finished else f"transport error: {type(exc).__name__}"
    except Exception:  # an event not as the protocol says: one request's, not the sweep's
        record.error = "unreadable stream"
    if record.error is None:
        if not finished:
            record.error = "stream cut off"
        elif record.tokens < gen_tokens:
            record.error = "short output"
    return record


async def run_level(
    base_url: str,
    dialect: Dialect,
    next_prompt: Callable[[], Prompt],
    *,
    concurrency: int,
    requests: int,
    gen_tokens: int,
    model: str,
    limits: Limits,
) -> tuple[list[RequestRecord], float, float]:
    """One concurrency: `concurrency` warm-up requests (not counted), then `requests`
    (rounded up to a multiple of `concurrency`, so that each of the C users sends as many
    and C are in flight until the last round) with exactly `concurrency` in flight. Returns
    the records and the wall-clock start and end of the counted part."""
    rounds = -(-requests // concurrency)
    timeout = httpx.Timeout(limits.first_token_s, connect=limits.connect_s)
    pool = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    # trust_env off: a proxy from the environment would sit between the client and the
    # server on loopback too, and could hold the stream back.
    async with httpx.AsyncClient(
        base_url=base_url, timeout=timeout, limits=pool, trust_env=False
    ) as client:

        async def one() -> RequestRecord:
            return await _request(
                client, dialect, next_prompt(), gen_tokens=gen_tokens, model=model, limits=limits
            )

        await asyncio.gather(*(one() for _ in range(concurrency)))  # warm-up
        records: list[RequestRecord] = []

        async def user() -> None:
            for _ in range(rounds):
                records.append(await one())

        started = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(concurrency)))
        return records, started, time.perf_counter()
