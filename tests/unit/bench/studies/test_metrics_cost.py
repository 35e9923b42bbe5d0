"""bench/studies/metrics_cost.py: a call repeats a worker's metric work, every stage and the
outcome once; the table's difference is the medians'."""

from __future__ import annotations

from bench.studies.metrics_cost import Turn, one_call, table, turn
from handlers.stages import Stage, StageClock, StoppedClock, now


def test_a_call_records_every_stage_once_and_its_outcome():
    clock = StageClock("model", None)
    one_call(clock, now())
    assert {stage: h.calls for stage, h in clock.histograms.items()} == {stage: 1 for stage in Stage}
    assert clock.outcomes == {"ok": 1}


def test_a_turn_counts_its_calls_and_a_stopped_clock_records_none():
    clock = StoppedClock()
    done = turn(clock, "off", 0.01)
    assert done.calls >= 1000 and done.cpu_us_per_call > 0
    assert all(h.calls == 0 for h in clock.histograms.values())


def test_the_table_gives_the_difference_of_the_medians():
    turns = [Turn("on", 10, v) for v in (15.0, 16.0, 30.0)] + [Turn("off", 10, v) for v in (10.0, 9.0, 11.0)]
    assert "The metrics cost 6.00 µs (0.0060 ms)" in table(turns, "# header")
