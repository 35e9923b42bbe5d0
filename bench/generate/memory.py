"""What a server holds while it streams: the peak PSS of its process tree, sampled.

    with PeakPss(system.pid) as peak:
        measure_streams(...)
    peak.bytes      # the largest sum of PSS over the server's processes seen, 0 without a pid

PSS (proportional set size) counts a page shared by several processes once in all (a mapped
model file, the kit's frontend and workers): the memory the server costs the machine. Sampled
once a second from /proc (smaps_rollup), as the kit's own `make serve` line reads it.
"""

from __future__ import annotations

import contextlib
import threading

import psutil

from kit.procinfo import process_tree

EVERY_S = 1.0


def tree_pss(pid: int) -> int:
    """The PSS of `pid` and its descendants now (processes that end meanwhile count nothing)."""
    total = 0
    for process in process_tree(pid):
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            total += process.memory_full_info().pss
    return total


class PeakPss:
    def __init__(self, pid: int | None, every_s: float = EVERY_S):
        self.pid, self.every_s, self.bytes = pid, every_s, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self.bytes = max(self.bytes, tree_pss(self.pid))
            if self._done.wait(self.every_s):
                return

    def __enter__(self) -> PeakPss:
        if self.pid is not None:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread.is_alive():
            self._thread.join()
