"""bench/generate/openvino_genai.py and its peer app's engine: the KV cache it is given, the rows' commands,
and the stepping loop over a pipeline that stands in for OpenVINO GenAI's (not installed here: the
peer runs in an environment of its own)."""

from __future__ import annotations

import enum
import json
import sys
import types

from bench.generate import openvino_genai
from bench.generate.completions import Completion
from bench.generate.openvino_genai_peer import END, Engine

QWEN05 = {"num_attention_heads": 14, "num_key_value_heads": 2, "hidden_size": 896, "num_hidden_layers": 24}


def test_the_kv_cache_holds_every_sequence_at_the_kits_context_in_its_kv_precision():
    # Qwen2.5-0.5B: 24 layers x (keys, values) x 2 heads x 64 x 4 bytes = 24 KiB a token in f32.
    assert openvino_genai.cache_gb(QWEN05, 8, 2048, "f32") == 1  # 0.4 GB, rounded up to the pipeline's unit
    assert openvino_genai.cache_gb(QWEN05, 64, 4096, "f32") == 7  # 6.4 GB
    assert openvino_genai.cache_gb(QWEN05, 64, 4096, "bf16") == 4  # 3.2 GB: half the bytes
    assert openvino_genai.cache_gb({**QWEN05, "head_dim": 128}, 64, 4096, "f32") == 13


def test_an_int8_row_runs_at_the_plugins_own_precision_the_others_at_theirs(tmp_path, monkeypatch):
    monkeypatch.setattr(openvino_genai, "python", lambda: tmp_path / "python")
    command = openvino_genai.server_command(tmp_path / "ir", 8700, "bfloat16", 8, 1, "bf16")
    assert command[-2:] == ["--precision", "bfloat16"] and command[command.index("--sequences") + 1] == "8"
    assert "--precision" not in openvino_genai.server_command(tmp_path / "ir", 8700, None, 8, 1, "bf16")


def test_the_kv_precision_is_always_set_not_the_plugins_8_bit_default(tmp_path, monkeypatch):
    monkeypatch.setattr(openvino_genai, "python", lambda: tmp_path / "python")
    for precision, kv in ((None, "bf16"), ("float32", "f32")):
        command = openvino_genai.server_command(tmp_path / "ir", 8700, precision, 8, 1, kv)
        assert command[command.index("--kv-precision") + 1] == kv


class Status(enum.Enum):
    RUNNING = 0
    FINISHED = 1


class Handle:
    def __init__(self, tokens: int):
        self.left, self.unread = tokens, []

    def can_read(self) -> bool:
        return bool(self.unread)

    def read(self) -> dict:
        out, self.unread = types.SimpleNamespace(generated_ids=self.unread), []
        return {0: out}

    def get_status(self) -> Status:
        return Status.RUNNING if self.left else Status.FINISHED


class Pipeline:
    """Each step gives every request its next token (its id is the step number)."""

    def __init__(self):
        self.handles: list[Handle] = []
        self.steps = 0

    def add_request(self, request_id, prompt, config) -> Handle:
        self.handles.append(Handle(config.max_new_tokens))
        return self.handles[-1]

    def step(self) -> None:
        self.steps += 1
        for handle in self.handles:
            if handle.left:
                handle.left -= 1
                handle.unread.append(self.steps)


def test_the_engine_steps_while_requests_run_and_gives_each_its_tokens(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino_genai", types.SimpleNamespace(GenerationStatus=Status))
    engine = Engine(Pipeline())
    first = engine.submit("a", types.SimpleNamespace(max_new_tokens=3))
    tokens = []
    while (new := first.get(timeout=5)) is not END:
        tokens += new
    assert len(tokens) == 3 and tokens == sorted(tokens)  # one a step, in order
    second = engine.submit("b", types.SimpleNamespace(max_new_tokens=2))
    assert [second.get(timeout=5), second.get(timeout=5), second.get(timeout=5)][-1] is END
    assert not engine.running  # done requests are forgotten: the loop waits for the next


def test_an_answer_streams_as_openais_clients_parse_it():
    answer = Completion("lm")
    events = list(answer.events(["Hel", "", "lo"], 4, lambda: 2))
    assert events[-1] == "data: [DONE]\n\n"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
    assert [c["choices"][0]["text"] for c in chunks[:-1]] == ["Hel", "lo", ""]  # no empty chunk but the last
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"] == {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6}
    whole = answer.whole("Hello", 4, 2)
    assert whole["choices"][0]["text"] == "Hello" and whole["usage"]["total_tokens"] == 6
