"""UTF-8 text -> a model's token inputs, padded to max_length (the handler cuts a batch down to its length bucket).

tokenizer = load_tokenizer(model_dir, pad_token="[PAD]")
encoded = encode(tokenizer, "a sentence", max_length=128, names=("input_ids", "attention_mask"))
encoded.inputs                      # 2 x [128] int64, in the order of `names`
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import torch

TOKENIZER_FILE = "tokenizer.json"
# What the Rust tokenizer's Encoding gives, under the names models' forwards take.
ENCODING_FIELDS = {"input_ids": "ids", "attention_mask": "attention_mask", "token_type_ids": "type_ids"}


@dataclasses.dataclass(frozen=True)
class Encoded:
    inputs: tuple[torch.Tensor, ...]  # one [S] int64 tensor per input name
    truncated: bool


def load_tokenizer(model_dir: str | Path, pad_token: str = "[PAD]"):
    # The Rust tokenizer alone (what transformers' fast tokenizers wrap): importing transformers
    # for it cost a text worker's start ~0.8 s. tests/unit/handlers/test_text.py checks that both give the
    # same ids, masks and truncation.
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(model_dir) / TOKENIZER_FILE))
    pad_id = tokenizer.token_to_id(pad_token)
    if pad_id is None:
        raise ValueError(
            f"pad_token {pad_token!r} is not in the vocabulary of {TOKENIZER_FILE}; set the model's pad_token"
        )
    tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token)
    return tokenizer


def encode(tokenizer, text: str, max_length: int, names: Sequence[str] = tuple(ENCODING_FIELDS)) -> Encoded:
    tokenizer.enable_truncation(max_length)
    tokenizer.enable_padding(**{**tokenizer.padding, "length": max_length})  # the pad token load_tokenizer set
    encoding = tokenizer.encode(text)
    inputs = tuple(torch.tensor(getattr(encoding, ENCODING_FIELDS[name])) for name in names)
    # The cut-off windows are only counted, to tell the caller the text was cut.
    return Encoded(inputs=inputs, truncated=bool(encoding.overflowing))
