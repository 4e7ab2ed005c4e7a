"""How many times a sweep measures each point (agent/runners/repeats.py): N times, or with
`repeats = "auto"` until the standard error of its S_TG is under the target, within caps of
repeats and time; checked as a rule on literal timings, then on the real in-process loop
and the real llama-batched-bench."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from fleetbench.agent.cli import app
from fleetbench.agent.runners import SweepSpec
from fleetbench.agent.runners.batched_bench_binary import BatchedBenchBinaryRunner
from fleetbench.agent.runners.llama_cpp_python import LlamaCppPythonRunner
from fleetbench.agent.runners.repeats import needs_more, relative_error, still_to_measure

AUTO = SweepSpec(repeats="auto")  # target 1.5%, 3 to 10 repeats, 900 s
KEY = (128, 32, 4)  # S_TG = 4 x 32 / T_TG = 128 / T_TG


def _timings(*t_tg: float) -> list[tuple[float, float]]:
    return [(0.1, t) for t in t_tg]


def test_the_relative_error_is_that_of_the_mean_of_s_tg() -> None:
    # S_TG 128, 64: mean 96, sample stdev 45.25, over sqrt(2): 33.3% of the mean
    assert relative_error(KEY, _timings(1.0, 2.0)) == pytest.approx(45.2548 / 96 / 2**0.5)
    assert relative_error(KEY, _timings(1.0)) is None
    # no generation: S_PP's (256 and 512: stdev 181.0, mean 384)
    assert relative_error((128, 0, 1), [(0.5, 0.0), (0.25, 0.0)]) == pytest.approx(1 / 3)


def test_fixed_repeats_measure_each_point_n_times() -> None:
    three = SweepSpec(repeats=3)
    assert needs_more(three, KEY, _timings(1.0, 1.0), elapsed_s=1e6)
    assert not needs_more(three, KEY, _timings(1.0, 1.0, 1.0), elapsed_s=0)


def test_auto_repeats_until_precise_within_their_caps() -> None:
    steady = _timings(1.0, 1.01, 0.99)  # 1% spread: 0.58% standard error
    noisy = _timings(1.0, 1.3, 0.8)  # 24% spread
    assert needs_more(AUTO, KEY, steady[:2], elapsed_s=0)  # fewer than 3 say nothing
    assert not needs_more(AUTO, KEY, steady, elapsed_s=0)
    assert needs_more(AUTO, KEY, noisy, elapsed_s=0)
    assert not needs_more(AUTO, KEY, noisy * 4, elapsed_s=0)  # 12 >= max_repeats (10)
    assert not needs_more(AUTO, KEY, noisy, elapsed_s=900)  # the time budget is spent
    assert needs_more(AUTO, KEY, [], elapsed_s=900)  # but every point is measured once
    measured = {KEY: noisy, (128, 32, 1): steady}
    assert still_to_measure(AUTO, measured, elapsed_s=0) == [KEY]


def test_the_in_process_loop_repeats_until_the_target(tiny_llama: Path) -> None:
    loose = SweepSpec(npp=(16,), ntg=(16,), npl=(1, 2), repeats="auto", repeat_target=1.0)
    strict = loose.model_copy(update={"repeat_target": 1e-9, "max_repeats": 4})
    for spec, repeats in ((loose, 3), (strict, 4)):
        outcome = LlamaCppPythonRunner().run(tiny_llama, spec)
        assert [(p.b, p.repeats) for p in outcome.points] == [(1, repeats), (2, repeats)]
        assert all(p.s_tg_stdev is not None and p.s_tg_stdev >= 0 for p in outcome.points)


def test_the_binary_is_run_again_until_the_target(batched_bench: Path, gemma: Path) -> None:
    # Gemma, not the tiny llama: a run of a few milliseconds can exit before batched-bench's
    # log thread writes its last lines (see test_batched_bench_binary.py)
    spec = SweepSpec(
        npp=(16,), ntg=(4,), npl=(1, 2), repeats="auto", repeat_target=1e-9, max_repeats=3
    )
    outcome = BatchedBenchBinaryRunner(batched_bench).run(gemma, spec)
    assert [(p.b, p.repeats) for p in outcome.points] == [(1, 3), (2, 3)]


def test_the_cli_takes_auto_and_refuses_other_words(tiny_llama: Path) -> None:
    bad = CliRunner().invoke(app, ["sweep", "-m", str(tiny_llama), "--repeats", "often"])
    assert bad.exit_code == 2
    assert "'often': give a number of times, or auto" in bad.output


@pytest.mark.parametrize(
    ("args", "option", "problem"),
    [
        (["--ubatch-size", "0"], "--ubatch-size", "greater than or equal to 1"),
        (["--ctx-size", "0"], "--ctx-size", "greater than or equal to 1"),
        (["--cache-type-k", "q9"], "--cache-type-k", "Input should be"),
        (["--flash-attn", "maybe"], "--flash-attn", "'on', 'off' or 'auto'"),
        (["--repeats", "1001"], "--repeats", "less than or equal to 1000"),
    ],
)
def test_a_setting_the_sweep_spec_refuses_names_its_option(
    tiny_llama: Path, args: list[str], option: str, problem: str
) -> None:
    """The options' bounds are SweepSpec's, and its error names the option it came from."""
    bad = CliRunner().invoke(app, ["sweep", "-m", str(tiny_llama), *args])
    assert bad.exit_code == 2, bad.output
    said = " ".join(bad.output.split())
    assert f"Invalid value for {option}:" in said and problem in said


def test_the_sweep_s_help_shows_the_sweep_spec_s_defaults() -> None:
    shown = CliRunner().invoke(app, ["sweep", "--help"], env={"COLUMNS": "200"}).output
    assert "concurrencies B, comma list [default: 1,2,4,8]" in shown
    assert "on, off or auto [default: auto]" in shown and "[default: 2048]" in shown
    assert "KV cells [default: sized to fit]" in shown  # no longer read as markup
