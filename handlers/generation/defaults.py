"""What a model directory says its answers default to: the end-of-sequence ids and the sampling
a request leaves unset, from generation_config.json (transformers' `generate` reads the same),
else config.json.

    eos, sampling = model_defaults(model_dir, AutoConfig.from_pretrained(model_dir))
"""

from __future__ import annotations

import json
from pathlib import Path

from handlers.generation.sampling import Sampling

GENERATION_CONFIG = "generation_config.json"


def model_defaults(model_dir: Path, config) -> tuple[set[int], Sampling]:
    """End-of-sequence ids and sampling defaults: generation_config.json, else config.json."""
    path = model_dir / GENERATION_CONFIG
    generation = json.loads(path.read_text()) if path.is_file() else {}
    eos = generation.get("eos_token_id", getattr(config, "eos_token_id", None))
    eos_ids = {eos} if isinstance(eos, int) else set(eos or ())
    # transformers applies a repetition penalty whether it samples or not.
    repetition = float(generation.get("repetition_penalty", 1.0) or 1.0)
    if not generation.get("do_sample", False):
        return eos_ids, Sampling(repetition_penalty=repetition)
    return eos_ids, Sampling(
        temperature=float(generation.get("temperature", 1.0)),
        top_p=float(generation.get("top_p", 1.0)),
        top_k=int(generation.get("top_k", 0) or 0),
        repetition_penalty=repetition,
    )
