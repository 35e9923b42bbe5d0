"""handlers/text_classification.py through TorchServe's Context and handle(), with tiny BERTs."""

from __future__ import annotations

import torch

from handlers.architectures.text import BertClassifier
from handlers.text import TOKENIZER_FILE, encode, load_tokenizer
from handlers.text_classification import TextClassificationHandler
from tests.unit.handlers.serving import make_context, serve, statuses, text_handler, write_text_archive


def test_text_classifier_serves_probabilities(tmp_path, tiny_bert_config):
    torch.manual_seed(0)
    model = BertClassifier(tiny_bert_config).eval()
    settings = {"architecture": "bert-classifier", "backend": "inductor", "max_length": 32}
    handler, context = text_handler(tmp_path, model, TextClassificationHandler, settings, 2)
    responses = serve(handler, context, [{"body": "a fine film"}, {"body": b"\xff bad"}, {"body": {"text": "dull"}}])
    assert statuses(context) == [200, 400, 200]
    tokenizer = load_tokenizer(tmp_path)
    for response, text in ((responses[0], "a fine film"), (responses[2], "dull")):
        inputs = tuple(t[None] for t in encode(tokenizer, text, 32).inputs)
        with torch.inference_mode():
            expected = torch.softmax(model(*inputs)[0], 0)
        assert list(response) == ["LABEL_0", "LABEL_1", "LABEL_2"]
        torch.testing.assert_close(torch.tensor(list(response.values())), expected, rtol=1e-4, atol=1e-5)


def test_text_over_the_limit_is_cut_or_refused_as_the_model_file_says(tmp_path, tiny_bert_config):
    write_text_archive(tmp_path, BertClassifier(tiny_bert_config).eval())
    long_text, short_text = " ".join(["word"] * 40), "a fine film"
    for over_length, status in (("truncate", 200), ("refuse", 400)):
        settings = {"architecture": "bert-classifier", "backend": "eager", "max_length": 16, "over_length": over_length}
        context = make_context(tmp_path, settings)
        handler = TextClassificationHandler()
        handler.initialize(context)
        (answer,) = serve(handler, context, [{"body": long_text}])
        assert statuses(context) == [status], answer
        assert status == 200 or "longer than the 16 tokens this model takes" in answer["message"]
        serve(handler, context, [{"body": short_text}])
        assert statuses(context) == [200]
        assert handler.stages.outcomes == ({"ok": 2} if status == 200 else {"too_long": 1, "ok": 1})


def test_a_text_model_with_a_small_vocabulary_warms_up_and_answers(tmp_path, tiny_bert_config):
    # Protein, DNA and character models have 25-100 tokens: warm-up ids must stay inside them.
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    words = ["[PAD]", "[UNK]", *"ACDEFGHIKLMNPQRSTVWY"]  # the 20 amino acids, one token each
    tokenizer = Tokenizer(WordLevel({word: i for i, word in enumerate(words)}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = Whitespace()
    tiny_bert_config.vocab_size = len(words)
    torch.manual_seed(0)
    model = BertClassifier(tiny_bert_config).eval()
    write_text_archive(tmp_path, model)
    tokenizer.save(str(tmp_path / TOKENIZER_FILE))
    context = make_context(tmp_path, {"architecture": "bert-classifier", "backend": "eager", "max_length": 32})
    handler = TextClassificationHandler()
    handler.initialize(context)
    text = "M K T A Y I A K Q R"
    (answer,) = serve(handler, context, [{"body": text}])
    assert statuses(context) == [200], answer
    inputs = tuple(t[None] for t in encode(load_tokenizer(tmp_path), text, 32).inputs)
    with torch.inference_mode():
        expected = torch.softmax(model(*inputs)[0], 0)
    torch.testing.assert_close(torch.tensor(list(answer.values())), expected, rtol=1e-4, atol=1e-5)
