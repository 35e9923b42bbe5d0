"""make bench-lengths' mix of texts: lengths and texts, without compiling a model."""

import collections

from bench.studies.lengths import BUCKET_SETS, COMPILED_SET, SHORTEST, main, mix_lengths, texts_of
from handlers.calibration import SENTENCES
from handlers.settings import LONGEST_TEXT, TextSettings
from handlers.text import encode, load_tokenizer
from model_store.recipes import minilm_dir


def test_the_mix_spreads_evenly_over_octaves_of_length():
    lengths = mix_lengths(128)
    assert lengths == mix_lengths(128)  # the same mix for every bucket set
    assert all(SHORTEST <= n <= 128 for n in lengths)
    octaves = collections.Counter(min(n.bit_length(), 7) for n in lengths)  # 4-7, 8-15, ..., 64-128
    assert sorted(octaves) == [3, 4, 5, 6, 7] and min(octaves.values()) >= len(lengths) // 10, octaves


def test_each_text_of_the_mix_has_its_token_count():
    tokenizer = load_tokenizer(minilm_dir())
    lengths = mix_lengths(128)
    texts = texts_of(tokenizer, " ".join(SENTENCES), lengths)
    assert [int(encode(tokenizer, text, 128).inputs[1].sum()) for text in texts] == lengths


def test_an_image_model_is_refused_by_name(capsys):
    assert main(["--models", "resnet50"]) == 2
    assert "resnet50: not text models; length buckets pad text only" in capsys.readouterr().err


def test_the_default_buckets_are_among_the_candidates():
    # The report compares every candidate with the default: a new default must be measured too.
    assert TextSettings.length_buckets in BUCKET_SETS.values()
    assert BUCKET_SETS[COMPILED_SET] == tuple(range(2, LONGEST_TEXT))  # a bucket at every length serves them all
