"""AOTInductor: compile (and int8-quantize) at archive time, load in milliseconds in the worker.

    precompile(model, settings, example_of, calibration, staging)   # make archive
    run = build(None, settings, spec)                                 # worker initialize()

Each package holds its own copy of the weights, so how many there are is the worker's memory:
- a model with a varying dimension (text: its length) gets ONE package whose batch dimension is
  dynamic too, serving every size in `aoti_batch_sizes`. Its kernels are shape-generic anyway:
  int8 BERT-base at batch 1 ran 10.8 vs 10.6 ms at 16 tokens and 37.3 vs 37.7 ms at 128 against a
  static-batch package, with the same outputs (AMX Xeon, one thread). Four packages had held four
  copies of the weights: ~720 MB of a worker's memory for BERT-base;
- a fixed-shape model (an image) gets one static package per size in `aoti_batch_sizes`: a
  dynamic batch dimension measured ~30 % slower for int8 ResNet-50 at batch 1 on this machine.
The weights are kept out of the compiled library (a blob beside it, read once into memory):
inside the .so, a package's weights were resident twice after loading, once copied out and once
as the library's mapped pages (BERT-base int8: 360 MB a package instead of 180).
A package never recompiles, so serving cannot stall on a compiler.

int8 is static PT2E post-training quantization (torchao's X86InductorQuantizer): export ->
prepare -> calibrate on representative inputs -> convert, then AOTInductor with freezing,
which fuses quantize/dequantize pairs into oneDNN int8 convolutions and linears (VNNI/AMX).
Without freezing the quantized graph runs as decomposed fp32 ops (measured ~10x slower).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from handlers.backends import ISAS, DType, cpu_flags, cpu_isas
from handlers.backends.common import BuildSpec, Inputs, export_shapes, mark_varying, prepare, to_layout
from handlers.backends.inductor import inductor_options
from handlers.quiet_imports import torchao_import
from handlers.repair import Quantizer, repaired_if_needed
from handlers.settings import OptimizationSettings

if TYPE_CHECKING:
    from handlers.accuracy import Validation

log = logging.getLogger(__name__)


DYNAMIC_BATCH_PACKAGE = "model.aoti.pt2"
# Inductor options of every package: the weights in a blob beside the library (see above).
WEIGHTS_BESIDE_LIBRARY = {
    "aot_inductor.package_constants_in_so": False,
    "aot_inductor.package_constants_on_disk_format": "binary_blob",
}


def package_name(batch_size: int) -> str:
    return f"model.aoti.b{batch_size}.pt2"


def one_package(settings: OptimizationSettings) -> bool:
    """A model whose inputs vary in a dimension besides the batch is packaged once, batch dynamic."""
    return bool(settings.varying_dims())


def export_for_int8(model: nn.Module, settings: OptimizationSettings, example: Inputs) -> torch.export.ExportedProgram:
    """`example` has batch size 2: the batch dimension is exported dynamic (a batch of 1 would be
    specialised), so the quantized graph can be packaged at any size."""
    return torch.export.export(model, example, dynamic_shapes=export_shapes(settings, example, batch=True))


def quantize_int8(
    program: torch.export.ExportedProgram, calibration: Sequence[Inputs], in_float: Sequence[str] = ()
) -> nn.Module:
    """PT2E static int8 of the exported model; the modules named in `in_float` stay in float."""
    with torchao_import():
        import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as x86
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = x86.X86InductorQuantizer()
    quantizer.set_global(x86.get_default_x86_inductor_quantization_config())
    for name in in_float:
        quantizer.set_module_name_qconfig(name, None)
    prepared = prepare_pt2e(program.module(), quantizer)
    with torch.no_grad():
        for inputs in calibration:
            prepared(*inputs)
    return convert_pt2e(prepared)


@dataclasses.dataclass(frozen=True)
class PackageSpec:
    """One package to compile: its export example, whether its batch dimension is dynamic, its path."""

    what: str  # for progress: the batch sizes it serves
    example: Inputs
    batch: bool
    path: Path
    takes_one: bool  # it serves a batch of one, as a repair's validation inputs are


def package_specs(
    settings: OptimizationSettings, example_of: Callable[[int], Inputs], out_dir: Path
) -> list[PackageSpec]:
    if one_package(settings):
        sizes = list(settings.aoti_batch_sizes)
        # Batch 2 to export: a batch of 1 would be specialised, as in quantize_int8.
        return [
            PackageSpec(
                f"one package for batch sizes {sizes}", example_of(2), True, out_dir / DYNAMIC_BATCH_PACKAGE, True
            )
        ]
    return [
        PackageSpec(f"batch size {size}", example_of(size), False, out_dir / package_name(size), size == 1)
        for size in settings.aoti_batch_sizes
    ]


def precompile(
    model: nn.Module,
    settings: OptimizationSettings,
    example_of: Callable[[int], Inputs],
    calibration: Sequence[Inputs],
    out_dir: Path,
    progress: Callable[[str], None] = log.info,
    validation: Validation | None = None,
) -> list[Path]:
    """The AOTInductor packages of the eval `model`, in the served layout: one, or one per batch size (above)."""

    def served(inputs: Inputs) -> Inputs:
        return to_layout(inputs, settings.channels_last)

    def compiled(model: nn.Module, spec: PackageSpec) -> Path:
        progress(f"AOTInductor: compiling {spec.what}")
        return compile_package(model, settings, spec.example, spec.batch, spec.path)

    model = prepare(model, settings)
    specs = package_specs(settings, lambda size: served(example_of(size)), out_dir)
    if settings.dtype is not DType.INT8:
        return [compiled(model, spec) for spec in specs]
    progress(f"int8: calibrating on {len(calibration)} batches")
    calibration = [served(batch) for batch in calibration]
    program = export_for_int8(model, settings, served(example_of(2)))
    model = quantize_int8(program, calibration)
    if validation is None:
        return [compiled(model, spec) for spec in specs]
    # The quantized model is judged as its first package (one taking a batch of one) computes: that
    # package is kept when no repair is needed, so the judgement costs no compile of its own; each
    # repair trial is judged compiled in process (as_packaged: the same kernels, one compile less).
    first = next((spec for spec in specs if spec.takes_one), None)
    kept = compiled(model, first) if first else None
    plain = Package(kept) if kept else as_packaged(model, settings)
    quantizer = Quantizer(
        module_groups(program),
        lambda in_float: quantize_int8(program, calibration, in_float),
        lambda quantized: plain if quantized is model else as_packaged(quantized, settings),
    )
    repaired = repaired_if_needed(model, quantizer, served_validation(validation, settings), progress)
    if repaired is not model:
        kept = None  # the first package is of the unrepaired model: compiled again
    return [kept if kept and spec is first else compiled(repaired, spec) for spec in specs]


# The ops PT2E's x86 quantizer runs in int8 (with their weight as the second argument).
QUANTIZABLE = frozenset({torch.ops.aten.linear.default, torch.ops.aten.conv2d.default, torch.ops.aten.conv1d.default})


def module_groups(program: torch.export.ExportedProgram) -> list[list[str]]:
    """The modules that call a quantizable op, grouped by op and weight shape: one role in every
    layer, which a repair keeps in float together (handlers/repair.py). Names as the quantizer's
    `set_module_name_qconfig` takes them (the module paths torch.export records)."""
    groups: dict[tuple, list[str]] = {}
    for node in program.graph.nodes:
        stack = node.meta.get("nn_module_stack")
        if node.op != "call_function" or node.target not in QUANTIZABLE or not stack:
            continue
        name = list(stack.values())[-1][0]
        key = (str(node.target), tuple(node.args[1].meta["val"].shape))
        if name not in groups.setdefault(key, []):
            groups[key].append(name)
    return list(groups.values())


def as_packaged(quantized: nn.Module, settings: OptimizationSettings) -> Callable[..., torch.Tensor]:
    """`quantized` computing as its package will: compiled by Inductor with freezing, which fuses
    its quantize/dequantize pairs into oneDNN's int8 kernels. A repair judges these answers, not
    the quantized graph's own: they differ by the CPU. On one without VNNI (AVX2: AMD EPYC Zen 3),
    oneDNN's int8 products lose range, and int8 ResNet-50 flipped one calibration image's top
    class past a 0.14 margin that the graph run as it is kept within 0.02; a repair measured
    there had installed a package over its limit."""
    torch._dynamo.reset()  # each trial is another model: nothing of the last one's graphs is reused
    compiled = torch.compile(quantized, backend="inductor", options=inductor_options(settings), dynamic=False)
    dims = tuple(settings.varying_dims())  # text lengths: one graph for them all, as the package has

    def run(*inputs: torch.Tensor) -> torch.Tensor:
        # Freezing is read when the first call compiles (handlers/backends/inductor.py).
        with torch._inductor.config.patch(freezing=True), quiet_int8_lowering():
            return compiled(*mark_varying(inputs, dims))

    return run


def served_validation(validation: Validation, settings: OptimizationSettings) -> Validation:
    """The validation inputs in the served layout (channels-last), as the quantized graph takes them."""
    return dataclasses.replace(
        validation, batches=[to_layout(batch, settings.channels_last) for batch in validation.batches]
    )


@contextlib.contextmanager
def quiet_int8_lowering() -> Iterator[None]:
    """Without the warning torch's own int8 lowering gives once per layer (it copies a tensor the
    deprecated way): nothing a user can act on."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)
        yield


def compile_package(model: nn.Module, settings: OptimizationSettings, example: Inputs, batch: bool, path: Path) -> Path:
    """One AOTInductor package of `model` at `example`'s shapes (`batch`: its batch dimension dynamic)."""
    with torch.no_grad(), quiet_int8_lowering():  # freezing only applies without autograd
        program = torch.export.export(model, example, dynamic_shapes=export_shapes(settings, example, batch=batch))
        options = {**inductor_options(settings), "freezing": True, **WEIGHTS_BESIDE_LIBRARY}
        return Path(torch._inductor.aoti_compile_and_package(program, package_path=str(path), inductor_configs=options))


def check_cpu(path: Path) -> None:
    """A package built on a newer CPU dies of SIGILL on an older one: refuse it by name instead."""
    metadata = torch._C._aoti.AOTIModelPackageLoader.load_metadata_from_package(str(path), "model")
    compiled_for = metadata.get("AOTI_CPU_ISA", "").split()
    here = cpu_isas(cpu_flags())
    missing = [isa for isa in compiled_for if isa in ISAS and isa not in here]
    if missing:
        raise RuntimeError(
            f"{path.name} was compiled for {' '.join(compiled_for)}, but this CPU lacks {' '.join(missing)}; "
            "rebuild the archive on this machine with `make archive`"
        )


@contextlib.contextmanager
def extraction_dir() -> Iterator[None]:
    """A directory of our own for the loader to unpack a package into, deleted once it is loaded.

    The loader unpacks into $TMPDIR/aotinductor_* and deletes that only in its destructor, which a
    worker TorchServe kills never runs: each worker start had left the package's library and
    weights in /tmp (59 MB for int8 ResNet-50 at one batch size), on a container's memory-backed
    /tmp as memory. Once loaded, the library is mapped and the weights read, so the files can go.
    """
    scratch = Path(tempfile.mkdtemp(prefix="kit-aoti-"))
    previous = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(scratch)
    try:
        yield
    finally:
        if previous is None:
            del os.environ["TMPDIR"]
        else:
            os.environ["TMPDIR"] = previous
        shutil.rmtree(scratch, ignore_errors=True)


class Package:
    """One package, run through AOTInductor's C++ loader.

    torch._inductor.aoti_load_package would import Dynamo and Inductor (~1.5 s) and compile and
    dlopen ISA test programs in subprocesses (~1.2 s) only to warn on an ISA mismatch: ~2.7 s of
    a ~3.4 s worker start, measured on one core. Our packages take tensors and return one tensor,
    so the loader's flat call is all the wrapper did; `check_cpu` is the ISA check, as an error.
    """

    def __init__(self, path: Path):
        with extraction_dir():  # reading the metadata unpacks the package too
            check_cpu(path)
            self.loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        (output,) = self.loader.boxed_run(list(inputs))
        return output


class PackagedModel:
    """Calls the package compiled for the batch size of the inputs (one package may serve them all)."""

    def __init__(self, runners: dict[int, Callable[..., torch.Tensor]]):
        self.runners = runners

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.runners[inputs[0].shape[0]](*inputs)


def build(model: nn.Module | None, settings: OptimizationSettings, spec: BuildSpec) -> PackagedModel:
    """The archive's packages for every served batch size; `model` (the eager one) is not needed."""
    model_dir, buckets = spec.archive(), spec.batch_sizes
    missing = sorted(set(buckets) - set(settings.aoti_batch_sizes))
    if missing:
        raise ValueError(
            f"the archive has AOTInductor packages for batch sizes {list(settings.aoti_batch_sizes)}, but serving "
            f"needs {missing}; lower batchSize or add them to aoti_batch_sizes and rebuild with `make archive`"
        )
    if one_package(settings):
        package = Package(existing(model_dir / DYNAMIC_BATCH_PACKAGE))
        return PackagedModel(dict.fromkeys(buckets, package))
    return PackagedModel({size: Package(existing(model_dir / package_name(size))) for size in buckets})


def existing(path: Path) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the archive; rebuild it with `make archive`")
    return path
