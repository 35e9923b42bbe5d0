"""A language model's forward compiled, and its graphs shipped in its archive: the Inductor cache a
build filled, and each kind of step's whole graph (precompiled.py).

    ship(cache, model_dir, model.forward)   # the build (model_store/lm_compile.py), after a worker's start
    said = unpack(model_dir, cache)         # a worker, before it compiles: what it found, in a phrase
    model.forward, said = compile_forward(model, model_dir)
    said = keep(model_dir, model.forward, cache)   # after its warm-up: graphs it compiled, for its next start

A worker's first start on a machine compiles its graphs (Qwen2.5-0.5B's shape: 98 s of warm-up on
2 cores). The build runs a worker's own start (load, compile, warm-up) with a cache of its own and
ships that cache's files (the FX graphs, AOTAutograd's entries and the kernels' compiled
libraries) and the whole graphs the start compiled (precompiled.py: Dynamo's part, which the
cache does not hold). torch's cache artifacts (`torch.compiler.save_cache_artifacts`) carry the
graphs but not the libraries, which each start then compiles again: a tiny Qwen2's warm-up took
48 s with neither, 26 s with the artifacts, 8 s with the cache's files (2-core AMD EPYC, one start
each); a whole graph still compiles its kernels' libraries when they are not in the cache (34 s
against 3 s for a tiny Qwen2's two, one start each).

Inductor compiles its kernels with -march=native and no key of its cache names the CPU: a library
built on one CPU may use instructions another lacks (SIGILL). The shipped directory is named by a
digest of torch's version and the CPU's /proc/cpuinfo flags (the whole graphs' also of Python's
and transformers' versions), and a worker takes only the one made for a CPU like its own;
otherwise it compiles, as without the files, and says why, and keeps the whole graphs it compiled
in the machine's compile cache (KEPT), under a digest of what decides them (the archive's
configuration, settings and code: model_key) and this CPU's key, where its next start and the
model's other workers find them: a pod on a CPU the build did not have compiles once, not at every
start. The thread
count is not part of it: a language model's kernels read theirs when they run (DYNAMIC_THREADS),
so graphs the build compiled with its threads serve a worker planned with any other number. The
files sit in the archive's directory as they sat in the cache: copied file by file, nothing to
extract, so nothing that could write outside the cache.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch import nn

from handlers.backends import cpu_flags, cpu_isas, cpuinfo
from handlers.backends.inductor import HEADERS, headers_in_cache
from handlers.generation import precompiled
from handlers.generation.precompiled import Forward

DIRECTORY = "compiled"  # in the model's directory (the archive's root)
LOCKS = "locks"  # Inductor's lock files: of the process that held them, never shipped
KEPT = "kit-whole-graphs"  # in a compile cache: whole graphs a worker compiled (its archive had none)
# The archive's files that decide its whole graphs (keyed by model_key): the model's configuration,
# the handler's settings and the code the graphs were traced from; not its weights (inputs of the
# graphs), its compiled graphs, nor TorchServe's manifest (it names the build's time).
KEYED = frozenset({".py", ".json", ".yaml", ".jinja"})
UNKEYED = frozenset({DIRECTORY, "MAR-INF"})


# Inductor's option for kernels that read the thread count when they run, in every compile of a
# language model, the build's and the workers' alike (its value is part of the cache's key).
# Without it each kernel is specialised for the threads it was compiled under and the cache's key
# names them: a worker planned with other threads than the build's compiled everything again.
# What it costs a decode step: `make bench-threads` (docs/generation.md, "Start").
DYNAMIC_THREADS = {"cpp.dynamic_threads": True}


def trace_settings() -> None:
    """Dynamo's settings for a language model's forward, process-wide (a worker compiles one model)."""
    # Sizes that happen to be equal when first traced share a symbol ("duck" shapes), and a later
    # call where they differ compiles again: a prompt padded to 64 positions would be tied to a
    # head size of 64.
    torch.fx.experimental._config.use_duck_shape = False
    # A float the model holds (an embedding's norm_type) would be traced as a symbol, then
    # specialised by a second trace of the whole graph: a third of the compile's time.
    torch._dynamo.config.specialize_float = True
    headers_in_cache()  # found again at the next start


def compile_traced(model: nn.Module, options: dict = DYNAMIC_THREADS) -> Callable:
    """The model's forward compiled graph by graph for any number of rows and tokens (dynamic
    shapes), traced again at every start."""
    trace_settings()
    return torch.compile(model.forward, dynamic=True, options=options)


def compile_forward(model: nn.Module, model_dir: Path, options: dict = DYNAMIC_THREADS) -> tuple[Forward, str]:
    """The model's forward as whole graphs: the archive's for this CPU, the others compiled at
    their first step; what was loaded, in a phrase."""
    trace_settings()
    flags = cpu_flags()
    graphs, said = precompiled.load(forward_dir(model_dir, flags), model)
    if not graphs and (kept := kept_dir(model_dir, flags, cache_dir())).is_dir():
        graphs, said = precompiled.load(kept, model)
        said += " from this machine's compile cache (an earlier worker's)"
    return Forward(model, options, graphs), said


def model_key(model_dir: Path) -> str:
    """A digest of the archive's files that decide its whole graphs (KEYED, outside UNKEYED)."""
    digest = hashlib.sha256()
    root = Path(model_dir)
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root)
        if path.is_file() and path.suffix in KEYED and relative.parts[0] not in UNKEYED:
            digest.update(f"{relative}\0{path.stat().st_size}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def kept_dir(model_dir: Path, flags: Iterable[str], cache: Path) -> Path:
    """Where a worker keeps the whole graphs it compiled for this model, CPU and versions."""
    return Path(cache) / KEPT / model_key(model_dir) / forward_dir(model_dir, flags).name


def keep(model_dir: Path, forward: Forward, cache: Path) -> str | None:
    """The whole graphs this worker compiled saved into the machine's compile cache, where its
    archive has none for this CPU and no other worker kept them first; what was kept, in a phrase,
    or None."""
    flags = cpu_flags()
    if not set(forward.graphs) - forward.loaded_kinds or forward_dir(model_dir, flags).is_dir():
        return None
    target = kept_dir(model_dir, flags, cache)  # the archive's files read only now: nothing to keep otherwise
    if target.exists():
        return None
    # Saved beside it, then renamed: the model's workers start at once on one cache.
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    saved = forward.save(partial)
    try:
        partial.rename(target)
    except OSError:  # another worker's came first
        shutil.rmtree(partial, ignore_errors=True)
        return None
    return f"kept {len(saved)} whole graphs ({', '.join(saved) or 'none'}) in this machine's compile cache for the next start"


def cpu_key(flags: Iterable[str], version: str = torch.__version__) -> str:
    return hashlib.sha256(" ".join([version, *sorted(flags)]).encode()).hexdigest()[:16]


def shipped_dir(model_dir: Path, flags: Iterable[str]) -> Path:
    return Path(model_dir) / DIRECTORY / f"inductor-{cpu_key(flags)}"


def forward_dir(model_dir: Path, flags: Iterable[str]) -> Path:
    """Where the whole graphs for this CPU are: their saved code is also Python's bytecode, and
    calls transformers' functions. torch loads them only under the Python that saved them, to its
    patch version (an image's Debian Python 3.11.2 refused a build's 3.11.7: "Compile package was
    created with a different Python version")."""
    versions = f"{torch.__version__} python {platform.python_version()} transformers {transformers_version()}"
    return Path(model_dir) / DIRECTORY / f"forward-{cpu_key(flags, versions)}"


def transformers_version() -> str:
    from importlib.metadata import version

    return version("transformers")


def describe(flags: Iterable[str]) -> str:
    """A CPU and torch in words: where a shipped cache was built, and where it is read."""
    isas = " ".join(cpu_isas(flags))
    return f"{cpuinfo().get('model name', 'unknown')} ({isas}), torch {torch.__version__}"


def ship(cache: Path, model_dir: Path, forward: Forward | None) -> tuple[Path, list[str]]:
    """The cache's files and the forward's whole graphs into the model's directory, under names for
    this CPU and torch; the cache's copy and the kinds of step saved whole."""
    flags = cpu_flags()
    target = shipped_dir(model_dir, flags)
    # The precompiled header stays out: ~150 MB, which a machine compiles once in 9 s (2 cores)
    # and keeps in its cache (headers_in_cache).
    # Nor what the build's worker kept for a start of its own (KEPT): the archive has its graphs.
    # Into a shipped directory already there (`make image`: the archive's kernels, graphs for the
    # image's Python added), only the files it lacks, nothing else touched: the image's layer
    # then holds only those.
    target.mkdir(parents=True, exist_ok=True)
    for source in sorted(cache.rglob("*")):
        relative = source.relative_to(cache)
        destination = target / relative
        if source.is_file() and relative.parts[0] not in (LOCKS, HEADERS, KEPT) and not destination.exists():
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination)
    target.with_suffix(".json").write_text(json.dumps({"built": describe(flags)}))
    saved = [] if forward is None else forward.save(forward_dir(model_dir, flags))
    return target, saved


def unpack(model_dir: Path, cache: Path) -> str:
    """The archive's compiled files for this CPU added to the worker's Inductor cache (a file the
    cache already has is kept); what was found, in a phrase for the log."""
    flags = cpu_flags()
    own = shipped_dir(model_dir, flags)
    if not own.is_dir():
        others = [json.loads(p.read_text()) for p in sorted((Path(model_dir) / DIRECTORY).glob("inductor-*.json"))]
        if not others:
            return "no compiled graphs in the archive: compiling them"
        built = "; ".join(other["built"] for other in others)
        return (
            f"the archive's compiled graphs are for another CPU or torch ({built}); "
            f"this worker: {describe(flags)}: compiling them"
        )
    shipped = [path for path in sorted(own.rglob("*")) if path.is_file()]
    added = 0
    for source in shipped:
        target = cache / source.relative_to(own)
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        # Copied beside it, then renamed: several workers of a model start at once on one cache,
        # and a file there is either whole or absent.
        partial = target.with_name(f".{target.name}.{os.getpid()}")
        shutil.copyfile(source, partial)
        os.replace(partial, target)
        added += 1
    size = sum(path.stat().st_size for path in shipped)
    return f"compiled graphs from the archive ({own.name}, {size / 1e6:.1f} MB, {added} files new here)"


def cache_dir() -> Path:
    """The Inductor cache this process compiles into (TORCHINDUCTOR_CACHE_DIR, or torch's default)."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir as inductor_cache

    return Path(inductor_cache())
