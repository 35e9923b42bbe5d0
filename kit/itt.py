"""The kit's ITT collector: each worker's inference ranges recorded without VTune, as a timeline.

    env = collector_environment(Path("logs/itt"))   # built with the system compiler on first use
    ... serve with env (ServeConfig.itt_trace_dir does this) ...
    ranges = read_ranges(Path("logs/itt"))          # [Range(pid, tid, "resnet50:bs1", begin_ns, end_ns)]
    Path("trace.json").write_text(json.dumps(chrome_trace(ranges)))   # open in ui.perfetto.dev

kit/itt_collector.c says how libtorch's ITT calls reach it.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

from kit.paths import ROOT

SOURCE = Path(__file__).resolve().parent / "itt_collector.c"
LIBRARY = ROOT / "build" / "itt" / "libkit_itt.so"
DIR_VAR = "KIT_ITT_DIR"  # where the collector writes (read by itt_collector.c)
# The ITT groups libittnotify binds to a collector: tasks, domains and string handles are "structure".
GROUPS = "structure"
DOMAINS_VAR = "KIT_ITT_DOMAINS"  # the domains the collector records (itt_collector.c); others are off
# torch's (torch.profiler.itt, emit_itt): the kit's inference ranges and ITT_OPS's op ranges.
DOMAINS = ("PyTorch",)


class CollectorError(RuntimeError):
    """The collector could not be built or its records not read; the message says what to do."""


@dataclasses.dataclass(frozen=True)
class Range:
    pid: int
    tid: int
    name: str
    begin_ns: int
    end_ns: int


def build_collector(library: Path = LIBRARY) -> Path:
    """Compile the collector unless `library` is newer than its source."""
    if library.is_file() and library.stat().st_mtime >= SOURCE.stat().st_mtime:
        return library
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        raise CollectorError("no C compiler (cc) to build the ITT collector; install gcc (`apt-get install gcc`)")
    library.parent.mkdir(parents=True, exist_ok=True)
    command = [compiler, "-O2", "-shared", "-fPIC", "-Wall", "-o", str(library), str(SOURCE), "-lpthread"]
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        raise CollectorError(f"building the ITT collector failed: {' '.join(command)}\n{completed.stderr}")
    return library


def collector_environment(out_dir: Path) -> dict[str, str]:
    """What a process needs in its environment for its ITT ranges to land in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    return {
        "INTEL_LIBITTNOTIFY64": str(build_collector()),
        "INTEL_ITTNOTIFY_GROUPS": GROUPS,
        DIR_VAR: str(out_dir),
        DOMAINS_VAR: ",".join(DOMAINS),
        # oneDNN reports every primitive it runs as a task of its own once a collector is attached:
        # ~400 per ResNet-50 inference, 1-2 ms of writes per request. The kit's ranges only.
        "ONEDNN_ITT_TASK_LEVEL": "0",
    }


def parse_records(pid: int, text: str) -> list[Range]:
    """One process's records -> its closed ranges (nested ranges pair per thread, innermost first)."""
    open_ranges: dict[int, list[tuple[str, int]]] = {}
    ranges = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split("\t")
        try:
            kind, tid, ns = fields[0], int(fields[1]), int(fields[2])
        except (IndexError, ValueError):
            raise CollectorError(f"itt-{pid}.tsv line {number} is not a record: {line!r}") from None
        if kind == "B":
            open_ranges.setdefault(tid, []).append((fields[3] if len(fields) > 3 else "", ns))
        elif open_ranges.get(tid):  # an end without a begin (collector loaded mid-range) is dropped
            name, begin = open_ranges[tid].pop()
            ranges.append(Range(pid, tid, name, begin, ns))
    return ranges


def read_ranges(out_dir: Path) -> list[Range]:
    """Every process's closed ranges in `out_dir`, by begin time."""
    ranges = [
        r
        for path in sorted(out_dir.glob("itt-*.tsv"))
        for r in parse_records(int(path.stem.removeprefix("itt-")), path.read_text())
    ]
    return sorted(ranges, key=lambda r: r.begin_ns)


def chrome_trace(ranges: list[Range]) -> dict:
    """The Chrome/Perfetto trace format: one complete event per range, a track per process and thread."""
    start = min((r.begin_ns for r in ranges), default=0)
    events = [
        {
            "name": r.name,
            "ph": "X",
            "pid": r.pid,
            "tid": r.tid,
            "ts": (r.begin_ns - start) / 1000,
            "dur": (r.end_ns - r.begin_ns) / 1000,
            "cat": "itt",
        }
        for r in ranges
    ]
    return {"traceEvents": events, "displayTimeUnit": "ms"}
