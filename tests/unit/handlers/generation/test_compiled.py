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
    """A cache as a build's worker leaves it: graphs, a kernel's library in a subdirectory, its locks,
    the precompiled header and the whole graphs the worker kept."""
    cache = root / "build-cache"
    (cache / "fxgraph" / "ab").mkdir(parents=True)
    (cache / "fxgraph" / "ab" / "graph").write_bytes(b"graph")
    (cache / "x7").mkdir()
    (cache / "x7" / "kernel.so").write_bytes(b"\x7fELF kernel")
    (cache / "locks").mkdir()
    (cache / "locks" / "x7.lock").write_text("")
    (cache / "precompiled_headers").mkdir()  # headers_in_cache: the machine's own, ~150 MB
    (cache / "precompiled_headers" / "c1.h.gch").write_bytes(b"gch")
    (cache / compiled.KEPT / "key" / "forward-x").mkdir(parents=True)  # the build's worker's own (keep)
    (cache / compiled.KEPT / "key" / "forward-x" / "decode.graph").write_bytes(b"whole")
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
    # torch loads a whole graph only under the Python that saved it, to the patch version.
    other_transformers = compiled.forward_dir(tmp_path, HERE)
    monkeypatch.setattr(compiled.platform, "python_version", lambda: "3.11.2")
    assert compiled.forward_dir(tmp_path, HERE) != other_transformers


def test_shipping_into_a_shipped_directory_adds_only_what_it_lacks(tmp_path, cpu):
    """`make image` runs a worker's start on a built archive and ships again: the archive's files
    stay as they are (the image's layer holds only the new ones), what the start added is added."""
    model_dir = tmp_path / "model"
    shipped, _ = compiled.ship(build_cache(tmp_path), model_dir, None)
    worker_cache = tmp_path / "worker-cache"
    compiled.unpack(model_dir, worker_cache)
    (worker_cache / "fxgraph" / "ab" / "graph").write_bytes(b"rewritten")  # never copied over the archive's
    (worker_cache / "fxgraph" / "cd").mkdir()
    (worker_cache / "fxgraph" / "cd" / "graph").write_bytes(b"new graph")
    before = (shipped / "fxgraph" / "ab" / "graph").stat().st_ino
    assert compiled.ship(worker_cache, model_dir, None)[0] == shipped
    assert files(shipped) == {
        "fxgraph/ab/graph": b"graph",
        "fxgraph/cd/graph": b"new graph",
        "x7/kernel.so": b"\x7fELF kernel",
    }
    assert (shipped / "fxgraph" / "ab" / "graph").stat().st_ino == before
    shipped.chmod(0o755)
    worker_cache.chmod(0o700)  # as a temporary directory is made: its mode is not the archive's
    compiled.ship(worker_cache, model_dir, None)
    assert shipped.stat().st_mode & 0o777 == 0o755


def test_a_worker_on_the_same_cpu_gets_every_file_the_build_compiled_but_locks_header_and_kept(tmp_path, cpu):
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


def archive(root: Path) -> Path:
    """An archive's files as TorchServe unpacks them: configuration, settings, code, weights."""
    (root / "MAR-INF").mkdir(parents=True)
    (root / "MAR-INF" / "MANIFEST.json").write_text('{"createdOn": "04/12/2026 17:00:36"}')
    (root / "handlers").mkdir()
    (root / "handlers" / "attention.py").write_text("# the code a graph is traced from")
    (root / "config.json").write_text('{"hidden_size": 16}')
    (root / "model-config.yaml").write_text("handler: {dtype: float32}")
    (root / "model.safetensors").write_bytes(b"weights")
    return root


def test_the_model_key_follows_configuration_settings_and_code_not_weights_graphs_or_build_time(tmp_path):
    root = archive(tmp_path / "model")
    key = compiled.model_key(root)
    (root / "model.safetensors").write_bytes(b"other weights")
    (root / "MAR-INF" / "MANIFEST.json").write_text('{"createdOn": "05/12/2026 09:00:00"}')
    (root / compiled.DIRECTORY).mkdir()
    (root / compiled.DIRECTORY / "inductor-x.json").write_text("{}")
    assert compiled.model_key(root) == key
    for name, text in [
        ("config.json", '{"hidden_size": 32}'),
        ("model-config.yaml", "handler: {}"),
        ("handlers/attention.py", "#"),
    ]:
        changed = archive(tmp_path / name.replace("/", "-"))
        (changed / name).write_text(text)
        assert compiled.model_key(changed) != key, name


def test_a_worker_keeps_the_whole_graphs_it_compiled_and_its_next_start_loads_them(tmp_path, cpu, monkeypatch):
    """An archive with no graphs for this CPU: the first worker compiles and keeps its graphs in the
    machine's compile cache; the next loads them and compiles nothing; another CPU does not."""
    from tests.unit.handlers.generation.test_precompiled import Tiny, ids

    cache = tmp_path / "cache"
    monkeypatch.setattr(compiled, "cache_dir", lambda: cache)
    monkeypatch.setattr(compiled, "trace_settings", lambda: None)  # process-wide; test_precompiled's patches
    model_dir = archive(tmp_path / "model")
    with torch.fx.experimental._config.patch(use_duck_shape=False), torch._dynamo.config.patch(specialize_float=True):
        forward, said = compiled.compile_forward(Tiny(), model_dir, {})
        assert said == "0 whole graphs loaded (none)"
        with torch.inference_mode():
            forward(input_ids=ids(2, 1))
            forward(input_ids=ids(1, 8), mixed=torch.tensor(0.5))
        said = compiled.keep(model_dir, forward, cache)
        assert said == "kept 2 whole graphs (decode, mixed) in this machine's compile cache for the next start"
        assert compiled.keep(model_dir, forward, cache) is None  # kept once, by the first worker

        served = Tiny()
        served.forward, said = compiled.compile_forward(served, model_dir, {})
        assert said == "2 whole graphs loaded (decode, mixed) from this machine's compile cache (an earlier worker's)"
        assert not served.forward.traces(["decode", "mixed"])
        with torch.inference_mode():
            torch.testing.assert_close(served(input_ids=ids(3, 1)), served.forward.original(input_ids=ids(3, 1)))
        assert compiled.keep(model_dir, served.forward, cache) is None  # nothing compiled here

        cpu(OTHER)
        assert compiled.compile_forward(Tiny(), model_dir, {})[1] == "0 whole graphs loaded (none)"


def test_a_worker_whose_archive_has_graphs_for_its_cpu_keeps_nothing(tmp_path, cpu):
    from handlers.generation.precompiled import Forward

    model_dir = archive(tmp_path / "model")
    compiled.forward_dir(model_dir, compiled.cpu_flags()).mkdir(parents=True)  # the build's (none loaded)
    forward = Forward(torch.nn.Identity(), {}, {})
    forward.graphs["decode"] = object()  # compiled here: its graph failed to load
    assert compiled.keep(model_dir, forward, tmp_path / "cache") is None
    assert not (tmp_path / "cache").exists()
