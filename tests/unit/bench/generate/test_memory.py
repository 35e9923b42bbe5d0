"""bench/generate/memory.py: a server's peak PSS, its process tree's, read from /proc."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from bench.generate.memory import PeakPss, process_pss

HOLD = 300_000_000  # bytes a child writes and holds
DRIFT = 4_000_000  # bytes PSS moves by as other processes map and unmap the same libraries


def test_a_childs_memory_counts_in_its_parents_peak():
    script = f"import sys, time; b = bytearray({HOLD}); b[::4096] = b'x' * len(b[::4096]); print(1, flush=True); time.sleep(60)"
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {script!r}])"],
        stdout=subprocess.PIPE,
    )
    try:
        assert parent.stdout.readline().strip() == b"1"  # the grandchild holds its bytes
        with PeakPss([parent.pid], every_s=0.1) as peak:
            time.sleep(0.5)
        # A later reading is the peak but for shared pages' shares (a library's pages divide among
        # the processes mapping them, which start and end beside the test): within DRIFT.
        assert peak.bytes >= HOLD and sum(process_pss([parent.pid])) <= peak.bytes + DRIFT
        assert peak.bytes < HOLD + 200_000_000  # two interpreters, not more
        # The largest one process is the grandchild holding the bytes, not the tree's sum.
        assert HOLD <= peak.largest < peak.bytes
    finally:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()


def test_a_system_without_processes_holds_nothing():
    with PeakPss([]) as peak:
        pass
    assert peak.bytes == peak.largest == 0
