"""Serve-time diagnostics a running server can switch on without rebuilding archives.

    make serve PROFILE_REQUESTS=20   # each worker: torch.profiler trace of its first 20 calls
    make serve ITT_OPS=1             # op-level ITT ranges (emit_itt) inside each request range

The serving preset (kit/serve_config.py) sets them as environment variables, which the
frontend passes to every worker; `initialize` reads them once (handlers/settings.py Diagnostics).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

log = logging.getLogger(__name__)


class RequestProfiler:
    """torch.profiler over a worker's first N inference calls; then a trace and a table on disk."""

    def __init__(self, requests: int, out_dir: Path, name: str):
        self.remaining = requests
        self.out_dir = out_dir
        self.name = name
        self._profile: profile | None = None

    @contextlib.contextmanager
    def record(self) -> Iterator[None]:
        if self.remaining <= 0:
            yield
            return
        if self._profile is None:
            self._profile = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
            self._profile.start()
        try:
            yield
        finally:
            self.remaining -= 1
            if self.remaining == 0:
                self._write()

    def _write(self) -> None:
        self._profile.stop()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        stem = self.out_dir / f"{self.name}-pid{os.getpid()}"
        self._profile.export_chrome_trace(f"{stem}.json")
        table = self._profile.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
        Path(f"{stem}-top20.txt").write_text(table)
        log.info("%s: profiler trace of the first requests written to %s.json", self.name, stem)
        self._profile = None


def op_ranges(enabled: bool) -> contextlib.AbstractContextManager:
    """One ITT range per aten op (torch.autograd.profiler.emit_itt), for VTune's op-level view."""
    return torch.autograd.profiler.emit_itt() if enabled else contextlib.nullcontext()
