"""Build an eval-mode nn.Module from the files of an extracted model archive.

    model = load_model(settings, "/tmp/models/abc123")

The archive says which loader to use (`architecture:` in model-config.yaml's handler settings);
the loader never guesses from file names.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

from handlers.settings import Architecture, OptimizationSettings

WEIGHTS_FILE = "model.pt"  # a state dict
EXPORTED_FILE = "model.pt2"  # a torch.export ExportedProgram
TEXT_CONFIG_FILE = "config.json"  # transformers' model config (BERT recipes, Hugging Face directories)


def _require(model_dir: Path, name: str) -> Path:
    path = model_dir / name
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the archive; rebuild it with `make archive`")
    return path


def _state_dict(model_dir: Path) -> dict[str, torch.Tensor]:
    # Memory-mapped: the weights stay pages of the archive's unpacked file, which every worker of
    # the model maps (TorchServe unpacks an archive once per model): shared between them, and
    # clean pages the kernel can drop under pressure instead of killing a worker.
    return torch.load(_require(model_dir, WEIGHTS_FILE), map_location="cpu", weights_only=True, mmap=True)


def _load_weights(model: nn.Module, model_dir: Path) -> nn.Module:
    """The archive's weights into `model`, as its parameters (assign: no copy into the initial ones)."""
    model.load_state_dict(_state_dict(model_dir), assign=True)
    return model


def _load_resnet50(model_dir: Path, settings) -> nn.Module:
    from handlers.architectures.resnet import resnet50

    return _load_weights(resnet50(), model_dir)


def _bert(class_name: str) -> Callable[[Path, OptimizationSettings], nn.Module]:
    def load(model_dir: Path, settings) -> nn.Module:
        from transformers import BertConfig

        from handlers.architectures import text

        config = BertConfig(**json.loads(_require(model_dir, TEXT_CONFIG_FILE).read_text()))
        return _load_weights(getattr(text, class_name)(config), model_dir)

    return load


def _load_exported_program(model_dir: Path, settings) -> nn.Module:
    return torch.export.load(_require(model_dir, EXPORTED_FILE)).module()


def _pretrained(auto_class: str, model_dir: Path, dtype: torch.dtype | str = torch.float32) -> nn.Module:
    import transformers

    _require(model_dir, TEXT_CONFIG_FILE)
    # Offline by construction: a local directory, never a hub name. In float32 whatever dtype the
    # checkpoint was saved in (transformers 5 loads that one by default; Qwen's and Llama's are
    # bf16): the accuracy guard's reference is the float model, and the handler settings' dtype,
    # not the file's, is the one served.
    return getattr(transformers, auto_class).from_pretrained(str(model_dir), local_files_only=True, dtype=dtype)


def _load_hf_sequence_classifier(model_dir: Path, settings) -> nn.Module:
    from handlers.architectures.auto import logits, text_model

    return text_model(_pretrained("AutoModelForSequenceClassification", model_dir), settings, logits)


def _load_hf_image_classifier(model_dir: Path, settings) -> nn.Module:
    from handlers.architectures.auto import ImageClassifier

    return ImageClassifier(_pretrained("AutoModelForImageClassification", model_dir))


def _load_hf_feature_extractor(model_dir: Path, settings) -> nn.Module:
    from handlers.architectures.auto import pooled, text_model

    return text_model(_pretrained("AutoModel", model_dir), settings, pooled(settings))


def _load_hf_causal_lm(model_dir: Path, settings) -> nn.Module:
    # Its own forward, not a wrapper: the engine passes it the KV cache (handlers/generation/).
    return _pretrained("AutoModelForCausalLM", model_dir)


def causal_lm_as_saved(model_dir: str | Path) -> nn.Module:
    """The causal language model in its checkpoint's own dtype, eval mode: where nothing needs the
    float model (the guard's answers shipped in the archive), weights.converted then turns it into
    the served dtype a tensor at a time. Read as float32 instead, transformers holds a bf16
    checkpoint's pages and the whole float32 copy at once."""
    return _pretrained("AutoModelForCausalLM", Path(model_dir), dtype="auto").eval()


LOADERS: dict[Architecture, Callable[[Path, OptimizationSettings], nn.Module]] = {
    Architecture.RESNET50: _load_resnet50,
    Architecture.BERT_CLASSIFIER: _bert("BertClassifier"),
    Architecture.SENTENCE_EMBEDDER: _bert("SentenceEmbedder"),
    Architecture.EXPORTED_PROGRAM: _load_exported_program,
    Architecture.HF_SEQUENCE_CLASSIFIER: _load_hf_sequence_classifier,
    Architecture.HF_IMAGE_CLASSIFIER: _load_hf_image_classifier,
    Architecture.HF_FEATURE_EXTRACTOR: _load_hf_feature_extractor,
    Architecture.HF_CAUSAL_LM: _load_hf_causal_lm,
}


def load_model(settings: OptimizationSettings, model_dir: str | Path) -> nn.Module:
    """The archive's model for these handler settings (their `architecture` picks the loader)."""
    model = LOADERS[settings.architecture](Path(model_dir), settings)
    # An ExportedProgram's module() refuses .eval(); it is already in inference form.
    if settings.architecture is not Architecture.EXPORTED_PROGRAM:
        model.eval()
    return model
