"""bench/studies/compiled_threads.py: the table gives each row's medians and the rounds' ratios."""

from __future__ import annotations

from bench.studies.compiled_threads import Timing, table


def test_the_table_gives_each_rows_medians_and_the_median_ratio_of_the_rounds():
    timings = [Timing(2, 16, [10.0, 12.0, 11.0], [11.0, 12.0, 9.9]), Timing(1, 2, [20.0, 20.0, 20.0], [21, 20, 22])]
    text = table(timings, "# header")
    assert text.startswith("# header\n")
    assert "| 2 | 16 | 11.0 | 11.0 | 1.000 (0.900–1.100) |" in text
    assert "| 1 | 2 | 20.0 | 21.0 | 1.050 (1.000–1.100) |" in text
