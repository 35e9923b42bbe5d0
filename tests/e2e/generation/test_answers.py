"""Answers equal transformers' greedy ones, token for token: whole and streamed, through the kit's
API and OpenAI's, many at once, with prompt lookup drafting, sampled with a seed, n at a time, and
a request arriving mid-generation answered before the first ends (the package's conftest.py: the
models and servers)."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.e2e.generation.conftest import GPT2, MAKERS, QWEN
from tests.e2e.language_models import CHAT, PROMPTS, generate, url

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("model", sorted(MAKERS))
def test_greedy_answers_equal_transformers_token_for_token_whole_and_streamed(server, references, model):
    reference = references[model]
    for prompt in PROMPTS:
        text, count = reference.prompt(prompt)
        whole = generate(server, model, {"prompt": prompt, "max_new_tokens": 24})
        assert whole.status_code == 200, whole.text
        assert whole.json()["text"] == text and whole.json()["usage"]["completion_tokens"] == count
        assert whole.json()["finish_reason"] == ("length" if count == 24 else "stop")
        streamed = generate(server, model, {"prompt": prompt, "max_new_tokens": 24, "stream": True}, stream=True)
        assert streamed.headers["Content-Type"].startswith("text/plain")
        chunks = [chunk.decode() for chunk in streamed.iter_content(None)]
        assert "".join(chunks) == text and len(chunks) > 1
        completion = generate(server, model, {"prompt": prompt, "max_tokens": 24}, "v1/completions").json()
        assert completion["choices"][0]["text"] == text and completion["usage"]["completion_tokens"] == count
    bare = generate(server, model, PROMPTS[0])  # a text body, the model's default max_new_tokens
    assert bare.status_code == 200 and bare.json()["usage"]["prompt_tokens"] == len(
        reference.tokenizer(PROMPTS[0])["input_ids"]
    )


def test_an_answers_usage_says_what_prompt_lookup_drafted_for_it(server, references):
    """OpenAI's accepted / rejected_prediction_tokens, where the model's engine drafted (Qwen, served
    with prompt lookup on the kit's engine); absent where nothing was drafted."""
    prompt = "one two three four one two three four one two three four one two three"
    for model in sorted(MAKERS):
        answer = generate(server, model, {"prompt": prompt, "max_tokens": 24}, "v1/completions").json()
        assert answer["choices"][0]["text"] == references[model].prompt(prompt)[0]
        details = answer["usage"].get("completion_tokens_details")
        if model == QWEN and server.config.variant.name != "openvino":
            kept, refused = details["accepted_prediction_tokens"], details["rejected_prediction_tokens"]
            assert kept + refused >= 1 and kept <= answer["usage"]["completion_tokens"], details
        else:
            assert details is None, f"{model} drafted nothing, yet its usage says {details}"


def test_requests_generated_together_each_get_their_solo_answer(server, references):
    jobs = [(model, prompt) for model in sorted(MAKERS) for prompt in PROMPTS] * 2
    answers: dict[int, str] = {}

    def ask(index: int, model: str, prompt: str) -> None:
        answers[index] = generate(server, model, {"prompt": prompt, "max_new_tokens": 24}).json()["text"]

    threads = [threading.Thread(target=ask, args=(i, *job)) for i, job in enumerate(jobs)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert [answers.get(i) for i in range(len(jobs))] == [references[m].prompt(p)[0] for m, p in jobs]


def test_a_seeded_request_draws_the_same_tokens_alone_and_beside_others(server):
    """Sampling on every engine (the kit's own; OpenVINO GenAI's pipeline samples itself): the
    same seed, the same answer, whatever else is generating; another seed, another answer."""
    body = {"prompt": PROMPTS[1], "max_new_tokens": 16, "temperature": 1.0, "seed": 7, "ignore_eos": True}
    alone = generate(server, QWEN, body).json()["text"]
    answers: dict[int, str] = {}

    def ask(index: int, request: dict) -> None:
        answers[index] = generate(server, QWEN, request).json()["text"]

    others = [{**body, "prompt": prompt, "seed": 100 + i} for i, prompt in enumerate(PROMPTS)]
    threads = [threading.Thread(target=ask, args=(i, request)) for i, request in enumerate([body, *others])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert answers[0] == alone
    assert generate(server, QWEN, {**body, "seed": 8}).json()["text"] != alone


def test_n_choices_are_each_the_answer_of_one_request_with_its_seed(server, references):
    """The official client asks for n choices: greedy, each is transformers' answer; seeded, choice
    i is what one choice with seed + i draws; streamed, each choice's chunks make the same text."""
    from openai import OpenAI

    client = OpenAI(base_url=url(server, GPT2, "v1"), api_key="unused")
    text, count = references[GPT2].prompt(PROMPTS[0])
    greedy = client.completions.create(model=GPT2, prompt=PROMPTS[0], max_tokens=24, n=2)
    assert [(c.index, c.text) for c in greedy.choices] == [(0, text), (1, text)]
    assert greedy.usage.completion_tokens == 2 * count
    sampled = {
        "model": GPT2,
        "prompt": PROMPTS[1],
        "max_tokens": 12,
        "temperature": 1.0,
        "extra_body": {"ignore_eos": True},
    }
    one = [client.completions.create(**sampled, seed=5 + i).choices[0].text for i in range(3)]
    three = client.completions.create(**sampled, seed=5, n=3)
    assert [c.text for c in sorted(three.choices, key=lambda c: c.index)] == one and len(set(one)) > 1
    streamed = ["", "", ""]
    for chunk in client.completions.create(**sampled, seed=5, n=3, stream=True):
        for choice in chunk.choices:
            streamed[choice.index] += choice.text
    assert streamed == one


def test_a_request_arriving_mid_generation_gets_its_first_token_before_the_first_ends(server):
    # ignore_eos: all 1000 tokens, whatever end-of-sequence token a random model meets.
    long = generate(
        server,
        QWEN,
        {
            "prompt": PROMPTS[0],
            "max_tokens": 1000,
            "stream": True,
            "ignore_eos": True,
            "stream_options": {"include_usage": True},
        },
        "v1/completions",
        stream=True,
    )
    lines = long.iter_lines()
    assert next(line for line in lines if line).startswith(b"data: ")  # the long one is generating
    arrived: dict[str, float] = {}

    def second() -> None:
        short = generate(server, QWEN, {"prompt": PROMPTS[1], "max_new_tokens": 5, "stream": True}, stream=True)
        next(short.iter_content(None))
        arrived["first token"] = time.perf_counter()
        short.close()

    thread = threading.Thread(target=second)
    thread.start()
    events = [json.loads(line.removeprefix(b"data: ")) for line in lines if line and line != b"data: [DONE]"]
    arrived["long done"] = time.perf_counter()
    thread.join(timeout=60)
    assert events[-1]["usage"]["completion_tokens"] >= 500, "the long answer ended early: no overlap to test"
    assert arrived["first token"] < arrived["long done"], arrived


def test_openai_client_chats_streamed_and_whole(server, references):
    from openai import NotFoundError, OpenAI

    assert [(m.id, m.max_model_len) for m in OpenAI(base_url=url(server, QWEN, "v1"), api_key="-").models.list()] == [
        (QWEN, 2048)
    ]  # at the model's own path: itself
    client = OpenAI(base_url=server.api.openai_url("/v1"), api_key="unused")  # the one base URL: every model
    listed = {m.id: m.max_model_len for m in client.models.list()}
    assert set(listed) == set(MAKERS) and listed[QWEN] == 2048
    text, count = references[QWEN].chat(16)
    whole = client.chat.completions.create(model=QWEN, messages=CHAT, max_tokens=16, temperature=0)
    assert whole.choices[0].message.content == text and whole.usage.completion_tokens == count
    stream = client.chat.completions.create(
        model=QWEN, messages=CHAT, max_tokens=16, stream=True, stream_options={"include_usage": True}
    )
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
    assert chunks[-1].usage.completion_tokens == count
    completion = client.completions.create(model=GPT2, prompt=PROMPTS[0], max_tokens=24)
    assert completion.choices[0].text == references[GPT2].prompt(PROMPTS[0])[0]
    with pytest.raises(NotFoundError, match="model 'elsewhere' is not served here; served: "):
        client.chat.completions.create(model="elsewhere", messages=CHAT)
