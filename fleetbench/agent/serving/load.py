"""The closed loop: exactly C streaming requests in flight until the level's requests are
sent (or its seconds are up), each timestamped token by token. Every wait is bounded
(connect, first token, each read, the whole request), so a server that stops answering ends
the level, never the agent."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from fleetbench.agent.serving.dialects import Dialect
from fleetbench.agent.serving.stats import RequestRecord
from fleetbench.contract.bounds import storable_text

__all__ = ["Limits", "Load", "run_level"]

Prompt = list[int] | str


@dataclass(frozen=True)
class Limits:
    connect_s: float = 5.0
    first_token_s: float = 60.0  # also the longest wait between two events of a stream
    request_s: float = 600.0


@dataclass(frozen=True)
class Load:
    """How long a level lasts: `requests` in all (rounded up to whole rounds of C), or each
    of the C users sending one request after another until `duration_s` is up."""

    requests: int | None = None
    duration_s: float | None = None


def _arrived(record: RequestRecord, new: int, now: float) -> None:
    """`new` tokens came in one event at `now`: the first event's all at once (that is the
    first token's time), a later event's spread evenly since the token before."""
    if not record.token_times:
        record.token_times.extend([now] * new)
        return
    last = record.token_times[-1]
    record.token_times.extend(last + (now - last) * i / new for i in range(1, new + 1))


@dataclass(frozen=True)
class _Target:
    """Where a level's requests go, and what each asks for."""

    session: aiohttp.ClientSession
    url: str
    dialect: Dialect
    gen_tokens: int
    model: str
    limits: Limits


async def _request(target: _Target, prompt: Prompt) -> RequestRecord:
    """One request, never raising: what went wrong is the record's error. A kept-alive
    connection the server closed as the request went out is given up and the request sent
    again, as any client does (llama-server closes idle ones within milliseconds at times),
    a few times at most: then the server is closing every connection it is sent."""
    for _ in range(_STALE_RETRIES):
        try:
            return await _attempt(target, prompt)
        except _StaleConnection:
            continue
    return RequestRecord(sent=time.perf_counter(), error="disconnected")


_STALE_RETRIES = 4
_ERROR_BYTES = 2**16  # read of an answer that is not the stream
_GIVE_UP = 3  # failed requests in a row after which a user of a timed level stops
# A kept-alive connection found closed fails at once; a server that took the request and
# then fell over takes longer, and is an error of its own, never sent again.
_STALE_WITHIN_S = 0.05


class _StaleConnection(Exception):
    """The server closed a kept-alive connection before answering on it."""


async def _attempt(target: _Target, prompt: Prompt) -> RequestRecord:
    dialect, limits, gen_tokens = target.dialect, target.limits, target.gen_tokens
    record = RequestRecord(sent=time.perf_counter())
    body = dialect.body(prompt, gen_tokens, target.model)
    finished = answered = False
    try:
        async with asyncio.timeout(limits.request_s):
            # a redirect is an answer like any other: the server may not send the load
            # (nor its prompts) to another address
            async with target.session.post(
                target.url, json=body, allow_redirects=False
            ) as response:
                answered = True
                if response.status != 200:
                    # some of its error, so that a short one leaves the connection reusable;
                    # never all of what a server may send
                    await response.content.read(_ERROR_BYTES)
                    record.error = f"http {response.status}"
                    return record
                # Read to the end of the stream, past its last event: a connection left
                # mid-response is closed, and the next request would pay a new one.
                async for raw in response.content:
                    line = raw.decode()
                    if line.startswith("error:"):  # llama-server's way of failing a stream
                        record.error = storable_text(f"server error: {line[6:].strip()}", 200)
                        return record
                    if finished or not line.startswith("data:"):
                        continue
                    event = dialect.read(line[5:].strip())
                    now = time.perf_counter()
                    if event.error is not None:
                        record.error = storable_text(f"server error: {event.error}", 200)
                        return record
                    if event.count is not None and event.count > gen_tokens:
                        # no server counts past what it was asked for; timestamping a
                        # billion tokens would fill the agent's memory
                        record.error = "more tokens than asked for"
                        return record
                    seen = len(record.token_times)
                    new = max(0, event.count - seen) if event.count is not None else int(event.text)
                    if new:
                        _arrived(record, new, now)
                    if event.done:
                        finished, record.done = True, now
    except aiohttp.ClientConnectorError:
        record.error = "refused"
    except TimeoutError:  # the request's bound, or a read's (aiohttp's timeouts are these)
        record.error = None if finished else "timeout"
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
        if not answered and time.perf_counter() - record.sent < _STALE_WITHIN_S:
            raise _StaleConnection from exc  # closed as the request went out
        record.error = None if finished else "stream cut off"  # after the end: no matter
    except aiohttp.ClientPayloadError:
        record.error = None if finished else "stream cut off"
    except aiohttp.ClientError as exc:
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
    load: Load,
    gen_tokens: int,
    model: str,
    limits: Limits,
) -> tuple[list[RequestRecord], float, float]:
    """One concurrency: `concurrency` warm-up requests (not counted), then the `load` with
    exactly `concurrency` in flight: its requests rounded up to a multiple of `concurrency`,
    so that each of the C users sends as many and C are in flight until the last round, or
    requests sent until its seconds are up (the last ones run to their end). Returns the
    records and the wall-clock start and end of the counted part."""
    requests = load.requests or max(8, 4 * concurrency)
    rounds = -(-requests // concurrency)
    timeout = aiohttp.ClientTimeout(connect=limits.connect_s, sock_read=limits.first_token_s)
    pool = aiohttp.TCPConnector(limit=concurrency)
    url = base_url.rstrip("/") + dialect.path  # a server under a path prefix too
    # aiohttp, not httpx: at 256 streams httpx's per-event cost on one core delayed the
    # tokens it timestamps (bench/serving_ceiling.py). trust_env is off by default: no
    # proxy from the environment sits between the client and a server on loopback. Lines
    # up to 8 MiB: llama-server's last event carries the prompt back.
    async with aiohttp.ClientSession(
        timeout=timeout, connector=pool, auto_decompress=False, read_bufsize=2**22
    ) as session:
        target = _Target(session, url, dialect, gen_tokens, model, limits)

        async def one() -> RequestRecord:
            return await _request(target, next_prompt())

        await asyncio.gather(*(one() for _ in range(concurrency)))  # warm-up
        records: list[RequestRecord] = []

        async def user() -> None:
            if load.duration_s is not None:
                failed = 0  # in a row: a server failing every request is not sent more
                while time.perf_counter() < started + load.duration_s and failed < _GIVE_UP:
                    records.append(record := await one())
                    failed = failed + 1 if record.error is not None else 0
                return
            for _ in range(rounds):
                records.append(await one())

        started = time.perf_counter()
        await asyncio.gather(*(user() for _ in range(concurrency)))
        return records, started, time.perf_counter()
