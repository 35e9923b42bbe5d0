"""handlers/generation/stream.py: text deltas that add up to the tokenizer's own decode, and stop strings."""

from __future__ import annotations

import pytest

from handlers.generation.stream import TextStream
from tests.hf_models import qwen2_lm

TEXTS = ["Hello world, naïve café — 漢字 and emoji 🙂 too.", "  leading spaces\nnew lines\n\nand tabs\t!"]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(qwen2_lm(tmp_path_factory.mktemp("lm")))


@pytest.mark.parametrize("text", TEXTS)
def test_deltas_add_up_to_the_decoded_text_and_never_split_a_character(tokenizer, text):
    ids = tokenizer(text)["input_ids"]
    assert len(ids) > len(text.split())  # multi-byte characters span several byte-level tokens
    stream = TextStream(tokenizer.decode)
    deltas = [stream.push(token) for token in ids]
    assert "".join(deltas) + stream.finish() == tokenizer.decode(ids) == text
    assert not any("\ufffd" in delta for delta in deltas)


def test_a_stop_string_ends_the_text_before_it_and_is_never_sent(tokenizer):
    ids = tokenizer("one two. three four")["input_ids"]
    stream = TextStream(tokenizer.decode, stop=(". th",))
    deltas = []
    for token in ids:
        deltas.append(stream.push(token))
        if stream.stopped:
            break
    assert stream.stopped and "".join(deltas) + stream.finish() == "one two"
    assert all("." not in delta for delta in deltas)  # held back while it could begin the stop string


def test_text_held_back_for_a_stop_string_that_never_comes_is_sent_at_the_end(tokenizer):
    ids = tokenizer("one two.")["input_ids"]
    stream = TextStream(tokenizer.decode, stop=(". th",))
    sent = "".join(stream.push(token) for token in ids)
    assert sent == "one two" and not stream.stopped
    assert stream.finish() == "."
