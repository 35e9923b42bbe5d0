"""AOTInductor: compile (and int8-quantize) at archive time, load in milliseconds in the worker.

    precompile(model, settings, example_of, calibration, staging)   # make archive
    run = build(None, settings, spec)                                 # worker initialize()

One package per batch size in `aoti_batch_sizes`, each with static shapes: a dynamic batch
dimension measured ~30 % slower for int8 ResNet-50 at batch 1 on this machine. A package
never recompiles, so serving cannot stall on a compiler.

int8 is static PT2E post-training quantization (torchao's X86InductorQuantizer): export ->
prepare -> calibrate on representative inputs -> convert, then AOTInductor with freezing,
which fuses quantize/dequantize pairs into oneDNN int8 convolutions and linears (VNNI/AMX).
Without freezing the quantized graph runs as decomposed fp32 ops (measured ~10x slower).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import nn

from handlers.backends import ISAS, DType, cpu_flags, cpu_isas
from handlers.backends.common import BuildSpec, Inputs, export_shapes, prepare, to_layout
from handlers.backends.inductor import inductor_options
from handlers.quiet_imports import torchao_import
from handlers.settings import OptimizationSettings

log = logging.getLogger(__name__)


def package_name(batch_size: int) -> str:
    return f"model.aoti.b{batch_size}.pt2"


def quantize_int8(
    model: nn.Module, settings: OptimizationSettings, example: Inputs, calibration: Sequence[Inputs]
) -> nn.Module:
    """PT2E static int8. `example` has batch size 2: the batch dimension is exported dynamic (a
    batch of 1 would be specialised), so the quantized graph can be packaged at any size."""
    with torchao_import():
        import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as x86
        from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = x86.X86InductorQuantizer()
    quantizer.set_global(x86.get_default_x86_inductor_quantization_config())
    program = torch.export.export(model, example, dynamic_shapes=export_shapes(settings, example, batch=True))
    prepared = prepare_pt2e(program.module(), quantizer)
    with torch.no_grad():
        for inputs in calibration:
            prepared(*inputs)
    return convert_pt2e(prepared)


def precompile(
    model: nn.Module,
    settings: OptimizationSettings,
    example_of: Callable[[int], Inputs],
    calibration: Sequence[Inputs],
    out_dir: Path,
    progress: Callable[[str], None] = log.info,
) -> list[Path]:
    """One AOTInductor package per batch size of the eval `model`, in the served layout."""

    def served(inputs: Inputs) -> Inputs:
        return to_layout(inputs, settings.channels_last)

    model = prepare(model, settings)
    calibration = [served(batch) for batch in calibration]
    if settings.dtype is DType.INT8:
        progress(f"int8: calibrating on {len(calibration)} batches")
        model = quantize_int8(model, settings, served(example_of(2)), calibration)
    packages = []
    for size in settings.aoti_batch_sizes:
        progress(f"AOTInductor: compiling batch size {size}")
        with torch.no_grad(), warnings.catch_warnings():  # freezing only applies without autograd
            # torch's own int8 lowering copies a tensor the deprecated way, once per layer.
            warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)
            example = served(example_of(size))
            program = torch.export.export(model, example, dynamic_shapes=export_shapes(settings, example, batch=False))
            packages.append(
                Path(
                    torch._inductor.aoti_compile_and_package(
                        program,
                        package_path=str(out_dir / package_name(size)),
                        inductor_configs={**inductor_options(settings), "freezing": True},
                    )
                )
            )
    return packages


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


class Package:
    """One package, run through AOTInductor's C++ loader.

    torch._inductor.aoti_load_package would import Dynamo and Inductor (~1.5 s) and compile and
    dlopen ISA test programs in subprocesses (~1.2 s) only to warn on an ISA mismatch: ~2.7 s of
    a ~3.4 s worker start, measured on one core. Our packages take tensors and return one tensor,
    so the loader's flat call is all the wrapper did; `check_cpu` is the ISA check, as an error.
    """

    def __init__(self, path: Path):
        check_cpu(path)
        self.loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        (output,) = self.loader.boxed_run(list(inputs))
        return output


class PackagedModel:
    """Calls the package compiled for the batch size of the inputs."""

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
    runners = {}
    for size in buckets:
        path = model_dir / package_name(size)
        if not path.is_file():
            raise FileNotFoundError(f"{path} is missing from the archive; rebuild it with `make archive`")
        runners[size] = Package(path)
    return PackagedModel(runners)
