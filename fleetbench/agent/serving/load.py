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
    request_s: float = 300.0


async def _request(
    client: httpx.AsyncClient,
    dialect: Dialect,
    prompt: Prompt,
    *,
    gen_tokens: int,
    model: str,
    limits: Limits,
) -> RequestRecord:
    record = RequestRecord(sent=time.perf_counter())
    body = dialect.body(prompt, gen_tokens, model)
    try:
        async with asyncio.timeout(limits.request_s):
            async with client.stream("POST", dialect.path, json=body) as response:
                if response.status_code != 200:
                    await response.aread()
                    record.error = f"http {response.status_code}"
                    return record
                finished = False
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    event = dialect.read(line[5:].strip())
                    now = time.perf_counter()
                    record.token_times.extend([now] * event.tokens)
                    if event.reported is not None:
                        record.tokens_reported = event.reported
                    if event.done:
                        finished = True
                        break
                record.done = time.perf_counter()
    except httpx.ConnectError:
        record.error = "refused"
        return record
    except (httpx.TimeoutException, TimeoutError):
        record.error = "timeout"
        return record
    except (httpx.RemoteProtocolError, httpx.ReadError):
        record.error = "stream cut off"
        return record
    except ValueError:  # an event that is not JSON
        record.error = "unreadable stream"
        return record
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
    requests with exactly `concurrency` in flight. Returns the records and the wall-clock
    start and end of the counted part."""
    timeout = httpx.Timeout(limits.first_token_s, connect=limits.connect_s)
    pool = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=pool) as client:

        async def one() -> RequestRecord:
            return await _request(
                client, dialect, next_prompt(), gen_tokens=gen_tokens, model=model, limits=limits
            )

        await asyncio.gather(*(one() for _ in range(concurrency)))  # warm-up
        records: list[RequestRecord] = []
        left = requests

        async def user() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                records.append(await one())

        started = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(min(concurrency, requests))))
        return records, started, time.perf_counter()
