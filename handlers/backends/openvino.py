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


def quantize_int8(converted, calibration: Sequence[Inputs], transformer: bool):
    import nncf

    return nncf.quantize(
        converted, calibration_set(calibration), subset_size=len(calibration), model_type=model_type(transformer)
    )


def calibration_set(calibration: Sequence[Inputs]):
    import nncf

    return nncf.Dataset([[t.numpy() for t in inputs] for inputs in calibration])


def model_type(transformer: bool):
    import nncf

    # Transformers keep softmax and layer norms in float (NNCF's preset for them); quantizing
    # those too made MiniLM embeddings useless (cosine ~0.5 to float32).
    return nncf.ModelType.TRANSFORMER if transformer else None


def repair_int8(converted, calibration: Sequence[Inputs], validation: Validation, transformer: bool):
    """NNCF's accuracy control: quantize, then put back in float the quantized operations that cost
    the most on `validation`, most costly first, until its worst answer error is within the limit
    (the metric is minus the worst error: float's is ~0, so the drop is the error itself)."""
    import nncf

    def validate(compiled, _items) -> tuple[float, list[float]]:
        errors = validation.errors(CompiledIR(compiled))
        return -max(errors), [-error for error in errors]

    items = nncf.Dataset(list(range(len(validation.batches))))  # validate() reads the batches itself
    return nncf.quantize_with_accuracy_control(
        converted, calibration_set(calibration), items, validate, max_drop=validation.limit,
        subset_size=len(calibration), model_type=model_type(transformer),
    )  # fmt: skip


# Operations that run in int8 when NNCF feeds them quantized inputs.
QUANTIZABLE = frozenset({"Convolution", "GroupConvolution", "MatMul", "ConvolutionBackpropData"})


PASS_THROUGH = frozenset({"Reshape", "Convert", "Transpose"})


def fed_by_fake_quantize(output, hops: int = 3) -> bool:
    node = output.get_node()
    if node.get_type_name() == "FakeQuantize":
        return True
    return (
        hops > 0
        and node.get_type_name() in PASS_THROUGH
        and any(fed_by_fake_quantize(i.get_source_output(), hops - 1) for i in node.inputs())
    )


def int8_operations(model) -> set[str]:
    """Names of the operations NNCF feeds a quantized input (through reshapes and converts)."""
    return {
        op.get_friendly_name()
        for op in model.get_ops()
        if op.get_type_name() in QUANTIZABLE and any(fed_by_fake_quantize(i.get_source_output()) for i in op.inputs())
    }


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
    int8 whose answers on `validation` are beyond its limit is repaired (`repair_int8`)."""
    import openvino as ov

    progress("OpenVINO: converting")
    converted = convert(model, settings, example_of(2))
    if settings.dtype is DType.INT8:
        progress(f"OpenVINO int8: NNCF calibration on {len(calibration)} batches")
        quantized = quantize_int8(converted, calibration, settings.transformer)
        if validation is not None:
            quantized = repaired_if_needed(converted, quantized, calibration, validation, settings, progress)
        converted = quantized
    path = out_dir / IR_FILE
    # save_model halves weights to fp16 by default; the archive keeps what was converted.
    ov.save_model(converted, str(path), compress_to_fp16=False)
    return path


def repaired_if_needed(converted, quantized, calibration, validation: Validation, settings, progress):
    """`quantized`, or when its answers on `validation` are beyond the limit, its repair; what the
    repair kept in float and the speed it cost are printed."""
    import openvino as ov

    config = {"INFERENCE_NUM_THREADS": torch.get_num_threads(), "INFERENCE_PRECISION_HINT": "f32"}
    worst = max(validation.errors(CompiledIR(ov.Core().compile_model(quantized, "CPU", config))))
    if worst <= validation.limit:
        return quantized
    progress(f"int8 answers differ by up to {worst:.3g} on {len(validation.batches)} calibration inputs (limit "
             f"{validation.limit:.3g}): NNCF accuracy control keeps the most costly operations in float")  # fmt: skip
    start = time.perf_counter()
    repaired = repair_int8(converted, calibration, validation, settings.transformer)
    after = max(validation.errors(CompiledIR(ov.Core().compile_model(repaired, "CPU", config))))
    kept = sorted(int8_operations(quantized) - int8_operations(repaired))
    speed = [items_per_second(model, calibration[0]) for model in (quantized, repaired)]
    progress(f"int8 repaired in {time.perf_counter() - start:.0f}s: kept {len(kept)} of {len(int8_operations(quantized))} "
             f"int8 operations in float ({', '.join(kept[:6])}{', ...' if len(kept) > 6 else ''}); worst error "
             f"{worst:.3g} -> {after:.3g}; in-process {speed[0]:.1f} -> {speed[1]:.1f} items/s at batch 1")  # fmt: skip
    return repaired


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
