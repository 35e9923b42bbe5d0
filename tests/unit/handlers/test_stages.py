"""handlers/stages.py: the stage histograms a worker writes and `make status` and the bench read."""

from __future__ import annotations

import json
import multiprocessing
import time

import pytest

from handlers.stages import (
    BOUNDS_MS,
    FLUSH_S,
    Histogram,
    Instant,
    Stage,
    StageClock,
    StoppedClock,
    difference,
    merge,
    now,
    read_stage_files,
    read_workers,
    replace_file,
    stage_table,
    summarize,
)


def histogram(*ms: float, requests_per_call: int = 1, cpu_share: float = 1.0) -> Histogram:
    h = Histogram()
    for value in ms:
        h.add(value, requests_per_call, value * cpu_share)
    return h


def span(seconds: float, cpu_seconds: float | None = None) -> tuple[Instant, Instant]:
    """A stage's start and end: `seconds` apart in wall time, `cpu_seconds` (default the same) in CPU."""
    return Instant(100.0, 7.0), Instant(100.0 + seconds, 7.0 + (seconds if cpu_seconds is None else cpu_seconds))


def test_quantiles_are_the_upper_bound_of_their_bucket_within_12_percent():
    h = histogram(*([1.0] * 98 + [50.0, 50.0]))
    p50, p99 = h.quantile(0.5), h.quantile(0.99)
    assert 1.0 <= p50 <= 1.12 and 50.0 <= p99 <= 56.0
    assert Histogram().quantile(0.5) is None


def test_values_past_the_last_bound_are_counted_not_lost():
    h = histogram(BOUNDS_MS[-1] * 10)
    assert h.counts[-1] == 1 and h.quantile(0.5) == BOUNDS_MS[-1]


def test_ms_per_request_divides_a_batched_call_among_its_requests():
    summary = summarize({Stage.MODEL: histogram(40.0, requests_per_call=4, cpu_share=0.5)})[Stage.MODEL]
    assert (summary.calls, summary.requests, summary.ms_per_request) == (1, 4, 10.0)
    assert summary.cpu_ms_per_request == 5.0
    assert Stage.DECODE not in summarize({Stage.DECODE: Histogram()})  # nothing recorded: no row


def test_a_written_clock_reads_back_merged_per_model(tmp_path):
    first, second = StageClock("resnet50", tmp_path), StageClock("resnet50", None)
    first.record(Stage.DECODE, *span(0.003), 1)
    second.record(Stage.DECODE, *span(0.005, cpu_seconds=0.001), 2)
    first.writer.write()
    replace_file(tmp_path / "resnet50-2.json", second.text())  # two workers: one file each (by pid)
    merged = merge(read_stage_files(tmp_path))
    assert set(merged) == {"resnet50"}
    decode = merged["resnet50"][Stage.DECODE]
    assert (decode.calls, decode.requests) == (2, 3) and decode.total_ms == pytest.approx(8.0)
    assert decode.cpu_ms == pytest.approx(4.0)  # 3 ms of the first, 1 of the second (preempted for 4)
    assert not list(tmp_path.glob("*.partial"))  # written whole, then renamed


def test_a_stopped_clock_records_nothing_and_writes_no_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    clock = StoppedClock()
    clock.record(Stage.DECODE, *span(0.003), 1)
    clock.answered("ok")
    assert clock.histograms[Stage.DECODE].calls == 0 and clock.outcomes == {} and clock.writer is None
    assert not list(tmp_path.iterdir())


def test_outcomes_are_counted_per_worker_and_read_back_with_its_pid(tmp_path):
    clock = StageClock("bert", tmp_path)
    clock.answered("ok", 20)
    for _ in range(3):
        clock.answered("bad_input")
    clock.writer.write()
    (worker,) = read_workers(tmp_path)
    assert (worker.model, worker.pid) == ("bert", clock.pid)
    assert worker.outcomes == {"ok": 20, "bad_input": 3}


def test_a_file_of_another_bucket_layout_or_half_written_is_skipped(tmp_path):
    (tmp_path / "old-1.json").write_text(json.dumps({"model": "old", "bounds_ms": [1, 2], "stages": {}}))
    (tmp_path / "torn-2.json").write_text('{"model": "to')
    assert list(read_stage_files(tmp_path)) == []


def test_a_record_is_on_disk_within_a_second_without_another_and_no_directory_never_writes(tmp_path):
    clock = StageClock("m", tmp_path)
    clock.record(Stage.READ, *span(0.001), 1)
    deadline, calls = time.monotonic() + FLUSH_S + 1.5, 0
    while time.monotonic() < deadline and not calls:
        time.sleep(0.05)
        calls = sum(histograms[Stage.READ].calls for _, histograms in read_stage_files(tmp_path))
    assert calls == 1 and {model for model, _ in read_stage_files(tmp_path)} == {"m"}
    clock.writer.stop()
    assert StageClock("m", None).writer is None  # a handler outside a server: in memory only


def record_in_a_child(clock: StageClock) -> None:
    clock.record(Stage.DECODE, *span(0.002), 1)
    time.sleep(FLUSH_S + 0.8)  # its own writer's turn


def test_a_forked_child_records_into_a_file_of_its_own(tmp_path):
    """A peer app's decode processes are forked with the clock: no writer thread comes with it."""
    clock = StageClock("m", tmp_path)
    clock.record(Stage.DECODE, *span(0.001), 1)
    clock.writer.write()
    child = multiprocessing.get_context("fork").Process(target=record_in_a_child, args=(clock,))
    child.start()
    child.join(10)
    assert child.exitcode == 0
    files = sorted(tmp_path.glob("m-*.json"))
    assert len(files) == 2  # the parent's and the child's, by pid
    calls = [histograms[Stage.DECODE].calls for _, histograms in read_stage_files(tmp_path)]
    assert sorted(calls) == [1, 1]  # the child's file holds its own call only
    clock.writer.stop()


def test_difference_is_what_a_bench_window_recorded():
    before = {Stage.MODEL: histogram(10.0)}
    after = {Stage.MODEL: histogram(10.0, 20.0, 20.0)}
    window = difference(after, before)[Stage.MODEL]
    assert (window.calls, window.total_ms, window.cpu_ms) == (2, pytest.approx(40.0), pytest.approx(40.0))
    assert difference(after, None) is after


def test_the_status_table_names_every_stage_recorded_and_the_total_without_the_wait():
    lines = stage_table(
        {
            "bert": {
                Stage.WAIT: histogram(50.0, cpu_share=0.0),
                Stage.DECODE: histogram(2.0),
                Stage.MODEL: histogram(8.0, cpu_share=0.75),
            }
        }
    )
    assert lines[0].split() == ["model", "stage", "calls", "ms/request", "cpu", "ms/req", "p50", "ms", "p99", "ms"]
    assert [line.split()[1] for line in lines[1:]] == ["wait", "decode", "model", "all"]
    assert [float(cell) for cell in lines[-1].split()[2:4]] == pytest.approx([10.0, 8.0])
    assert lines[-1].endswith("CPU outside the model call: 2.000 ms/request)")  # decode's 2 of the 8


def sleep_then_spin() -> tuple[Instant, Instant, Instant]:
    start = now()
    time.sleep(0.05)
    slept = now()
    # Busy until the thread's CPU time has grown by 30 ms: a thread preempted by other processes
    # (the unit tests run one process per CPU) spins longer in wall time, never less. The deadline
    # only bounds a clock that would not grow.
    deadline = time.perf_counter() + 10
    while now().cpu - slept.cpu < 0.03 and time.perf_counter() < deadline:
        pass
    return start, slept, now()


def test_now_reads_the_cpu_time_which_a_sleep_does_not_spend():
    # In a fresh process: the CPU time is the whole process's, and in this one the OpenMP threads
    # of an earlier test's torch call may still be spinning while this one sleeps.
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        start, slept, spun = pool.apply(sleep_then_spin)
    assert slept.wall - start.wall >= 0.05 and slept.cpu - start.cpu < 0.02
    assert spun.cpu - slept.cpu >= 0.03 and spun.wall - slept.wall >= 0.03  # CPU time grew, no faster than wall
