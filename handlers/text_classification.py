"""TorchServe handler: UTF-8 text (or JSON {"text": ...}) -> {label: probability} (BERT or any text classifier).

torch-model-archiver --handler handlers/text_classification.py ...   (see model_store/build.py)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch

from handlers.accuracy import Answer
from handlers.backends.common import Inputs
from handlers.base import OptimizedHandler, collate
from handlers.calibration import SENTENCES
from handlers.labels import Labels
from handlers.payload import TooLong, request_text
from handlers.settings import OverLength, TextSettings
from handlers.text import ENCODING_FIELDS, encode, load_tokenizer

log = logging.getLogger(__name__)


def text_example(
    batch_size: int, max_length: int, vocabulary: int, names: Sequence[str] = tuple(ENCODING_FIELDS)
) -> Inputs:
    """Warm-up rows of token ids below `vocabulary` (the tokenizer's size: protein, DNA and
    character vocabularies have 25-100 tokens, and an id past the embedding table stops a worker)."""
    # Half-padded rows: an all-ones mask would let the compiler specialise padding away.
    mask = torch.ones(batch_size, max_length, dtype=torch.long)
    mask[:, max_length // 2 :] = 0
    made = {
        "input_ids": torch.randint(0, vocabulary, (batch_size, max_length)),
        "attention_mask": mask,
        "token_type_ids": torch.zeros(batch_size, max_length, dtype=torch.long),
    }
    return tuple(made[name] for name in names)


def synthetic_text(index: int) -> str:
    """SENTENCES[index]; past them, two of them joined (a text none of the others is, longer)."""
    count = len(SENTENCES)
    first = index % count
    if index < count:
        return SENTENCES[first]
    return f"{SENTENCES[first]} {SENTENCES[(first + 1 + index // count) % count]}"


class TextClassificationHandler(OptimizedHandler):
    settings_class = TextSettings
    answer = Answer.PROBABILITIES

    def setup(self, model_dir: str) -> None:
        self.tokenizer = load_tokenizer(model_dir, self.settings.pad_token)
        self.labels = Labels.load(model_dir, self.settings.labels_file, prefix="LABEL_")
        self.vocabulary = self.tokenizer.get_vocab_size()

    def decode(self, request: dict[str, Any]) -> Inputs:
        return self.encode_text(request_text(request))

    def encode_text(self, text: str) -> Inputs:
        encoded = encode(self.tokenizer, text, self.settings.max_length, self.settings.input_names)
        if encoded.truncated and self.settings.over_length is OverLength.REFUSE:
            raise TooLong(
                f"text is longer than the {self.settings.max_length} tokens this model takes; send a shorter text"
            )
        if encoded.truncated:
            log.info("%s: input truncated to %d tokens", self.model_name, self.settings.max_length)
        return encoded.inputs

    def example(self, batch_size: int) -> Inputs:
        return text_example(batch_size, self.settings.max_length, self.vocabulary, self.settings.input_names)

    def examples(self, batch_size: int) -> list[Inputs]:
        return [
            text_example(batch_size, length, self.vocabulary, self.settings.input_names)
            for length in self.settings.lengths
        ]

    def collate(self, items: Sequence[Inputs], bucket: int) -> Inputs:
        # Items come padded to max_length; the batch keeps the length bucket its longest text needs.
        # Padding is at the end and masked, so cutting it changes no answer.
        length = self.settings.length_for(max(self.tokens(item) for item in items))
        return collate([tuple(t[:length] for t in item) for item in items], bucket)

    def tokens(self, item: Inputs) -> int:
        """The real tokens of one decoded text (its mask's ones; max_length without a mask)."""
        names = self.settings.input_names
        if "attention_mask" not in names:
            return self.settings.max_length
        return int(item[names.index("attention_mask")].sum())

    def synthetic_body(self, index: int) -> bytes:
        return synthetic_text(index).encode()

    def format(self, output: torch.Tensor) -> dict[str, float]:
        probabilities = torch.softmax(output.float(), dim=0)
        return {self.labels.name(i): float(p) for i, p in enumerate(probabilities)}
