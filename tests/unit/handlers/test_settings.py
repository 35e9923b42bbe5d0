import re

import pytest

from handlers.backends import Backend, DType
from handlers.settings import (
    Architecture,
    CompileMode,
    ImageSettings,
    TensorSettings,
    TextSettings,
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


@pytest.mark.parametrize("settings_class", [ImageSettings, TextSettings, TensorSettings])
def test_int8_weights_are_a_language_models_and_another_task_is_told_its_int8(settings_class):
    with pytest.raises(SettingsError, match=re.escape("choose dtype int8 (aoti-int8, openvino-int8)")):
        parse_settings(settings_class, {"weights": "int8"})
