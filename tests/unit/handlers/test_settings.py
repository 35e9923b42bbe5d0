import re

import pytest

from handlers.backends import Backend, DType
from handlers.settings import (
    Architecture,
    CompileMode,
    GenerationSettings,
    ImageSettings,
    TensorSettings,
    TextSettings,
    Weights,
)
from handlers.typed_config import SettingsError, parse_settings


def test_defaults_when_section_missing():
    settings = parse_settings(ImageSettings, None)
    assert settings.backend is Backend.INDUCTOR
    assert settings.mode is CompileMode.DEFAULT
    assert settings.dtype is DType.FLOAT32
    assert settings.channels_last is True  # CNN default
    assert settings.architecture is Architecture.RESNET50
    assert parse_settings(TextSettings, {}).channels_last is False


def test_values_are_coerced_to_enums():
    settings = parse_settings(TextSettings, {"backend": "eager", "mode": "max-autotune", "dtype": "bfloat16"})
    assert (settings.backend, settings.mode, settings.dtype) == (
        Backend.EAGER,
        CompileMode.MAX_AUTOTUNE,
        DType.BFLOAT16,
    )


def test_unknown_key_names_the_key_and_valid_keys():
    with pytest.raises(SettingsError, match=r"unknown setting\(s\) \['batchsize'\].*valid keys: \[.*'backend'"):
        parse_settings(ImageSettings, {"batchsize": 4})


def test_unknown_backend_lists_choices():
    with pytest.raises(SettingsError, match="backend 'indcutor' is unknown; choose one of: eager, inductor, ipex"):
        parse_settings(ImageSettings, {"backend": "indcutor"})


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("channels_last", "yes", "channels_last must be true or false, got 'yes'"),
        ("top_k", "5", "top_k must be an integer, got '5'"),
        ("top_k", True, "top_k must be an integer, got True"),
        ("labels_file", 3, "labels_file must be a string, got 3"),
    ],
)
def test_wrong_types_are_rejected(key, value, message):
    with pytest.raises(SettingsError, match=message):
        parse_settings(ImageSettings, {key: value})


def test_invariants_are_checked():
    with pytest.raises(SettingsError, match="max_length must be 8 tokens or more, got 4"):
        parse_settings(TextSettings, {"max_length": 4})
    with pytest.raises(SettingsError, match="crop <= resize"):
        parse_settings(ImageSettings, {"crop": 300, "resize": 256})
    with pytest.raises(SettingsError, match="warmup_iterations"):
        parse_settings(TextSettings, {"warmup_iterations": -1})


def test_settings_are_frozen():
    settings = parse_settings(ImageSettings, {})
    with pytest.raises(AttributeError):
        settings.backend = Backend.EAGER


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("accuracy_min_match_rate", 1.5, "accuracy_min_match_rate must be between 0 and 1 or null, got 1.5"),
        ("accuracy_tokens", 0, "accuracy_tokens must be 1 or more, got 0"),
        ("accuracy_prompts", 0, "accuracy_prompts must be 1 or more, got 0"),
        ("prefill_chunk", -8, "prefill_chunk must be 0 or more, got -8"),
        ("max_waiting", -1, "max_waiting must be 0 or more, got -1"),
        ("backend", "aoti", "a generative model is served by backend eager or inductor or openvino, not 'aoti'"),
        ("batching", "sync", "batching 'sync' is unknown; choose one of: async, continuous"),
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


@pytest.mark.parametrize(("given", "chunk"), [({}, 256), ({"prefill_chunk": None}, None), ({"prefill_chunk": 0}, 0)])
def test_a_prefill_chunk_is_256_by_default_null_to_measure_it_0_for_whole_prompts(given, chunk):
    assert parse_settings(GenerationSettings, given).prefill_chunk == chunk


@pytest.mark.parametrize("settings_class", [ImageSettings, TextSettings, TensorSettings])
def test_int8_weights_are_a_language_models_and_another_task_is_told_its_int8(settings_class):
    with pytest.raises(SettingsError, match=re.escape("choose dtype int8 (aoti-int8, openvino-int8)")):
        parse_settings(settings_class, {"weights": "int8"})


def test_a_language_model_on_int8_weights_names_both_precisions():
    settings = parse_settings(GenerationSettings, {"dtype": "bfloat16", "weights": "int8"})
    assert (settings.dtype, settings.weights) == (DType.BFLOAT16, Weights.INT8)
    assert settings.precision == "bfloat16 on int8 weights"
    assert parse_settings(GenerationSettings, {}).precision == "float32"
    with pytest.raises(SettingsError, match="weights 'int4' is unknown; choose one of: dtype, int8"):
        parse_settings(GenerationSettings, {"weights": "int4"})
