"""apache-bench (`ab`) as a typed function: argv built as a list, output parsed into AbResult.

argv = ab_command(url, Path("photo.jpg"), "image/jpeg", seconds=20, concurrency=4)
result = parse_ab(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
result, argv, cpu_ms = measure_ab(url, headers, payload, 4, 20, server.process_tree, group)  # + CPU per request
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from bench.cpu_accounting import children_cpu_s, per_request_ms, process_cpu_s

if TYPE_CHECKING:
    from bench.payloads import Payload
    from bench.plan import RunSettings

# ab stops at whichever comes first: this many requests or the time limit.
MAX_REQUESTS = 1_000_000


class AbParseError(ValueError):
    """ab printed something we cannot read; the message quotes the missing field."""


@dataclasses.dataclass(frozen=True)
class AbResult:
    complete: int
    # Connect/receive/exception failures only: ab's "Length" failures just mean responses of
    # different sizes (every JSON result differs), not errors.
    failed: int
    non_2xx: int
    requests_per_s: float
    mean_ms: float  # mean latency of one request as its client saw it
    p50_ms: float
    p90_ms: float
    p99_ms: float
    max_ms: float
    duration_s: float


def ab_command(
    url: str,
    payload: Path,
    content_type: str,
    seconds: float,
    concurrency: int,
    headers: dict[str, str] | None = None,
    requests: int = MAX_REQUESTS,
) -> list[str]:
    argv = [
        "ab",
        "-k",  # keep-alive: without it ab stalls on TorchServe's connection handling
        "-t",
        str(int(seconds)),
        "-n",
        str(requests),  # after -t, which would otherwise cap it at 50000
        "-c",
        str(concurrency),
        "-s",
        "300",  # per-request timeout (s): a slow batch must not abort the run
        "-p",
        str(payload),
        "-T",
        content_type,
    ]
    for name, value in (headers or {}).items():
        argv += ["-H", f"{name}: {value}"]
    return [*argv, url]


def _number(pattern: str, text: str, field: str) -> float:
    match = re.search(pattern, text, re.MULTILINE)
    if not match:
        raise AbParseError(f"ab output has no {field!r} line; is this ab's full stdout?")
    return float(match.group(1))


def parse_ab(text: str) -> AbResult:
    complete = int(_number(r"^Complete requests:\s+(\d+)", text, "Complete requests"))
    breakdown = re.search(r"\(Connect: (\d+), Receive: (\d+), Length: (\d+), Exceptions: (\d+)\)", text)
    failed = int(breakdown.group(1)) + int(breakdown.group(2)) + int(breakdown.group(4)) if breakdown else 0
    non_2xx = re.search(r"^Non-2xx responses:\s+(\d+)", text, re.MULTILINE)

    def percentile(p: int) -> float:
        return _number(rf"^\s+{p}%\s+(\d+)", text, f"{p}% percentile")

    return AbResult(
        complete=complete,
        failed=failed,
        non_2xx=int(non_2xx.group(1)) if non_2xx else 0,
        requests_per_s=_number(r"^Requests per second:\s+([\d.]+)", text, "Requests per second"),
        mean_ms=_number(r"^Time per request:\s+([\d.]+) \[ms\] \(mean\)$", text, "Time per request"),
        p50_ms=percentile(50),
        p90_ms=percentile(90),
        p99_ms=percentile(99),
        max_ms=percentile(100),
        duration_s=_number(r"^Time taken for tests:\s+([\d.]+) seconds", text, "Time taken for tests"),
    )


def run_ab(
    url: str, headers: dict[str, str], payload: Payload, concurrency: int, seconds: int, requests: int = MAX_REQUESTS
) -> tuple[AbResult, list[str]]:
    argv = ab_command(
        url,
        payload.path,
        payload.content_type,
        seconds=seconds,
        concurrency=concurrency,
        headers=headers,
        requests=requests,
    )
    completed = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 600)
    if completed.returncode != 0:
        raise RuntimeError(f"ab failed ({completed.returncode}): {completed.stderr.strip()[-500:]}")
    return parse_ab(completed.stdout), argv


def warm_up(url: str, headers: dict[str, str], payload: Payload, concurrency: int, run: RunSettings) -> None:
    """`warmup_requests`, then `warmup_seconds` more of the same load: TorchServe's JVM compiles
    its request path for the first ~30 s of traffic (C1/C2 threads: ~1 ms of CPU per request
    then, ~0 after; docs/benchmarks.md), which a server running for hours no longer pays."""
    if run.warmup_requests:  # ab refuses fewer requests than its concurrency
        run_ab(url, headers, payload, concurrency, seconds=120, requests=max(run.warmup_requests, concurrency))
    if run.warmup_seconds:
        run_ab(url, headers, payload, concurrency, seconds=run.warmup_seconds)


def measure_ab(
    url: str,
    headers: dict[str, str],
    payload: Payload,
    concurrency: int,
    seconds: int,
    processes: Callable[[], list[psutil.Process]],
    group: Callable[[psutil.Process], str],
) -> tuple[AbResult, list[str], dict[str, float]]:
    """The measured ab run, with CPU ms per request of each process group (/proc before and after)."""
    before, ab_before = process_cpu_s(processes(), group), children_cpu_s()
    result, argv = run_ab(url, headers, payload, concurrency, seconds)
    cpu_ms = per_request_ms(before, process_cpu_s(processes(), group), children_cpu_s() - ab_before, result.complete)
    return result, argv, cpu_ms
