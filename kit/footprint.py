"""What one warmed worker of a model variant holds in memory: measured from /proc, recorded beside
its archive, read by the plan (kit/plan.py) to fit the workers into the memory budget.

    footprint = measure(pid)                      # Footprint(rss=..., pss=..., private=..., peak=...)
    record(archive, 4, [measure(pid) for pid in worker_pids])   # model_store/<variant>/<model>.b4.footprint.json, beside <model>/
    recorded(archive, 4)                          # None: never measured at that batch size, or the archive was rebuilt since

`kit.server.Server.wait_ready` records every model once its workers are READY (warm-up runs in
the handler's initialize, so READY means warmed); `make status` shows the live numbers.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path

from handlers.archive_files import MANIFEST
from kit.topology import gib, kb_fields

SUFFIX = ".footprint.json"


@dataclasses.dataclass(frozen=True)
class Footprint:
    """Bytes. Shared pages (libraries, memory-mapped weights, pages inherited from a parent) are
    mapped by other processes too; private ones are what every further worker adds."""

    rss: int  # resident: private + shared
    pss: int  # proportional: each shared page divided by the processes that map it
    private: int  # Private_Clean + Private_Dirty (USS)
    peak: int  # VmHWM: the most it ever held (warm-up, compilation)
    workers: int = 1  # workers of the model running when measured: how many shared the shared pages
    sequences: int = 0  # a language model's KV cache rows when measured (0: it has none)

    @property
    def shared(self) -> int:
        return self.rss - self.private

    @property
    def per_worker(self) -> int:
        """What one more worker costs: its private pages, plus what it held above them while warming
        (workers of a model start, and warm up, at the same time)."""
        return self.private + max(0, self.peak - self.rss)

    def cost(self, workers: int) -> int:
        """What `workers` workers of the model hold at most: each its own pages, the shared ones once
        (an over-count for pages also shared with other models' workers, such as torch's libraries)."""
        return workers * self.per_worker + self.shared

    def with_sequences(self, sequences: int, per_sequence: int) -> Footprint:
        """What the worker would hold with `sequences` KV cache rows of `per_sequence` bytes each
        instead of its own: the cache is allocated once, filled, at start (private pages)."""
        delta = (self.sequences - sequences) * per_sequence
        return dataclasses.replace(
            self,
            rss=self.rss - delta,
            pss=self.pss - delta,
            private=self.private - delta,
            peak=self.peak - delta,
            sequences=sequences,
        )

    @classmethod
    def of_size(cls, size: int) -> Footprint:
        """A worker said to hold `size` bytes, none shared (`kit plan --footprint bert=1.3Gi`)."""
        return cls(size, size, size, size)

    @classmethod
    def worst(cls, measured: Sequence[Footprint], sequences: int = 0) -> Footprint:
        """One footprint for several workers of a model (each with `sequences` KV cache rows): the
        largest of each field."""
        return cls(
            max(f.rss for f in measured),
            max(f.pss for f in measured),
            max(f.private for f in measured),
            max(f.peak for f in measured),
            len(measured),
            sequences,
        )

    def summary(self) -> str:
        return (
            f"{gib(self.per_worker)} per worker + {gib(self.shared)} shared "
            f"(RSS {gib(self.rss)}, PSS {gib(self.pss)}, peak {gib(self.peak)}; {self.workers} worker(s) measured"
            + (f", {self.sequences} sequence(s) each)" if self.sequences else ")")
        )


def measure(pid: int) -> Footprint:
    rollup = kb_fields(Path(f"/proc/{pid}/smaps_rollup").read_text())
    status = kb_fields(Path(f"/proc/{pid}/status").read_text())
    return Footprint(rollup["Rss"], rollup["Pss"], rollup["Private_Clean"] + rollup["Private_Dirty"], status["VmHWM"])


def measure_live(pid: int) -> Footprint | None:
    """measure(pid), or None when the process is gone (also if it exits while being read)."""
    try:
        return measure(pid)
    except OSError:
        return None


def footprint_file(archive: Path, batch_size: int) -> Path:
    """A worker that batches holds more (a graph or package per batch shape, larger activations):
    one file per TorchServe batchSize the archive was served at, beside the archive's directory."""
    return archive.with_name(f"{archive.name}{f'.b{batch_size}' if batch_size > 1 else ''}{SUFFIX}")


def archive_identity(archive: Path) -> list:
    """What changes when the archive is rebuilt (its measurement is then stale) and survives a copy
    (into a container image): a digest of its manifest, which torch-model-archiver stamps with the
    second it was written."""
    return [hashlib.sha256((archive / MANIFEST).read_bytes()).hexdigest()]


def record(archive: Path, batch_size: int, measured: Sequence[Footprint], sequences: int = 0) -> Footprint:
    """Write the worst of `measured` (workers holding `sequences` KV cache rows each) beside
    `archive` (atomically: servers of a bench may race)."""
    footprint = Footprint.worst(measured, sequences)
    path = footprint_file(archive, batch_size)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    partial.write_text(json.dumps({"archive": archive_identity(archive), **dataclasses.asdict(footprint)}, indent=2))
    partial.replace(path)
    return footprint


def recorded(archive: Path, batch_size: int) -> Footprint | None:
    path = footprint_file(archive, batch_size)
    try:
        raw = json.loads(path.read_text())
        if raw.pop("archive") != archive_identity(archive):
            return None
        return Footprint(**raw)
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or an older format: measure again
        return None
