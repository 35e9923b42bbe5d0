"""What the handlers' unit tests share: TorchServe's own Context and handle(), with tiny models in
tmp_path."""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from ts.context import Context, RequestProcessor

import handlers.itt
from handlers.image_classification import ImageClassificationHandler
from handlers.outside_context import worker_context
from handlers.text import TOKENIZER_FILE
from model_store.recipes import minilm_dir


def make_context(model_dir: Path, handler_settings: dict, batch_size: int = 1) -> Context:
    return worker_context(model_dir, "tiny", handler_settings, batch_size)


# What TorchServe 0.12 hands the handler per request (ts/service.py): an entry per input field,
# and a REST request's HTTP headers; a gRPC request has no HTTP headers.
REST_HEADERS = {"body": {"content-type": "image/jpeg"}, "Host": "127.0.0.1:8080", "Content-Length": "1"}


GRPC_HEADERS = {"data": {"content-type": ""}}


def serve(handler, context: Context, requests: list[dict], headers: dict = REST_HEADERS) -> list:
    context.request_processor = [RequestProcessor(dict(headers)) for _ in requests]
    context.request_ids = {i: f"req-{i}" for i in range(len(requests))}
    return handler.handle(requests, context)


def statuses(context: Context) -> list[int]:
    return [p.get_response_status_code() for p in context.request_processor]


def image_handler(model_dir, batch_size=1, **settings):
    context = make_context(model_dir, {"architecture": "exported-program", **settings}, batch_size)
    handler = ImageClassificationHandler()
    handler.initialize(context)
    return handler, context


def write_text_archive(model_dir: Path, model) -> Path:
    torch.save(model.state_dict(), model_dir / "model.pt")
    (model_dir / "config.json").write_text(model.config.to_json_string())
    shutil.copy(minilm_dir() / TOKENIZER_FILE, model_dir / TOKENIZER_FILE)
    return model_dir


def text_handler(model_dir: Path, model, handler_class, settings: dict, batch_size: int = 1):
    """`model` saved as a text archive in `model_dir`, served by `handler_class`, initialized."""
    write_text_archive(model_dir, model)
    context = make_context(model_dir, settings, batch_size)
    handler = handler_class()
    handler.initialize(context)
    return handler, context


class RangeRecorder:
    def __init__(self):
        self.events: list[str] = []

    def install(self, monkeypatch):
        monkeypatch.setattr(handlers.itt.itt, "is_available", lambda: True)
        monkeypatch.setattr(handlers.itt.itt, "range_push", lambda name: self.events.append(f"push {name}"))
        monkeypatch.setattr(handlers.itt.itt, "range_pop", lambda: self.events.append("pop"))
