"""UTF-8 text -> BERT inputs padded to a fixed length (one static shape for the compiler).

tokenizer = load_tokenizer(model_dir)
encoded = encode(tokenizer, "a sentence", max_length=128)  # encoded.inputs: 3 x [128]
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

VOCAB_FILE = "vocab.txt"
TOKENIZER_FILE = "tokenizer.json"


@dataclasses.dataclass(frozen=True)
class Encoded:
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # input_ids, attention_mask, token_type_ids: [S]
    truncated: bool


def load_tokenizer(model_dir: str | Path):
    from transformers import BertTokenizerFast

    model_dir = Path(model_dir)
    return BertTokenizerFast(
        vocab_file=str(model_dir / VOCAB_FILE), tokenizer_file=str(model_dir / TOKENIZER_FILE), do_lower_case=True
    )


def encode(tokenizer, text: str, max_length: int) -> Encoded:
    # Overflowing windows are only counted, to tell the caller the text was cut.
    batch = tokenizer(
        text,
        padding="max_length",
        truncation=True,
        max_length=max_length,
        return_overflowing_tokens=True,
        return_tensors="pt",
    )
    inputs = (batch["input_ids"][0], batch["attention_mask"][0], batch["token_type_ids"][0])
    return Encoded(inputs=inputs, truncated=batch["input_ids"].shape[0] > 1)
