"""Memory a worker freed, given back to the system by whichever allocator the worker runs on.

    gave = give_back()    # after the load: "tcmalloc gave back 823 MB (RSS 3231 -> 2408 MB)"

A language model's load frees more than it keeps: float32 copies of a bf16 checkpoint once
packed, quantization's temporaries, the accuracy guard's activations. The allocators the kit
preloads keep what is freed for reuse: tcmalloc in its page heap, jemalloc in arenas that torch's
launcher tells never to decay. A worker's RSS, and the footprint the memory plan reads from it
(kit/footprint.py), kept that garbage for the worker's life: Qwen2.5-0.5B's shape on int8 weights
held 2.2 GB after its load on tcmalloc, 1.0 GB once given back (docs/generation.md, "Memory of a
load that converts").
Each allocator has its own call; glibc's malloc_trim is the fallback.
"""

from __future__ import annotations

import ctypes
import mmap
import os

MALLCTL_ARENAS_ALL = 4096  # jemalloc's index for "every arena"


def resident_bytes() -> int:
    with open(f"/proc/{os.getpid()}/statm") as statm:
        return int(statm.read().split()[1]) * mmap.PAGESIZE


def give_back() -> str:
    """Free pages of the process's allocator returned to the system; what was done, in words."""
    process = ctypes.CDLL(None)  # the preloaded allocator's symbols come first
    before = resident_bytes()
    if hasattr(process, "MallocExtension_ReleaseFreeMemory"):  # gperftools' tcmalloc
        process.MallocExtension_ReleaseFreeMemory()
        allocator = "tcmalloc"
    elif hasattr(process, "mallctl"):  # jemalloc: purge every arena's unused dirty pages
        process.mallctl.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]
        process.mallctl(f"arena.{MALLCTL_ARENAS_ALL}.purge".encode(), None, None, None, 0)
        allocator = "jemalloc"
    else:
        process.malloc_trim(0)
        allocator = "glibc malloc"
    after = resident_bytes()
    return (
        f"{allocator} gave back {max(0, before - after) / 1e6:.0f} MB (RSS {before / 1e6:.0f} -> {after / 1e6:.0f} MB)"
    )
