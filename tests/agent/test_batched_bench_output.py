"""Reading llama-batched-bench output: tables, settings, builds, JSONL, noise."""

from __future__ import annotations

import re

import pytest

from fleetbench.agent.batched_bench_build import parse_build
from fleetbench.agent.batched_bench_output import (
    BadRow,
    NoTableFound,
    parse_batched_bench_output,
)
from tests.factories import FIXTURES


def _read(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_full_table_with_settings_and_build() -> None:
    [run] = parse_batched_bench_output(_read("batched-bench-10col.log"))
    assert run.format == "table"
    assert (run.engine.build_number, run.engine.commit) == (6527, "e7a5130a")
    s = run.settings
    assert (s.n_ctx, s.n_batch, s.n_ubatch) == (2048, 2048, 512)
    assert (s.flash_attn, s.pp_shared, s.tg_separate) == ("auto", False, False)
    assert (s.n_gpu_layers, s.n_threads, s.n_threads_batch) == (-1, 2, 2)
    assert [p.b for p in run.points] == [1, 2, 4, 8]
    last = run.points[-1]
    assert (last.pp, last.tg, last.n_kv) == (128, 32, 1280)
    assert (last.t_pp, last.s_pp, last.t_tg, last.s_tg) == (0.751, 1363.52, 0.598, 428.09)
    assert (last.t, last.s) == (1.349, 948.85)


def test_old_main_prefix_shared_prompt_and_cuda_backend() -> None:
    [run] = parse_batched_bench_output(_read("batched-bench-old-main.log"))
    assert (run.engine.build_number, run.engine.commit) == (4589, "1d1e6a90")
    assert run.engine.backend == "CUDA"
    assert run.settings.flash_attn == "on"
    assert run.settings.pp_shared is True
    assert run.settings.tg_separate is None  # old builds did not print it
    # one copy of the prompt for all sequences: PP + B*TG cells, a unified cache
    assert [p.n_kv for p in run.points] == [640, 1024, 2560]
    assert run.settings.kv_unified is True


def test_six_column_report_fills_only_what_follows_exactly() -> None:
    text = _read("report-two-builds.md")
    before, after = parse_batched_bench_output(text)
    assert (before.engine.build_number, before.engine.commit) == (6400, "4a9b2c1")
    assert (after.engine.build_number, after.engine.commit) == (6527, "e7a5130a")
    assert before.columns == ["pp", "tg", "b", "n_kv", "s_pp", "s_tg"]
    b1, b8, _ = before.points
    # T_TG = B*TG/S_TG always follows
    assert b8.t_tg == pytest.approx(8 * 128 / 610.02)
    # B=1: shared or not, the prompt work is the same, so T_PP, T and S follow too
    assert b1.t_pp == pytest.approx(512 / 9821.40)
    assert b1.t == pytest.approx(512 / 9821.40 + 128 / 120.51)
    assert b1.s == pytest.approx(640 / b1.t)
    # B=8 with N_KV = B*(PP+TG): separate prompts, or a shared one in a split cache; the
    # prompt's token count is unknown, so T_PP is left empty rather than guessed
    assert (b8.t_pp, b8.t, b8.s) == (None, None, None)


def test_noise_inside_a_table_is_skipped() -> None:
    _, after = parse_batched_bench_output(_read("report-two-builds.md"))
    assert [p.b for p in after.points] == [1, 8, 32]
    assert after.points[1].s_tg == 571.96


def test_unified_shared_prompt_is_recognised_from_n_kv() -> None:
    text = """
| PP | TG | B | N_KV | S_PP t/s | S_TG t/s |
|----|----|---|------|----------|----------|
| 512 | 128 | 4 | 1024 | 1000.00 | 200.00 |
"""
    [run] = parse_batched_bench_output(text)
    [point] = run.points
    # N_KV = PP + B*TG only with a shared prompt: prefill processed 512 tokens, not 2048
    assert point.t_pp == pytest.approx(512 / 1000)
    assert point.s == pytest.approx((512 + 4 * 128) / (0.512 + 4 * 128 / 200))


def test_jsonl_records() -> None:
    [run] = parse_batched_bench_output(_read("batched-bench.jsonl"))
    assert run.format == "jsonl"
    assert (run.engine.build_number, run.engine.commit, run.engine.backend) == (
        7200,
        "abc1234",
        "CUDA",
    )
    assert (run.settings.n_ctx, run.settings.flash_attn, run.settings.n_gpu_layers) == (
        4096,
        "off",
        99,
    )
    assert [(p.b, p.n_kv) for p in run.points] == [(1, 320), (2, 640), (4, 1280)]
    assert run.points[2].s_tg == pytest.approx(4 * 64 / 0.350)


def test_newer_version_line() -> None:
    text = "version: 0.0.7200 (build 7200, commit 1a2b3c4d)\n" + _read("batched-bench.jsonl")
    [run] = parse_batched_bench_output(text)
    assert (run.engine.build_number, run.engine.commit) == (7200, "abc1234")
    [run] = parse_batched_bench_output(text.replace("version: 7200 (abc1234)", ""))
    assert (run.engine.build_number, run.engine.commit) == (7200, "1a2b3c4d")


def test_rounded_short_times_are_mended_from_the_speed() -> None:
    # T_TG printed as 0.012 s for 1*1/S_TG = 0.01163 s: 3.2% apart by rounding alone
    text = """
|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|    16 |      1 |    1 |     17 |    0.010 |  1600.00 |    0.012 |    86.00 |    0.022 |   772.73 |
"""
    [run] = parse_batched_bench_output(text)
    assert run.points[0].t_tg == pytest.approx(1 / 86.0)


def test_inf_is_treated_as_unknown() -> None:
    text = """
| PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
|----|----|---|------|--------|----------|--------|----------|-----|-------|
| 0 | 16 | 1 | 16 | 0.000 | nan | 0.200 | 80.00 | 0.200 | 80.00 |
"""
    [run] = parse_batched_bench_output(text)
    assert run.points[0].s_pp is None
    assert run.points[0].s_tg == 80.0


def test_article_text_with_prose_run_into_the_last_row() -> None:
    text = """| PP | TG | B | N_KV | S_PP t/s | S_TG t/s |
|-----|-----|----|-------|----------|----------|
| 512 | 128 | 16 | 10240 | 284.82 | 163.18 |
| 512 | 128 | 32 | 20480 | 286.06 | 193.55 |S_TG is total decode throughput."""
    [run] = parse_batched_bench_output(text)
    assert [p.s_tg for p in run.points] == [163.18, 193.55]


@pytest.mark.parametrize("text", [_read("no-table.txt"), "", "| PP | TG | B |\n|--|--|--|"])
def test_no_table_is_a_clear_error(text: str) -> None:
    with pytest.raises(NoTableFound, match="no llama-batched-bench table found"):
        parse_batched_bench_output(text)


def test_a_later_table_of_other_numbers_is_not_taken_for_rows() -> None:
    text = (
        _read("report-two-builds.md")
        + """
## Cost

| GPUs | nodes | W | price | eur/h | eur/Mtok |
|------|-------|---|-------|-------|----------|
| 8 | 2 | 700 | 1.5 | 12 | 3.1 |
"""
    )
    _, after = parse_batched_bench_output(text)
    assert [p.b for p in after.points] == [1, 8, 32]


def test_a_separator_after_rows_ends_the_table() -> None:
    text = """
| PP | TG | B | N_KV | S_PP t/s | S_TG t/s |
|----|----|---|------|----------|----------|
| 512 | 128 | 1 | 640 | 282.07 | 28.30 |
|----|----|---|------|----------|----------|
| 9 | 9 | 9 | 9 | 9 | 9 |
"""
    [run] = parse_batched_bench_output(text)
    assert [p.b for p in run.points] == [1]


def test_shared_prompt_from_the_settings_line_gives_the_prefill_time() -> None:
    settings = (
        "llama_batched_bench: n_kv_max = 8192, n_batch = 2048, n_ubatch = 512, flash_attn = 1, "
        "is_pp_shared = 1, is_tg_separate = 0, n_gpu_layers = 99, n_threads = 8, "
        "n_threads_batch = 8"
    )
    text = (
        settings
        + """
| PP | TG | B | N_KV | S_PP t/s | S_TG t/s |
|----|----|---|------|----------|----------|
| 512 | 128 | 4 | 2560 | 1000.00 | 200.00 |
"""
    )
    [run] = parse_batched_bench_output(text)
    [point] = run.points
    assert point.t_pp == pytest.approx(512 / 1000)  # one prompt of 512, not 4 x 512
    # shared, yet N_KV = B*(PP+TG): each sequence has its own copy, the cache is split
    assert run.settings.kv_unified is False


def test_jsonl_nan_and_inf_are_unknown_figures() -> None:
    text = (
        '{"n_kv_max": 4096, "pp": 0, "tg": 32, "pl": 2, "n_kv": 64, "t_pp": 0.000000, '
        '"speed_pp": nan, "t_tg": 0.400000, "speed_tg": 160.000000, "t": 0.400000, '
        '"speed": 160.000000}\n'
        '{"n_kv_max": 4096, "pp": 0, "tg": 32, "pl": 4, "n_kv": 128, "t_pp": 0.000000, '
        '"speed_pp": -inf, "t_tg": 0.500000, "speed_tg": 256.000000, "t": 0.500000, '
        '"speed": 256.000000}\n'
    )
    [run] = parse_batched_bench_output(text)
    assert [(p.b, p.s_pp, p.s_tg) for p in run.points] == [(2, None, 160.0), (4, None, 256.0)]


def test_jsonl_blocks_with_other_settings_are_separate_runs() -> None:
    records = _read("batched-bench.jsonl").splitlines()[2:]
    other = [r.replace('"n_threads": 8', '"n_threads": 16') for r in records]
    runs = parse_batched_bench_output("\n".join(records + other))
    assert [(r.settings.n_threads, len(r.points)) for r in runs] == [(8, 3), (16, 3)]


@pytest.mark.parametrize(
    ("row", "message"),
    [
        (
            "| 512 | 128 | 1 | 640 | 1.000 | 512.00 | 4.000 | 28.30 | 5.000 | 128.00 |",
            "line 4: s_tg: Value error, s_tg=28.3 disagrees",
        ),
        (
            "| 512 | 128 | 0 | 640 | 1.000 | 512.00 | 4.523 | 28.30 | 5.523 | 115.88 |",
            "line 4: b: Input should be greater than or equal to 1",
        ),
    ],
)
def test_an_invalid_row_names_its_line(row: str, message: str) -> None:
    text = f"""
| PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | T s | S t/s |
|----|----|---|------|--------|----------|--------|----------|-----|-------|
{row}
"""
    with pytest.raises(BadRow, match=re.escape(message)):
        parse_batched_bench_output(text)


def test_a_broken_jsonl_record_names_its_line() -> None:
    with pytest.raises(BadRow, match="line 2: not a JSON record"):
        parse_batched_bench_output('\n{"pp": 1, "tg": 2, "pl": 1, "speed_tg": oops}')


@pytest.mark.parametrize(
    ("text", "number", "commit"),
    [
        (
            "version: 0.5.0-dev (build 1, commit 0c1e570)\nbuilt with GNU 12.2.0 for Linux",
            1,
            "0c1e570",
        ),
        ("version: 4589 (1d1e6a90)\nbuilt with cc (Debian 12.2.0) for x86_64", 4589, "1d1e6a90"),
        # built from a source archive, without git (a release's number given to CMake, or not)
        ("version: 0.6.0-dev (build 0, commit unknown)\nbuilt with GNU 12.2.0", None, None),
        ("version: 0.6.0-dev (build 11434, commit unknown)\nbuilt with GNU 12.2.0", 11434, None),
        ("nothing useful", None, None),
    ],
)
def test_parse_build_from_version_output(text: str, number: int | None, commit: str | None) -> None:
    build = parse_build(text)
    assert (build.build_number, build.commit) == (number, commit)


# --- what real outputs posted by users contain (fixtures written in those formats) ----------

IMPORTS = FIXTURES / "import"


def test_speeds_printed_with_two_decimals_on_a_slow_machine_and_crlf() -> None:
    """S_TG 0.16 for 5 tokens in 30.895 s is 1.1% off B*TG/T_TG by rounding alone: the
    speed is taken from the time, which is printed more precisely."""
    text = (IMPORTS / "slow-two-decimals-crlf.md").read_bytes().decode()  # CRLF kept
    [run] = parse_batched_bench_output(text)
    assert [p.b for p in run.points] == [1, 2, 3]
    first = run.points[0]
    assert first.t_tg == 30.895 and first.s_tg == pytest.approx(5 / 30.895)
    assert [p.s_tg for p in run.points[1:]] == [0.30, 0.43]  # within 1% as printed
    assert (run.engine.build_number, run.engine.commit) == (4910, "2c9f833d")
    assert (run.settings.n_threads, run.settings.flash_attn) == (4, "off")


def test_crlf_and_lone_cr_line_ends_read_as_newlines() -> None:
    crlf = (IMPORTS / "slow-two-decimals-crlf.md").read_bytes().decode()
    mixed = (IMPORTS / "build-line-at-the-end.md").read_bytes().decode()
    assert "\r\n" in crlf and "|\r|" in mixed  # a lone CR between two rows
    assert [p.b for p in parse_batched_bench_output(crlf)[0].points] == [1, 2, 3]
    assert [p.b for p in parse_batched_bench_output(mixed)[1].points] == [1, 2]


def test_one_build_line_before_a_table_is_not_given_to_the_tables_before_it() -> None:
    table = "| PP | TG | B | S_TG t/s |\n|---|---|---|---|\n| 128 | 32 | 1 | 50.00 |\n"
    first, second = parse_batched_bench_output(f"{table}\nbuild: 100 (aaaaaaa)\n\n{table}")
    assert (first.engine.build_number, second.engine.build_number) == (None, 100)


def test_one_build_line_at_the_end_applies_to_every_table() -> None:
    text = (IMPORTS / "build-line-at-the-end.md").read_bytes().decode()  # mixed line ends
    first, second = parse_batched_bench_output(text)
    assert [p.b for p in first.points] == [1, 3, 5]  # odd B values
    assert [p.s_tg for p in first.points] == [127.41, 341.77, 517.02]
    assert [(p.pp, p.b, p.s_pp) for p in second.points] == [(0, 1, 0.0), (0, 2, 0.0)]
    for run in (first, second):
        assert (run.engine.build_number, run.engine.commit) == (6710, "7f1a3c2")


def test_two_build_lines_each_apply_to_the_tables_after_them() -> None:
    table = "| PP | TG | B | S_TG t/s |\n|---|---|---|---|\n| 128 | 32 | 1 | 50.00 |\n"
    text = f"{table}\nbuild: 100 (aaaaaaa)\n\n{table}\nbuild: 200 (bbbbbbb)\n"
    first, second = parse_batched_bench_output(text)
    assert (first.engine.build_number, second.engine.build_number) == (None, 100)


def test_other_tools_tables_are_ignored_and_a_crashed_table_keeps_its_rows() -> None:
    """llama-bench's table and llama-sweep-bench's 7 columns (no B) look alike: neither is
    read as batched-bench; the table cut short by an assert keeps the rows printed."""
    [run] = parse_batched_bench_output((IMPORTS / "other-tools-and-a-crash.md").read_text())
    assert run.line == 19
    assert [(p.b, p.n_kv, p.s_tg) for p in run.points] == [(1, 640, 128.26), (4, 2560, 422.79)]
    assert (run.settings.n_ctx, run.settings.flash_attn, run.settings.n_gpu_layers) == (
        8192,
        "on",
        99,
    )
    assert run.engine.build_number == 6527  # the one build line, after the crash


def test_a_table_with_a_bad_row_is_left_out_and_the_others_read() -> None:
    text = (IMPORTS / "one-bad-row-two-tables.md").read_text()
    skipped: list[BadRow] = []
    [run] = parse_batched_bench_output(text, skipped=skipped)
    assert [(p.b, p.s_tg) for p in run.points] == [(1, 128.0), (2, 240.0)]
    [problem] = skipped
    assert str(problem).startswith("line 3: s_tg:")
    with pytest.raises(BadRow, match="line 3"):  # strict: the first problem is an error
        parse_batched_bench_output(text)
