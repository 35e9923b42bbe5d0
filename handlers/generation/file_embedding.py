"""A language model's input embedding read from its checkpoint's file, the rows its tokens need.

    reason = read_embedding_from_file(model, model_dir, torch.float32)    # after packing; None when it reads from the file

An embedding is only ever read a row per token, yet its table is the model's largest weight
(Qwen2.5-0.5B: 151936 x 896, 545 MB in float32), and a head tied to it is packed apart for its
product (packed_linear.py, weights.py): held in memory, the table would be a second copy of that
weight. Read from the safetensors file instead, a step costs a `pread` per token (microseconds;
a step's forward takes tens of milliseconds), and the table is in the system's file cache, which
the kernel drops under memory pressure and reads again, never in the worker's memory.

Not a mapping of the file: the kernel maps a whole run of pages around each one read (measured on
Linux 6.18: 6 tokens' rows made 5 MB of the mapping resident), so served text makes the whole
table resident within a few hundred distinct tokens.

The table in the file is checked equal to the one transformers loaded (in the loaded table's
dtype) before it replaces it: a checkpoint whose tensor is not the model's (renamed, transposed, of
another file) keeps the loaded table, and the worker says why.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from pathlib import Path

import torch
from torch import nn

from handlers.generation.file_pages import FilePages

# safetensors' dtype names (its header's "dtype") an embedding table may be saved in.
DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
CHECKED_ROWS = 4096  # the equality check reads this many rows at a time (a bounded temporary)


@dataclasses.dataclass(frozen=True)
class Stored:
    """A tensor of a safetensors file, where its bytes are."""

    file: Path
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    offset: int  # of its first byte in the file


def stored_tensors(model_dir: Path) -> list[Stored]:
    """Every tensor of the directory's safetensors checkpoint (one file or shards)."""
    if (model_dir / INDEX).is_file():
        files = sorted(set(json.loads((model_dir / INDEX).read_text())["weight_map"].values()))
    elif (model_dir / SINGLE).is_file():
        files = [SINGLE]
    else:
        return []
    return [stored for file in files for stored in header(model_dir / file)]


def header(path: Path) -> list[Stored]:
    """A safetensors file's tensors: an 8-byte little-endian header length, a JSON header, the data."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        entries = json.loads(f.read(length))
    return [
        Stored(path, name, DTYPES[entry["dtype"]], tuple(entry["shape"]), 8 + length + entry["data_offsets"][0])
        for name, entry in entries.items()
        if name != "__metadata__" and entry["dtype"] in DTYPES
    ]


class Table:
    """A stored (rows, width) table read by rows, each row with one `pread` of the open file."""

    def __init__(self, stored: Stored):
        self.stored = stored
        self.fd = os.open(stored.file, os.O_RDONLY)  # held for the worker's life: positional reads only
        self.row_bytes = stored.shape[1] * torch.tensor([], dtype=stored.dtype).element_size()

    @property
    def bytes(self) -> int:
        return self.stored.shape[0] * self.row_bytes

    def rows(self, ids: list[int]) -> torch.Tensor:
        """The rows of `ids`, in the file's dtype."""
        out, view = self.empty(len(ids))
        for i, token in enumerate(ids):
            self.read(view[i * self.row_bytes : (i + 1) * self.row_bytes], token)
        return out

    def span(self, start: int, count: int) -> torch.Tensor:
        """`count` consecutive rows from `start`, in one read."""
        out, view = self.empty(count)
        self.read(view, start)
        return out

    def empty(self, rows: int) -> tuple[torch.Tensor, memoryview]:
        out = torch.empty((rows, self.stored.shape[1]), dtype=self.stored.dtype)
        return out, memoryview(out.view(torch.uint8).numpy()).cast("B")

    def read(self, into: memoryview, row: int) -> None:
        """The file's bytes from row `row` on, as many as `into` holds."""
        if os.preadv(self.fd, [into], self.stored.offset + row * self.row_bytes) != len(into):
            raise OSError(f"{self.stored.file} ended inside {self.stored.name} (from row {row})")

    def equals(self, loaded: torch.Tensor) -> bool:
        """Whether the stored table, in the loaded one's dtype, is the loaded one."""
        if tuple(loaded.shape) != self.stored.shape:
            return False
        total, pages = self.stored.shape[0], FilePages()
        for row in range(0, total, CHECKED_ROWS):
            chunk = loaded[row : row + CHECKED_ROWS]
            equal = torch.equal(self.span(row, min(CHECKED_ROWS, total - row)).to(loaded.dtype), chunk)
            pages.release(chunk)  # where the loaded table maps the checkpoint: read once, not kept
            if not equal:
                return False
        return True


TABLES: dict[int, Table] = {}  # the graphs name a table by its key, as linears.py's kernels


@torch.library.custom_op("kit::file_embedding", mutates_args=())
def file_embedding(ids: torch.Tensor, key: int, dtype: torch.dtype) -> torch.Tensor:
    rows = TABLES[key].rows(ids.reshape(-1).tolist())
    return rows.to(dtype).reshape(*ids.shape, rows.shape[-1])


@file_embedding.register_fake
def _(ids: torch.Tensor, key: int, dtype: torch.dtype) -> torch.Tensor:
    return ids.new_empty((*ids.shape, TABLES[key].stored.shape[1]), dtype=dtype)


class FileEmbedding(nn.Module):
    """nn.Embedding's forward over a table in the file, each row converted to the served dtype as
    read (a float's conversion rounds the same row by row as whole)."""

    def __init__(self, embedding: nn.Embedding, table: Table, dtype: torch.dtype | None = None):
        super().__init__()
        self.key = len(TABLES)
        TABLES[self.key] = table
        self.dtype = embedding.weight.dtype if dtype is None else dtype
        self.num_embeddings, self.embedding_dim = embedding.num_embeddings, embedding.embedding_dim
        self.padding_idx = embedding.padding_idx

    @property
    def table(self) -> Table:
        return TABLES[self.key]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return file_embedding(ids, self.key, self.dtype)


def read_embedding_from_file(model: nn.Module, model_dir: Path, dtype: torch.dtype | None = None) -> str | None:
    """The model's input embedding replaced by one that reads its table from the checkpoint's
    file, its rows in `dtype` (the loaded table's if None); None when done, else why not (the
    loaded table kept)."""
    embedding = model.get_input_embeddings()
    if type(embedding) is not nn.Embedding:  # a subclass's forward (a scale, a norm) is its own
        return f"the input embedding is a {type(embedding).__name__}, not an nn.Embedding"
    loaded = embedding.weight.detach()
    candidates = [s for s in stored_tensors(model_dir) if s.shape == tuple(loaded.shape)]
    if not candidates:
        return "no safetensors tensor of its shape in the checkpoint"
    with torch.no_grad():
        for stored in candidates:
            table = Table(stored)
            if table.equals(loaded):
                model.set_input_embeddings(FileEmbedding(embedding, table, dtype))
                if not any(p.data_ptr() == loaded.data_ptr() for p in model.parameters()):
                    return None
                model.set_input_embeddings(embedding)
                os.close(table.fd)
                return "the head reads the same table (it is not packed apart)"
            os.close(table.fd)
    return "no tensor of the checkpoint equals the loaded table"
