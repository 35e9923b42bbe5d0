"""handlers/free_memory.py: memory freed but kept by the allocator goes back to the system (RSS
from /proc), on each allocator a worker may preload (tests/unit/handlers/generation/test_cache.py's)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kit.paths import ROOT

ALLOCATORS = {"glibc malloc": None, "tcmalloc": "libtcmalloc.so", "jemalloc": "libjemalloc.so"}
# torch's launcher preloads jemalloc with decays that never come (run_cpu's MALLOC_CONF).
NEVER_DECAYS = (
    "oversize_threshold:1,background_thread:true,metadata_thp:auto,dirty_decay_ms:9000000000,muzzy_decay_ms:9000000000"
)
FREED = """
import ctypes
from handlers.free_memory import give_back, resident_bytes

process = ctypes.CDLL(None)
process.malloc.restype, process.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
process.free.argtypes = [ctypes.c_void_p]
blocks = [process.malloc(64 << 10) for _ in range(3200)]  # 200 MB in blocks a heap keeps
for block in blocks:
    ctypes.memset(block, 1, 64 << 10)
for i, block in enumerate(blocks):
    if i % 16:
        process.free(block)  # a sixteenth kept: the freed pages lie between used ones
freed = resident_bytes()
said = give_back()
print(freed - resident_bytes(), said)
"""


@pytest.mark.parametrize("allocator", sorted(ALLOCATORS))
def test_freed_memory_leaves_the_process_whatever_the_allocator(allocator):
    env = dict(os.environ, MALLOC_CONF=NEVER_DECAYS)
    if library := ALLOCATORS[allocator]:
        path = Path(sys.prefix) / "lib" / library
        assert path.is_file(), f"{path}: the kit's {allocator} is not installed"
        env["LD_PRELOAD"] = str(path)
    run = subprocess.run([sys.executable, "-c", FREED], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]
    given, said = run.stdout.split(maxsplit=1)
    assert said.startswith(f"{allocator} gave back ")
    assert int(given) > 150 << 20, run.stdout  # of the 188 MB freed
