"""What a server holds while it streams: the peak PSS of its process tree, sampled.

    with PeakPss(system.pids) as peak:
        measure_streams(...)
    peak.bytes      # the largest sum of PSS over the server's processes seen, 0 without pids
    peak.largest    # the largest PSS of one of them seen (the kit's worker, llama.cpp's server)

PSS (proportional set size) counts a page shared by several processes once in all (a mapped
model file, the kit's frontend and workers): the memory the server costs the machine. Sampled
once a second from /proc (smaps_rollup), as the kit's own `make serve` line reads it. The largest
one process is beside it: a server of one process against one of several (the kit's TorchServe
frontend, a JVM, beside its worker) differ by more than where the model's memory is.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterable, Sequence

import psutil

from kit.procinfo import process_tree

EVERY_S = 1.0


def process_pss(roots: Iterable[int]) -> list[int]:
    """The PSS of each of `roots` and of their descendants now (processes that end meanwhile are left out)."""
    sizes = []
    for process in (process for root in roots for process in process_tree(root)):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            sizes.append(process.memory_full_info().pss)
    return sizes


class PeakPss:
    def __init__(self, pids: Sequence[int], every_s: float = EVERY_S):
        self.pids, self.every_s, self.bytes, self.largest = pids, every_s, 0, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            sizes = process_pss(self.pids)
            self.bytes, self.largest = max(self.bytes, sum(sizes)), max(self.largest, *sizes, 0)
            if self._done.wait(self.every_s):
                return

    def __enter__(self) -> PeakPss:
        if self.pids:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
