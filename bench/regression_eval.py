"""How well does the regression detector find real drops, and how often does it cry wolf?

A simulated fleet of series whose noise is real: run-to-run variation measured by repeated
sweeps on this machine (bench/collect_noise.py). Each series is a history on one build, a
build change, then a few runs on the new build, with the new build's runs slower by 5%, 10%
or 20%, or not at all (noise only, where any step reported is a false alarm). A second set of
noise-only series has no build change at all (the detector's unknown-cause path).

Noise: each series picks one measured (B, metric) series and replays its relative
deviations from their median in blocks of consecutive sweeps (a block bootstrap keeps the
drift and the outliers a real machine has, not just their spread).

A drop counts as detected when the detector reports a regression starting at the first run
on the new build. Targets: >= 95% of 10% drops detected, <= 1% of noise-only series alarmed.

    .venv/bin/python bench/regression_eval.py bench/data/noise-cpu-gemma3-270m.json
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import write_result
from fleetbench.agent.runners.repeats import needs_more
from fleetbench.contract.sweep_spec import SweepSpec
from fleetbench.registry.regressions.rules import DetectionSettings, SeriesRun, find_steps

START = datetime(2026, 1, 1, tzinfo=UTC)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("noise", type=Path, nargs="+", help="noise files (collect_noise.py)")
    parser.add_argument("--series", type=int, default=1000, help="series per cell")
    parser.add_argument("--history", default="8,20", help="runs before the change: min,max")
    parser.add_argument("--after", default="2,3,5", help="runs after the change, per column")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--z-known", type=float, help="override DetectionSettings.z_known")
    parser.add_argument("--z-unknown", type=float, help="override DetectionSettings.z_unknown")
    parser.add_argument(
        "--block", type=int, default=1, help="consecutive sweeps replayed together (1: iid)"
    )
    parser.add_argument(
        "--repeats",
        default="1",
        help="sweeps per run, median kept (agent --repeats): N, or auto (agent --repeats auto: "
        "until the standard error of the mean is under 1.5%%, 3 to 10 sweeps)",
    )
    return parser.parse_args(argv)


def load_noise(paths: Sequence[Path]) -> dict[str, list[float]]:
    """Relative deviations from the median, in sweep order, per file x (PP, TG, B, metric)."""
    found: dict[str, list[float]] = {}
    for path in paths:
        data = json.loads(path.read_text())
        values: dict[str, list[float]] = {}
        for repeat in data["repeats"]:
            for p in repeat["points"]:
                for metric in ("s_tg", "s_pp"):
                    if p.get(metric):
                        key = f"{path.name} pp{p['pp']} tg{p['tg']} b{p['b']} {metric}"
                        values.setdefault(key, []).append(p[metric])
        for key, series in values.items():
            centre = statistics.median(series)
            found[key] = [v / centre - 1 for v in series]
    return found


def replay(deviations: list[float], n: int, block: int, rng: random.Random) -> list[float]:
    """n deviations drawn as blocks of `block` consecutive measured sweeps."""
    out: list[float] = []
    while len(out) < n:
        start = rng.randrange(0, max(1, len(deviations) - block + 1))
        out.extend(deviations[start : start + block])
    return out[:n]


def auto_repeats(noise: list[float], rng: random.Random) -> float:
    """One run's deviation under `repeats = "auto"` (agent/runners/repeats.py): sweeps drawn
    until the relative standard error of their mean is at most 1.5% (3 to 10 of them), the
    median kept. The sweeps of one run are drawn independently: closer in time than runs,
    a real run's repeats share some drift, so this errs on the side of noise."""
    spec = SweepSpec(repeats="auto")
    draws: list[float] = []
    while not draws or needs_more(spec, KEY, [(1.0, 1 / (1 + d)) for d in draws], 0.0):
        draws.append(rng.choice(noise))
    REPEATS_USED.append(len(draws))
    return statistics.median(draws)


KEY = (0, 1, 1)  # a point whose S_TG is 1 / T_TG: the deviation's own scale
REPEATS_USED: list[int] = []


def make_series(builds: list[str], values: list[float], hardware: str = "node") -> list[SeriesRun]:
    return [
        SeriesRun(
            run_id=uuid.uuid4(),
            started_at=START + timedelta(hours=i),
            value=value,
            build=build,
            binding=None,
            hardware=hardware,
            settings="",
        )
        for i, (build, value) in enumerate(zip(builds, values, strict=True))
    ]


def trial(
    noise: list[float],
    *,
    before: int,
    after: int,
    drop: float,
    build_change: bool,
    settings: DetectionSettings,
    block: int,
    repeats: str,
    rng: random.Random,
) -> tuple[bool, bool]:
    """(detected the drop at the change, reported anything else)."""
    if repeats == "auto":
        deviations = [auto_repeats(noise, rng) for _ in range(before + after)]
    else:
        draws = [replay(noise, before + after, block, rng) for _ in range(int(repeats))]
        deviations = [statistics.median(d) for d in zip(*draws, strict=True)]
    centre = 100.0
    values = [centre * (1 + d) * (1 - drop if i >= before else 1) for i, d in enumerate(deviations)]
    builds = ["b1"] * before + (["b2"] * after if build_change else ["b1"] * after)
    runs = make_series(builds, values)
    steps = find_steps(runs, settings)
    hit = any(s.first is runs[before] and s.is_regression for s in steps)
    other = any(not (s.first is runs[before] and s.is_regression) for s in steps)
    return hit, other


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    noise = load_noise(args.noise)
    keys = sorted(noise)
    settings = DetectionSettings()
    if args.z_known is not None:
        settings = replace(settings, z_known=args.z_known)
    if args.z_unknown is not None:
        settings = replace(settings, z_unknown=args.z_unknown)
    low, high = (int(v) for v in args.history.split(","))
    afters = [int(v) for v in args.after.split(",")]

    spreads = sorted(statistics.pstdev(v) for v in noise.values())
    print(
        f"noise: {len(keys)} measured series, {min(len(v) for v in noise.values())}+ sweeps "
        f"each; run-to-run standard deviation median {100 * statistics.median(spreads):.2f}%, "
        f"range {100 * spreads[0]:.2f}-{100 * spreads[-1]:.2f}%"
    )
    print(
        f"detector: min_change {settings.min_change:.0%}, z {settings.z_known:g} at a known "
        f"change, {settings.z_unknown:g} otherwise, "
        f"confirm {settings.confirm_known} runs after a known change, "
        f"{settings.confirm_unknown} otherwise; history {low}-{high} runs; "
        f"{args.repeats} sweep(s) per run; {args.series} series per cell\n"
    )
    table: dict[str, dict[str, float]] = {}  # case -> runs after -> % of series
    figures: dict[str, object] = {
        "noise": {
            "series": len(keys),
            "sweeps_each_min": min(len(v) for v in noise.values()),
            "stdev_pct_median": round(100 * statistics.median(spreads), 2),
            "stdev_pct_range": [round(100 * spreads[0], 2), round(100 * spreads[-1], 2)],
        },
        "detector": {
            "min_change": settings.min_change,
            "z_known": settings.z_known,
            "z_unknown": settings.z_unknown,
            "confirm_known": settings.confirm_known,
            "confirm_unknown": settings.confirm_unknown,
        },
        "series_per_cell": args.series,
        "repeats": args.repeats,
        "block": args.block,
        "history": [low, high],
        "runs_after": afters,
        "detected_or_alarmed_pct": table,
    }
    header = "".join(f"{f'{a} runs after':>16}" for a in afters)
    print(f"{'case':<38}{header}")
    cases: list[tuple[str, float, bool, str]] = [
        ("5% drop at a build change: detected", 0.05, True, "hit"),
        ("10% drop at a build change: detected", 0.10, True, "hit"),
        ("20% drop at a build change: detected", 0.20, True, "hit"),
        ("noise only, build change: false alarms", 0.0, True, "any"),
        ("noise only, no change: false alarms", 0.0, False, "any"),
    ]
    for label, drop, build_change, count in cases:
        cells = []
        shares: dict[str, float] = {}
        for after in afters:
            hits = 0
            for _ in range(args.series):
                hit, other = trial(
                    noise[rng.choice(keys)],
                    before=rng.randint(low, high),
                    after=after,
                    drop=drop,
                    build_change=build_change,
                    settings=settings,
                    block=args.block,
                    repeats=args.repeats,
                    rng=rng,
                )
                hits += hit if count == "hit" else (hit or other)
            cells.append(f"{100 * hits / args.series:15.1f}%")
            shares[f"{after} runs after"] = round(100 * hits / args.series, 1)
        print(f"{label:<38}{''.join(cells)}")
        table[label] = shares
    if REPEATS_USED:
        print(
            f"\nrepeats auto: {statistics.mean(REPEATS_USED):.1f} sweeps per run on average "
            f"(median {statistics.median(REPEATS_USED):g}, "
            f"{100 * sum(n == 10 for n in REPEATS_USED) / len(REPEATS_USED):.0f}% at the cap of 10)"
        )
        figures["repeats_auto"] = {
            "sweeps_per_run_mean": round(statistics.mean(REPEATS_USED), 1),
            "sweeps_per_run_median": statistics.median(REPEATS_USED),
            "at_cap_pct": round(100 * sum(n == 10 for n in REPEATS_USED) / len(REPEATS_USED)),
        }
    print("\ntargets: 10% drops >= 95% detected; noise-only false alarms <= 1%")
    figures["targets"] = {"detected_10pct_drops_pct_min": 95, "false_alarms_pct_max": 1}
    write_result("regression_eval", figures, arguments=argv)


if __name__ == "__main__":
    main()
