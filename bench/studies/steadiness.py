"""Whether this machine keeps its speed while it is measured: a fixed read of memory and a fixed
piece of Python, timed again and again with nothing else running (`make bench-steadiness`).

    .venv/bin/python -m bench.studies.steadiness [--seconds 60] [--every 0.5]

A shared cloud VM's host lends its memory bandwidth and its cores to other tenants, so the VM's
speed can change several-fold for seconds at a time. A language model's decode step, which reads
every weight once a token, shows it first: a stream's time between tokens moves with it, whatever
the server does. Every `--every` seconds this process times a sum over a float32 tensor of
READ_BYTES (more than a CPU's caches hold: a read of memory) with a thread per core it may use,
and a fixed Python loop on one thread (the core's own speed). The table gives, per probe, the
fastest, median and slowest sample, the slowest over the fastest, and the share of samples slower
than SLOW times the fastest. Where that share is over UNSTEADY_SHARE, a number measured once on
this machine may be its host's moment: compare only within one run, in interleaved rounds, as
`make bench` does.
Results: bench/results/steadiness-<time>/results.json, report.md and the table printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable

from bench.results import RESULTS, study_report

READ_BYTES = 256 << 20
LOOP_STEPS = 300_000  # ~10-20 ms of Python on a current core
SLOW = 1.5  # a sample this many times the fastest is the machine slowed down, not noise
# A slow sample now and then is the OS (another process woke, a page was faulted in); a machine that
# slows down has more of them than this share.
UNSTEADY_SHARE = 0.02


@dataclasses.dataclass(frozen=True)
class Probe:
    name: str
    ms: list[float]  # one sample per tick, in order

    @property
    def fastest(self) -> float:
        return min(self.ms)

    @property
    def slow_share(self) -> float:
        return sum(ms > SLOW * self.fastest for ms in self.ms) / len(self.ms)


def python_loop() -> None:
    total = 0
    for step in range(LOOP_STEPS):
        total += step


def measure(seconds: float, every: float, threads: int) -> list[Probe]:
    """Both probes every `every` seconds for `seconds`: the read with `threads` threads, the loop on one."""
    import torch

    tensor = torch.ones(READ_BYTES // 4)
    probes: dict[str, tuple[Callable[[], object], int]] = {
        f"read of {READ_BYTES >> 20} MiB ({threads} threads)": (tensor.sum, threads),
        f"Python loop of {LOOP_STEPS:,} steps (1 thread)": (python_loop, 1),
    }
    samples: dict[str, list[float]] = {name: [] for name in probes}
    for work, count in probes.values():
        torch.set_num_threads(count)
        work()  # the first call allocates and warms the caches
    ends = time.monotonic() + seconds
    while time.monotonic() < ends:
        for name, (work, count) in probes.items():
            torch.set_num_threads(count)
            started = time.perf_counter()
            work()
            samples[name].append(1000 * (time.perf_counter() - started))
        time.sleep(every)
    return [Probe(name, ms) for name, ms in samples.items()]


def table(probes: list[Probe], header: str) -> str:
    lines = [
        header,
        "",
        f"| probe | samples | fastest | median | slowest | slowest ÷ fastest | samples over {SLOW:g}× the fastest |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in probes:
        lines.append(
            f"| {p.name} | {len(p.ms)} | {p.fastest:.1f} ms | {statistics.median(p.ms):.1f} ms | {max(p.ms):.1f} ms "
            f"| {max(p.ms) / p.fastest:.2f} | {100 * p.slow_share:.0f} % |"
        )
    return "\n".join([*lines, "", verdict(probes)]) + "\n"


def verdict(probes: list[Probe]) -> str:
    """One sentence: which probes slowed down, if any."""
    unsteady = [p.name for p in probes if p.slow_share > UNSTEADY_SHARE]
    if unsteady:
        return f"Unsteady ({', '.join(unsteady)}): compare only within one run, in interleaved rounds."
    return f"Steady: at most {100 * UNSTEADY_SHARE:g} % of each probe's samples took {SLOW:g} times its fastest."


def brief(probes: list[Probe]) -> str:
    """A line for another report's header: each probe's fastest, median and slow share, and the verdict."""
    said = "; ".join(
        f"{p.name}: {p.fastest:.1f} / {statistics.median(p.ms):.1f} ms fastest / median, "
        f"{100 * p.slow_share:.0f} % of {len(p.ms)} samples over {SLOW:g}×"
        for p in probes
    )
    return f"{said}. {verdict(probes)}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to sample (default 60)")
    parser.add_argument("--every", type=float, default=0.5, help="seconds between samples (default 0.5)")
    args = parser.parse_args(argv)
    from kit.topology import read_topology

    threads = read_topology().capacity
    print(f"[steadiness] sampling for {args.seconds:g} s, every {args.every:g} s", file=sys.stderr)
    probes = measure(args.seconds, args.every, threads)
    out = RESULTS / f"steadiness-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    study_report(
        out,
        "Whether this machine keeps its speed",
        f"{args.seconds:g} s, a sample every {args.every:g} s, nothing else running",
        lambda header: table(probes, header),
        {"probes": probes},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
