"""handlers/generation/compiled.py: the build's Inductor cache shipped, unpacked only on a CPU like
the build's, never over a file the worker's cache has."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from handlers.generation import compiled

HERE = frozenset({"fpu", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"})
OTHER = HERE - {"avx512f", "avx512bw", "avx512vl", "avx512dq"}  # an AVX2-only CPU


@pytest.fixture
def cpu(monkeypatch):
    """The CPU the code reads: HERE until a test sets another."""

    def use(flags: frozenset[str]) -> None:
        monkeypatch.setattr(compiled, "cpu_flags", lambda: flags)

    use(HERE)
    return use


def build_cache(root: Path) -> Path:
    """A cache as Inductor leaves it: graphs, a kernel's library in a subdirectory, and its locks."""
    cache = root / "build-cache"
    (cache / "fxgraph" / "ab").mkdir(parents=True)
    (cache / "fxgraph" / "ab" / "graph").write_bytes(b"graph")
    (cache / "x7").mkdir()
    (cache / "x7" / "kernel.so").write_bytes(b"\x7fELF kernel")
    (cache / "locks").mkdir()
    (cache / "locks" / "x7.lock").write_text("")
    (cache / "precompiled_headers").mkdir()  # headers_in_cache: the machine's own, ~150 MB
    (cache / "precompiled_headers" / "c1.h.gch").write_bytes(b"gch")
    return cache


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_the_key_names_torch_and_the_cpus_flags_in_any_order():
    assert compiled.cpu_key(["b", "a"], "2.13.0") == compiled.cpu_key(["a", "b"], "2.13.0")
    assert compiled.cpu_key(["a", "b"], "2.13.0") != compiled.cpu_key(["a", "b"], "2.14.0")
    assert compiled.cpu_key(HERE) != compiled.cpu_key(OTHER)


def test_whole_graphs_are_named_by_the_cpu_and_by_pythons_and_transformers_versions(tmp_path, monkeypatch):
    here = compiled.forward_dir(tmp_path, HERE)
    assert here.parent == tmp_path / compiled.DIRECTORY and here != compiled.forward_dir(tmp_path, OTHER)
    monkeypatch.setattr(compiled, "transformers_version", lambda: "0.0.1")
    assert compiled.forward_dir(tmp_path, HERE) != here


def test_a_worker_on_the_same_cpu_gets_every_file_the_build_compiled_but_its_locks_and_header(tmp_path, cpu):
    model_dir = tmp_path / "model"
    shipped, whole = compiled.ship(build_cache(tmp_path), model_dir, None)
    assert whole == [] and shipped.parent == model_dir / compiled.DIRECTORY
    worker_cache = tmp_path / "worker-cache"
    said = compiled.unpack(model_dir, worker_cache)
    assert said.startswith(f"compiled graphs from the archive ({shipped.name}, 0.0 MB, 2 files new here)")
    assert files(worker_cache) == {"fxgraph/ab/graph": b"graph", "x7/kernel.so": b"\x7fELF kernel"}
    assert not (model_dir / compiled.DIRECTORY / shipped.name / "locks").exists()
    # A second worker (or a restart): nothing new, nothing left behind beside the cache's files.
    assert "0 files new here" in compiled.unpack(model_dir, worker_cache)
    assert sorted(p.name for p in worker_cache.iterdir()) == ["fxgraph", "x7"]


def test_a_file_the_workers_cache_has_is_kept(tmp_path, cpu):
    model_dir = tmp_path / "model"
    compiled.ship(build_cache(tmp_path), model_dir, None)
    worker_cache = tmp_path / "worker-cache"
    (worker_cache / "x7").mkdir(parents=True)
    (worker_cache / "x7" / "kernel.so").write_bytes(b"its own")
    assert "1 files new here" in compiled.unpack(model_dir, worker_cache)
    assert (worker_cache / "x7" / "kernel.so").read_bytes() == b"its own"


def test_another_cpu_compiles_and_is_told_which_cpu_the_archive_was_built_for(tmp_path, cpu, monkeypatch):
    monkeypatch.setattr(compiled, "cpuinfo", lambda: {"model name": "Builder CPU"})
    model_dir = tmp_path / "model"
    compiled.ship(build_cache(tmp_path), model_dir, None)
    cpu(OTHER)
    monkeypatch.setattr(compiled, "cpuinfo", lambda: {"model name": "Older CPU"})
    said = compiled.unpack(model_dir, tmp_path / "worker-cache")
    assert said.startswith(
        "the archive's compiled graphs are for another CPU or torch (Builder CPU (AVX2 AVX512), torch "
    )
    assert said.endswith(f"); this worker: Older CPU (AVX2), torch {torch.__version__}: compiling them")
    assert not (tmp_path / "worker-cache").exists()


def test_an_archive_without_compiled_graphs_says_so(tmp_path, cpu):
    assert compiled.unpack(tmp_path, tmp_path / "cache") == "no compiled graphs in the archive: compiling them"
