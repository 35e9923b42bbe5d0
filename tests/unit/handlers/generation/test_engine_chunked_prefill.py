"""handlers/generation/engine.py's chunked prefill: a prompt computed a chunk a step beside the
sequences in flight, chunks shared by waiting prompts, answers equal to transformers' greedy ones
(tiny random models of two families: conftest.py). The rest of the engine: test_engine.py."""

from __future__ import annotations

import pytest

from handlers.generation.engine import prompt_chunk
from handlers.generation.runner import MIN_ROWS
from handlers.generation.sequences import Generation
from tests.unit.handlers.generation.engines import PROMPTS, Recorder, counted, engine, reference


def test_a_long_prompt_is_computed_a_chunk_a_step_while_the_streams_in_flight_advance(lm):
    """Chunked prefill: a prompt of 108 tokens joining with 48 a step takes three steps (48, 48,
    12), and the sequence already generating gets a token at every one of them; both answers are
    transformers' greedy ones."""
    model, tokenizer = lm
    short, long = (tokenizer(p)["input_ids"] for p in (PROMPTS[0], PROMPTS[2]))
    assert 96 < len(long) < 144
    eng = engine(model, tokenizer, slots=2, chunk=48)
    computed: list[list[int]] = []
    forwards: list[int] = []
    parts, forward = eng._prompt_parts, eng.runner._forward

    def recording_parts():
        planned = parts()
        computed.append([len(part.tokens) for _, part in planned])
        return planned

    def counting_forward(*args, **kwargs):
        forwards[-1] += 1
        return forward(*args, **kwargs)

    eng._prompt_parts, eng.runner._forward = recording_parts, counting_forward
    first = eng.submit(Generation(tuple(short), 12), Recorder())
    forwards.append(0)
    eng.step()
    before = len(first.tokens)
    second = eng.submit(Generation(tuple(long), 6), Recorder())
    progress = []
    while not second.tokens:
        forwards.append(0)
        eng.step()
        progress.append(len(first.tokens))
    assert computed[1:] == [[48], [48], [len(long) - 96]]
    # Each of them one forward: the running sequence's decode row and the part together (a mixed step).
    assert forwards[1:] == [1, 1, 1]
    assert progress == [before + 1, before + 2, before + 3]  # a token at each of the long prompt's steps
    while eng.busy:
        eng.step()
    assert first.tokens == reference(model, short, 12) and second.tokens == reference(model, long, 6)


def test_waiting_prompts_take_a_step_each_in_the_order_they_came_beside_the_decode_rows(lm):
    """Where the model mixes, a step computes one prompt part, in one forward with the rows of the
    sequences decoding: a second part would be a forward of its own (every weight read again)."""
    model, tokenizer = lm
    ids = [tuple(tokenizer(p)["input_ids"]) for p in (PROMPTS[0], PROMPTS[3], PROMPTS[2])]
    assert len(ids[0]) + len(ids[1]) <= 24 and len(ids[2]) > 32
    eng = engine(model, tokenizer, slots=3, chunk=32)
    assert eng.mixes
    tokens = counted(eng)
    sequences = [eng.submit(Generation(i, 4), Recorder()) for i in ids]
    computed = []
    for _ in range(3):
        eng.step()
        computed.append([s.computed for s in sequences])
    first, second = len(ids[0]), len(ids[1])
    # The first whole, alone; the second whole beside the first's decode row; then the third's
    # first chunk beside both rows. One forward a step: a row per slot up to the last one taken
    # (the first step's idle, MIN_ROWS of them), then the part, a last part padded to 8 tokens.
    assert computed == [[first, 0, 0], [first + 1, second, 0], [first + 2, second + 1, 32]]
    assert tokens == [MIN_ROWS + 16, 3 + 8, 3 + 32] and first <= 16 and second <= 8
    while eng.busy:
        eng.step()
    assert [s.tokens for s in sequences] == [reference(model, list(i), 4) for i in ids]


def test_where_the_model_does_not_mix_a_chunk_is_shared_by_the_prompts_waiting(lm):
    """Each part is then a forward of its own anyway: the chunk goes to the prompts waiting, in the
    order they came."""
    model, tokenizer = lm
    ids = [tuple(tokenizer(p)["input_ids"]) for p in (PROMPTS[0], PROMPTS[3], PROMPTS[2])]
    eng = engine(model, tokenizer, slots=3, chunk=32)
    eng.runner.mixes = False
    sequences = [eng.submit(Generation(i, 4), Recorder()) for i in ids]
    eng.step()
    # The first two whole; of the third, what is left in multiples of 8 (only a prompt's end is padded).
    left = 32 - len(ids[0]) - len(ids[1])
    assert [s.computed for s in sequences] == [len(ids[0]), len(ids[1]), left // 8 * 8]
    while eng.busy:
        eng.step()
    assert [s.tokens for s in sequences] == [reference(model, list(i), 4) for i in ids]


@pytest.mark.parametrize(("asked", "served"), [(0, 0), (3, 8), (20, 16), (256, 256)])
def test_a_chunk_is_whole_padding_steps_so_only_a_prompts_end_is_padded(asked, served):
    assert prompt_chunk(asked) == served


def test_a_prompt_alone_is_computed_whole_and_in_chunks_while_another_decodes(lm):
    """The chunk bounds what the streams in flight wait for: with none, a prompt goes whole."""
    model, tokenizer = lm
    ids = tokenizer(PROMPTS[2])["input_ids"]
    eng = engine(model, tokenizer, slots=2, chunk=16, prefix_caching=False)
    forwards = counted(eng)
    first = eng.submit(Generation(tuple(ids), 8), Recorder())
    eng.step()
    assert len(forwards) == 1 and forwards[0] >= len(ids) and first.tokens  # one forward, whole
    forwards.clear()
    second = eng.submit(Generation(tuple(ids), 8), Recorder())
    eng.step()
    assert len(forwards) == 1 and forwards[0] <= 16 + MIN_ROWS  # a chunk beside the first's decode row
    while eng.busy:
        eng.step()
    assert first.tokens == second.tokens == reference(model, ids, 8)
