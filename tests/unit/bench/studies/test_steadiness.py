"""bench/studies/steadiness.py: the table says which probes slowed past SLOW times their fastest."""

from __future__ import annotations

from bench.studies import steadiness
from bench.studies.steadiness import Probe, table


def test_a_probe_that_once_took_more_than_slow_times_its_fastest_makes_the_machine_unsteady():
    steady = Probe("loop", [10.0, 11.0, 14.9, 12.0])
    slowed = Probe("read", [10.0, 30.0, 11.0, 16.0])
    assert steady.slow_share == 0
    assert slowed.slow_share == 0.5
    text = table([steady, slowed], "# header")
    assert text.startswith("# header\n")
    assert "| loop | 4 | 10.0 ms | 11.5 ms | 14.9 ms | 1.49 | 0 % |" in text
    assert "| read | 4 | 10.0 ms | 13.5 ms | 30.0 ms | 3.00 | 50 % |" in text
    assert "Unsteady (read): compare only within one run" in text


def test_one_slow_sample_in_many_is_the_os_not_an_unsteady_machine():
    once = Probe("read", [10.0] * 60 + [20.0])  # 1.6 %
    text = table([once], "# h")
    assert "| read | 61 | 10.0 ms | 10.0 ms | 20.0 ms | 2.00 | 2 % |" in text
    assert "Steady: at most 2 % of each probe's samples took 1.5 times its fastest." in text


def test_measure_samples_each_probe_once_a_tick_and_the_read_is_larger_than_a_cache(monkeypatch):
    monkeypatch.setattr(steadiness, "LOOP_STEPS", 10)
    probes = steadiness.measure(seconds=0.05, every=0.01, threads=1)
    assert [p.name.split(" ")[0] for p in probes] == ["read", "Python"]
    assert len(probes[0].ms) == len(probes[1].ms) >= 1
    assert all(ms > 0 for p in probes for ms in p.ms)
    assert steadiness.READ_BYTES > 96 << 20  # beyond an L3 domain (96 MiB on the largest, AMD V-Cache)


def test_the_brief_line_for_another_reports_header_names_each_probes_numbers_and_the_verdict():
    line = steadiness.brief([Probe("read", [10.0, 30.0, 11.0, 16.0]), Probe("loop", [5.0, 5.5])])
    assert line == (
        "read: 10.0 / 13.5 ms fastest / median, 50 % of 4 samples over 1.5×; "
        "loop: 5.0 / 5.2 ms fastest / median, 0 % of 2 samples over 1.5×. "
        "Unsteady (read): compare only within one run, in interleaved rounds."
    )
