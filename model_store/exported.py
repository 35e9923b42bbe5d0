"""What a torch.export program takes, as a tensor model's handler settings (`make model`, the build).

    settings = tensor_inputs(Path("net.pt2"))   # {"input_shapes": [[4]], "input_dtypes": ["float32"]}
    settings = text_inputs(Path("clf.pt2"))     # {"input_names": ["input_ids", "attention_mask"]}

The kit batches requests, so every input's first dimension must be the batch and exported
dynamic; the rest of each shape is what one request sends. What the kit cannot serve is
refused by name, with what to change in the export.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from handlers.settings import TensorType
from handlers.text import ENCODING_FIELDS
from handlers.typed_config import SettingsError

EXPORT_HINT = "export with dynamic_shapes={'x': {0: torch.export.Dim('batch')}} for each input"


def text_inputs(path: Path) -> dict[str, Any]:
    """A text program's inputs, by their names in its forward: which encodings the tokenizer gives it."""
    names = list(torch.export.load(path).graph_signature.user_inputs)
    if not names or not set(names) <= set(ENCODING_FIELDS) or "input_ids" not in names:
        raise SettingsError(
            f"{path} takes {names}; a text program takes input_ids and any of {list(ENCODING_FIELDS)[1:]}, by those "
            "names (the tokenizer's), or serve it as TASK=tensor"
        )
    return {"input_names": names}


def tensor_inputs(path: Path) -> dict[str, Any]:
    program = torch.export.load(path)
    signature = program.graph_signature
    if len(signature.user_outputs) != 1:
        raise SettingsError(f"{path} returns {len(signature.user_outputs)} values; a tensor model returns one tensor")
    nodes = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    shapes, dtypes = [], []
    for name in signature.user_inputs:
        value = nodes[name].meta.get("val")
        if not isinstance(value, torch.Tensor):
            raise SettingsError(
                f"{path}: input {name!r} is not a tensor ({type(value).__name__}); the kit sends tensors only"
            )
        dtype = str(value.dtype).removeprefix("torch.")
        if dtype not in {t.value for t in TensorType}:
            raise SettingsError(f"{path}: input {name!r} is {dtype}; the kit serves {', '.join(TensorType)} inputs")
        if value.dim() == 0 or isinstance(value.shape[0], int):
            raise SettingsError(
                f"{path}: input {name!r} has no dynamic batch dimension (shape {list(value.shape)}); {EXPORT_HINT}"
            )
        if not all(isinstance(size, int) for size in value.shape[1:]):
            raise SettingsError(
                f"{path}: input {name!r} is dynamic beyond the batch (shape {list(value.shape)}); export the others static"
            )
        shapes.append(list(value.shape[1:]))
        dtypes.append(dtype)
    return {"input_shapes": shapes, "input_dtypes": dtypes}
