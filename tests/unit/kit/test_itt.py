"""The ITT collector's records: pairing, the trace format, and the real collector in a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from handlers.itt import parse_range_name, range_name
from kit.itt import CollectorError, Range, chrome_trace, collector_environment, parse_records, read_ranges

RECORDS = "B\t7\t100\tresnet50:bs4\nB\t7\t110\tinner\nE\t7\t150\nE\t7\t200\nE\t8\t300\nB\t9\t400\tunfinished\n"


def test_records_pair_per_thread_innermost_first():
    assert parse_records(42, RECORDS) == [
        Range(42, 7, "inner", 110, 150),
        Range(42, 7, "resnet50:bs4", 100, 200),
    ]  # an end without a begin and a range still open are dropped


def test_a_torn_record_is_an_error_naming_the_line():
    with pytest.raises(CollectorError, match=r"itt-42.tsv line 2 is not a record: 'B\\tx'"):
        parse_records(42, "B\t7\t100\tm:bs1\nB\tx\n")


def test_chrome_trace_events_are_microseconds_from_the_first_range():
    trace = chrome_trace([Range(1, 2, "m:bs1", 5_000, 7_500), Range(1, 3, "m:bs2", 6_000, 9_000)])
    assert [(e["name"], e["ts"], e["dur"], e["tid"]) for e in trace["traceEvents"]] == [
        ("m:bs1", 0.0, 2.5, 2),
        ("m:bs2", 1.0, 3.0, 3),
    ]


def test_range_names_parse_back():
    assert parse_range_name(range_name("my:model", 8)) == ("my:model", 8)
    assert parse_range_name("aten::conv2d") is None


def test_torch_itt_ranges_reach_the_built_collector(tmp_path):
    """libtorch's ITT static part loads the compiled collector and hands it every range, with names."""
    script = (
        "from torch.profiler import itt\n"
        "assert itt.is_available()\n"
        "for size in (1, 2, 4):\n"
        "    itt.range_push(f'm:bs{size}'); itt.range_push('inner'); itt.range_pop(); itt.range_pop()\n"
    )
    env = {**os.environ, **collector_environment(tmp_path)}
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120)
    ranges = read_ranges(tmp_path)
    assert [r.name for r in ranges] == ["m:bs1", "inner", "m:bs2", "inner", "m:bs4", "inner"]
    assert len({r.pid for r in ranges}) == 1 and all(r.end_ns > r.begin_ns for r in ranges)


def test_itt_trace_command_writes_the_timeline_and_summarises(tmp_path, capsys):
    from kit.__main__ import main

    assert main(["itt-trace", "--dir", str(tmp_path)]) == 1
    assert "no ranges in" in capsys.readouterr().out
    (tmp_path / "itt-5.tsv").write_text("B\t5\t0\tm:bs1\nE\t5\t2000000\nB\t5\t3000000\tm:bs1\nE\t5\t7000000\n")
    assert main(["itt-trace", "--dir", str(tmp_path)]) == 0
    assert "m:bs1: 2 ranges, median 3.0 ms, max 4.0 ms" in capsys.readouterr().out
    assert len(json.loads((tmp_path / "trace.json").read_text())["traceEvents"]) == 2


def test_only_the_kits_domains_are_recorded(tmp_path, monkeypatch):
    """OpenVINO and TBB carry ITT too: a domain not in KIT_ITT_DOMAINS is created disabled (its
    callers then skip it) and records nothing even when called with its flags set, while torch's records."""
    import ctypes

    from kit.itt import DOMAINS, build_collector

    for name, value in collector_environment(tmp_path).items():
        monkeypatch.setenv(name, value)
    collector = ctypes.CDLL(str(build_collector()))
    collector.__itt_domain_create.restype = ctypes.POINTER(ctypes.c_int)  # the struct's first field: flags
    collector.__itt_string_handle_create.restype = ctypes.c_void_p

    class Id(ctypes.Structure):  # __itt_id, passed by value
        _fields_ = [("d1", ctypes.c_ulonglong), ("d2", ctypes.c_ulonglong), ("d3", ctypes.c_ulonglong)]

    for domain_name, task in ((DOMAINS[0].encode(), b"kept:bs1"), (b"ov_intel_cpu", b"node"), (b"tbb", b"loop")):
        domain = collector.__itt_domain_create(domain_name)
        assert domain.contents.value == (1 if task == b"kept:bs1" else 0)
        domain.contents.value = 1  # as TBB does to its own domains: still not recorded
        handle = collector.__itt_string_handle_create(task)
        collector.__itt_task_begin(domain, Id(), Id(), ctypes.c_void_p(handle))
        collector.__itt_task_end(domain)
    assert [r.name for r in read_ranges(tmp_path)] == ["kept:bs1"]
