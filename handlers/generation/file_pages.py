"""A checkpoint's mapped pages let go once what was read from them has a copy of its own.

    pages = FilePages()            # the process's file mappings, read from /proc/self/maps
    pages.release(linear.weight)   # after packing it: its pages leave the process's memory

transformers maps a safetensors checkpoint and hands the model views of the mapping, whose pages
stay resident while the mapping lives (weights.py lets it go at the end). A worker that packs
each weight into a copy (packed_linear.py) would hold the checkpoint's pages and the packed
copies at once: twice the weights, the load's peak, which the memory plan counts per worker.
Released weight by weight, the peak is the packed copies and one weight.

Only pages that still hold the file's bytes: the kernel reads them again from the file if
anything touches them later (a tied embedding read after its head was packed), so releasing one
loses nothing. A mapping transformers hands out is private and writable: a page written in place
(a weight changed after loading) is the process's own copy, which releasing would revert to the
file's bytes; a tensor with such a page (/proc/self/pagemap: present and not a file page, or
swapped) is left as it is. Memory of the process's own is never released here.
"""

from __future__ import annotations

import ctypes
import mmap
from pathlib import Path

import numpy as np
import torch

# /proc/self/pagemap: a 64-bit entry per page; bit 63 present, 62 swapped, 61 a file's (or shared) page.
PRESENT, SWAPPED, FILE_PAGE = np.uint64(1 << 63), np.uint64(1 << 62), np.uint64(1 << 61)
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


class FilePages:
    def __init__(self, maps: str | None = None):
        self.ranges: list[tuple[int, int]] = []  # [start, end) of every mapping of a file
        self.paths: list[str] = []  # the file each range maps
        for line in (Path("/proc/self/maps").read_text() if maps is None else maps).splitlines():
            fields = line.split(maxsplit=5)
            # address perms offset device inode path: a file's has an inode and an absolute path
            if len(fields) >= 6 and fields[4] != "0" and fields[5].startswith("/"):
                start, end = (int(a, 16) for a in fields[0].split("-"))
                self.ranges.append((start, end))
                self.paths.append(fields[5])

    def of_file(self, start: int, end: int) -> bool:
        return any(low <= start and end <= high for low, high in self.ranges)

    def release(self, tensor: torch.Tensor) -> int:
        """The whole pages of the tensor's bytes let go where they map a file; the bytes released."""
        if type(tensor.data) is not torch.Tensor:
            return 0  # a tensor subclass (torchao's int8): its own tensors are not the checkpoint's
        start = tensor.data_ptr()
        end = start + tensor.numel() * tensor.element_size()
        if not self.of_file(start, end):
            return 0
        first, last = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE, end // mmap.PAGESIZE * mmap.PAGESIZE
        if last <= first or written(first, last):
            return 0
        if _LIBC.madvise(first, last - first, mmap.MADV_DONTNEED) != 0:
            raise OSError(ctypes.get_errno(), "madvise(MADV_DONTNEED) of a checkpoint's pages")
        return last - first

    def release_file(self, path: Path) -> int:
        """Every mapping of the file let go, as `release` lets a tensor's pages go; the bytes
        released. For a library that maps a file and compiles copies of what it reads (OpenVINO's
        CPU plugin, an IR's weights): pages it reads again come back from the file as used."""
        released = 0
        for (first, last), mapped in zip(self.ranges, self.paths, strict=True):
            if mapped == str(path.resolve()) and not written(first, last):
                if _LIBC.madvise(first, last - first, mmap.MADV_DONTNEED) != 0:
                    raise OSError(ctypes.get_errno(), f"madvise(MADV_DONTNEED) of {path}'s pages")
                released += last - first
        return released


def written(first: int, last: int) -> bool:
    """Whether a page of [first, last) is the process's own (written after it was mapped)."""
    pages = (last - first) // mmap.PAGESIZE
    try:
        with open("/proc/self/pagemap", "rb") as f:
            f.seek(first // mmap.PAGESIZE * 8)
            entries = np.frombuffer(f.read(pages * 8), dtype=np.uint64)
    except OSError:  # a /proc that hides it (a sandbox): nothing is known, so nothing is released
        return True
    own = ((entries & PRESENT) != 0) & ((entries & FILE_PAGE) == 0)
    return bool(own.any() or ((entries & SWAPPED) != 0).any())
