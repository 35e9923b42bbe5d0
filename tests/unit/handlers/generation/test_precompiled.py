"""handlers/generation/precompiled.py: each kind of step compiled whole at its first call, saved and
loaded in another model's forward, answering as the eager model; a step whose shapes fail a whole
graph's guards, and a model Dynamo cannot take whole, computed by graphs traced as before."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from handlers.generation import precompiled
from handlers.generation.precompiled import Forward, step_kind


class Tiny(nn.Module):
    """A language model's call, small: token ids in, a row of scores per token out."""

    def __init__(self, seed: int = 0, breaks: bool = False):
        super().__init__()
        torch.manual_seed(seed)
        self.embed, self.head, self.breaks = nn.Embedding(40, 16), nn.Linear(16, 40), breaks

    def forward(self, input_ids: torch.Tensor, mixed: torch.Tensor | None = None) -> torch.Tensor:
        hidden = self.embed(input_ids)
        if self.breaks:
            torch._dynamo.graph_break()
        if mixed is not None:
            hidden = hidden * mixed
        return torch.tanh(self.head(hidden))


@pytest.fixture(autouse=True)
def trace_settings():
    """compiled.trace_settings(), a worker's, undone after each test."""
    with torch.fx.experimental._config.patch(use_duck_shape=False), torch._dynamo.config.patch(specialize_float=True):
        yield


def ids(rows: int, tokens: int) -> torch.Tensor:
    return torch.arange(rows * tokens).reshape(rows, tokens) % 40


def test_a_step_is_computed_by_the_graph_of_its_kind():
    assert step_kind({"input_ids": ids(3, 1)}) == "decode"
    assert step_kind({"input_ids": ids(1, 9)}) == "part"
    assert step_kind({"input_ids": ids(1, 9), "mixed": object()}) == "mixed"


def test_whole_graphs_saved_by_one_model_answer_as_the_eager_model_in_another(tmp_path, caplog):
    built = Tiny()
    forward = Forward(built, {})
    with torch.inference_mode():
        forward(input_ids=ids(2, 1))
        forward(input_ids=ids(1, 8), mixed=torch.tensor(0.5))
    assert forward.save(tmp_path) == ["decode", "mixed"]
    served = Tiny()  # a worker's own model: the same weights (the archive's), another object
    graphs, said = precompiled.load(tmp_path, served)
    assert said == "2 whole graphs loaded (decode, mixed)"
    served.forward = Forward(served, {}, graphs)
    assert len(served.forward.loaded_kinds) == 2
    assert not served.forward.traces(["decode", "mixed"]) and served.forward.traces(["decode", "part"])
    assert forward.traces(["decode"])  # compiled at its first call here, not loaded
    with torch.inference_mode(), caplog.at_level(logging.INFO, logger=precompiled.__name__):
        for rows in (2, 5, 16):
            torch.testing.assert_close(served(input_ids=ids(rows, 1)), served.forward.original(input_ids=ids(rows, 1)))
        for tokens in (8, 24):
            asked = {"input_ids": ids(1, tokens), "mixed": torch.tensor(2.0)}
            torch.testing.assert_close(served(**asked), served.forward.original(**asked))
    assert served.forward.traced is None and "compiled whole" not in caplog.text  # nothing compiled here
    with torch.inference_mode():
        served(input_ids=ids(1, 1))  # a size of 1 fails the decode graph's guards (rows >= 2)
    assert served.forward.traces(["decode", "mixed"])  # its shapes are traced from now on


def test_shapes_that_fail_a_whole_graphs_guards_are_computed_by_a_traced_graph(tmp_path, caplog):
    model = Tiny()
    model.forward = Forward(model, {})
    with torch.inference_mode(), caplog.at_level(logging.WARNING, logger=precompiled.__name__):
        model(input_ids=ids(2, 1))  # a size of 1 is specialised, 2 is not: this graph's rows are >= 2
        torch.testing.assert_close(model(input_ids=ids(1, 1)), model.forward.original(input_ids=ids(1, 1)))
    assert "a decode step's shapes fail its whole graph's guards" in caplog.text
    assert model.forward.traced is not None
    # Not shipped: a worker that loads a graph warms up with one prompt, trusting these sizes.
    with caplog.at_level(logging.INFO, logger=precompiled.__name__):
        assert model.forward.save(tmp_path) == []
    assert "the decode step's whole graph failed its guards at some sizes: not saved" in caplog.text


def test_a_model_dynamo_cannot_take_whole_is_compiled_graph_by_graph_and_says_why(tmp_path, caplog):
    model = Tiny(breaks=True)
    model.forward = Forward(model, {})
    with torch.inference_mode(), caplog.at_level(logging.INFO, logger=precompiled.__name__):
        answer = model(input_ids=ids(3, 1))
        torch.testing.assert_close(answer, model.forward.original(input_ids=ids(3, 1)))
    assert "the decode step cannot be compiled whole (" in caplog.text
    assert set(model.forward.fallbacks) == {"decode"} and model.forward.save(tmp_path) == []


def test_graphs_that_do_not_load_are_named_and_compiled_again(tmp_path):
    (tmp_path / f"decode{precompiled.SUFFIX}").write_bytes(b"not a graph")
    graphs, said = precompiled.load(tmp_path, Tiny())
    assert graphs == {} and said.startswith("0 whole graphs loaded (none); not loaded: decode: ")
    assert precompiled.load(tmp_path / "absent", Tiny()) == ({}, "0 whole graphs loaded (none)")
