"""What the generation bench asks a language model: prompts and answer lengths, counted in the
model's own tokens.

    tokenizer = workloads.tokenizer_of(model)          # its directory's tokenizer
    asks = WORKLOADS["text"](tokenizer)                # [Ask(prompt, max_tokens, schema), ...]

A prompt's length is counted by the served model's tokenizer, not in sentences: tokenizers differ
by several times in characters per token (a tokenizer trained on little text, as a random test
model's may be, makes a 2,149-character prompt 940 tokens; Qwen's own, about 480), and the prompt's
share of the compute decides what a run measures. Every server of a run tokenizes the same text
with the same vocabulary (llama.cpp's GGUF and OpenVINO's export are converted from the directory).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from bench.generate.streams import Ask
from handlers.calibration import SENTENCES
from kit.models import Model

# Prompts of 20, 80 and 300 tokens, answers of 32 and 64: chat turns to RAG answers. A row lasts
# until its last answer ends, and an unbatched peer writes 16 answers at once slowly.
PROMPT_TOKENS = (20, 80, 300)
ANSWER_TOKENS = (32, 64)
# Structured output's workload: the same prompts and lengths, each answer a JSON string the grammar
# masks token by token, longer than any answer may be (so it runs to max_tokens as free text does
# under ignore_eos, and the rows differ by the masks' cost alone).
SCHEMA = {"type": "string", "minLength": 4000}
# Prompt lookup's copy-heavy workload: an edit, whose answer is mostly its prompt's text again.
EDIT = "Correct the spelling in the text below and write the whole text out again.\n\nText: {}\n\nCorrected text:"
EDIT_TOKENS = (80, 300)


class Tokenizer(Protocol):
    """What a workload needs of a tokenizer (transformers' have it)."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...


def tokenizer_of(model: Model) -> Tokenizer:
    """The tokenizer of the model file's directory, offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model.source.path), local_files_only=True)


def sentences(tokenizer: Tokenizer, tokens: int, first: int = 0) -> str:
    """The kit's sentences from the `first`-th on, cut after `tokens` of the tokenizer's tokens."""
    text, index = "", first
    while len(ids := tokenizer.encode(text, add_special_tokens=False)) < tokens:
        text = f"{text} {SENTENCES[index % len(SENTENCES)]}".lstrip()
        index += 1
    return tokenizer.decode(ids[:tokens])


def text(tokenizer: Tokenizer, schema: dict | None = None) -> list[Ask]:
    """Free text (or, with `schema`, JSON following it): each prompt length with each answer length."""
    asks = []
    for index, tokens in enumerate(PROMPT_TOKENS):
        prompt = sentences(tokenizer, tokens, index)
        asks += [Ask(prompt, answer, schema) for answer in ANSWER_TOKENS]
    return asks


def edits(tokenizer: Tokenizer) -> list[Ask]:
    """Edits of texts of EDIT_TOKENS tokens, each answer as long as the longest free-text answer."""
    return [
        Ask(EDIT.format(sentences(tokenizer, tokens, index)), ANSWER_TOKENS[-1])
        for index, tokens in enumerate(EDIT_TOKENS)
    ]


# The kit's rows measure each workload asked; the peers, text.
WORKLOADS: dict[str, Callable[[Tokenizer], list[Ask]]] = {
    "text": text,
    "json_schema": lambda tokenizer: text(tokenizer, SCHEMA),
    "copy": edits,
}
