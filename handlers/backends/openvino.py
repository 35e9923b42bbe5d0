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
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from handlers.backends import DType
from handlers.backends.common import BuildSpec, Inputs, export_shapes
from handlers.quiet_imports import loggers_at
from handlers.repair import Quantizer, repaired_if_needed
from handlers.settings import OptimizationSettings

if TYPE_CHECKING:
    from handlers.accuracy import Validation

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


def quantize_int8(converted, calibration: Sequence[Inputs], transformer: bool, in_float: Sequence[str] = ()):
    """NNCF post-training int8; the operations named in `in_float` stay in float."""
    import nncf

    dataset = nncf.Dataset([[t.numpy() for t in inputs] for inputs in calibration])
    # Transformers keep softmax and layer norms in float (NNCF's preset for them); quantizing
    # those too made MiniLM embeddings useless (cosine ~0.5 to float32).
    model_type = nncf.ModelType.TRANSFORMER if transformer else None
    ignored = nncf.IgnoredScope(names=list(in_float)) if in_float else None
    # At INFO, NNCF lists every operation a repair keeps in float, one paragraph each, after the
    # kit's own line that names them.
    with loggers_at(logging.WARNING, "nncf"):
        return nncf.quantize(
            converted, dataset, subset_size=len(calibration), model_type=model_type, ignored_scope=ignored
        )


# Operations that run in int8 when NNCF feeds them quantized inputs.
QUANTIZABLE = frozenset({"Convolution", "GroupConvolution", "MatMul", "ConvolutionBackpropData"})


def operation_groups(converted) -> list[list[str]]:
    """The quantizable operations with a constant weight, grouped by op and weight shape: one role
    in every layer, which a repair keeps in float together (handlers/repair.py)."""
    groups: dict[tuple, list[str]] = {}
    for op in converted.get_ops():
        weight = op.input(1).get_partial_shape() if op.get_input_size() > 1 else None
        if op.get_type_name() in QUANTIZABLE and weight is not None and weight.is_static:
            groups.setdefault((op.get_type_name(), tuple(weight.to_shape())), []).append(op.get_friendly_name())
    return list(groups.values())


def runner(model) -> CompiledIR:
    """`model` compiled as a worker compiles an int8 IR."""
    import openvino as ov

    config = {"INFERENCE_NUM_THREADS": torch.get_num_threads(), "INFERENCE_PRECISION_HINT": "f32"}
    return CompiledIR(ov.Core().compile_model(model, "CPU", config))


def items_per_second(model, example: Inputs, seconds: float = 1.0) -> float:
    """In-process calls per second of `model` at `example`, as a worker compiles it."""
    import openvino as ov

    request = ov.Core().compile_model(model, "CPU", {"INFERENCE_NUM_THREADS": torch.get_num_threads()})
    arrays = [t.numpy() for t in example]
    request.create_infer_request().infer(arrays)
    infer = request.create_infer_request()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        infer.infer(arrays)
        calls += 1
    return calls * example[0].shape[0] / (time.perf_counter() - start)


def precompile(
    model: nn.Module,
    settings: OptimizationSettings,
    example_of: Callable[[int], Inputs],
    calibration: Sequence[Inputs],
    out_dir: Path,
    progress: Callable[[str], None] = log.info,
    validation: Validation | None = None,
) -> Path:
    """The IR of the float32 NCHW eval `model`: OpenVINO chooses layouts and precision itself.
    int8 whose answers on `validation` are too far off is repaired (handlers/repair.py)."""
    import openvino as ov

    progress("OpenVINO: converting")
    converted = convert(model, settings, example_of(2))
    if settings.dtype is DType.INT8:
        progress(f"OpenVINO int8: NNCF calibration on {len(calibration)} batches")
        quantized = quantize_int8(converted, calibration, settings.transformer)
        if validation is not None:
            quantizer = Quantizer(
                operation_groups(converted),
                lambda in_float: quantize_int8(converted, calibration, settings.transformer, in_float),
                runner,
                lambda model: items_per_second(model, calibration[0]),
            )
            quantized = repaired_if_needed(quantized, quantizer, validation, progress)
        converted = quantized
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
