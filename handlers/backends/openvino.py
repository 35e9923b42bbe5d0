"""OpenVINO: convert (and int8-quantize with NNCF) at archive time, compile the IR in the worker.

    precompile(model, settings, example_of, calibration, staging)   # make archive: model.xml + model.bin
    run = build(None, settings, spec)                               # worker initialize(), ~1 s

The IR keeps a dynamic batch dimension (and text length), so every batch size runs without recompiling.
OpenVINO picks its own inference precision: bf16 on CPUs with AMX or AVX512-BF16, which is
not what `dtype: float32` promises, so the precision hint is set from `dtype` explicitly.
Threads follow the worker's torch thread count (the launcher's OMP_NUM_THREADS).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from handlers.backends import DType
from handlers.backends.common import BuildSpec, Inputs, export_shapes
from handlers.settings import OptimizationSettings

log = logging.getLogger(__name__)

IR_FILE = "model.xml"  # + model.bin beside it
# int8 runs int8 kernels where NNCF inserted quantization, f32 elsewhere.
PRECISION_HINT = {DType.FLOAT32: "f32", DType.BFLOAT16: "bf16", DType.INT8: "f32"}


def convert(model: nn.Module, settings: OptimizationSettings, example: Inputs):
    """Through torch.export (also takes a user's exported program): the batch dimension and the
    settings' varying ones (text length) stay dynamic in the IR."""
    import openvino as ov

    with torch.no_grad():
        program = torch.export.export(model, example, dynamic_shapes=export_shapes(settings, example, batch=True))
    return ov.convert_model(program)


def quantize_int8(converted, calibration: Sequence[Inputs], transformer: bool):
    import nncf

    dataset = nncf.Dataset([[t.numpy() for t in inputs] for inputs in calibration])
    # Transformers keep softmax and layer norms in float (NNCF's preset for them); quantizing
    # those too made MiniLM embeddings useless (cosine ~0.5 to float32).
    model_type = nncf.ModelType.TRANSFORMER if transformer else None
    return nncf.quantize(converted, dataset, subset_size=len(calibration), model_type=model_type)


def precompile(
    model: nn.Module,
    settings: OptimizationSettings,
    example_of: Callable[[int], Inputs],
    calibration: Sequence[Inputs],
    out_dir: Path,
    progress: Callable[[str], None] = log.info,
) -> Path:
    """The IR of the float32 NCHW eval `model`: OpenVINO chooses layouts and precision itself."""
    import openvino as ov

    progress("OpenVINO: converting")
    converted = convert(model, settings, example_of(2))
    if settings.dtype is DType.INT8:
        progress(f"OpenVINO int8: NNCF calibration on {len(calibration)} batches")
        converted = quantize_int8(converted, calibration, settings.transformer)
    path = out_dir / IR_FILE
    # save_model halves weights to fp16 by default; the archive keeps what was converted.
    ov.save_model(converted, str(path), compress_to_fp16=False)
    return path


def compile_config(settings: OptimizationSettings) -> dict:
    return {
        "PERFORMANCE_HINT": "LATENCY",  # one request at a time per worker, as TorchServe calls it
        "INFERENCE_NUM_THREADS": torch.get_num_threads(),
        "INFERENCE_PRECISION_HINT": PRECISION_HINT[settings.dtype],
    }


class CompiledIR:
    def __init__(self, compiled):
        self.request = compiled.create_infer_request()

    def __call__(self, *inputs: torch.Tensor) -> torch.Tensor:
        # OpenVINO reads plain C-order arrays: channels-last tensors are copied to NCHW.
        arrays = [np.ascontiguousarray(t.numpy()) for t in inputs]
        return torch.from_numpy(self.request.infer(arrays)[0].copy())


def build(model: nn.Module | None, settings: OptimizationSettings, spec: BuildSpec) -> CompiledIR:
    """The archive's IR compiled for this CPU; `model` (the eager one) is not needed."""
    import openvino as ov

    path = spec.archive() / IR_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the archive; rebuild it with `make archive`")
    core = ov.Core()
    return CompiledIR(core.compile_model(core.read_model(str(path)), "CPU", compile_config(settings)))
