"""A served language model's weights held once, and counted by part for the READY line.

    said = served_form(model, model_dir, torch.float32, int8=False)   # kernels, the embedding from the file, the rest
    converted(model, dtype)    # the served dtype, a tensor at a time, the checkpoint let go as it goes
    own_memory(model)          # after packing: nothing left that maps the checkpoint's file
    weight_parts(model)        # {"linear kernels": 1.9e9, "other": 1.8e5, "embedding read from the file": 5.4e8}

transformers maps a safetensors checkpoint and, where its dtype is the served one, hands the
model views of the mapping: the file's pages stay resident (and counted in the worker's memory)
for as long as any of them is referenced, though packing (packed_linear.py, quantized.py) has
replaced most of them with copies of their own. Copying what is left (embeddings, norms) into
memory of its own lets the mapping go.

A head tied to the input embedding is packed too (the plain weight's product took 3-4x as long
at 16 rows and twice as long at one, every decode step: 2-core AMD EPYC, float32; medians of 10
calls in one process, far past the ±20 % between runs), and the embedding then reads its rows
from the checkpoint's file (file_embedding.py): the largest weight is held once.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from handlers.generation.file_embedding import FileEmbedding, read_embedding_from_file
from handlers.generation.file_pages import FilePages
from handlers.generation.linears import OpaqueLinear
from handlers.generation.packed_linear import Packed, can_pack, pack_linears
from handlers.generation.quantized import int8_weights
from handlers.generation.row_linear import row_kernels_for, row_linears


def served_form(model: nn.Module, model_dir: Path, dtype: torch.dtype, int8: bool) -> list[str]:
    """The model, in place, as it serves in `dtype`: its linear layers on their kernels (`kernels`;
    converted a layer at a time as their kernels are made: linears.py), its input embedding read
    from the checkpoint's file (file_embedding.py), the rest converted, nothing left that maps the
    file; what was done, in words for the log."""
    said = [words] if (words := kernels(model, dtype, int8)) else []
    if (kept := read_embedding_from_file(model, model_dir, dtype)) is not None:
        said.append(f"the input embedding is held in memory: {kept}")
    converted(model, dtype)
    own_memory(model)
    return said


def kernels(model: nn.Module, dtype: torch.dtype, int8: bool) -> str:
    """The model's linear layers, in place, on the kernels this CPU serves `dtype` with: int8
    weights, the kit's row kernels (row_linear.py: where they read faster than oneDNN), or oneDNN's
    packed weights; what was done, in words ("" where this torch has no oneDNN)."""
    if int8:
        return f"{int8_weights(model, dtype)} linear layers on int8 weights"
    if not can_pack():
        return ""
    if (isa := row_kernels_for(dtype)) is not None:
        return f"{row_linears(model, dtype, isa, Packed.of)} linear layers on the kit's row kernels ({isa.name})"
    # Also in float32: a packed weight sums its products in another order than F.linear's, as
    # compiled code does; the greedy answers the tests compare stay transformers'.
    return f"{pack_linears(model, dtype)} linear layers on prepacked weights"


def converted(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """`model.to(dtype)`, each tensor's checkpoint pages let go once its copy exists
    (file_pages.py): converted whole, a float32 checkpoint's pages and the whole bf16 copy were
    resident at once, the load's peak."""
    pages = FilePages()

    def convert(tensor: torch.Tensor) -> torch.Tensor:
        if not tensor.is_floating_point() or tensor.dtype == dtype:
            return tensor
        copy = tensor.to(dtype)
        pages.release(tensor)
        return copy

    return model._apply(convert)  # what nn.Module.to applies to each parameter and buffer


def own_memory(model: nn.Module) -> None:
    """Every parameter and buffer of the model copied into memory of its own (a tied head and its
    embedding stay one tensor)."""
    copies: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for module in model.modules():
            for _, tensor in [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]:
                if tensor is None:
                    continue
                copy = copies.setdefault(id(tensor), tensor.detach().clone())
                tensor.data = copy


def kernel_bytes(module: OpaqueLinear) -> int:
    tensors = [v for v in vars(module.kernel).values() if isinstance(v, torch.Tensor)]
    return sum(t.numel() * t.element_size() for t in tensors)


def weight_parts(model: nn.Module) -> dict[str, int]:
    """Bytes of the linear layers' kernels (packed or int8), of the other weights, each counted
    once, and of an embedding table read from the file (in no memory of the worker's)."""
    kernels = sum(kernel_bytes(m) for m in model.modules() if isinstance(m, OpaqueLinear))
    others = {id(t): t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()]}
    parts = {"linear kernels": kernels, "other": sum(others.values())}
    read = sum(m.table.bytes for m in model.modules() if isinstance(m, FileEmbedding))
    return parts | ({"embedding read from the file": read} if read else {})
