"""Your language model, served: `make model` from a causal LM directory the kit does not bundle, a
real TorchServe, answers token for token equal to transformers' greedy `generate`, streamed and
whole, many at once, through the kit's API, OpenAI's (with the official `openai` client) and gRPC.

Two families, tiny and random (tests/hf_models.py): Qwen2 (Llama-style: RoPE, grouped KV heads,
a ChatML chat template), served over TorchServe's continuousBatching, and GPT-2 (learned
positions, no chat template) over asyncCommunication, so every test runs on both protocols
(handlers/replies.py); a client that goes away is tested on continuousBatching, the protocol
that tells the worker. The reference text is
transformers' tokens decoded as the kit streams text (handlers/generation/stream.py, tested on
its own against the tokenizer), so equal texts mean equal tokens. Reduced precisions are judged
in test_lm_precision.py, the memory plan and `make tune` in test_lm_plan.py: modules of their own,
so that the two test processes share the work (Makefile: test-e2e).
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
import sys
import threading
import time

import pytest
import requests
import torch

from client import grpc_client
from kit.paths import ROOT
from kit.ports import PORTS
from kit.proxy import AuthProxy
from kit.serve_config import ServeConfig
from kit.server import Server
from kit.supervise import stop_proxy
from tests.e2e.conftest import one_cpu, start_server
from tests.e2e.language_models import (
    CHAT,
    PROMPTS,
    Reference,
    assert_archive_graphs,
    generate,
    made_models,
    url,
)
from tests.hf_models import gpt2_lm, qwen2_lm
from tests.prometheus import Prometheus, dashboard_queries, finite, recorded_series, rules_file

pytestmark = pytest.mark.e2e

QWEN, GPT2 = "test-yours-qwen2-lm", "test-yours-gpt2-lm"
MAKERS = {QWEN: qwen2_lm, GPT2: gpt2_lm}
VARIANTS = ("eager", "inductor", "openvino")
CHUNK = 32
LOOKUP = 4  # Qwen's prompt lookup: draft tokens a step
DRAFTED = {QWEN: {"prompt_lookup": LOOKUP}}  # served over its archive's settings (a preset's model_settings)


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    # Qwen's prompts are computed CHUNK tokens a step (chunked prefill; the longest prompt here in
    # 7 parts) while the other streams advance, over continuousBatching, and the servers below
    # draft its answers by prompt lookup (DRAFTED: every answer must still be transformers');
    # GPT-2's prompts whole (prefill_chunk 0), over asyncCommunication.
    settings = {
        QWEN: {"prefill_chunk": CHUNK, "batching": "continuous"},
        GPT2: {"prefill_chunk": 0, "batching": "async"},
    }
    with made_models(tmp_path_factory.mktemp("lms"), MAKERS, settings, VARIANTS) as made:
        yield made


@pytest.fixture(scope="module")
def references(sources) -> dict[str, Reference]:
    return {name: Reference(path) for name, path in sources.items()}


@pytest.fixture(scope="module", params=VARIANTS)
def server(request, sources, tmp_path_factory):
    config = ServeConfig.from_preset(
        "optimized", variant=request.param, models=list(MAKERS), cpus=one_cpu(), model_settings=DRAFTED
    )
    server = start_server(tmp_path_factory.mktemp(request.param), config)
    yield server
    server.stop()


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


def scraped(server: Server, model: str) -> dict[str, float]:
    """The model's series on the router's /metrics, summed over its workers, by name and reason
    (a finish reason or an outcome)."""
    text = requests.get(server.api.openai_url("/metrics"), timeout=10).text
    values: dict[str, float] = {}
    for name, labels, value in re.findall(r"^(kit_\w+)\{([^}]*)\} (\S+)$", text, re.MULTILINE):
        if f'model_name="{model}"' in labels and 'le="' not in labels:
            reason = re.search(r'(?:finished_reason|outcome)="(\w+)"', labels)
            key = f"{name}:{reason[1]}" if reason else name
            values[key] = values.get(key, 0.0) + float(value)
    return values


def test_the_metrics_endpoint_counts_what_the_clients_were_told_within_a_second(server):
    """Six streamed completions: a scrape 1.5 s after the last answer (no request since) has moved
    each counter by what the answers' usage said, and the latency histograms by each token."""
    import openai
    from openai import OpenAI

    time.sleep(1.5)  # what the tests before it asked is in the file by now
    before = scraped(server, QWEN)
    client = OpenAI(base_url=server.api.openai_url("/v1"), api_key="unused")
    usages = []
    for index in range(6):
        chunks = client.completions.create(
            model=QWEN,
            prompt=f"{index}. {PROMPTS[index % len(PROMPTS)]}",
            max_tokens=5 + index,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        usages.append([chunk.usage for chunk in chunks if chunk.usage][0])
    with pytest.raises(openai.BadRequestError):  # refused, counted by its reason
        client.completions.create(model=QWEN, prompt="x", max_tokens=-1)
    time.sleep(1.5)
    after = scraped(server, QWEN)
    moved = {name: after[name] - before.get(name, 0.0) for name in after}
    assert moved["kit_lm_prompt_tokens_total"] == sum(u.prompt_tokens for u in usages)
    generated = sum(u.completion_tokens for u in usages)
    assert moved["kit_lm_generation_tokens_total"] == generated
    assert sum(v for k, v in moved.items() if k.startswith("kit_lm_request_success_total:")) == 6
    assert moved["kit_lm_time_to_first_token_seconds_count"] == 6
    assert moved["kit_lm_e2e_request_latency_seconds_count"] == 6
    assert moved["kit_lm_inter_token_latency_seconds_count"] == generated - 6
    assert after["kit_lm_num_requests_running"] == after["kit_lm_num_requests_waiting"] == 0
    assert moved["kit_requests_total:ok"] == 6 and moved["kit_requests_total:bad_input"] == 1
    # make status shows the same files: a line for the model's worker, its requests counted.
    (table,) = [lines for title, lines in server.numbers() if "language models" in title]
    (line,) = [line.split() for line in table[1:] if line.split()[0] == QWEN]
    assert int(line[2]) >= 6


def test_a_real_prometheus_scrapes_every_series_and_the_shipped_rules_and_dashboard_answer(server, tmp_path):
    """Issue 59: Debian's Prometheus scrapes the routers of a classifier server and of a language
    model server; after 20 good and 3 bad requests to bert and six streamed completions, its
    HTTP API answers the counts, deploy/k8s's rules pass promtool and record, and every query of
    deploy/grafana's dashboard returns a number. One backend: the series are the router's."""
    from openai import OpenAI

    if server.config.variant.name != "eager":
        pytest.skip("the series are the router's, the same for every backend: scraped once, on eager")
    rules = rules_file(tmp_path)
    checked = subprocess.run(["promtool", "check", "rules", str(rules)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    # Its own classifier server (eager: ready in seconds), not the optimized one other modules share.
    classifier = start_server(
        tmp_path / "classifier", ServeConfig.from_preset("optimized", variant="eager", models=["bert"], cpus=one_cpu())
    )
    routers = [s.api.openai_url("").removeprefix("http://") for s in (classifier, server)]
    try:
        with Prometheus.scraping(tmp_path, routers, rules) as prometheus:
            for index in range(20):
                answer = requests.post(
                    classifier.api.url("inference", "/predictions/bert"), data=f"text {index}".encode(), timeout=60
                )
                assert answer.status_code == 200, answer.text
            for body in (b"\xff\xfe not text", b"   ", b"\t"):
                answer = requests.post(classifier.api.url("inference", "/predictions/bert"), data=body, timeout=60)
                assert answer.status_code == 400, answer.text
            client = OpenAI(base_url=server.api.openai_url("/v1"), api_key="unused")
            generated = 0
            for index in range(6):
                chunks = client.completions.create(
                    model=QWEN,
                    prompt=PROMPTS[index % len(PROMPTS)],
                    max_tokens=6,
                    temperature=0,
                    stream=True,
                    stream_options={"include_usage": True},
                )
                generated += [chunk.usage for chunk in chunks if chunk.usage][0].completion_tokens
            time.sleep(3)  # the workers' files (within 1 s), then scrapes of 1 s
            assert set(prometheus.targets_up().values()) == {"up"}, prometheus.targets_up()
            # Counters grow from their start in each worker: the LM server's hold the tests before too.
            ok = prometheus.query('sum(kit_requests_total{model_name="bert",outcome="ok"})')
            refused = prometheus.query('sum(kit_requests_total{model_name="bert",outcome="bad_input"})')
            assert float(ok[0]["value"][1]) >= 20 and float(refused[0]["value"][1]) >= 3
            grew = prometheus.query(f'sum(increase(kit_lm_generation_tokens_total{{model_name="{QWEN}"}}[1m]))')
            assert finite(grew) and float(grew[0]["value"][1]) > 0
            answered = prometheus.query(f'sum(kit_lm_generation_tokens_total{{model_name="{QWEN}"}})')
            assert float(answered[0]["value"][1]) >= generated
            empty = {
                name: expr for name, expr in dashboard_queries().items() if not finite(prometheus.wait_for(expr, 10))
            }
            assert not empty, f"dashboard queries without a number: {empty}"
            unrecorded = [name for name in recorded_series() if not prometheus.wait_for(name, 10)]
            assert not unrecorded, unrecorded
    finally:
        classifier.stop()


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


# A value asking for something of each field of the official client's chat schema the kit does not
# serve yet: each is a 400 naming the field (handlers/generation/fields.py), never free text.
NOT_SERVED_YET = {
    "functions": [{"name": "f", "parameters": {"type": "object"}}],
    "function_call": {"name": "f"},
    "audio": {"voice": "alloy", "format": "wav"},
    "modalities": ["text", "audio"],
    "prediction": {"type": "content", "content": "x"},
    "reasoning_effort": "high",
    "verbosity": "low",
    "web_search_options": {},
    "moderation": {"model": "omni-moderation-latest"},
    "store": True,
    "service_tier": "flex",
}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo", "Lima"]}, "celsius": {"type": "boolean"}},
            "required": ["city", "celsius"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time", "description": "The time now"}}
# And of every other field: served (parallel_tool_calls asks for nothing without tools).
SERVED = {
    "tools": [WEATHER],
    "tool_choice": "required",
    "frequency_penalty": 0.5,
    "presence_penalty": 0.5,
    "logit_bias": {"5": -100},
    "max_completion_tokens": 2,
    "n": 2,
    "logprobs": True,
    "top_logprobs": 2,
    "response_format": {"type": "json_object"},
    "metadata": {"run": "e2e"},
    "parallel_tool_calls": False,
    "prompt_cache_key": "e2e",
    "prompt_cache_options": {},
    "prompt_cache_retention": "in_memory",
    "safety_identifier": "e2e",
    "seed": 3,
    "stop": ["\n\n"],
    "stream_options": None,
    "temperature": 0.5,
    "top_p": 0.9,
    "user": "e2e",
}
ALONG = {"top_logprobs": {"logprobs": True}, "tool_choice": {"tools": [WEATHER]}}  # what a field needs beside it
# What the kit's engine serves and OpenVINO GenAI's pipeline does not (openvino_engine.py).
UNSERVED_ON_OPENVINO = {
    "frequency_penalty",
    "presence_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
}


def test_every_field_of_openais_chat_schema_is_served_or_refused_by_name(server, references):
    """The official client sends each field of its chat schema, one at a time, at a value that asks
    for something: what is served answers (a repetition penalty and a logit bias as transformers'
    generate does), the rest is a 400 naming the field; the worker serves on."""
    from openai import BadRequestError, NotFoundError, OpenAI
    from openai.types.chat import completion_create_params

    schema = set(completion_create_params.CompletionCreateParamsBase.__annotations__)
    assert schema - {"model", "messages", "max_tokens"} == set(NOT_SERVED_YET) | set(SERVED)
    client = OpenAI(base_url=server.api.openai_url("/v1"), api_key="unused")  # the one base URL
    openvino = server.config.variant.name == "openvino"
    refused = set(NOT_SERVED_YET) | (UNSERVED_ON_OPENVINO if openvino else set())
    for name, value in {**NOT_SERVED_YET, **SERVED}.items():
        ask = {"model": QWEN, "messages": CHAT, "max_tokens": 2, name: value, **ALONG.get(name, {})}
        if name in refused:
            named = "|".join([name, *ALONG.get(name, {})])  # the first the server met
            with pytest.raises(BadRequestError, match=f"({named}).* is not served"):
                client.chat.completions.create(**ask)
        else:
            assert client.chat.completions.create(**ask).choices[0].finish_reason in ("length", "stop", "tool_calls"), (
                name
            )
    at_its_path = OpenAI(base_url=url(server, QWEN, "v1"), api_key="unused")  # a model's own path checks it too
    with pytest.raises(NotFoundError, match="model 'elsewhere' is not served at this path"):
        at_its_path.chat.completions.create(model="elsewhere", messages=CHAT)
    if openvino:
        return
    reference = references[QWEN]
    plain = reference.chat(16)
    banned = reference.tokens(reference.chat_ids(), 1)[0]  # the greedy answer's first token
    for extra, options in [
        ({"repetition_penalty": 1.5}, {"repetition_penalty": 1.5}),
        ({"logit_bias": {str(banned): -100}}, {"sequence_bias": {(banned,): -100.0}}),
    ]:
        text, count = reference.chat(16, **options)
        assert (text, count) != plain, f"{extra} does not change transformers' answer: nothing to test"
        answer = client.chat.completions.create(
            model=QWEN, messages=CHAT, max_tokens=16, temperature=0, extra_body=extra
        )
        assert (answer.choices[0].message.content, answer.usage.completion_tokens) == (text, count), extra
    # Log-probabilities: transformers' log-softmax of its float32 logits, within 2e-3.
    tokens, scores = reference.scores(reference.chat_ids(), 8)
    answer = client.chat.completions.create(
        model=QWEN,
        messages=CHAT,
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
        extra_body={"ignore_eos": True},  # all 8, as transformers' without an end
    )
    content = answer.choices[0].logprobs.content
    assert len(content) == len(tokens) == answer.usage.completion_tokens
    for entry, token, score in zip(content, tokens, scores, strict=True):
        assert entry.token == reference.tokenizer.decode([token]) and abs(entry.logprob - float(score[token])) < 2e-3
        top = torch.topk(score, 3).values.tolist()
        assert max(abs(t.logprob - v) for t, v in zip(entry.top_logprobs, top, strict=True)) < 2e-3


TRIAGE = {
    "type": "object",
    "properties": {
        "mood": {"enum": ["happy", "sad", "neutral"]},
        "urgent": {"type": "boolean"},
        "escalate": {"type": "boolean"},
    },
    "required": ["mood", "urgent", "escalate"],
    "additionalProperties": False,
}


def test_a_strict_json_schema_is_answered_valid_whole_and_streamed(server):
    """The official client asks a random model for a strict schema of enums and booleans: every
    answer parses and validates and ends by itself (stop), whole and streamed."""
    import jsonschema
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=server.api.openai_url("/v1"), api_key="unused")  # the one base URL
    response_format = {"type": "json_schema", "json_schema": {"name": "triage", "schema": TRIAGE, "strict": True}}
    ask = {"model": QWEN, "messages": CHAT, "max_tokens": 64, "temperature": 1.0, "response_format": response_format}
    for seed in range(4):
        answer = client.chat.completions.create(**ask, seed=seed).choices[0]
        assert answer.finish_reason == "stop", answer.message.content
        jsonschema.validate(json.loads(answer.message.content), TRIAGE)
    streamed = client.chat.completions.create(**ask, seed=9, stream=True)
    chunks = [c for c in streamed if c.choices]
    jsonschema.validate(json.loads("".join(c.choices[0].delta.content or "" for c in chunks)), TRIAGE)
    assert chunks[-1].choices[0].finish_reason == "stop"
    # llguidance names what it cannot compile; the pipeline's grammar (schema_ebnf.py) the keyword.
    unservable = "pattern is not served" if server.config.variant.name == "openvino" else "look-around"
    with pytest.raises(BadRequestError, match=unservable):
        bad = {"type": "string", "pattern": "(?<=a)b"}
        client.chat.completions.create(
            **{**ask, "response_format": {**response_format, "json_schema": {"name": "x", "schema": bad}}}
        )


def test_forced_tool_calls_validate_whole_and_streamed_and_the_tools_answer_is_answered(server, references):
    """The official client offers a random model with a Hermes-style template two functions: a named
    or required tool_choice gets a call whose arguments validate against the function's parameters,
    ending for tool_calls, whole and streamed; the call and the tool's answer sent back are rendered
    by the model's template as transformers renders them (the greedy answer equal to its)."""
    import jsonschema
    from openai import OpenAI

    client = OpenAI(base_url=server.api.openai_url("/v1"), api_key="unused")  # the one base URL
    ask = {"model": QWEN, "messages": CHAT, "max_tokens": 64, "temperature": 1.0, "tools": [WEATHER, CLOCK]}
    named = {"type": "function", "function": {"name": "get_weather"}}
    calls = []
    for seed, choice in enumerate([named, named, "required", "required"]):
        answer = client.chat.completions.create(**ask, tool_choice=choice, seed=seed).choices[0]
        assert answer.finish_reason == "tool_calls" and answer.message.content is None, answer.message
        (call,) = answer.message.tool_calls
        assert call.type == "function" and call.id.startswith("call_")
        if call.function.name == "get_weather":
            jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
        else:
            assert (call.function.name, json.loads(call.function.arguments)) == ("get_time", {})
        assert choice == "required" or call.function.name == "get_weather"
        calls.append(call)
    streamed = [c for c in client.chat.completions.create(**ask, tool_choice=named, seed=7, stream=True) if c.choices]
    deltas = [d for c in streamed for d in c.choices[0].delta.tool_calls or ()]
    assert {d.index for d in deltas} == {0} and deltas[0].function.name == "get_weather"
    jsonschema.validate(
        json.loads("".join(d.function.arguments or "" for d in deltas)), WEATHER["function"]["parameters"]
    )
    assert streamed[-1].choices[0].finish_reason == "tool_calls"
    # The call and the tool's answer go back: greedy, the answer transformers gives the same turns.
    call = calls[0]
    sent = {
        "id": call.id,
        "type": "function",
        "function": {"name": call.function.name, "arguments": call.function.arguments},
    }
    turns = [
        *CHAT,
        {"role": "assistant", "content": None, "tool_calls": [sent]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees"},
    ]
    rendered = [
        *CHAT,
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {**sent, "function": {**sent["function"], "arguments": json.loads(call.function.arguments)}}
            ],
        },
        turns[-1],
    ]
    reference = references[QWEN]
    text, count = reference.text(reference.chat_ids(rendered, [WEATHER, CLOCK]), 16)
    answer = client.chat.completions.create(
        model=QWEN, messages=turns, tools=[WEATHER, CLOCK], max_tokens=16, temperature=0
    )
    assert (answer.choices[0].message.content or "", answer.usage.completion_tokens) == (text, count)


def pinged(url: str) -> bool:
    try:
        return requests.get(url, timeout=5).status_code == 200
    except requests.ConnectionError:
        return False


def test_the_openai_client_streams_a_chat_through_the_containers_auth_proxy(sources, references, tmp_path):
    """The container's authenticating proxy (kit/proxy.py: nginx with a bearer key, as `python -m
    kit run --key-file` starts it) in front of a served language model: the official `openai`
    client with the key streams a chat through it piece by piece (the proxy does not hold them
    back), equal to transformers' answer; without the key it is refused."""
    from openai import AuthenticationError, OpenAI

    key_file = tmp_path / "api-key"
    key_file.write_text(secrets.token_urlsafe(32))
    key_file.chmod(0o600)
    config = ServeConfig.from_preset("optimized", variant="eager", models=[QWEN], cpus=one_cpu())
    server = start_server(tmp_path / "served", config)
    proxy = AuthProxy(key_file, *PORTS.take(2))
    nginx = proxy.start(server.config, tmp_path / "proxy")
    try:
        base = f"http://127.0.0.1:{proxy.inference_port}/v1"  # the one base URL, on the published port
        deadline = time.monotonic() + 30
        while not pinged(f"http://127.0.0.1:{proxy.inference_port}/ping"):
            assert time.monotonic() < deadline and nginx.poll() is None, "the proxy did not answer /ping"
            time.sleep(0.5)
        text, count = references[QWEN].chat(16)
        client = OpenAI(base_url=base, api_key=key_file.read_text())
        stream = client.chat.completions.create(
            model=QWEN, messages=CHAT, max_tokens=16, stream=True, stream_options={"include_usage": True}
        )
        chunks = list(stream)
        assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == text
        assert chunks[-1].usage.completion_tokens == count
        # Piece by piece: the first piece of a long answer arrives long before its last.
        began, arrived = time.perf_counter(), []
        long = client.completions.create(
            model=QWEN, prompt=PROMPTS[0], max_tokens=400, stream=True, extra_body={"ignore_eos": True}
        )
        for chunk in long:
            if chunk.choices and chunk.choices[0].text:
                arrived.append(time.perf_counter() - began)
        assert len(arrived) > 100 and arrived[0] < 0.5 * arrived[-1], (len(arrived), arrived[0], arrived[-1])
        assert [m.id for m in client.models.list()] == [QWEN]
        with pytest.raises(AuthenticationError, match="send the API key as api_key"):
            OpenAI(base_url=base, api_key="not-the-key").chat.completions.create(model=QWEN, messages=CHAT)
    finally:
        stop_proxy(nginx)
        server.stop()


@pytest.mark.parametrize(
    ("model", "path", "body", "code", "message"),
    [
        (QWEN, "", {"prompt": "hi", "temperature": "hot"}, 400, "temperature must be a number"),
        (QWEN, "", {"prompt": "  "}, 400, "prompt is empty"),
        (QWEN, "", {"prompt": "word " * 3000}, 400, "this model's context is 2048 tokens"),
        (QWEN, "v1/completions", {"prompt": "hi", "n": 17}, 400, "n must be from 1 to 16, got 17"),
        (GPT2, "v1/chat/completions", {"messages": CHAT}, 400, "no chat template"),
        (QWEN, "v1/embeddings", {"input": "hi"}, 404, "unknown path 'v1/embeddings'"),
    ],
)
def test_a_bad_request_gets_its_error_and_the_worker_serves_on(server, model, path, body, code, message):
    response = generate(server, model, body, path)
    assert response.status_code == code
    error = response.json()
    assert message in (error["message"] if "message" in error else error["error"]["message"])
    assert generate(server, model, {"prompt": "still there?", "max_new_tokens": 2}).status_code == 200


def test_grpc_answers_whole_as_rest_does(server):
    target = f"127.0.0.1:{server.config.grpc_inference_port}"
    body = {"prompt": PROMPTS[0], "max_new_tokens": 12}
    answer = json.loads(grpc_client.predict(target, GPT2, json.dumps(body).encode()))
    assert answer == generate(server, GPT2, body).json()


@pytest.mark.parametrize("transport", ["rest", "grpc"])
def test_the_client_prints_the_answer_as_it_streams(server, transport):
    """`python -m client [--grpc HOST:PORT] generate MODEL PROMPT`: the text the whole answer has."""
    body = {"prompt": PROMPTS[1], "max_new_tokens": 10}
    whole = generate(server, QWEN, body).json()["text"]
    where = (
        ["--grpc", f"127.0.0.1:{server.config.grpc_inference_port}"]
        if transport == "grpc"
        else ["--url", url(server, QWEN).removesuffix(f"/predictions/{QWEN}")]
    )
    command = [sys.executable, "-m", "client", *where, "generate", QWEN, PROMPTS[1], "--max-new-tokens", "10"]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout == whole + "\n"


def test_a_client_that_goes_away_ends_its_sequence(server):
    """continuousBatching (Qwen's): the frontend leaves a request whose client closed its connection
    out of its next batch, and the worker ends its sequence at the next step (its slot serves the
    next request: tests/unit/handlers/generation/test_engine.py). When the frontend holds no other
    request it sends no batch: the worker learns it with the next request's, and generates nothing
    for the gone ones meanwhile."""
    cancelled = re.compile(rf"{QWEN}: request (\S+) cancelled after (\d+) token\(s\)")
    before = len(cancelled.findall(server.logs.model_log.read_text(errors="replace")))
    openai = {"model": QWEN, "prompt": PROMPTS[1], "max_tokens": 2000, "ignore_eos": True, "stream": True}
    bodies = [
        ({"prompt": PROMPTS[0], "max_new_tokens": 2000, "ignore_eos": True, "stream": True}, url(server, QWEN)),
        ({"prompt": PROMPTS[1], "max_new_tokens": 2000, "ignore_eos": True}, url(server, QWEN)),  # whole
        (openai, url(server, QWEN, "v1/completions")),
        (openai, server.api.openai_url("/v1/completions")),  # through the one base URL: the router lets go too
    ]
    for body, address in bodies:
        response = requests.post(address, json=body, timeout=120, stream=True)
        assert response.status_code == 200  # the answer is open before its first token
        if body.get("stream"):
            next(response.iter_content(None))
        response.close()
    time.sleep(2)  # a step or more: the last of them may hold the engine until a batch comes
    assert generate(server, QWEN, {"prompt": "still there?", "max_new_tokens": 2}).status_code == 200
    found = cancelled.findall(server.logs.model_log.read_text(errors="replace"))[before:]
    assert len(found) == len(bodies), f"cancelled: {found}; the worker did not learn that clients left"
    assert all(int(tokens) < 2000 for _, tokens in found)  # ended where its client left, not at its end


def test_no_request_waited_for_the_compiler(server):
    """Runs after the others on each server: every shape they sent was compiled at warm-up."""
    log = server.logs.model_log.read_text(errors="replace")
    assert f"{QWEN} ready: backend={server.config.variant.name.split('-')[0]}" in log
    assert "recompiled while serving" not in log, "a request waited for the compiler"
    # The kit's engine drafts (the prompts above repeat themselves); OpenVINO's pipeline says it does not.
    lookup = 0 if server.config.variant.name == "openvino" else LOOKUP
    assert re.search(rf"{QWEN} ready: .* prompt_lookup={lookup} ", log), "the READY line does not say the lookup"
    assert re.search(rf"{GPT2} ready: .* prompt_lookup=0 ", log), "model_settings reached a model it does not name"
    if server.config.variant.name == "inductor":
        # Two graphs (a decode step; a prompt's part with decode rows): each more is compiled at
        # every start, a graph of a real-size model's some 40 s on 2 cores.
        for model in MAKERS:
            assert re.search(rf"{model} ready: .* graphs=2 ", log), f"{model} compiled other than 2 graphs"
            assert_archive_graphs(server, model, log)
