"""TorchServe handler: JSON numbers -> the exported program's output as JSON numbers.

torch-model-archiver --handler handlers/tensor.py ...   (see model_store/build.py)

A request is one sample, without the batch dimension: a JSON array for a model of one input,
or {"inputs": [array, ...]} with one array per forward argument, in order. The answer is the
output row as nested lists. Shapes and element types are checked against the model file's
`input_shapes`/`input_dtypes` (read from the program by `make model`); a mismatch is a 400.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from handlers.backends.common import Inputs
from handlers.base import OptimizedHandler
from handlers.payload import InvalidInput, request_json
from handlers.settings import TensorSettings, TensorType

# JSON values -> numpy kinds each element type accepts ('b' bool, 'i'/'u' integers, 'f' floats).
ACCEPTED_KINDS = {TensorType.FLOAT32: "iuf", TensorType.INT64: "iu", TensorType.INT32: "iu", TensorType.BOOL: "b"}
TORCH_DTYPES = {
    TensorType.FLOAT32: torch.float32,
    TensorType.INT64: torch.int64,
    TensorType.INT32: torch.int32,
    TensorType.BOOL: torch.bool,
}


def to_tensor(index: int, value: Any, shape: tuple[int, ...], dtype: TensorType) -> torch.Tensor:
    try:
        array = np.asarray(value)
    except ValueError:  # ragged nesting
        raise InvalidInput(f"input {index} is not a rectangular array (its rows differ in length)") from None
    if array.dtype.kind not in ACCEPTED_KINDS[dtype]:
        got = {"b": "booleans", "f": "non-integer numbers", "i": "integers", "u": "integers"}.get(array.dtype.kind)
        raise InvalidInput(
            f"input {index} must hold {dtype.value} values, got {got or 'non-numbers (strings or null)'}"
        )
    if array.shape != shape:
        raise InvalidInput(
            f"input {index} has shape {list(array.shape)}; the model takes {list(shape)} per request "
            "(one sample, without the batch dimension)"
        )
    return torch.from_numpy(array).to(TORCH_DTYPES[dtype])


class TensorHandler(OptimizedHandler):
    settings_class = TensorSettings

    def decode(self, request: dict[str, Any]) -> Inputs:
        body, count = request_json(request), len(self.settings.input_shapes)
        if isinstance(body, dict):
            if not isinstance(body.get("inputs"), list) or len(body["inputs"]) != count:
                raise InvalidInput(f'JSON object needs "inputs": a list of {count} array(s), one per model input')
            values = body["inputs"]
        elif count == 1:
            values = [body]
        else:
            raise InvalidInput(f'this model takes {count} inputs: send {{"inputs": [...]}} with one array each')
        specs = zip(values, self.settings.input_shapes, self.settings.input_dtypes, strict=True)
        return tuple(to_tensor(i, value, shape, dtype) for i, (value, shape, dtype) in enumerate(specs))

    def example(self, batch_size: int) -> Inputs:
        return tuple(self.random(batch_size, index) for index in range(len(self.settings.input_shapes)))

    def synthetic_body(self, index: int) -> bytes:
        generator = torch.Generator().manual_seed(index)  # sample i is the same in every process
        # float32 -> JSON -> float32 is exact (repr round-trips), so decode gives these values back.
        inputs = [self.random(1, i, generator)[0].tolist() for i in range(len(self.settings.input_shapes))]
        return json.dumps({"inputs": inputs}).encode()

    def random(self, batch_size: int, index: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Standard normal floats; integer and boolean inputs zero (a valid index for any table)."""
        shape, dtype = (batch_size, *self.settings.input_shapes[index]), self.settings.input_dtypes[index]
        if dtype is TensorType.FLOAT32:
            return torch.randn(shape, generator=generator)
        return torch.zeros(shape, dtype=TORCH_DTYPES[dtype])

    def format(self, output: torch.Tensor) -> Any:
        return output.tolist()
