"""handlers/generation/native.py: the kit's kernels are built into the kit's directory, and a
library that cannot be built leaves oneDNN and sdpa, saying why."""

from __future__ import annotations

import logging

from handlers.generation import native


def test_a_library_that_cannot_be_built_leaves_onednn_and_says_why(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv(native.KERNELS_VAR, str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # a compiler that fails
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert native.library.__wrapped__() is None
    assert "not available" in caplog.text and "row_kernels.cpp and decode_attention.cpp failed" in caplog.text
    assert not list(tmp_path.glob("*.so")) and not list(tmp_path.glob(".build-*"))


def test_the_library_is_named_by_every_source_it_is_built_from(tmp_path, monkeypatch):
    before = native.digest()
    changed = tmp_path / "decode_attention.cpp"
    changed.write_bytes(native.SOURCES[1].read_bytes() + b"// changed\n")
    monkeypatch.setattr(native, "SOURCES", (native.SOURCES[0], changed))
    assert native.digest() != before


def test_the_kernels_directory_is_the_one_the_kit_sets():
    from kit.paths import KERNELS, KERNELS_VAR, process_environment

    assert KERNELS_VAR == native.KERNELS_VAR
    assert process_environment({})[KERNELS_VAR] == str(KERNELS)
