"""UTF-8 text -> BERT inputs padded to a fixed length (one static shape for the compiler).

tokenizer = load_tokenizer(model_dir)
encoded = encode(tokenizer, "a sentence", max_length=128)  # encoded.inputs: 3 x [128]
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

TOKENIZER_FILE = "tokenizer.json"


@dataclasses.dataclass(frozen=True)
class Encoded:
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # input_ids, attention_mask, token_type_ids: [S]
    truncated: bool


def load_tokenizer(model_dir: str | Path):
    # The Rust tokenizer alone (what transformers' BertTokenizerFast wraps): importing
    # transformers for it cost a text worker's start ~0.8 s. tests/unit/test_text.py checks that
    # both give the same ids, masks and truncation.
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(Path(model_dir) / TOKENIZER_FILE))


def encode(tokenizer, text: str, max_length: int) -> Encoded:
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding(length=max_length)
    encoding = tokenizer.encode(text)
    inputs = tuple(torch.tensor(ids) for ids in (encoding.ids, encoding.attention_mask, encoding.type_ids))
    # The cut-off windows are only counted, to tell the caller the text was cut.
    return Encoded(inputs=inputs, truncated=bool(encoding.overflowing))
