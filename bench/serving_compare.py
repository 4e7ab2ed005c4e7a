"""fleetbench's serving load generator side by side with an established one (AIPerf).

Both clients drive the same real llama-server (Gemma 3 270M, one thread, 4 slots) with the
same closed loop: C streaming completions in flight, the same prompt and output lengths
(ignore_eos, greedy, no prompt cache), the same number of counted requests after C warm-up
requests. Runs are interleaved (fleetbench first in even pairs, the peer first in odd ones),
each client is a child process of this script, and its CPU time (user + system of its whole
process tree, from getrusage(RUSAGE_CHILDREN)) is the client's cost: over the whole process
(start-up included) and, with --marginal-cpu (the default), per request past start-up, from a
second run of C requests only. Beside each client's own figures, llama-server's counters say
what the server did during the run, the same whichever client asked.

With --pin (the default) the server runs on core 0 and each client on core 1; with --no-pin
the server stays on core 0 and the clients may run anywhere, so whatever a client does at
once beyond one core comes out of the server's; --compare-pinning runs both placements in
every pair and shows what each client's freedom costs the server. Every figure printed is the
median over pairs; every ratio is the median of the pairs' ratios (fleetbench / peer).

    .venv/bin/python bench/serving_compare.py --llama-server PATH --model-file GGUF \\
        --peer-venv ~/.cache/fleetbench/peer-venv --tokenizer ~/.cache/fleetbench/gemma3-tok
    ... --concurrency 2,4 --pairs 5 --compare-pinning
    ... --peer-request-rate 200      # AIPerf's scheduler on a clock, not polling

The peer is AIPerf from PyPI, in a virtual environment of its own (its pins clash with
fleetbench's); --tokenizer is a Hugging Face tokenizer directory for the model, made from the
GGUF by the peer's transformers when the directory is missing (no torch needed). AIPerf
0.13's closed loop (--concurrency alone) polls for a free slot without pause, which keeps one
core busy for the whole run; --peer-request-rate has it start requests on a clock of that
rate instead (never more than C in flight all the same).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.aiperf_peer import PEER, Peer, ensure_tokenizer, peer_command, peer_version, run_peer
from bench.common import free_port, write_result
from bench.serving_clients import (
    OFFLINE,
    PINNED,
    SERVER_CORE,
    UNPINNED,
    Placement,
    Run,
    Workload,
    become_subreaper,
    run_child,
    with_cpu,
)

FLEETBENCH = "fleetbench"


@contextlib.contextmanager
def llama_server(binary: Path, model_file: Path, log: Path) -> Iterator[tuple[str, list[str]]]:
    """llama-server on core 0 and a free loopback port, one thread, 4 slots of 1024 tokens,
    with its Prometheus counters (read between runs only: no client scrapes them); yields its
    URL and command line once /health answers 200."""
    port = free_port()
    command = [
        "taskset", "-c", str(SERVER_CORE),
        str(binary), "-m", str(model_file), "--host", "127.0.0.1", "--port", str(port),
        "-np", "4", "-c", "4096", "-t", "1", "--no-webui", "--metrics",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with log.open("wb") as sink:
        process = subprocess.Popen(
            command, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 120
        while True:
            if process.poll() is not None:
                said = log.read_text(errors="replace")[-3000:]
                raise SystemExit(f"llama-server exited with {process.returncode}:\n{said}")
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=1, trust_env=False).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise SystemExit("llama-server did not answer /health within 120 s")
            time.sleep(0.25)
        yield url, command
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


_COUNTERS = ("tokens_predicted_total", "tokens_predicted_seconds_total", "n_decode_total")


def server_counters(url: str) -> dict[str, float]:
    """llama-server's own running totals: tokens generated, the seconds its slots spent
    generating them (summed over slots), and decode steps."""
    text = httpx.get(f"{url}/metrics", timeout=5, trust_env=False).text
    found = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name.removeprefix("llamacpp:") in _COUNTERS:
            found[name.removeprefix("llamacpp:")] = float(value)
    return found


def server_figures(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """What the server saw of one client run (its warm-up too), by its own clock: each
    request's decode speed (token-weighted) and tokens per decode step (the batch it ran)."""
    tokens = after["tokens_predicted_total"] - before["tokens_predicted_total"]
    seconds = after["tokens_predicted_seconds_total"] - before["tokens_predicted_seconds_total"]
    steps = after["n_decode_total"] - before["n_decode_total"]
    return {
        "server_decode_tps": tokens / seconds if seconds > 0 else math.nan,
        "server_batch": tokens / steps if steps > 0 else math.nan,
    }


def fleetbench_command(url: str, model: str, load: Workload) -> list[str]:
    agent = Path(sys.executable).parent / "fleetbench-agent"
    return [
        str(agent), "serve-sweep", "--url", url, "--model", model,
        "--concurrency", str(load.concurrency), "--prompt-tokens", str(load.prompt_tokens),
        "--gen-tokens", str(load.gen_tokens), "--requests", str(load.requests), "--json",
    ]  # fmt: skip


def run_fleetbench(
    url: str, model: str, load: Workload, placement: Placement, timeout_s: float
) -> Run:
    command = placement.pinned(fleetbench_command(url, model, load))
    child = run_child(command, {**os.environ, **OFFLINE}, timeout_s)
    outcome = json.loads(child.stdout)
    if outcome.get("failures") or len(outcome.get("points", [])) != 1:
        raise SystemExit(f"fleetbench's sweep failed: {outcome.get('failures')}")
    point = outcome["points"][0]
    figures = {
        "total_tps": point["total_tps"],
        "per_user_tps_p50": point["per_user_tps_p50"],
        "ttft_ms_p50": point["ttft_ms_p50"],
        "ttft_ms_p90": point["ttft_ms_p90"],
        "itl_ms_p50": point["itl_ms_p50"],
        "completed": point["completed"],
        "output_tokens_mean": point["output_tokens"] / max(1, point["requests"]),
        "input_tokens_mean": load.prompt_tokens if outcome.get("prompt_exact") else math.nan,
        "measured_s": point["seconds"],
    }
    return Run(FLEETBENCH, placement.name, with_cpu(figures, child, load))


ROWS: list[tuple[str, str, str]] = [  # key, label, format
    ("total_tps", "total output tokens/s", ".2f"),
    ("per_user_tps_p50", "per-user decode tokens/s p50", ".2f"),
    ("ttft_ms_p50", "TTFT p50 ms", ".1f"),
    ("ttft_ms_p90", "TTFT p90 ms", ".1f"),
    ("itl_ms_p50", "ITL p50 ms", ".2f"),
    ("server_decode_tps", "server: decode tokens/s per request", ".2f"),
    ("server_batch", "server: tokens per decode step", ".3f"),
    ("cpu_s", "client CPU s (whole process)", ".2f"),
    ("cpu_ms_per_request", "client CPU ms / request", ".1f"),
    ("cpu_pct_per_stream", "client CPU % of a core / stream", ".2f"),
    ("marginal_cpu_ms_per_request", "client CPU ms / extra request", ".1f"),
    ("marginal_cpu_pct_per_stream", "client CPU % of a core / stream, extra", ".2f"),
    ("wall_s", "client wall s (whole process)", ".1f"),
    ("measured_s", "measured part s", ".1f"),
    ("completed", "requests counted", ".0f"),
    ("input_tokens_mean", "prompt tokens (server's count)", ".1f"),
    ("output_tokens_mean", "output tokens / request", ".1f"),
]


def _median(values: Sequence[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return statistics.median(kept) if kept else math.nan


nan = math.nan


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else nan


def compare(runs: list[Run], placement: str) -> dict[str, dict[str, float]]:
    """Per figure: the median of each client over the pairs, and the median of the pairs'
    ratios (fleetbench / peer)."""
    ours, theirs = _figures(runs, FLEETBENCH, placement), _figures(runs, PEER, placement)
    table: dict[str, dict[str, float]] = {}
    for key, _, _ in ROWS:
        pairs = zip(ours, theirs, strict=True)
        ratios = [_ratio(a.get(key, nan), b.get(key, nan)) for a, b in pairs]
        table[key] = {
            FLEETBENCH: _median([f.get(key, nan) for f in ours]),
            PEER: _median([f.get(key, nan) for f in theirs]),
            "ratio": _median(ratios),
        }
    return table


NOTES = """\
  per-user speed and ITL as each client defines them: fleetbench's per-user speed is a
  request's tokens after its first over the time from first to last token, and its ITL the
  median of every gap between two tokens; AIPerf's ITL is each request's (latency - TTFT) /
  (tokens - 1), its per-user speed 1 / that, medians over requests. The server's rows are
  llama-server's own counters over the client's whole run (warm-up included), the same
  whichever client asks: its slots' decode speed, and tokens per decode step (C when the
  client keeps C streams in flight)."""


def print_table(title: str, table: dict[str, dict[str, float]]) -> None:
    print(f"\n{title}")
    print(f"{'':40s}{FLEETBENCH:>12s}{PEER:>12s}  fleetbench/{PEER}")
    for key, label, fmt in ROWS:
        row = table[key]
        if math.isnan(row[FLEETBENCH]) and math.isnan(row[PEER]):
            continue  # not measured (--no-marginal-cpu)
        print(
            f"{label:40s}{row[FLEETBENCH]:>12{fmt}}{row[PEER]:>12{fmt}}"
            f"  {row['ratio']:>{len(PEER) + 11}.3f}"
        )


def print_disturbance(runs: list[Run]) -> dict[str, dict[str, float]]:
    """What each client costs the server when it may run on the server's core: the median
    over pairs of (unpinned / pinned) for the server-side figures."""
    keys = [("total_tps", "total output tokens/s"), ("per_user_tps_p50", "per-user tokens/s p50")]
    keys += [("ttft_ms_p50", "TTFT p50 ms"), ("itl_ms_p50", "ITL p50 ms")]
    keys += [("server_decode_tps", "server: decode tokens/s per request")]
    keys += [("server_batch", "server: tokens per decode step")]
    print("\nunpinned / pinned (1.000: the client took nothing from the server's core)")
    print(f"{'':40s}{FLEETBENCH:>12s}{PEER:>12s}")
    result: dict[str, dict[str, float]] = {}
    for key, label in keys:
        row = {}
        for client in (FLEETBENCH, PEER):
            pinned, free = _figures(runs, client, "pinned"), _figures(runs, client, "unpinned")
            row[client] = _median(
                [_ratio(u[key], p[key]) for u, p in zip(free, pinned, strict=True)]
            )
        result[key] = row
        print(f"{label:40s}{row[FLEETBENCH]:>12.3f}{row[PEER]:>12.3f}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", type=Path, required=True, help="the binary")
    parser.add_argument("--model-file", type=Path, required=True, help="the GGUF")
    parser.add_argument("--model", default="gemma-3-270m", help="the name both clients send")
    parser.add_argument("--peer-venv", type=Path, required=True, help="AIPerf's virtualenv")
    parser.add_argument(
        "--tokenizer", type=Path, required=True, help="HF tokenizer dir (made if missing)"
    )
    parser.add_argument(
        "--peer-request-rate",
        type=float,
        help="AIPerf's requests started per second at most (its clock, not its busy poll)",
    )
    parser.add_argument("--concurrency", default="2", help="comma list")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--gen-tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=16, help="counted, per run")
    parser.add_argument("--pairs", type=int, default=3, help="interleaved pairs per level")
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="clients on core 1 (else anywhere); the server is on core 0 either way",
    )
    parser.add_argument(
        "--compare-pinning",
        action="store_true",
        help="both placements in every pair, and what each client costs the server",
    )
    parser.add_argument(
        "--marginal-cpu",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also run each client with C requests only: CPU per request past start-up",
    )
    parser.add_argument("--timeout", type=float, default=900, help="seconds per client run")
    args = parser.parse_args()
    if len(os.sched_getaffinity(0)) < 2:
        raise SystemExit("needs 2 cores: the server on core 0, the clients on core 1")
    placements = [PINNED, UNPINNED] if args.compare_pinning else [PINNED if args.pin else UNPINNED]
    levels = [int(c) for c in args.concurrency.split(",")]
    become_subreaper()
    version = peer_version(args.peer_venv)
    ensure_tokenizer(args.peer_venv, args.model_file, args.tokenizer)

    with (
        tempfile.TemporaryDirectory(prefix="serving-compare-") as scratch,
        llama_server(args.llama_server, args.model_file, Path(scratch) / "server.log") as served,
    ):
        url, server_command = served
        print(f"server: {shlex.join(server_command)}")
        first = Workload(levels[0], args.prompt_tokens, args.gen_tokens, args.requests)
        print(f"fleetbench: {shlex.join(fleetbench_command(url, args.model, first))}")
        shown = peer_command(peer_of(args), url, args.model, first, Path("DIR"))
        print(f"peer: AIPerf {version}: {shlex.join(shown)}")
        where = " / ".join(
            f"{p.name} ({'core ' + p.client_cores if p.client_cores else 'any core'})"
            for p in placements
        )
        print(
            f"placement: server on core {SERVER_CORE} (-t 1); clients {where};"
            f" {args.pairs} interleaved pair(s) per level; figures are medians over pairs"
        )
        results: dict[str, Any] = {"peer": f"aiperf {version}", "levels": {}}
        for level in levels:
            load = Workload(level, args.prompt_tokens, args.gen_tokens, args.requests)
            results["levels"][str(level)] = report(measure(args, url, load, placements), load)
    print(json.dumps(results))
    setup = {"model_file": args.model_file.name, "server": shlex.join(server_command)}
    setup |= {"prompt_tokens": args.prompt_tokens, "gen_tokens": args.gen_tokens}
    setup |= {"requests": args.requests, "pairs": args.pairs}
    setup |= {"placements": [p.name for p in placements]}
    setup |= {"peer_request_rate": args.peer_request_rate}
    write_result("serving_compare", {**setup, **results})


def peer_of(args: argparse.Namespace) -> Peer:
    return Peer(args.peer_venv, args.tokenizer.resolve(), args.peer_request_rate)


def report(runs: list[Run], load: Workload) -> dict[str, Any]:
    """The tables of one level, printed, and as a dict."""
    placements = sorted({r.placement for r in runs}, key=["pinned", "unpinned"].index)
    found: dict[str, Any] = {}
    for placement in placements:
        table = compare(runs, placement)
        found[placement] = table
        print_table(
            f"C = {load.concurrency}, prompt {load.prompt_tokens}, output {load.gen_tokens}, "
            f"{load.requests} requests, clients {placement}",
            table,
        )
    print(NOTES)
    if len(placements) == 2:
        found["unpinned/pinned"] = print_disturbance(runs)
    found["runs"] = [{"client": r.client, "placement": r.placement, **r.figures} for r in runs]
    return found


def _figures(runs: list[Run], client: str, placement: str) -> list[dict[str, float]]:
    return [r.figures for r in runs if r.client == client and r.placement == placement]


def measure(
    args: argparse.Namespace, url: str, load: Workload, placements: list[Placement]
) -> list[Run]:
    """`--pairs` rounds; in each, every client in every placement once, in one order in even
    pairs and the reverse in odd ones, so that neither client always goes first. With
    --marginal-cpu each is then run again with only C requests after its warm-up, and the
    CPU the longer run took beyond the shorter is the client's cost of its extra requests:
    its start-up, its warm-up and the first C requests left out."""
    jobs = [(client, placement) for placement in placements for client in (FLEETBENCH, PEER)]
    short = replace(load, requests=load.concurrency)
    marginal = args.marginal_cpu and load.requests > short.requests
    runs: list[Run] = []
    for pair in range(args.pairs):
        order = jobs if pair % 2 == 0 else jobs[::-1]
        started = time.perf_counter()
        full = {(c, p.name): _one(args, url, c, p, load, pair) for c, p in order}
        if marginal:
            for client, placement in order:
                brief = _one(args, url, client, placement, short, pair)
                full[client, placement.name].figures.update(_marginal(full, brief, load, short))
        runs.extend(full.values())
        print(f"  pair {pair + 1} took {time.perf_counter() - started:.0f} s", flush=True)
    return runs


def _one(
    args: argparse.Namespace,
    url: str,
    client: str,
    placement: Placement,
    load: Workload,
    pair: int,
) -> Run:
    before = server_counters(url)
    if client == FLEETBENCH:
        run = run_fleetbench(url, args.model, load, placement, args.timeout)
    else:
        run = run_peer(peer_of(args), url, args.model, load, placement, args.timeout)
    run.figures.update(server_figures(before, server_counters(url)))
    print(
        f"  C={load.concurrency} pair {pair + 1}: {client:10s} {placement.name:8s}"
        f" {load.requests:4d} requests {run.figures['total_tps']:7.2f} t/s,"
        f" CPU {run.figures['cpu_s']:6.2f} s, wall {run.figures['wall_s']:5.1f} s",
        flush=True,
    )
    return run


def _marginal(
    full: dict[tuple[str, str], Run], brief: Run, load: Workload, short: Workload
) -> dict[str, float]:
    """CPU per extra request, and per stream as a share of a core over the extra time."""
    long = full[brief.client, brief.placement].figures
    cpu = long["cpu_s"] - brief.figures["cpu_s"]
    seconds = long["measured_s"] - brief.figures["measured_s"]
    return {
        "marginal_cpu_ms_per_request": 1000 * cpu / (load.requests - short.requests),
        "marginal_cpu_pct_per_stream": 100 * cpu / seconds / load.concurrency
        if seconds > 0
        else math.nan,
    }


if __name__ == "__main__":
    main()
