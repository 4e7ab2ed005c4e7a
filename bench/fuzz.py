"""A longer fuzzing run: the suite's schemathesis test (tests/registry/test_fuzz.py, every
operation of the OpenAPI schema, valid and invalid inputs, every check, against a live
registry on SQLite and on PostgreSQL) with many more examples per operation than CI runs.

    .venv/bin/python bench/fuzz.py                 # 1,000 examples per operation and mode
    .venv/bin/python bench/fuzz.py --examples 200

Prints how many operations and modes ran on each database, how many requests that made, the
failures (none expected) and the time taken. Needs PostgreSQL on 127.0.0.1:5432, as the suite.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import write_result

ROOT = Path(__file__).resolve().parent.parent


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=1000, help="per operation and mode")
    args = parser.parse_args(argv)
    env = {**os.environ, "FLEETBENCH_FUZZ_EXAMPLES": str(args.examples)}
    began = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-rA",
            "tests/registry/test_fuzz.py",
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    took = time.monotonic() - began
    results = re.findall(r"^(PASSED|FAILED) .*\[(sqlite|postgresql)-(.+)\]", done.stdout, re.M)
    figures: dict[str, object] = {"examples": args.examples}
    for database in ("sqlite", "postgresql"):
        mine = [(outcome, case) for outcome, db, case in results if db == database]
        failed = [case for outcome, case in mine if outcome == "FAILED"]
        print(
            f"{database}: {len(mine)} operation x mode cases, up to {args.examples} requests "
            f"each ({len(mine) * args.examples:,} at most), {len(failed)} failed"
        )
        for case in failed:
            print(f"  FAILED {case}")
        figures[database] = {
            "cases": len(mine),
            "requests_at_most": len(mine) * args.examples,
            "failed": failed,
        }
    said = (done.stdout.strip().splitlines() or [""])[-1]
    print(f"took {took / 60:.1f} min; pytest said: {said}")
    if done.returncode != 0:
        print(done.stdout[-20000:])
    figures |= {"took_s": round(took, 1), "pytest_said": said, "exit_status": done.returncode}
    write_result("fuzz", figures, arguments=argv)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
