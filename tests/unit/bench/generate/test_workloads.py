"""bench/generate/workloads.py: prompts as long as asked in the model's own tokens, whatever its
tokenizer's characters per token; each workload's answer lengths and schema."""

from __future__ import annotations

import pytest

from bench.example_models import causal_tokenizer
from bench.generate.workloads import (
    ANSWER_TOKENS,
    EDIT_TOKENS,
    PROMPT_TOKENS,
    SCHEMA,
    WORKLOADS,
    edits,
    sentences,
    text,
)
from handlers.calibration import SENTENCES


class Words:
    """A tokenizer of a token per word: several times as many characters per token as BPE's."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[str]:
        return text.split()

    def decode(self, ids: list[str]) -> str:
        return " ".join(ids)


@pytest.fixture(scope="module")
def bpe():
    return causal_tokenizer(chat=False)


def count(tokenizer, prompt: str) -> int:
    return len(tokenizer.encode(prompt, add_special_tokens=False))


@pytest.mark.parametrize("tokens", [1, 20, 80, 300, 1000])
def test_a_prompt_has_its_tokens_in_a_byte_level_bpe_and_in_words(bpe, tokens):
    # A cut BPE text may encode its last characters in another split: at most one token apart.
    assert abs(count(bpe, sentences(bpe, tokens)) - tokens) <= 1
    assert count(Words(), sentences(Words(), tokens)) == tokens


def test_prompts_of_one_length_differ_in_characters_by_tokenizer(bpe):
    """The same 300 tokens are several times the text in words: what a sentence count hid."""
    assert len(sentences(Words(), 300)) > 2 * len(sentences(bpe, 300))


def test_a_prompt_begins_at_its_sentence():
    assert sentences(Words(), 3, first=1) == " ".join(SENTENCES[1].split()[:3])


def test_the_text_workload_is_each_prompt_length_with_each_answer_length(bpe):
    asks = text(bpe)
    assert [(round(count(bpe, a.prompt), -1), a.max_tokens) for a in asks] == [
        (round(p, -1), a) for p in PROMPT_TOKENS for a in ANSWER_TOKENS
    ]
    assert all(a.schema is None for a in asks)
    assert [a.schema for a in WORKLOADS["json_schema"](bpe)] == [SCHEMA] * len(asks)


def test_an_edit_holds_its_texts_tokens_and_asks_the_longest_answer():
    asks = edits(Words())
    assert [a.max_tokens for a in asks] == [ANSWER_TOKENS[-1]] * len(EDIT_TOKENS)
    texts = [a.prompt.split("Text: ")[1].split("\n\nCorrected text:")[0] for a in asks]
    assert [len(t.split()) for t in texts] == list(EDIT_TOKENS)
