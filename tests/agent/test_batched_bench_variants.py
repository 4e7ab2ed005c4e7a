"""Every llama-batched-bench table people post, read from real posted outputs (each
fixture's source is in its test): PL for B, units in parentheses with markdown alignment
rows, several tables with their own settings lines among prose and other tools' tables, a
header with no rows after it (the run crashed), and a table whose line breaks were lost."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from fleetbench.agent.batched_bench_output import (
    BadRow,
    NoTableFound,
    PassedOver,
    parse_batched_bench_output,
)
from fleetbench.agent.batched_bench_table import Header, NotOurs, header_of, rows_of
from fleetbench.agent.importer import reports_from_output
from fleetbench.contract.wire import ModelInfo
from tests.factories import FIXTURES

IMPORTS = FIXTURES / "import"


def _parse(
    name: str,
) -> tuple[list[tuple[int, list[tuple[int, int, int, float | None]]]], list[str]]:
    """Each run's first line and (PP, TG, B, S_TG) points, and what was passed over."""
    passed_over: list[PassedOver] = []
    runs = parse_batched_bench_output((IMPORTS / name).read_text(), passed_over=passed_over)
    found = [(r.line, [(p.pp, p.tg, p.b, p.s_tg) for p in r.points]) for r in runs]
    return found, [str(p) for p in passed_over]


def test_pl_for_b_and_right_aligned_rows_beside_the_tools_own_table() -> None:
    """A GGUF model card of stepfun-ai/Step-3.7-Flash (Hugging Face, 2026), its sections 2,
    4 (Mac Studio M4 Max, Q4_K_S and Q3_K_L) and 6: one table reformatted by hand with `PL`
    and `|---:|` rows, one as the tool prints it (`|131072 |`: no space after the pipe), and
    the card's own tables of files and licenses."""
    (pl_at, pl_points), (b_at, b_points) = _parse("step-3.7-flash-model-card.md")[0]
    assert (pl_at, b_at) == (19, 36)
    assert pl_points[0] == (0, 128, 1, 51.20)
    assert pl_points[-1] == (262144, 128, 1, 9.71)
    assert len(pl_points) == len(b_points) == 8
    assert b_points[-2] == (131072, 128, 1, 18.92)
    assert _parse("step-3.7-flash-model-card.md")[1] == [
        "line 3: a table of other columns (File, Quant, Size, Notes)",
        "line 49: a table of other columns (Component, License)",
    ]


def test_units_in_parentheses_and_a_spaced_alignment_row() -> None:
    """elliottzheng/Step-3.5-Flash, llama.cpp/docs/step3.5-flash.md: `T_PP (s)`,
    `S_PP (t/s)`, ..., under them `| ------ | --- |`."""
    passed_over: list[PassedOver] = []
    text = (IMPORTS / "step-3.5-flash-units-in-parentheses.md").read_text()
    [run] = parse_batched_bench_output(text, passed_over=passed_over)
    assert run.columns == ["pp", "tg", "b", "n_kv", "t_pp", "s_pp", "t_tg", "s_tg", "t", "s"]
    assert [(p.pp, p.n_kv, p.t_tg, p.s_tg) for p in run.points] == [
        (0, 128, 2.657, 48.18),
        (2048, 2176, 2.785, 45.96),
        (262144, 262272, 14.409, 8.88),
    ]
    assert passed_over == []


def test_several_tables_with_their_settings_lines_and_llama_bench_between() -> None:
    """ggml-org/llama.cpp PR #16894 (scripts/bench-models.sh output, 2025-10-31): the
    settings line before the table, llama-bench's table after it."""
    [(line, points)], passed_over = _parse("bench-models-pr-16894.md")
    assert line == 7
    assert [(b, s_tg) for _, _, b, s_tg in points] == [
        (1, 79.04),
        (2, 136.37),
        (4, 224.52),
        (1, 74.77),
        (2, 124.48),
        (4, 195.49),
    ]
    assert passed_over == ["line 18: a llama-bench table, not llama-batched-bench's"]
    [run] = parse_batched_bench_output((IMPORTS / "bench-models-pr-16894.md").read_text())
    assert (run.settings.n_ctx, run.settings.n_ubatch, run.settings.flash_attn) == (
        20480,
        2048,
        "on",
    )
    assert run.settings.n_gpu_layers == -1


def test_the_2023_settings_line_and_rows_ending_in_a_backslash() -> None:
    """A write-up of Llama-2 7B on an NVIDIA T4 (late 2023, `./batched-bench` with
    positional arguments): the settings line before `n_batch` existed (with `mmq`), each
    line ending in a markdown line break `\\`, three tables each padded its own way, and a
    run that died of CUDA out-of-memory before printing any header."""
    text = (IMPORTS / "t4-deep-dive-2023.md").read_text()
    first, second, third = parse_batched_bench_output(text)
    assert [(p.b, p.n_kv, p.s_tg) for p in first.points] == [(1, 1024, 17.77), (2, 2048, 30.79)]
    settings = first.settings
    assert (settings.n_ctx, settings.pp_shared, settings.n_gpu_layers, settings.n_threads) == (
        4096,
        False,
        99,
        4,
    )
    assert settings.n_batch is None  # not printed before 2024
    assert [(p.pp, p.s_tg) for p in second.points] == [(512, 38.65)]
    assert [(p.pp, p.s_tg) for p in third.points] == [(512, 29.72)]
    assert second.settings.n_ctx is None  # a settings line describes only the table after it


def test_a_header_with_no_rows_is_a_failed_run_with_its_settings() -> None:
    """ggml-org/llama.cpp issue #13553 ("No output using llama-batched-bench", build 5374):
    -npl 128 in a 4096-cell cache; the header and its alignment row merged into one line,
    then the timings, and no error."""
    [run] = parse_batched_bench_output((IMPORTS / "no-rows-issue-13553.log").read_text())
    assert run.line == 2 and run.points == []
    assert run.failure == (
        "the table has no rows: the run stopped before its first row and printed no error"
    )
    assert (run.settings.n_ctx, run.settings.n_threads, run.settings.flash_attn) == (
        4096,
        48,
        "off",
    )


def test_the_error_printed_after_a_header_is_the_failed_runs_reason() -> None:
    """The crash of ikawrakow/ik_llama.cpp issue #389 (`GGML_ASSERT(fms.S[j] > 0) failed`
    from iqk_mul_mat.cpp), printed where the first row would be."""
    lines = (IMPORTS / "crash-after-two-rows-ik-389.log").read_text().splitlines()
    header_only = "\n".join(lines[:2] + lines[4:])
    [run] = parse_batched_bench_output(header_only)
    assert run.failure == (
        "the run stopped before its first row: /app/llama.cpp/ggml/src/iqk/"
        "iqk_mul_mat.cpp:16600: GGML_ASSERT(fms.S[j] > 0) failed"
    )
    # As posted, the rows before the crash are measurements: a run of two points.
    [partial] = parse_batched_bench_output("\n".join(lines))
    assert partial.failure is None
    assert [(p.b, p.s_tg) for p in partial.points] == [(1, 12.15), (2, 25.97)]


def test_a_log_whose_line_breaks_were_lost() -> None:
    """r/LocalLLaMA, "My DeepSeek V4 Pro at home got faster again" (2026-07-03): the command,
    a loader warning, the settings line (its 2026 prefix `llama_batched_bench:`) and the
    whole table on one line, padding collapsed."""
    [run] = parse_batched_bench_output((IMPORTS / "one-line-reddit-deepseek-v4.txt").read_text())
    assert [(p.pp, p.n_kv, p.s_tg) for p in run.points] == [
        (8192, 8320, 11.73),
        (16384, 16512, 11.62),
        (32768, 32896, 11.36),
        (65536, 65664, 11.01),
        (131072, 131200, 10.42),
        (262144, 262272, 9.35),
        (524288, 524416, 7.77),
        (1048064, 1048192, 5.83),
    ]
    assert (run.settings.n_ctx, run.settings.n_ubatch, run.settings.tg_separate) == (
        1048576,
        8192,
        False,
    )


def test_a_one_line_table_whose_rows_cannot_be_told_apart_is_a_clear_error() -> None:
    """The same post with one row's cell lost (as a paste that drops a cell would): the
    boundaries between rows no longer say which cell belongs to which row."""
    text = (IMPORTS / "one-line-reddit-deepseek-v4.txt").read_text()
    broken = text.replace("| 16384 | 128 | 1 | 16512 |", "| 16384 | 128 | 16512 |")
    with pytest.raises(BadRow, match=r"line 1: a table whose line breaks were lost") as raised:
        parse_batched_bench_output(broken)
    assert "rows of 9, 10 cells under a header of 10" in str(raised.value)


def test_columns_the_author_added_or_dropped_are_read_past_and_named() -> None:
    """A table as people post it: a column added (whatever it holds), others dropped (no
    S_PP, no times); read by the columns it has."""
    text = (
        "| PP | TG | B | N_KV | S_TG t/s | J/token | GPU temp |\n|---|---|---|---|---|---|---|\n"
        "| 128 | 32 | 1 | 160 | 50.00 | 0.4 | 61 C |\n"
        "| 128 | 32 | 4 | 640 | 120.00 | 0.2 | 70 C |\n"
    )
    [run] = parse_batched_bench_output(text)
    assert run.left_out == ("J/token", "GPU temp")
    assert [(p.b, p.n_kv, p.s_tg, p.s_pp) for p in run.points] == [
        (1, 160, 50.0, None),
        (4, 640, 120.0, None),
    ]
    # derived from what remains: T_TG = B x TG / S_TG
    assert [p.t_tg for p in run.points] == [pytest.approx(0.64), pytest.approx(128 / 120)]
    assert header_of(["PP", "TG", "B", "S_TG t/s", "S_TG t/s"]) == NotOurs(
        "a llama-batched-bench header naming a column twice", True
    )


def test_nothing_importable_says_what_it_looked_for_and_what_it_passed_over() -> None:
    text = (IMPORTS / "bench-models-pr-16894.md").read_text().split("- `llama-bench`")[1]
    with pytest.raises(NoTableFound) as raised:
        parse_batched_bench_output(text)
    message = str(raised.value)
    assert "'| PP | TG | B | N_KV | S_PP t/s | S_TG t/s |'" in message and "PL" in message
    assert "passed over line 3: a llama-bench table, not llama-batched-bench's" in message


@pytest.mark.parametrize(
    ("cells", "columns"),
    [
        (["PP", "TG", "PL", "N_KV", "S_TG t/s"], ["pp", "tg", "b", "n_kv", "s_tg"]),
        (["pp", "tg", "b", "S_TG (t/s)"], ["pp", "tg", "b", "s_tg"]),
        (["PP", "TG", "B", "T_TG [s]", "T (s)", "S (t/s)"], ["pp", "tg", "b", "t_tg", "t", "s"]),
    ],
)
def test_header_spellings(cells: list[str], columns: list[str]) -> None:
    assert header_of(cells) == Header(columns)


def test_a_header_without_a_decode_figure_is_not_a_table_to_import() -> None:
    assert header_of(["PP", "TG", "PL", "T_PP s", "S_PP t/s"]) == NotOurs(
        "a llama-batched-bench header without S_TG or T_TG", False
    )


def test_rows_of_a_line() -> None:
    assert rows_of("| 1 | 2 |") == [["1", "2"]]
    assert rows_of("|---|:--:|") == [None]
    assert rows_of("| a | b | |---|---| | 1 | 2 | | 3 | 4 |") == [
        ["a", "b"],
        None,
        ["1", "2"],
        ["3", "4"],
    ]
    assert rows_of("| 1 | 2 |\\") == [["1", "2"]]  # a markdown line break after the row


HEADER = (
    "|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s "
    "|    S t/s |"
)
ROW = (
    "|   512 |    128 |    1 |    640 |    0.500 |  1024.00 |    2.000 |    64.00 |    2.500 "
    "|   256.00 |"
)


@pytest.mark.parametrize(
    "row",
    [
        ROW.replace("   64.00 ", "**64.00**"),
        ROW + " fast |",
        ROW.replace("1024.00", "1,024.0"),
    ],
)
def test_rows_that_do_not_fit_their_header_are_an_error_not_a_crash(row: str) -> None:
    with pytest.raises(BadRow, match=r"line 3: a row that does not fit .* header at line 1"):
        parse_batched_bench_output(f"{HEADER}\n|---|\n{row}\n")


def test_a_quoted_table_is_read() -> None:
    """A GitHub reply quoting a table: each line begins with `> `."""
    [run] = parse_batched_bench_output(f"> {HEADER}\n> |---|---|\n> {ROW}\n")
    assert [(p.b, p.s_tg) for p in run.points] == [(1, 64.0)]


def test_a_header_shown_as_an_example_before_the_results_is_passed_over() -> None:
    text = f"The columns:\n\n{HEADER}\n\nThe failed attempt, then the run:\n\n{HEADER}\n{ROW}\n"
    passed_over: list[PassedOver] = []
    [run] = parse_batched_bench_output(text, passed_over=passed_over)
    assert run.line == 7 and run.failure is None
    assert [str(p) for p in passed_over] == [
        "line 3: a llama-batched-bench header with no rows before the next table"
    ]


def test_a_crash_line_is_made_storable_and_two_crashes_are_two_runs() -> None:
    crash = "CUDA error: out of memory \x00\x00 garbage"
    text = f"{HEADER}\n{crash}\n\n{HEADER}\n{crash}\n"
    first, second = parse_batched_bench_output(text)
    assert (
        first.failure
        == "the run stopped before its first row: CUDA error: out of memory \ufffd\ufffd garbage"
    )
    assert second.failure == first.failure
    reports = reports_from_output(
        text, node="n1", model=ModelInfo(name="m"), measured_at=datetime(2026, 1, 1, tzinfo=UTC)
    )
    assert [r.report.status for r in reports] == ["failed", "failed"]
    assert reports[0].report.run_id != reports[1].report.run_id


def test_a_one_line_log_keeps_the_build_line_before_its_settings() -> None:
    text = (
        "build: 6527 (e7a5130a) with cc (GCC) 13.2.1 ggml_cuda_init: found 1 CUDA devices "
        "main: n_kv_max = 4096, n_batch = 2048, is_pp_shared = 0 | PP | TG | B | S_TG t/s | "
        "| 512 | 128 | 1 | 60.00 |"
    )
    [run] = parse_batched_bench_output(text)
    assert (run.engine.build_number, run.engine.backend, run.settings.n_ctx) == (
        6527,
        "CUDA",
        4096,
    )


def test_a_column_without_a_name_is_passed_over_not_an_error() -> None:
    passed_over: list[PassedOver] = []
    labelled = "| | PP | TG | B | S_TG t/s |\n|---|---|---|---|---|\n| GPU0 | 1 | 2 | 1 | 3.0 |\n"
    text = f"{labelled}\n{HEADER}\n{ROW}\n"
    [run] = parse_batched_bench_output(text, passed_over=passed_over)
    assert run.line == 5
    assert [str(p) for p in passed_over] == [
        "line 1: a table of PP, TG and B with a column without a name"
    ]


def test_a_settings_line_no_run_may_carry_names_the_table() -> None:
    text = f"main: n_kv_max = 4294967296, n_batch = 2048\n{HEADER}\n{ROW}\n"
    with pytest.raises(BadRow, match=r"line 2: its settings: n_ctx: Input should be less"):
        parse_batched_bench_output(text)
