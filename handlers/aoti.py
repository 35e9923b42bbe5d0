"""AOTInductor: compile (and int8-quantize) at archive time, load in milliseconds in the worker.

    build_packages(model, settings, example_of, calibration, staging)  # make archive
    run = load_packages(model_dir, settings, buckets)                   # worker initialize()

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

from handlers.optimize import Inputs, inductor_options
from handlers.settings import DType, OptimizationSettings

log = logging.getLogger(__name__)


def package_name(batch_size: int) -> str:
    return f"model.aoti.b{batch_size}.pt2"


def quantize_int8(model: nn.Module, example: Inputs, calibration: Sequence[Inputs]) -> nn.Module:
    """PT2E static int8. `example` has batch size 2: the batch dimension is exported dynamic (a
    batch of 1 would be specialised), so the quantized graph can be packaged at any size."""
    import torchao.quantization.pt2e.quantizer.x86_inductor_quantizer as x86
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    quantizer = x86.X86InductorQuantizer()
    quantizer.set_global(x86.get_default_x86_inductor_quantization_config())
    # AUTO: dynamic unless the model limits it (a user's exported program may cap the batch).
    program = torch.export.export(model, example, dynamic_shapes=tuple({0: torch.export.Dim.AUTO} for _ in example))
    prepared = prepare_pt2e(program.module(), quantizer)
    with torch.no_grad():
        for inputs in calibration:
            prepared(*inputs)
    return convert_pt2e(prepared)


def build_packages(
    model: nn.Module,
    settings: OptimizationSettings,
    example_of: Callable[[int], Inputs],
    calibration: Sequence[Inputs],
    out_dir: Path,
    progress: Callable[[str], None] = log.info,
) -> list[Path]:
    """One AOTInductor package per batch size; `model` is the prepared (layout) eval model."""
    if settings.dtype is DType.INT8:
        progress(f"int8: calibrating on {len(calibration)} batches")
        model = quantize_int8(model, example_of(2), calibration)
    packages = []
    for size in settings.aoti_batch_sizes:
        progress(f"AOTInductor: compiling batch size {size}")
        with torch.no_grad(), warnings.catch_warnings():  # freezing only applies without autograd
            # torch's own int8 lowering copies a tensor the deprecated way, once per layer.
            warnings.filterwarnings("ignore", message="To copy construct from a tensor", category=UserWarning)
            program = torch.export.export(model, example_of(size))
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


class PackagedModel:
    """Calls the package compiled for the batch size of the inputs."""

    def __init__(self, runners: dict[int, Callable[..., torch.Tensor]]):
        self.runners = runners

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        return self.runners[inputs[0].shape[0]](*inputs)


def load_packages(model_dir: Path, settings: OptimizationSettings, buckets: Sequence[int]) -> PackagedModel:
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
        runners[size] = torch._inductor.aoti_load_package(str(path))
    return PackagedModel(runners)
