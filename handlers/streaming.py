"""The contract of a handler that answers by itself, token by token (a language model's).

    class TextGenerationHandler(StreamingHandler): ...      # handlers/text_generation.py
    isinstance(handler, StreamingHandler)                    # handlers/worker.py: how it is served
    issubclass(handler_class(file), StreamingHandler)        # model_store/build.py: how it is built

The kit's worker (handlers/worker.py) serves such a handler over TorchServe's generative protocols
instead of calling `handle` per batch: it `connect`s the handler to the frontend's answers, hands
it each request as it arrives (`accept`), and each request whose client went away (`cancel`),
while `serve` computes on the worker's main thread until `stop`. (`handle`, TorchServe's per-batch
call, is never made.) A new streaming task subclasses
this; the worker and the build find it by its type, not by the methods it happens to have.
"""

from __future__ import annotations

import abc
from typing import Any

from handlers.replies import Transport


class StreamingHandler(abc.ABC):
    @abc.abstractmethod
    def initialize(self, context) -> None:
        """Load, optimize and warm up, as TorchServe's handlers do."""

    @abc.abstractmethod
    def connect(self, replies: Transport) -> None:
        """Where the handler writes its answers (the frontend's connection)."""

    @abc.abstractmethod
    def accept(self, request_id: str, request: dict[str, Any], headers: dict[str, Any]) -> None:
        """A new request: queue it, or refuse it through the transport. Never blocks on compute."""

    @abc.abstractmethod
    def cancel(self, request_id: str) -> None:
        """The request's client went away: stop computing for it."""

    @abc.abstractmethod
    def serve(self) -> None:
        """Compute and answer, on the calling thread, until `stop`."""

    @abc.abstractmethod
    def stop(self) -> None:
        """End `serve` (the frontend went away)."""
