"""bench/studies/decode_split.py: the rest is the step less the kernels; rates are bytes over time."""

from __future__ import annotations

from bench.studies.decode_split import Split, table


def split() -> Split:
    return Split(1, 2, 2_000_000_000, [100.0, 90.0, 110.0], [80.0, 80.0, 100.0], [20.0, 22.0, 24.0])


def test_the_rest_is_each_rounds_step_less_its_time_in_the_kernels():
    assert split().rest_ms == [20.0, 10.0, 10.0]


def test_the_kernels_rate_is_their_bytes_over_their_time():
    assert split().kernels_gbps == [25.0, 25.0, 20.0]


def test_the_table_gives_each_columns_median_and_the_rounds_spread():
    text = table([split()], "# header")
    assert text.startswith("# header\n")
    assert "| 1 | 2 | 100.0 (90.0–110.0) | 80.0 (80.0–100.0) | 10.0 (10.0–20.0) | 2.00 GB | 25.0 (20.0–25.0) " in text
    assert "| 22.0 (20.0–24.0) |" in text


def mixed_split() -> Split:
    return Split(16, 2, 2_000_000_000, [100.0], [80.0], [20.0], 256, [200.0, 180.0, 250.0], [120.0, 130.0, 150.0])


def test_a_mixed_steps_rest_is_each_rounds_step_less_its_time_in_the_kernels():
    assert mixed_split().mixed_rest_ms == [80.0, 50.0, 100.0]


def test_the_mixed_table_says_the_parts_tokens_and_the_decode_rows_beside_them():
    text = table([mixed_split()], "# header")
    assert "| 16 | 256 | 15 | 200.0 (180.0–250.0) | 130.0 (120.0–150.0) | 80.0 (50.0–100.0) |" in text


def test_without_mixed_steps_there_is_no_mixed_table():
    assert "prompt's part" not in table([split()], "# header")
