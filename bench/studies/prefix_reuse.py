"""What prefix caching gives a shared system prompt: the first request's time to first token
against the later ones' (`make bench-prefix MODELS=lm`).

    .venv/bin/python -m bench.studies.prefix_reuse --models lm [--rounds 3] [--later 5] [--tokens 1000]

One server as `make serve` starts it, serving the language model. Each round opens a system
prompt of about `--tokens` tokens (the kit's sentences, counted with the model's own tokenizer)
that no earlier request began with (the round's number opens it), then asks, one at a time, the
first question after it and `--later` others after the same system prompt: every request the
system prompt and a question of its own, streamed through OpenAI's completions API at the
model's own path, greedy, 8 tokens. The first computes the whole system prompt; a later one
finds its full blocks in the prefix cache (handlers/generation/prefix.py) and computes the rest.
Per round: the first's time to first token, the later ones' median, and their ratio. Results:
bench/results/prefix-<time>/results.json, report.md and the table printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

import requests

from bench.generate.streams import stream_one
from bench.results import RESULTS, study_report
from handlers.calibration import SENTENCES
from kit.models import Model, Task
from kit.serve_config import ServeConfig
from kit.server import start_ready

QUESTIONS = (
    "Summarise the text above in one sentence.",
    "Which word of the text above is the longest?",
    "Name three things the text above mentions.",
    "Say what the text above is about.",
    "Write a title for the text above.",
    "Which sentence of the text above is the shortest?",
    "Rewrite the first sentence of the text above.",
    "Count the sentences of the text above.",
)
ANSWER_TOKENS = 8


@dataclasses.dataclass(frozen=True)
class Round:
    prompt_tokens: int  # the system prompt's, counted by the model's tokenizer
    first_ms: float  # the first request's time to first token
    later_ms: list[float]  # each later request's

    @property
    def ratio(self) -> float:
        return statistics.median(self.later_ms) / self.first_ms


def system_prompt(tokenizer, tokens: int, opening: str) -> str:
    """The kit's sentences after `opening`, as many as make `tokens` tokens or more."""
    text, index = opening, 0
    while len(tokenizer(text)["input_ids"]) < tokens:
        text += " " + SENTENCES[index % len(SENTENCES)]
        index += 1
    return text


def ask(session: requests.Session, url: str, model: str, prompt: str) -> float:
    """The time to first token of one streamed, greedy completion, in ms."""
    body = {"model": model, "prompt": prompt, "max_tokens": ANSWER_TOKENS, "temperature": 0, "stream": True}
    record = stream_one(session, url, body)
    if record.error or record.first is None:
        raise RuntimeError(f"{url} answered {record.error or 'no token'}")
    return 1000 * (record.first - record.started)


def table(rounds: list[Round], header: str) -> str:
    lines = [
        header,
        "",
        "| round | system prompt tokens | first TTFT ms | later TTFT ms (median) | later ÷ first |",
        "|---|---|---|---|---|",
    ]
    for number, r in enumerate(rounds, 1):
        later = statistics.median(r.later_ms)
        lines.append(f"| {number} | {r.prompt_tokens} | {r.first_ms:.0f} | {later:.0f} | {r.ratio:.2f} |")
    ratios = [r.ratio for r in rounds]
    lines += [
        "",
        f"Later ÷ first, the median of the rounds' ratios: {statistics.median(ratios):.2f} "
        f"({min(ratios):.2f}–{max(ratios):.2f}).",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", required=True, help="a text-generation model file (make model NAME=... SRC=...)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--later", type=int, default=5, help="requests after the first, each with its own question")
    parser.add_argument("--tokens", type=int, default=1000, help="the system prompt's length in tokens")
    args = parser.parse_args(argv)
    name = args.models.split(",")[0]
    model = Model.load(name)
    if model.task is not Task.TEXT_GENERATION:
        print(f"[prefix] ERROR: {name} is a {model.task.value} model; name a text-generation one", file=sys.stderr)
        return 2
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model.source.path), local_files_only=True)
    out = RESULTS / f"prefix-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    server = start_ready(ServeConfig.from_preset("optimized", models=[name]), out / "server", progress=print)
    url = server.api.url("inference", f"/predictions/{name}/1.0/v1/completions")
    rounds: list[Round] = []
    try:
        with requests.Session() as session:
            ask(session, url, name, "Warm up. " + QUESTIONS[0])
            for number in range(args.rounds):
                prompt = system_prompt(tokenizer, args.tokens, f"Session {number} of {time.time():.0f}.")
                questions = [QUESTIONS[i % len(QUESTIONS)] for i in range(args.later + 1)]
                times = [ask(session, url, name, f"{prompt}\n\n{question}") for question in questions]
                rounds.append(Round(len(tokenizer(prompt)["input_ids"]), times[0], times[1:]))
                print(f"[prefix] round {number + 1}/{args.rounds}: {rounds[-1]}", flush=True)
    finally:
        server.stop()
    study_report(
        out,
        f"A shared system prompt: {name}",
        f"{args.rounds} rounds of a first request and {args.later} later ones, one at a time",
        lambda header: table(rounds, header),
        {"rounds": rounds},
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
