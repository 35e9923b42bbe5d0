"""The model registry (kit/models.py), model files written by `make model` (model_store/model_file.py)
and what a Hugging Face directory implies (model_store/huggingface.py)."""

from __future__ import annotations

import json

import pytest
import yaml

from handlers.settings import ImageSettings, TextSettings
from handlers.typed_config import SettingsError, parse_settings
from kit import models
from kit.layout import Grouping, OmpWaitPolicy
from kit.models import Medium, Model, SourceKind, Task, model_names, parse_model
from model_store import huggingface
from model_store.huggingface import SourceError, derive, guess_task
from model_store.model_file import main as make_model
from model_store.model_file import write_model_file
from tests.conftest import BUNDLED_MODELS
from tests.hf_models import IMAGE_LABELS, LABELS, distilbert_classifier, gpt2_lm, qwen2_lm, vit_classifier


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """An empty model directory in place of config/models/."""
    monkeypatch.setattr(models, "MODELS_DIR", tmp_path / "models")
    (tmp_path / "models").mkdir()
    models._load.cache_clear()
    yield tmp_path / "models"
    models._load.cache_clear()


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("hf")
    return {"text": distilbert_classifier(root / "distil"), "image": vit_classifier(root / "vit")}


def test_bundled_models_are_ordinary_model_files():
    assert set(BUNDLED_MODELS) <= set(model_names())
    for model in map(Model.load, BUNDLED_MODELS):
        assert model.source.kind is SourceKind.RECIPE
        # Kit keys stay out of the TorchServe config the archives carry; its defaults are filled in.
        assert not {"source", "task"} & set(model.serving)
        assert model.serving["startupTimeout"] == models.STARTUP_TIMEOUT_S
    assert Model.load("resnet50").task.medium is Medium.IMAGE
    assert Model.load("minilm").task.handler == "sentence_embedding.py"


def test_a_model_file_is_checked_and_errors_say_how_to_fix_it(registry):
    with pytest.raises(SettingsError, match=r"model 'nope' is unknown; choose one of: .*make model NAME=nope"):
        Model.load("nope")
    with pytest.raises(SettingsError, match=r"task 'image' is unknown; choose one of: image-classification"):
        parse_model("m", {"source": {"exported": "m.pt2"}, "task": "image"})
    with pytest.raises(SettingsError, match=r"source 'hub' is unknown; choose one of: recipe, huggingface, exported"):
        parse_model("m", {"source": {"hub": "bert-base"}, "task": "text-classification"})
    with pytest.raises(SettingsError, match=r"source must be one of .* got 'm.pt2'"):
        parse_model("m", {"source": "m.pt2", "task": "text-classification"})
    (registry / "bad.yaml").write_text("source: {exported: m.pt2}\n")
    with pytest.raises(SettingsError, match=r"bad.yaml: .*task"):
        Model.load("bad")


def test_a_model_files_handler_section_is_parsed_by_its_tasks_settings_when_read(registry):
    text = {"source": {"huggingface": "/data/roberta"}, "task": "text-classification"}
    assert parse_model("m", {**text, "handler": {"max_length": 64}}).settings == TextSettings(max_length=64)
    (registry / "typo.yaml").write_text(yaml.safe_dump({**text, "handler": {"max_lenght": 64}}))
    with pytest.raises(
        SettingsError, match=r"typo.yaml: handler: unknown setting\(s\) \['max_lenght'\] for TextSettings"
    ):
        Model.load("typo")  # at any command that reads the file, not at the archive build
    with pytest.raises(SettingsError, match=r"handler: top_k must be >= 1, got 0"):
        parse_model("m", {"source": {"huggingface": "/d"}, "task": "image-classification", "handler": {"top_k": 0}})


@pytest.mark.parametrize("task", list(Task))
def test_each_tasks_settings_are_its_handlers(task):
    import importlib

    module = importlib.import_module(f"handlers.{task.handler.removesuffix('.py')}")
    handlers = [v for v in vars(module).values() if isinstance(v, type) and v.__module__ == module.__name__]
    assert {h.settings_class for h in handlers if hasattr(h, "settings_class")} == {task.settings}


def test_make_model_writes_a_file_the_registry_reads(registry, hf_dirs, tmp_path):
    path = write_model_file("mine", hf_dirs["text"], task=None)
    model = Model.load("mine")
    assert path == registry / "mine.yaml" and model_names() == ["mine"]
    assert model.task is Task.TEXT_CLASSIFICATION  # from config.json's DistilBertForSequenceClassification
    assert (model.source.kind, model.source.path) == (SourceKind.HUGGINGFACE, hf_dirs["text"])
    with pytest.raises(SettingsError, match="already exists .*FORCE=1"):
        write_model_file("mine", hf_dirs["image"], task=None)
    write_model_file("mine", hf_dirs["image"], task=None, force=True)
    exported = tmp_path / "net.pt2"
    exported.write_bytes(b"")
    with pytest.raises(SettingsError, match="an exported program does not say its task; give TASK="):
        write_model_file("net", exported, task=None)
    assert yaml.safe_load(write_model_file("net", exported, Task.IMAGE_CLASSIFICATION).read_text()) == {
        "source": {"exported": str(exported)},
        "task": "image-classification",
    }
    with pytest.raises(SettingsError, match="NAME 'My Model' must be lower-case"):
        write_model_file("My Model", exported, Task.IMAGE_CLASSIFICATION)
    with pytest.raises(SettingsError, match="neither a Hugging Face directory nor a .pt2"):
        write_model_file("x", tmp_path / "weights.bin", Task.IMAGE_CLASSIFICATION)


def test_make_models_set_writes_handler_settings_parsed_by_the_task(registry, hf_dirs, capsys):
    """`make model ... SET="max_length=64 accuracy_tolerance=0.05"`: values read as YAML, checked by
    the task's settings before the file is written; an unknown key or a word without = is refused."""
    make_model(["mine", str(hf_dirs["text"]), "--set", "max_length=64", "--set", "accuracy_tolerance=0.05"])
    assert yaml.safe_load((registry / "mine.yaml").read_text())["handler"] == {
        "max_length": 64,
        "accuracy_tolerance": 0.05,
    }
    with pytest.raises(SystemExit, match="handler: .*no_such_setting"):
        make_model(["other", str(hf_dirs["text"]), "--set", "no_such_setting=1"])
    assert not (registry / "other.yaml").exists()
    with pytest.raises(SystemExit):
        make_model(["other", str(hf_dirs["text"]), "--set", "max_length"])
    assert "'max_length' is not KEY=VALUE" in capsys.readouterr().err


def test_a_text_classifier_directory_gives_its_labels_inputs_and_tokenizer(hf_dirs):
    derived = derive(hf_dirs["text"], guess_task(hf_dirs["text"]))
    assert derived.labels == tuple(LABELS.values())
    settings = parse_settings(TextSettings, derived.settings)
    assert settings.input_names == ("input_ids", "attention_mask")  # DistilBERT takes no token_type_ids
    assert (settings.pad_token, settings.max_length) == ("[PAD]", 128)  # served at most at the kit's default


def test_an_image_processor_config_becomes_the_kits_preprocessing(hf_dirs):
    derived = derive(hf_dirs["image"], Task.IMAGE_CLASSIFICATION)
    assert derived.labels == tuple(IMAGE_LABELS.values())
    settings = parse_settings(ImageSettings, derived.settings)
    assert (settings.resize, settings.crop, settings.fit.value, settings.resample.value) == (
        64,
        64,
        "stretch",
        "bilinear",
    )
    assert settings.mean == settings.std == (0.5, 0.5, 0.5)


@pytest.mark.parametrize(
    ("change", "refusal"),
    [
        ({"do_pad": True}, r"options \['do_pad'\] are not reproduced"),
        ({"size": {"height": 64, "width": 48}}, r"size .* is not square"),
        ({"do_resize": False}, "do_resize false"),
        ({"size": {"shortest_edge": 64}}, "keeps the aspect ratio"),
    ],
)
def test_an_image_processor_option_the_kit_cannot_reproduce_is_refused_by_name(hf_dirs, tmp_path, change, refusal):
    directory = tmp_path / "vit"
    directory.mkdir()
    processor = {**json.loads((hf_dirs["image"] / huggingface.PREPROCESSOR_FILE).read_text()), **change}
    (directory / huggingface.PREPROCESSOR_FILE).write_text(json.dumps(processor))
    (directory / huggingface.CONFIG_FILE).write_text((hf_dirs["image"] / huggingface.CONFIG_FILE).read_text())
    with pytest.raises(SourceError, match=refusal):
        derive(directory, Task.IMAGE_CLASSIFICATION)


def test_a_centre_cropped_processor_keeps_its_aspect_ratio_then_crops(tmp_path):
    (tmp_path / huggingface.PREPROCESSOR_FILE).write_text(
        json.dumps({"size": {"shortest_edge": 224}, "crop_pct": 0.875, "resample": 3})  # ConvNeXt's
    )
    settings = huggingface.image_settings(tmp_path)
    assert (settings["resize"], settings["crop"], settings["fit"], settings["resample"]) == (
        256,
        224,
        "crop",
        "bicubic",
    )


def test_a_classifier_the_kit_would_answer_wrongly_is_refused(hf_dirs, tmp_path):
    config = json.loads((hf_dirs["text"] / huggingface.CONFIG_FILE).read_text())
    with pytest.raises(SourceError, match="problem_type 'multi_label_classification' is not served"):
        huggingface.labels({**config, "problem_type": "multi_label_classification"})
    with pytest.raises(SourceError, match="1 label"):
        huggingface.labels({**config, "id2label": {"0": "score"}})
    (tmp_path / huggingface.CONFIG_FILE).write_text(json.dumps({"architectures": ["WhisperForConditionalGeneration"]}))
    with pytest.raises(SourceError, match=r"architectures \['WhisperForConditionalGeneration'\] name no task .* TASK="):
        guess_task(tmp_path)


def test_sentence_transformers_pooling_is_read_from_its_modules(tmp_path):
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    (tmp_path / "modules.json").write_text(json.dumps(modules))
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    assert huggingface.pooling(tmp_path) == {"pooling": "cls", "normalize": False}
    assert guess_task(tmp_path) is Task.FEATURE_EXTRACTION
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_max_tokens": True}))
    with pytest.raises(SourceError, match=r"pooling \['pooling_mode_max_tokens'\] is not reproduced"):
        huggingface.pooling(tmp_path)


def test_building_an_unknown_model_names_the_known_ones_and_how_to_add_one():
    from model_store import build

    with pytest.raises(
        SystemExit, match=r"\[archive\] ERROR: model 'nope' is unknown; choose one of: .*bert.*make model"
    ):
        build.main(["--models", "nope", "--variants", "eager"])


def test_bench_targets_are_declared_in_the_model_files():
    assert Model.load("resnet50").targets.speedup == 3.0
    assert Model.load("minilm").targets.int8_cosine_mean == 0.99
    with pytest.raises(SettingsError, match=r"unknown setting\(s\) \['speed'\] for Targets"):
        parse_model("m", {"source": {"recipe": "bert"}, "task": "text-classification", "targets": {"speed": 2}})


def test_a_tensor_model_file_declares_what_one_request_sends(registry, hf_dirs, tmp_path):
    import torch

    from tests.tensor_models import FEATURES, tabular_model, tabular_program

    program = tabular_program(tmp_path / "ranker.pt2")
    document = yaml.safe_load(write_model_file("ranker", program, Task.TENSOR).read_text())
    assert document["handler"] == {"input_shapes": [[FEATURES], [3]], "input_dtypes": ["float32", "int64"]}
    assert Model.load("ranker").task.medium is Medium.TENSOR
    static = torch.export.export(tabular_model(), (torch.randn(2, FEATURES), torch.zeros(2, 3, dtype=torch.long)))
    torch.export.save(static, tmp_path / "static.pt2")
    with pytest.raises(SettingsError, match=r"input 'features' has no dynamic batch dimension .*Dim\('batch'\)"):
        write_model_file("static", tmp_path / "static.pt2", Task.TENSOR)
    with pytest.raises(SettingsError, match="TASK=tensor serves a torch.export program"):
        write_model_file("hf", hf_dirs["text"], Task.TENSOR)
    assert model_names() == ["ranker"]


def test_an_exported_text_program_is_given_exactly_the_inputs_its_forward_takes(tmp_path):
    import torch

    from model_store.exported import text_inputs

    class TwoInputs(torch.nn.Module):
        def forward(self, input_ids, attention_mask):
            return (input_ids * attention_mask).float().sum(1, keepdim=True)

    class Features(torch.nn.Module):
        def forward(self, features):
            return features.sum(1, keepdim=True)

    ids = torch.ones(2, 8, dtype=torch.long)
    torch.export.save(torch.export.export(TwoInputs(), (ids, ids)), tmp_path / "text.pt2")
    assert text_inputs(tmp_path / "text.pt2") == {"input_names": ["input_ids", "attention_mask"]}
    torch.export.save(torch.export.export(Features(), (torch.randn(2, 4),)), tmp_path / "other.pt2")
    with pytest.raises(SettingsError, match=r"takes \['features'\]; a text program takes input_ids .* TASK=tensor"):
        text_inputs(tmp_path / "other.pt2")


def test_a_model_file_may_not_ask_for_longer_texts_than_its_model_takes(registry, hf_dirs, tmp_path):
    from model_store.sources import write_source

    derived = derive(hf_dirs["text"], Task.TEXT_CLASSIFICATION)
    config = json.loads((hf_dirs["text"] / "config.json").read_text())
    assert derived.longest_text == config["max_position_embeddings"]  # below the tokenizer's model_max_length
    write_model_file("long", hf_dirs["text"], task=None)
    path = registry / "long.yaml"
    written = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**written, "handler": {"max_length": derived.longest_text + 1}}))
    models._load.cache_clear()
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(SettingsError, match=rf"asks for max_length {derived.longest_text + 1}, but .* takes at most"):
        write_source(staging, Model.load("long"))
    # Longer than BERT's 512 is no error in itself: the model's own files set the bound.
    assert parse_settings(TextSettings, {"max_length": 2048}).max_length == 2048


def test_a_model_file_without_an_architecture_is_refused_not_given_resnet50(registry, tmp_path):
    from model_store.sources import write_source

    (registry / "bare.yaml").write_text(
        "source: {recipe: bert}\ntask: text-classification\nhandler: {max_length: 32}\n"
    )
    staging = tmp_path / "staging"
    staging.mkdir()
    with pytest.raises(
        SettingsError, match=r"bare.yaml names no `architecture:` .*give one of: resnet50, bert-classifier"
    ):
        write_source(staging, Model.load("bare"))


def test_a_language_models_task_and_context_come_from_its_directory(registry, tmp_path):
    qwen, gpt2 = qwen2_lm(tmp_path / "qwen2"), gpt2_lm(tmp_path / "gpt2")
    assert guess_task(qwen) is guess_task(gpt2) is Task.TEXT_GENERATION  # Qwen2ForCausalLM, GPT2LMHeadModel
    derived = derive(gpt2, Task.TEXT_GENERATION)  # n_positions 1024, under the kit's default 2048
    assert derived.settings == {"architecture": "hf-causal-lm", "context_length": 1024} and derived.longest_text == 1024
    derived = derive(qwen, Task.TEXT_GENERATION)  # 32768 positions: served at the default, up to them on request
    assert derived.settings["context_length"] == 2048 and derived.longest_text == 32768
    config = json.loads((qwen / "config.json").read_text())
    (qwen / "config.json").write_text(json.dumps({**config, "use_sliding_window": True, "sliding_window": 512}))
    assert derive(qwen, Task.TEXT_GENERATION).settings["context_length"] == 512  # the window ends a causal mask
    path = write_model_file("lm", gpt2, task=None)
    assert yaml.safe_load(path.read_text())["task"] == "text-generation"
    # continuousBatching by default: a round trip per step, the frontend's batch holding every
    # sequence and every waiting request; one worker in all. The settings' keys win over the file's.
    serving = Model.load("lm").serving
    assert serving["continuousBatching"] is True and serving["asyncCommunication"] is False
    assert serving["maxBatchDelay"] == 1 and serving["batchSize"] > 8 + 64  # all it has: the engine refuses
    assert models.grouping("lm") is Grouping.ONE
    assert models.omp_wait_policy("lm") is OmpWaitPolicy.DEFAULT  # not the presets' passive: a step is many regions
    document = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**document, "continuousBatching": True, "handler": {"batching": "async"}}))
    models._load.cache_clear()
    serving = Model.load("lm").serving
    assert serving["asyncCommunication"] is True and serving["continuousBatching"] is False
    assert models.grouping("lm") is Grouping.DOMAIN  # its engine batches every stream of a domain
    path.write_text(yaml.safe_dump(document))
    models._load.cache_clear()
    path.write_text(yaml.safe_dump({**yaml.safe_load(path.read_text()), "handler": {"context_length": 4096}}))
    models._load.cache_clear()
    from model_store.sources import write_source

    (tmp_path / "staging").mkdir()
    with pytest.raises(SettingsError, match=r"asks for context_length 4096, but .* takes at most 1024 tokens"):
        write_source(tmp_path / "staging", Model.load("lm"))


def test_a_language_model_is_served_by_the_backends_and_dtypes_that_serve_it():
    from handlers.generation.settings import GenerationSettings

    assert parse_settings(GenerationSettings, {"backend": "inductor", "dtype": "bfloat16"}).max_sequences == 16
    assert parse_settings(GenerationSettings, {"backend": "openvino", "weights": "int8"}).precision == (
        "float32 on int8 weights"
    )
    with pytest.raises(SettingsError, match="served by backend eager or inductor or openvino, not 'ipex'"):
        parse_settings(GenerationSettings, {"backend": "ipex"})
    with pytest.raises(SettingsError, match="max_sequences must be 1 or more"):
        parse_settings(GenerationSettings, {"max_sequences": 0})
