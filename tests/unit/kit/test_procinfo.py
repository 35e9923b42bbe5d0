"""The allocator check reads the real /proc/PID/maps of a real process."""

import os
import subprocess
import sys

import pytest

from kit.procinfo import inspect_process, loaded_allocator
from kit.variant import Variant

VENV = Variant.load("inductor").environment  # the main environment, with its allocator links

SLEEPER = [sys.executable, "-c", "import time; print('ready', flush=True); time.sleep(30)"]


def start(env_extra: dict[str, str]) -> subprocess.Popen:
    process = subprocess.Popen(SLEEPER, env={**os.environ, **env_extra}, stdout=subprocess.PIPE, text=True)
    # Once Python prints, ld.so has long mapped every preloaded library.
    assert process.stdout.readline().strip() == "ready"
    return process


@pytest.mark.parametrize("allocator", ["jemalloc", "tcmalloc"])
def test_preloaded_allocator_is_seen_in_maps(allocator):
    library = VENV / "lib" / f"lib{allocator}.so"
    assert library.exists(), f"{library} missing: `make install` links it for the launcher"
    process = start({"LD_PRELOAD": str(library)})
    try:
        assert loaded_allocator(process.pid) == allocator
    finally:
        process.kill()
        process.wait()


def test_plain_process_uses_default_allocator():
    process = start({"LD_PRELOAD": ""})
    try:
        info = inspect_process(process.pid)
        assert info.allocator == "default"
        assert info.cpus == tuple(sorted(os.sched_getaffinity(0)))
        assert info.rss_mb > 0
    finally:
        process.kill()
        process.wait()
