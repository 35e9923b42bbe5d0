"""handlers/generation/settings.py: a language model's settings, what it refuses, and what a preset serves over them."""

import re

import pytest

from handlers.backends import DType
from handlers.generation.settings import GenerationSettings
from handlers.settings import Weights
from handlers.typed_config import SettingsError, parse_settings


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("accuracy_min_match_rate", 1.5, "accuracy_min_match_rate must be between 0 and 1 or null, got 1.5"),
        ("accuracy_tokens", 0, "accuracy_tokens must be 1 or more, got 0"),
        ("accuracy_prompts", 0, "accuracy_prompts must be 1 or more, got 0"),
        ("prefill_chunk", -8, "prefill_chunk must be 0 or more, got -8"),
        ("max_waiting", -1, "max_waiting must be 0 or more, got -1"),
        ("prefix_store_mb", -64, "prefix_store_mb must be 0 or more, got -64"),
        ("backend", "aoti", "a generative model is served by backend eager or inductor or openvino, not 'aoti'"),
        ("batching", "sync", "batching 'sync' is unknown; choose one of: async, continuous"),
        ("kv_cache", "fp8", "kv_cache 'fp8' is unknown; choose one of: dtype, int8"),
    ],
)
def test_a_generative_models_settings_refuse_what_it_cannot_serve(key, value, message):
    with pytest.raises(SettingsError, match=re.escape(message)):
        parse_settings(GenerationSettings, {key: value})


def test_a_preset_serves_scheduling_settings_over_the_archives_and_nothing_it_was_built_with():
    """ServeConfig.model_settings (make tune's prompt lookup) over the model file's `handler:`."""
    section = {"prompt_lookup": 2, "context_length": 512}
    served = GenerationSettings.served_over(section, {"prompt_lookup": 4, "prefill_chunk": 64})
    assert (served.prompt_lookup, served.prefill_chunk, served.context_length) == (4, 64, 512)
    assert GenerationSettings.served_over(section, {}) == parse_settings(GenerationSettings, section)
    with pytest.raises(SettingsError, match=re.escape("cannot serve ['context_length', 'dtype'] over the archive's")):
        GenerationSettings.served_over(section, {"context_length": 64, "dtype": "bfloat16"})


@pytest.mark.parametrize(("given", "chunk"), [({}, 128), ({"prefill_chunk": None}, None), ({"prefill_chunk": 0}, 0)])
def test_a_prefill_chunk_is_128_by_default_null_to_measure_it_0_for_whole_prompts(given, chunk):
    assert parse_settings(GenerationSettings, given).prefill_chunk == chunk


def test_a_language_model_on_int8_weights_names_both_precisions():
    settings = parse_settings(GenerationSettings, {"dtype": "bfloat16", "weights": "int8"})
    assert (settings.dtype, settings.weights) == (DType.BFLOAT16, Weights.INT8)
    assert settings.precision == "bfloat16 on int8 weights"
    assert parse_settings(GenerationSettings, {}).precision == "float32"
    with pytest.raises(SettingsError, match="weights 'int4' is unknown; choose one of: dtype, int8"):
        parse_settings(GenerationSettings, {"weights": "int4"})


@pytest.mark.parametrize("backend", ["inductor", "openvino"])
def test_an_int8_kv_cache_is_named_in_the_precision_on_either_engine(backend):
    settings = parse_settings(GenerationSettings, {"backend": backend, "dtype": "bfloat16", "kv_cache": "int8"})
    assert settings.precision == "bfloat16 with an int8 KV cache"
