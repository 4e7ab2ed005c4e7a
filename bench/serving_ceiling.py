"""The serving load generator's own ceiling: how exactly it measures, and what it costs.

A stub OpenAI-compatible server (aiohttp, its own process, pinned to one core) streams every
request's tokens at a fixed interval and records when it wrote each. fleetbench's closed
loop (fleetbench/agent/serving/load.py, pinned to the other core) drives it at each
concurrency; the script compares, per concurrency, the per-user speed and inter-token
latency the client measured with what the stub actually sent (its own timestamps, so the
stub's scheduling drift is not blamed on the client) and with the nominal rate, and gives
the client's CPU per stream. Medians over `--repeats` runs of each concurrency.

    .venv/bin/python bench/serving_ceiling.py                       # C = 64 and 256
    .venv/bin/python bench/serving_ceiling.py --concurrency 16,64,256 --interval-ms 20
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import httpx
from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import free_port, write_result
from fleetbench.agent.serving.dialects import OPENAI
from fleetbench.agent.serving.load import Limits, Load, run_level
from fleetbench.agent.serving.stats import percentile, serving_point


def _stub(port: int, interval_s: float, core: int | None) -> None:
    """The stub's process: each request streams `max_tokens` events `interval_s` apart; the
    send time of every event is kept for GET /sent (and cleared by DELETE /sent)."""
    if core is not None:
        os.sched_setaffinity(0, {core})
    sent: list[list[float]] = []

    async def complete(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        times: list[float] = []
        for _ in range(int(body["max_tokens"])):
            await asyncio.sleep(interval_s)
            await response.write(b'data: {"choices": [{"text": "x"}]}\n\n')
            times.append(time.perf_counter())
        await response.write(b"data: [DONE]\n\n")
        sent.append(times)
        return response

    async def report(_: web.Request) -> web.Response:
        return web.json_response(sent)

    async def clear(_: web.Request) -> web.Response:
        sent.clear()
        return web.json_response([])

    app = web.Application()
    app.add_routes(
        [
            web.post("/v1/completions", complete),
            web.get("/sent", report),
            web.delete("/sent", clear),
        ]
    )
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


def _sent_speeds(streams: list[list[float]]) -> tuple[list[float], list[float]]:
    """Per-stream speed (tokens after the first over first to last) and every gap, as sent."""
    speeds: list[float] = []
    gaps: list[float] = []
    for times in streams:
        if len(times) > 1 and times[-1] > times[0]:
            speeds.append((len(times) - 1) / (times[-1] - times[0]))
        gaps.extend(b - a for a, b in itertools.pairwise(times))
    return speeds, gaps


def measure(url: str, concurrency: int, tokens: int) -> dict[str, float]:
    httpx.delete(f"{url}/sent")
    before = resource.getrusage(resource.RUSAGE_SELF)
    records, started, ended = asyncio.run(
        run_level(
            url,
            OPENAI,
            lambda: "hello",
            concurrency=concurrency,
            load=Load(requests=concurrency * 2),
            gen_tokens=tokens,
            model="stub",
            limits=Limits(first_token_s=30),
        )
    )
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    point = serving_point(concurrency, records, started=started, ended=ended)
    # the stub's record holds the warm-up requests too: the last 2C streams are the counted
    sent_speeds, sent_gaps = _sent_speeds(httpx.get(f"{url}/sent").json()[-2 * concurrency :])
    return {
        "completed": point.completed,
        "client_tps_p50": point.per_user_tps_p50 or 0.0,
        "sent_tps_p50": percentile(sent_speeds, 50) or 0.0,
        "client_itl_ms_p50": point.itl_ms_p50 or 0.0,
        "sent_itl_ms_p50": (percentile(sent_gaps, 50) or 0.0) * 1000,
        # the client's CPU over the whole level (warm-up included) per stream, in % of a core
        "cpu_pct_per_stream": 100 * cpu / (ended - started) / concurrency,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="64,256")
    parser.add_argument("--interval-ms", type=float, default=20.0, help="between two tokens")
    parser.add_argument("--tokens", type=int, default=64, help="per request")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--uvloop", action="store_true", help="the client on uvloop's loop")
    args = parser.parse_args()
    if args.uvloop:
        import uvloop

        uvloop.install()
    cores = sorted(os.sched_getaffinity(0))
    stub_core, client_core = (cores[-1], cores[0]) if len(cores) > 1 else (None, None)
    port = free_port()
    stub = multiprocessing.get_context("spawn").Process(
        target=_stub, args=(port, args.interval_ms / 1000, stub_core), daemon=True
    )
    stub.start()
    if client_core is not None:
        os.sched_setaffinity(0, {client_core})
    url = f"http://127.0.0.1:{port}"
    for _ in range(100):
        try:
            httpx.get(f"{url}/sent", timeout=1)
            break
        except httpx.TransportError:
            time.sleep(0.1)
    nominal = 1000 / args.interval_ms
    print(f"stub on core {stub_core}, client on core {client_core}; {nominal:.1f} t/s per stream")
    print(
        "   C  client t/s  sent t/s  client/sent  vs nominal  ITL client ms  ITL sent ms"
        "  client CPU/stream"
    )
    results = {}
    try:
        for concurrency in (int(c) for c in args.concurrency.split(",")):
            runs = [measure(url, concurrency, args.tokens) for _ in range(args.repeats)]
            row = {key: statistics.median(run[key] for run in runs) for key in runs[0]}
            results[concurrency] = row
            print(
                f"{concurrency:4d}  {row['client_tps_p50']:10.2f}  {row['sent_tps_p50']:8.2f}"
                f"  {row['client_tps_p50'] / row['sent_tps_p50']:11.4f}"
                f"  {row['client_tps_p50'] / nominal:10.4f}"
                f"  {row['client_itl_ms_p50']:13.2f}  {row['sent_itl_ms_p50']:11.2f}"
                f"  {row['cpu_pct_per_stream']:14.3f} %"
            )
    finally:
        stub.terminate()
    print(json.dumps(results))
    figures = {
        "nominal_tps_per_stream": nominal,
        "tokens_per_request": args.tokens,
        "repeats": args.repeats,
        "uvloop": args.uvloop,
        "by_concurrency": {
            str(c): {
                **row,
                "client_over_sent": row["client_tps_p50"] / row["sent_tps_p50"],
                "client_over_nominal": row["client_tps_p50"] / nominal,
            }
            for c, row in results.items()
        },
    }
    write_result("serving_ceiling", figures)


if __name__ == "__main__":
    main()
