"""Every backend a handler can run, and its traits: the one place they are declared.

    traits = BACKENDS[Backend.AOTI]                       # precompiled? environment? allocator? ...
    run = builder(settings.backend)(model, settings, spec)   # imports handlers/backends/aoti.py now

Importing this module imports no torch: the serving side (kit/) reads the traits to pick a
variant's Python environment and allocator without loading a model.

Adding a backend: a module in this package with `build(model, settings, spec) -> runner` (and
`precompile(...)` if `make archive` compiles it; see aoti.py), a member of `Backend` with its
entry in `BACKENDS`, and a config/variants/<name>.yaml that selects it.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

DEFAULT_ENVIRONMENT = ".venv"  # torch 2.13: the kit's own


class Backend(enum.StrEnum):
    EAGER = "eager"
    INDUCTOR = "inductor"
    IPEX = "ipex"  # ipex.optimize + TorchScript trace + freeze
    IPEX_COMPILE = "ipex-compile"  # torch.compile(backend="ipex")
    AOTI = "aoti"  # AOTInductor packages compiled at archive time
    OPENVINO = "openvino"  # OpenVINO IR converted at archive time


class DType(enum.StrEnum):
    FLOAT32 = "float32"
    BFLOAT16 = "bfloat16"
    # Static post-training quantization, calibrated at archive time.
    INT8 = "int8"


class BatchSizes(enum.Enum):
    BUCKETS = "powers of two up to the batch size, each compiled and warmed up in the worker"
    PACKAGED = "only the sizes packaged at archive time (the aoti_batch_sizes setting)"


FLOATS = frozenset({DType.FLOAT32, DType.BFLOAT16})


@dataclasses.dataclass(frozen=True)
class BackendTraits:
    module: str  # handlers/backends/<module>.py, imported only when the backend is used
    dtypes: frozenset[DType]
    builder: str = "build"  # the module's function that returns the runner
    # Compiled (and quantized) by `make archive`: a worker only loads the artifact, in seconds.
    precompiled: bool = False
    environment: str = DEFAULT_ENVIRONMENT  # the Python environment (repository-relative) its workers run in
    preloaded_allocator: bool = True  # runs with tcmalloc/jemalloc LD_PRELOADed by the launcher
    batch_sizes: BatchSizes = BatchSizes.BUCKETS
    # Serves inputs whose non-batch sizes vary (text at its own length): the IR, the package or
    # the compiled graph keeps those dimensions dynamic. A TorchScript trace is not checked at
    # other lengths than its example, so IPEX pads to the one length it was traced at.
    varying_sizes: bool = True
    # A language model on it: the TextGenerationHandler method that makes its engine (the kit's
    # torch engine, or OpenVINO GenAI's pipeline); "": it serves none (AOTInductor and IPEX compile
    # one graph per request shape, and a decode step's cache is state they do not carry).
    generation_engine: str = ""


# BackendTraits.generation_engine's values: the kit's own engine, OpenVINO GenAI's pipeline.
TORCH_ENGINE, OPENVINO_ENGINE = "torch_engine", "openvino_engine"

BACKENDS: dict[Backend, BackendTraits] = {
    Backend.EAGER: BackendTraits("eager", FLOATS, generation_engine=TORCH_ENGINE),
    Backend.INDUCTOR: BackendTraits("inductor", FLOATS, generation_engine=TORCH_ENGINE),
    # IPEX 2.8 imports only with torch 2.8, hence its own environment. Its traced path serves bf16
    # (ipex.optimize's bf16 weights, traced under autocast); its compiled one, measured slower
    # than plain Inductor, stays float32 for comparison.
    Backend.IPEX: BackendTraits("ipex", FLOATS, "build_traced", environment=".venv-ipex", varying_sizes=False),
    Backend.IPEX_COMPILE: BackendTraits(
        "ipex", frozenset({DType.FLOAT32}), "build_compiled", environment=".venv-ipex", varying_sizes=False
    ),
    Backend.AOTI: BackendTraits("aoti", FLOATS | {DType.INT8}, precompiled=True, batch_sizes=BatchSizes.PACKAGED),
    # OpenVINO's CPU plugin frees with glibc what a preloaded tcmalloc/jemalloc allocated
    # ("free(): invalid pointer" in compile_model): its workers keep glibc malloc.
    Backend.OPENVINO: BackendTraits(
        "openvino",
        FLOATS | {DType.INT8},
        precompiled=True,
        preloaded_allocator=False,
        generation_engine=OPENVINO_ENGINE,
    ),
}


CPUINFO = Path("/proc/cpuinfo")
# The vector ISAs that decide which kernels run, by the names users know and Inductor writes in a
# package's AOTI_CPU_ISA, each with the /proc/cpuinfo flags it needs. The one table for the AOTI
# package check, the bf16 check and what `kit topology` and `make status` print.
ISAS: dict[str, frozenset[str]] = {
    "AVX2": frozenset({"avx2", "fma"}),
    "AVX512": frozenset({"avx512f", "avx512bw", "avx512vl", "avx512dq"}),
    "AVX512_VNNI": frozenset({"avx512_vnni"}),
    "AVX_VNNI": frozenset({"avx_vnni"}),
    "AVX512_BF16": frozenset({"avx512_bf16"}),
    "AMX_TILE": frozenset({"amx_tile"}),
    "AMX_BF16": frozenset({"amx_bf16"}),
    "AMX_INT8": frozenset({"amx_int8"}),
}
# bfloat16 is fast only where the CPU computes it: AMX (Intel Sapphire Rapids+) or AVX512_BF16
# (AMD Zen 4+, Intel Cooper Lake). Elsewhere oneDNN converts to float32 around every op, slower
# than float32 (pytorch issue 86270): refused there.
BF16_ISAS = ("AMX_BF16", "AVX512_BF16")
# oneDNN's int8 kernels (AOTInductor's and OpenVINO's) sum u8 x s8 products into 32 bits in one
# instruction on a CPU with one of these. Without, vpmaddubsw first sums pairs of products into
# 16 bits, which saturates: the same int8 program answers differently there (ResNet-50's
# calibration photo 4 flipped on an AMD EPYC Zen 3 and not in the graph's own arithmetic, stop 80).
EXACT_INT8_ISAS = ("AMX_INT8", "AVX512_VNNI", "AVX_VNNI")


def cpuinfo(path: Path = CPUINFO) -> dict[str, str]:
    """The first CPU's /proc/cpuinfo fields ("vendor_id", "model name", "flags", ...)."""
    fields: dict[str, str] = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_isas(flags: Iterable[str]) -> tuple[str, ...]:
    """The ISAS a CPU with these /proc/cpuinfo flags has, in the table's order."""
    flags = set(flags)
    return tuple(name for name, needs in ISAS.items() if needs <= flags)


def bf16_isa(flags: Iterable[str]) -> str | None:
    """The ISA that computes bfloat16 on a CPU with these flags, or None."""
    isas = cpu_isas(flags)  # once: `flags` may be an iterator
    return next((name for name in BF16_ISAS if name in isas), None)


def int8_refusal(judged_on: Iterable[str], here: Iterable[str]) -> str:
    """Why a CPU with the ISAS `here` must not serve int8 answers judged on one with `judged_on`'s
    ("" when it may). Judged with 32-bit sums, served with 16-bit pairs: answers the build never
    saw, and worse ones. The other way round the products are exact where the build's saturated:
    closer to the float arithmetic the quantization was calibrated in, so it may serve."""
    judged = [name for name in EXACT_INT8_ISAS if name in set(judged_on)]
    if not judged or any(name in set(here) for name in EXACT_INT8_ISAS):
        return ""
    return (
        f"its int8 answers were judged on a CPU that sums int8 products in 32 bits ({judged[0]}); this one has "
        f"no {' or '.join(EXACT_INT8_ISAS)} and sums them in 16-bit pairs, which saturate, so it would give "
        "answers the build never judged: rebuild the archive on this machine with `make archive`"
    )


def dtype_refusal(dtype: DType, flags: Iterable[str]) -> str:
    """Why a CPU with these flags must not serve `dtype` ("" when it may)."""
    if dtype is DType.BFLOAT16 and bf16_isa(flags) is None:
        return (
            f"dtype bfloat16 needs a CPU with {' or '.join(BF16_ISAS)}; this one has neither, and "
            "bfloat16 runs slower than float32 there (pytorch issue 86270): serve a float32 or int8 variant here"
        )
    return ""


def cpu_flags(path: Path = CPUINFO) -> frozenset[str]:
    return frozenset(cpuinfo(path).get("flags", "").split())


def cpu_refusal(dtype: DType) -> str:
    """Why this machine's CPU must not serve `dtype` ("" when it may): the one check of archive
    builds, worker starts, the bench and `make tune`."""
    return dtype_refusal(dtype, cpu_flags())


def _module(backend: Backend):
    return importlib.import_module(f"{__name__}.{BACKENDS[backend].module}")


def builder(backend: Backend) -> Callable[..., Any]:
    """`build(model, settings, spec) -> runner` of the backend (imports its module)."""
    return getattr(_module(backend), BACKENDS[backend].builder)


def precompiler(backend: Backend) -> Callable[..., Any]:
    """`precompile(model, settings, example_of, calibration, out_dir, progress, validation)` of a precompiled backend."""
    return _module(backend).precompile


def backends_serving(dtype: DType) -> list[str]:
    return sorted(b.value for b, traits in BACKENDS.items() if dtype in traits.dtypes)


def batch_buckets(max_batch: int) -> list[int]:
    """Powers of two up to max_batch, plus max_batch: the shapes compiled at start-up."""
    sizes = {max_batch}
    size = 1
    while size < max_batch:
        sizes.add(size)
        size *= 2
    return sorted(sizes)


def serving_buckets(max_batch: int, backend: Backend, packaged: Sequence[int]) -> list[int]:
    """The batch sizes to warm up and pad to, for a TorchServe batchSize of max_batch."""
    if BACKENDS[backend].batch_sizes is BatchSizes.BUCKETS:
        return batch_buckets(max_batch)
    sizes = sorted(packaged)
    # Up to the first packaged size that holds a full batch; none -> max_batch, which the
    # loader then reports as missing from the archive.
    cover = next((size for size in sizes if size >= max_batch), max_batch)
    return [size for size in sizes if size < cover] + [cover]
