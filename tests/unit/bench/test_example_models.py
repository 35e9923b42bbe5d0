"""bench/example_models.py's causal tokenizer: a real-size vocabulary of ordinary entries."""

from __future__ import annotations

from bench.example_models import CHAT_TOKENS, causal_tokenizer


def test_the_vocabulary_grows_to_its_size_with_ordinary_words_that_decode():
    tokenizer = causal_tokenizer(size=700)
    assert len(tokenizer) == 700
    assert set(tokenizer.get_added_vocab()) == set(CHAT_TOKENS)  # the words are no added tokens
    assert tokenizer.decode([699, 650]) == " w699 w650"
    text = "the model answers"
    assert tokenizer.decode(tokenizer(text).input_ids) == text
    assert max(tokenizer(text).input_ids) < 512  # no merge makes a padding word


def test_size_zero_keeps_the_trained_vocabulary():
    assert len(causal_tokenizer(size=0)) == len(causal_tokenizer(size=100)) <= 512
