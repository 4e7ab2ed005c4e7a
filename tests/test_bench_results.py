"""Each benchmark leaves its raw result under bench/results/ (bench.common.write_result), and
bench/README.md quotes figures only from files that are there."""

from __future__ import annotations

import ast
import json
import math
import os
import re
import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from bench.common import write_result

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
README = BENCH / "README.md"

# The modules of bench/ that are no benchmark, and why: they measure nothing of their own.
NOT_BENCHMARKS = {
    "common": "what the benchmarks share",
    "load_fleet": "bench/load.py's fleet: reports, database, history",
    "load_costs": "bench/load.py's cost sampling",
    "serving_clients": "bench/serving_compare.py's client runs",
    "aiperf_peer": "bench/serving_compare.py's peer",
    "collect_noise": "collects bench/data/noise-*.json, the input of bench/regression_eval.py",
}
BENCHMARKS = sorted(path.stem for path in BENCH.glob("*.py") if path.stem not in NOT_BENCHMARKS)


def test_a_result_holds_date_machine_commit_command_and_figures(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    figures = {
        "p50_ms": 12.5,
        "counts": [1, 2, 3],
        "by_b": {1: {"s_tg": 40.0}, 2: {"s_tg": 71.5}},
        "met": False,
        "note": None,
        "ratio": math.nan,
        "pair": (0.97, 1.03),
    }
    before = datetime.now(UTC).replace(microsecond=0)
    path = write_result("demo", figures, arguments=["--pairs", "3"], results_dir=tmp_path)
    after = datetime.now(UTC)

    assert path.parent == tmp_path
    assert f"result: {path}" in capsys.readouterr().out
    result = json.loads(path.read_text())
    assert result["benchmark"] == "demo"
    date = datetime.fromisoformat(result["date"])
    assert date.utcoffset() == timedelta(0) and before <= date <= after
    machine = result["machine"]
    assert machine["logical_cores"] == os.cpu_count() and machine["memory_bytes"] > 0
    assert machine["cpu"] and machine["os"] and machine["python"]
    git = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if git.returncode == 0:  # a checkout: its HEAD, and whether the tree differs from it
        head = git.stdout.strip()
        assert result["commit"]["sha"] == head and isinstance(result["commit"]["dirty"], bool)
        assert path.name == f"demo-{date:%Y-%m-%d}-{head[:7]}.json"
    else:  # an unpacked release: no commit to name
        assert result["commit"] == {"sha": None, "dirty": None}
        assert path.name == f"demo-{date:%Y-%m-%d}-nocommit.json"
    assert result["command"][1:] == ["--pairs", "3"]
    assert result["figures"] == {
        **figures,
        "by_b": {"1": {"s_tg": 40.0}, "2": {"s_tg": 71.5}},
        "ratio": None,  # strict JSON has no NaN
        "pair": [0.97, 1.03],
    }


def test_a_second_result_the_same_day_does_not_overwrite_the_first(tmp_path: Path) -> None:
    first = write_result("demo", {"run": 1}, arguments=[], results_dir=tmp_path)
    second = write_result("demo", {"run": 2}, arguments=[], results_dir=tmp_path)
    third = write_result("demo", {"run": 3}, arguments=[], results_dir=tmp_path)
    assert second.name == first.name.replace(".json", "-2.json")
    assert third.name == first.name.replace(".json", "-3.json")
    runs = [json.loads(p.read_text())["figures"]["run"] for p in (first, second, third)]
    assert runs == [1, 2, 3]


def test_a_figure_that_is_not_json_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="Path"):
        write_result("demo", {"where": tmp_path}, arguments=[], results_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def _write_result_names(path: Path) -> list[object]:
    """The benchmark names passed to write_result in `path`'s source."""
    names: list[object] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            called = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
            if called == "write_result" and node.args:
                first = node.args[0]
                names.append(first.value if isinstance(first, ast.Constant) else "?")
    return names


def test_the_lists_of_modules_are_up_to_date() -> None:
    assert set(NOT_BENCHMARKS) <= {path.stem for path in BENCH.glob("*.py")}
    assert {"placement_latency", "regression_eval", "gpu_check"} <= set(BENCHMARKS)


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_every_benchmark_writes_its_result_under_its_own_name(benchmark: str) -> None:
    assert _write_result_names(BENCH / f"{benchmark}.py") == [benchmark]


def _sections() -> dict[str, str]:
    """bench/README.md's `## ` sections: heading -> body."""
    parts = re.split(r"^## (.+)$", README.read_text(), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


@pytest.mark.parametrize("benchmark", BENCHMARKS)
def test_the_readme_has_a_section_for_every_benchmark_with_its_latest_result(
    benchmark: str,
) -> None:
    script = f"bench/{benchmark}.py"
    mine = [body for heading, body in _sections().items() if script in heading]
    assert len(mine) == 1, f"bench/README.md: no section (or several) whose heading names {script}"
    [latest] = [line for line in mine[0].splitlines() if line.startswith("Latest result")]
    links = re.findall(r"\]\((results/[^)\s]+)\)", latest)
    assert links or "none recorded in bench/results/ yet" in latest, latest
    for link in links:
        result = json.loads((BENCH / link).read_text())
        assert result["benchmark"] == benchmark, link


def test_every_result_the_readme_links_to_exists() -> None:
    text = README.read_text()
    links = re.findall(r"\]\((results/[^)\s]+)\)", text)
    assert links, "bench/README.md links to no result"
    missing = [link for link in links if not (BENCH / link).is_file()]
    assert not missing, f"bench/README.md links to results that are not there: {missing}"
