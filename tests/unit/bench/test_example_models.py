"""bench/example_models.py: the causal tokenizer (a real-size vocabulary of ordinary entries), the repeating model."""

from __future__ import annotations

from bench.example_models import CHAT_TOKENS, TOOL_TOKENS, causal_tokenizer, qwen2_repeating


def test_the_vocabulary_grows_to_its_size_with_ordinary_words_that_decode():
    tokenizer = causal_tokenizer(size=700)
    assert len(tokenizer) == 700
    # the words are no added tokens; the tool-call markers are, the last ids, decoded with the text
    assert set(tokenizer.get_added_vocab()) == {*CHAT_TOKENS, *TOOL_TOKENS}
    assert tokenizer.decode([697, 650]) == " w697 w650"
    assert tokenizer.convert_tokens_to_ids(list(TOOL_TOKENS)) == [698, 699]
    assert tokenizer.decode([698, 699], skip_special_tokens=True) == "<tool_call></tool_call>"
    text = "the model answers"
    assert tokenizer.decode(tokenizer(text).input_ids) == text
    assert max(tokenizer(text).input_ids) < 512  # no merge makes a padding word


def test_size_zero_keeps_the_trained_vocabulary():
    assert len(causal_tokenizer(size=0)) == len(causal_tokenizer(size=100)) <= 512 + len(TOOL_TOKENS)


def test_the_repeating_models_greedy_answer_is_its_prompts_last_token_again(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory = qwen2_repeating(tmp_path, dim=64, layers=2, heads=4, kv_heads=2, vocabulary=0)
    model, tokenizer = AutoModelForCausalLM.from_pretrained(directory), AutoTokenizer.from_pretrained(directory)
    ids = tokenizer("the cat sat on the mat", return_tensors="pt").input_ids
    with torch.no_grad():
        answer = model.generate(ids, max_new_tokens=6, do_sample=False)[0, ids.shape[1] :]
    assert answer.tolist() == [ids[0, -1].item()] * 6
