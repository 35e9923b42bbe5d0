"""What the kit's own metrics cost a worker per request, in CPU time (`make bench-metrics`).

    .venv/bin/python -m bench.studies.metrics_cost [--rounds 5] [--seconds 3]

The metrics a classifier's worker keeps (handlers/stages.py, the metrics port's kit_stage_* and
kit_requests_total) are, per inference call: the worker loop's 4 readings of the clocks and 3
stage records (handlers/worker.py), the handler's 4 readings, 3 records and its outcome count
(handlers/base.py), and a thread that rewrites the worker's file within a second of a change.
This repeats exactly that work, in one process, for `--seconds` per turn: with the clock on (a
real file in a temporary directory, its writer thread running) and with it switched off
(StoppedClock: the readings stay, as in a worker with `stage_metrics: false`), turns alternated,
the CPU time of the whole process (the writer thread's included) divided by the calls made.
`make bench PLAN=metrics` serves the same switch end to end, where the worker's own CPU per
request varies between runs by far more than this difference. Results:
bench/results/metrics-<time>/results.json, report.md and the table printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import tempfile
import time
from pathlib import Path

from bench.results import RESULTS, study_report
from handlers.stages import OK, Stage, StageClock, StoppedClock, now


@dataclasses.dataclass(frozen=True)
class Turn:
    clock: str  # "on" or "off"
    calls: int
    cpu_us_per_call: float  # the process's CPU time per call, all threads


def one_call(clock: StageClock, sent) -> object:
    """One call of one request: the worker loop's and the base handler's metric work."""
    start = now()  # the worker: the frame's first byte
    read = now()
    begun = now()  # the handler: preprocess, inference, postprocess
    decoded = now()
    inferred = now()
    clock.record(Stage.DECODE, begun, decoded, 1)
    clock.record(Stage.MODEL, decoded, inferred, 1)
    clock.record(Stage.FORMAT, inferred, now(), 1)
    clock.answered(OK)
    answered = now()  # the worker again: the answer is written
    clock.record(Stage.WAIT, sent, start, 1)
    sent = now()
    clock.record(Stage.READ, start, read, 1)
    clock.record(Stage.WRITE, answered, sent, 1)
    return sent


def turn(clock: StageClock, name: str, seconds: float) -> Turn:
    sent, calls = now(), 0
    cpu, deadline = time.process_time(), time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        for _ in range(1000):
            sent = one_call(clock, sent)
        calls += 1000
    return Turn(name, calls, (time.process_time() - cpu) / calls * 1e6)


def table(turns: list[Turn], header: str) -> str:
    on = statistics.median(t.cpu_us_per_call for t in turns if t.clock == "on")
    off = statistics.median(t.cpu_us_per_call for t in turns if t.clock == "off")
    lines = [header, "", "| clock | turns | calls per turn (median) | CPU µs per call (median) |", "|---|---|---|---|"]
    for name, value in (("on", on), ("off (stage_metrics: false)", off)):
        mine = [t for t in turns if t.clock == name.split()[0]]
        lines.append(f"| {name} | {len(mine)} | {statistics.median(t.calls for t in mine):.0f} | {value:.2f} |")
    lines += ["", f"The metrics cost {on - off:.2f} µs ({(on - off) / 1000:.4f} ms) of CPU per call of one request."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="per turn: the writer rewrites once a second")
    args = parser.parse_args(argv)
    out = RESULTS / f"metrics-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    turns: list[Turn] = []
    with tempfile.TemporaryDirectory() as directory:
        clocks = {"on": StageClock("model", Path(directory)), "off": StoppedClock()}
        for round_ in range(args.rounds):
            for name in list(clocks)[round_ % 2 :] + list(clocks)[: round_ % 2]:  # rotated
                turns.append(turn(clocks[name], name, args.seconds))
                print(f"[metrics] round {round_ + 1}/{args.rounds} clock {name}: {turns[-1]}", flush=True)
        clocks["on"].writer.stop()
    study_report(
        out,
        "What the kit's metrics cost a worker",
        f"{args.rounds} rounds of {args.seconds:.0f} s per clock, in turns, one process",
        lambda header: table(turns, header),
        {"turns": turns},
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
