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
Per round: the first's time to first token, the later ones' median, and their ratio.

    .venv/bin/python -m bench.studies.prefix_reuse --models lm,lm-store --conversations 3

Returning conversations instead (`--conversations K`): each round opens K texts of `--tokens`,
and asks in turns, one request at a time, each conversation's first question, then each one's
next, `--later` times: a conversation's later turn finds its text only if nothing another took
its row since (prefix.py: a lone request goes to the lowest row), or if the prefix store kept
it (prefix_store.py, `prefix_store_mb`, off by default; `lm-store`: the same directory with
`handler: {prefix_store_mb: 128}`). First: the conversations' first turns; later: the others.
Several model files (the same directory with other settings) are served one after the other, a
row each. Results: bench/results/prefix-<time>/results.json, report.md and the table
printed.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import sys
import time
from collections.abc import Callable

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
    model: str  # the model file served
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
        "| model | round | system prompt tokens | first TTFT ms | later TTFT ms (median) | later ÷ first |",
        "|---|---|---|---|---|---|",
    ]
    models = list(dict.fromkeys(r.model for r in rounds))
    for model in models:
        for number, r in enumerate([r for r in rounds if r.model == model], 1):
            later = statistics.median(r.later_ms)
            lines.append(f"| {model} | {number} | {r.prompt_tokens} | {r.first_ms:.0f} | {later:.0f} | {r.ratio:.2f} |")
    lines.append("")
    for model in models:
        ratios = [r.ratio for r in rounds if r.model == model]
        lines.append(
            f"{model}: later ÷ first, the median of the rounds' ratios: {statistics.median(ratios):.2f} "
            f"({min(ratios):.2f}–{max(ratios):.2f})."
        )
    return "\n".join(lines) + "\n"


def shared_prompt(
    ask_: Callable[[str], float], tokenizer, tokens: int, later: int, opening: str
) -> tuple[int, list[float]]:
    """One system prompt, then its first question and `later` others: the prompt's tokens, each TTFT."""
    prompt = system_prompt(tokenizer, tokens, opening)
    return len(tokenizer(prompt)["input_ids"]), [
        ask_(f"{prompt}\n\n{QUESTIONS[i % len(QUESTIONS)]}") for i in range(later + 1)
    ]


def conversations(
    ask_: Callable[[str], float], tokenizer, tokens: int, later: int, opening: str, count: int
) -> tuple[int, list[float], list[float]]:
    """`count` texts, asked in turns: every first question, then every next one; a text's tokens,
    the first turns' TTFTs, the later ones'."""
    texts = [system_prompt(tokenizer, tokens, f"{opening} Conversation {c}.") for c in range(count)]
    turns = [[ask_(f"{text}\n\n{QUESTIONS[turn % len(QUESTIONS)]}") for text in texts] for turn in range(later + 1)]
    return len(tokenizer(texts[0])["input_ids"]), turns[0], [t for turn in turns[1:] for t in turn]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--models",
        required=True,
        help="text-generation model files, comma-separated, served one after the other (make model NAME=... SRC=...)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--later", type=int, default=5, help="requests after the first, each with its own question")
    parser.add_argument("--tokens", type=int, default=1000, help="the system prompt's length in tokens")
    parser.add_argument(
        "--conversations", type=int, default=0, help="returning conversations asked in turns (0: one shared prompt)"
    )
    args = parser.parse_args(argv)
    names = args.models.split(",")
    models = [Model.load(name) for name in names]
    if wrong := [m.name for m in models if m.task is not Task.TEXT_GENERATION]:
        print(
            f"[prefix] ERROR: {', '.join(wrong)} not text-generation; name text-generation model files", file=sys.stderr
        )
        return 2
    from transformers import AutoTokenizer

    out = RESULTS / f"prefix-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True)
    rounds: list[Round] = []
    for model in models:
        tokenizer = AutoTokenizer.from_pretrained(str(model.source.path), local_files_only=True)
        config = ServeConfig.from_preset("optimized", models=[model.name])
        server = start_ready(config, out / f"server-{model.name}", progress=print)
        url = server.api.url("inference", f"/predictions/{model.name}/1.0/v1/completions")
        try:
            with requests.Session() as session:
                ask_ = functools.partial(ask, session, url, model.name)
                ask_("Warm up. " + QUESTIONS[0])
                for number in range(args.rounds):
                    opening = f"Session {number} of {time.time():.0f}."
                    if args.conversations:
                        tokens, first, later = conversations(
                            ask_, tokenizer, args.tokens, args.later, opening, args.conversations
                        )
                        rounds.append(Round(model.name, tokens, statistics.median(first), later))
                    else:
                        tokens, times = shared_prompt(ask_, tokenizer, args.tokens, args.later, opening)
                        rounds.append(Round(model.name, tokens, times[0], times[1:]))
                    print(f"[prefix] {model.name} round {number + 1}/{args.rounds}: {rounds[-1]}", flush=True)
        finally:
            server.stop()
    if args.conversations:
        title, what = (
            f"Returning conversations: {args.models}",
            f"{args.rounds} rounds of {args.conversations} conversations asked in turns, {args.later + 1} turns each, "
            "one request at a time; first: the median of the first turns",
        )
    else:
        title, what = (
            f"A shared system prompt: {args.models}",
            f"{args.rounds} rounds of a first request and {args.later} later ones, one at a time",
        )
    study_report(out, title, what, lambda header: table(rounds, header), {"rounds": rounds})
    return 0


if __name__ == "__main__":
    sys.exit(main())
