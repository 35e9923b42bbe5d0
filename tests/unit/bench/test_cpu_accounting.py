"""bench/cpu_accounting.py: CPU per request from /proc readings at both ends of a window."""

from __future__ import annotations

from bench.cpu_accounting import per_request_ms


def test_cpu_per_request_counts_processes_alive_at_both_ends():
    before = {
        (10, ""): ("frontend", 1.0),
        (10, "jit"): ("frontend JIT", 0.5),
        (11, ""): ("workers", 2.0),
        (12, ""): ("workers", 5.0),
    }
    after = {
        (10, ""): ("frontend", 1.5),
        (10, "jit"): ("frontend JIT", 0.6),
        (11, ""): ("workers", 3.0),
        (13, ""): ("workers", 9.0),
    }  # 12 died, 13 replaced it
    assert per_request_ms(before, after, ab_cpu_s=0.1, requests=100) == {
        "ab": 1.0,
        "frontend": 5.0,
        "frontend JIT": 1.0,
        "workers": 10.0,
    }
