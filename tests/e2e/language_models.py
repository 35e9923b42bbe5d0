"""Language models the e2e tests make, serve and ask (generation/, test_lm_precision.py,
test_lm_plan.py): tiny random Qwen2 and GPT-2 directories through `make model`, transformers'
greedy answers as the reference, and the requests. Each module makes its models under names of
its own: the modules run in two processes at once (Makefile: test-e2e), and a model's file and
archives are named by the model.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import requests
import torch
import yaml

from handlers.generation.stream import TextStream
from kit.models import model_file
from kit.paths import ROOT
from kit.server import Server
from tests.e2e.test_your_model import remove_model

PROMPTS = [
    "The committee postponed the expansion",
    "A quick brown fox",
    "Interest rates rose again this quarter, " * 12,
]  # the last: prefill past 64 positions
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where is the river bank?"}]


@contextlib.contextmanager
def made_models(
    root: Path, makers: dict[str, Callable[[Path], Path]], settings: dict[str, dict], variants: tuple[str, ...]
) -> Iterator[dict[str, Path]]:
    """`make model` for each model's source with its `settings` (SET=) and its `variants`; the
    models removed after. The sources sit where torch-model-archiver would stage the archive
    ($TMPDIR/<name>), as a user's `make model NAME=lm SRC=/tmp/lm` does: the builds must leave them alone."""
    made = {name: make(root / name) for name, make in makers.items()}
    environment = {**os.environ, "TMPDIR": str(root)}
    try:
        for name, source in made.items():
            assignments = " ".join(f"{key}={value}" for key, value in settings.get(name, {}).items())
            command = ["make", "--no-print-directory", "model", f"NAME={name}", f"SRC={source}"]
            command += [f"VARIANTS={','.join(variants)}", f"SET={assignments}"]
            done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1200, env=environment)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            document = yaml.safe_load(model_file(name).read_text())
            assert document["task"] == "text-generation"  # inferred from architectures
            handler = document.get("handler", {})
            assert handler == {**handler, **settings.get(name, {})}
        for source in made.values():
            assert (source / "config.json").is_file(), f"building the archives deleted {source}"
        yield made
    finally:
        for name in made:
            remove_model(name)


class Reference:
    """transformers' greedy answers (float32), as text the way the kit streams it."""

    def __init__(self, directory: Path):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(directory)
        self.model = AutoModelForCausalLM.from_pretrained(directory).eval()

    def tokens(self, ids: list[int], new: int, **options) -> list[int]:
        """`options`: generate's own (repetition_penalty, sequence_bias)."""
        with torch.inference_mode():
            out = self.model.generate(
                torch.tensor([ids]), max_new_tokens=new, do_sample=False, pad_token_id=0, **options
            )
        answer = out[0, len(ids) :].tolist()
        eos = set(self.model.generation_config.eos_token_id)
        return answer[: next((i for i, t in enumerate(answer) if t in eos), len(answer))]

    def scores(self, ids: list[int], new: int) -> tuple[list[int], list[torch.Tensor]]:
        """The greedy answer's tokens (all `new`) and each step's log-softmax of the logits."""
        with torch.inference_mode():
            out = self.model.generate(
                torch.tensor([ids]),
                max_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
                eos_token_id=None,
                output_logits=True,
                return_dict_in_generate=True,
            )
        return out.sequences[0, len(ids) :].tolist(), [step[0].float().log_softmax(-1) for step in out.logits]

    def text(self, ids: list[int], new: int, **options) -> tuple[str, int]:
        tokens = self.tokens(ids, new, **options)
        stream = TextStream(lambda t: self.tokenizer.decode(t, skip_special_tokens=True))
        return "".join(stream.push(t) for t in tokens) + stream.finish(), len(tokens)

    def prompt(self, text: str) -> tuple[str, int]:
        return self.text(self.tokenizer(text)["input_ids"], 24)

    def chat_ids(self, messages: list[dict] = CHAT, tools: list[dict] | None = None) -> list[int]:
        rendered = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
        return self.tokenizer(rendered, add_special_tokens=False)["input_ids"]

    def chat(self, new: int, **options) -> tuple[str, int]:
        return self.text(self.chat_ids(), new, **options)


def url(server: Server, model: str, path: str = "") -> str:
    return server.api.url("inference", f"/predictions/{model}" + (f"/1.0/{path}" if path else ""))


def generate(server: Server, model: str, body, path: str = "", stream: bool = False) -> requests.Response:
    data = (
        {"json": body} if isinstance(body, dict) else {"data": body.encode(), "headers": {"Content-Type": "text/plain"}}
    )
    return requests.post(url(server, model, path), timeout=120, stream=stream, **data)


def assert_archive_graphs(server: Server, model: str, log: str) -> None:
    """The build compiled the graphs and shipped them (handlers/generation/compiled.py): a worker
    loads every graph whole, traces none, whatever the cache held before and whatever its threads
    (its prompt lookup, number of sequences and threads are not the build's)."""
    assert re.search(rf"{model}: compiled graphs from the archive \(inductor-\w+, ", log), model
    assert re.search(rf"{model} ready: .* graphs=(\d+) \(\1 loaded whole, 0 from the compile cache\)", log), model
