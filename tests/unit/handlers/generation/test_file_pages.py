"""handlers/generation/file_pages.py: a tensor's pages that map a file leave the process's
memory (the mapping's Rss in /proc/self/smaps) and read the same afterwards; a tensor written
in place and the process's own memory are never released; packing a checkpoint's model lets its pages go weight by weight; a file's every mapping is released by its path."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from handlers.generation.file_pages import FilePages
from handlers.generation.packed_linear import can_pack, pack_linears
from tests.unit.handlers.generation.checkpoints import read_whole, resident_kb


def test_a_files_pages_are_released_and_read_the_same_again(tmp_path):
    path = tmp_path / "table.bin"
    values = np.arange(1 << 20, dtype=np.float32)  # 4 MB
    values.tofile(path)
    mapped = torch.from_numpy(np.memmap(path, dtype=np.float32, mode="c"))
    total = float(mapped.sum())  # every page read: resident
    assert resident_kb(path) >= 4000
    released = FilePages().release(mapped)
    assert released >= 4 * (1 << 20) - 2 * 4096  # all but the partial pages at its ends
    assert resident_kb(path) <= 8
    assert float(mapped.sum()) == total  # read again from the file


def test_a_files_every_mapping_is_released_by_its_path_and_other_files_keep_theirs(tmp_path):
    # As OpenVINO's plugin maps an IR's weights (shared, read-only) and compiles copies of them.
    path, other = tmp_path / "openvino_model.bin", tmp_path / "other.bin"
    for file in (path, other):
        np.arange(1 << 20, dtype=np.float32).tofile(file)
    mapped = [np.memmap(file, dtype=np.float32, mode="r") for file in (path, path, other)]
    totals = [float(m.sum()) for m in mapped]  # every page read: resident
    assert resident_kb(path) >= 4000 and resident_kb(other) >= 4000
    assert FilePages().release_file(path) == 2 * 4 * (1 << 20)  # both of its mappings
    assert resident_kb(path) <= 8 and resident_kb(other) >= 4000
    assert [float(m.sum()) for m in mapped] == totals  # read again from the file


def test_a_tensor_written_after_it_was_mapped_keeps_its_pages_and_its_values(tmp_path):
    path = tmp_path / "table.bin"
    np.arange(1 << 20, dtype=np.float32).tofile(path)
    mapped = torch.from_numpy(np.memmap(path, dtype=np.float32, mode="c"))  # private, as transformers'
    float(mapped.sum())
    mapped[5000] = -1.0  # a weight changed in place: that page is the process's own now
    assert FilePages().release(mapped) == 0
    assert float(mapped[5000]) == -1.0


def test_a_proc_that_hides_the_pagemap_releases_nothing(tmp_path, monkeypatch):
    path = tmp_path / "table.bin"
    np.arange(1 << 20, dtype=np.float32).tofile(path)
    mapped = torch.from_numpy(np.memmap(path, dtype=np.float32, mode="c"))
    float(mapped.sum())
    real_open = open

    def hidden(name, *args, **kwargs):
        if str(name) == "/proc/self/pagemap":
            raise PermissionError(13, "Permission denied", name)
        return real_open(name, *args, **kwargs)

    monkeypatch.setattr("builtins.open", hidden)
    assert FilePages().release(mapped) == 0
    assert resident_kb(path) >= 4000


def test_the_processs_own_memory_is_never_released():
    tensor = torch.arange(1 << 20, dtype=torch.float32)
    assert FilePages().release(tensor) == 0
    assert torch.equal(tensor, torch.arange(1 << 20, dtype=torch.float32))


def test_only_mappings_of_a_file_count():
    maps = "\n".join(
        [
            "7f0000000000-7f0000100000 r--p 00000000 fd:01 1234 /models/lm/model.safetensors",
            "7f0000100000-7f0000200000 rw-p 00000000 00:00 0 ",
            "7f0000200000-7f0000300000 rw-p 00000000 00:00 0 [heap]",
        ]
    )
    pages = FilePages(maps)
    assert pages.ranges == [(0x7F0000000000, 0x7F0000100000)]
    assert pages.paths == ["/models/lm/model.safetensors"]
    assert pages.of_file(0x7F0000001000, 0x7F0000002000) and not pages.of_file(0x7F0000101000, 0x7F0000102000)


@pytest.mark.skipif(not can_pack(), reason="this torch has no oneDNN")
def test_packing_a_checkpoints_model_lets_its_pages_go(tmp_path):
    model, checkpoint, before = read_whole(tmp_path / "lm")
    pack_linears(model)
    # The linear weights (the tied head, so the embedding's pages too) let go; norms and the
    # pages at the weights' ends stay.
    assert resident_kb(checkpoint) < before / 10
