"""handlers/generation/defaults.py: what a model directory's generation_config.json makes the defaults."""

from __future__ import annotations

import json
import types

import pytest

from handlers.generation.defaults import model_defaults
from handlers.generation.sampling import Sampling


@pytest.mark.parametrize(
    ("generation", "want"),
    [
        ({"eos_token_id": [2, 5]}, ({2, 5}, Sampling())),
        # transformers penalises repetition whether it samples or not
        ({"eos_token_id": 2, "repetition_penalty": 1.1}, ({2}, Sampling(repetition_penalty=1.1))),
        (
            {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05},
            ({7}, Sampling(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)),
        ),
    ],
)
def test_generation_config_gives_the_end_ids_and_sampling_defaults(tmp_path, generation, want):
    (tmp_path / "generation_config.json").write_text(json.dumps(generation))
    assert model_defaults(tmp_path, types.SimpleNamespace(eos_token_id=7)) == want
