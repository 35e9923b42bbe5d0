"""The bench's payload sets: each body is what its name says, and the handlers' preprocessing takes it."""

from __future__ import annotations

import io

import pytest
import torch
from PIL import Image

from bench.payloads import DEFAULT_PAYLOAD, PAYLOADS, TEXT_TOKENS, body_for, write_payload
from handlers.image import image_to_tensor
from handlers.text import encode, load_tokenizer
from kit.models import Medium, Model, parse_model
from model_store.recipes import minilm_dir

IMAGES = {  # name -> (format, mode, size)
    "thumbnail": ("JPEG", "RGB", (224, 168)),
    "vga": ("JPEG", "RGB", (640, 480)),
    "phone": ("JPEG", "RGB", (4032, 3024)),
    "png-alpha": ("PNG", "RGBA", (640, 480)),
}
TEXTS = {"short": (16, False), "typical": (TEXT_TOKENS, False), "long": (TEXT_TOKENS, True)}  # tokens, truncated


@pytest.mark.parametrize("name", sorted(IMAGES))
def test_image_payloads_are_what_they_say_and_decode(name):
    body = PAYLOADS[name].body(Model.load("resnet50"))
    image = Image.open(io.BytesIO(body.data))
    assert (image.format, image.mode, image.size) == IMAGES[name]
    assert body.content_type == f"image/{image.format.lower()}"
    assert image_to_tensor(body.data).shape == (3, 224, 224)


@pytest.mark.parametrize("name", sorted(TEXTS))
def test_text_payloads_have_their_length(name):
    tokens, truncated = TEXTS[name]
    encoded = encode(
        load_tokenizer(minilm_dir()), PAYLOADS[name].body(Model.load("minilm")).data.decode(), max_length=TEXT_TOKENS
    )
    assert int(encoded.inputs[1].sum()) == tokens  # attention mask: real tokens incl. [CLS]/[SEP]
    assert encoded.truncated is truncated


def test_every_task_has_a_default_and_written_files_keep_their_bytes(tmp_path):
    assert {PAYLOADS[name].medium for name in DEFAULT_PAYLOAD.values()} == set(Medium)
    assert {kind.medium for kind in PAYLOADS.values()} == {*Medium, None}  # None: the model's own samples
    resnet50 = Model.load("resnet50")
    payload = write_payload("thumbnail", resnet50, tmp_path)
    assert payload.path.read_bytes() == PAYLOADS["thumbnail"].body(resnet50).data
    assert body_for(resnet50).data == PAYLOADS["vga"].body(resnet50).data


def test_a_tensor_models_payload_is_one_request_its_handler_decodes(tmp_path):
    from handlers.settings import TensorSettings
    from handlers.tensor import TensorHandler
    from handlers.typed_config import parse_settings

    handler_settings = {"input_shapes": [[2, 3], [4]], "input_dtypes": ["float32", "int64"]}
    model = parse_model("ranker", {"source": {"exported": "r.pt2"}, "task": "tensor", "handler": handler_settings})
    payload = write_payload("tensor", model, tmp_path)
    assert (payload.path.name, payload.content_type) == ("ranker.json", "application/json")
    handler = TensorHandler()
    handler.settings = parse_settings(TensorSettings, handler_settings)
    features, ids = handler.decode({"body": payload.path.read_bytes()})
    assert (features.shape, features.dtype, ids.shape, ids.dtype) == ((2, 3), torch.float32, (4,), torch.int64)
