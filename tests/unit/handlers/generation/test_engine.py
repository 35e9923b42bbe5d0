"""handlers/generation/engine.py against transformers' own greedy `generate`, on tiny random models
of two families: Llama-style (Qwen2, grouped KV heads, RoPE) and GPT-2 (learned positions)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from handlers.generation.engine import Engine, prompt_chunk
from handlers.generation.lookup import PAUSE_MOST
from handlers.generation.precompiled import Forward
from handlers.generation.runner import MIN_ROWS, PROMPT_STEP
from handlers.generation.sampling import Sampling
from handlers.generation.sequences import Finish, Generation, QueueFull, Usage
from tests.hf_models import gpt2_lm, qwen2_lm

FAMILIES = {"qwen2": qwen2_lm, "gpt2": gpt2_lm}
# Prompts of different lengths, one longer than a padding step (64), one token long.
PROMPTS = ["The committee postponed", "A", "Interest rates rose again this quarter, " * 6, "fox jumps"]


class Recorder:
    def __init__(self):
        self.parts: list[str] = []
        self.logprobs: list = []
        self.reason: Finish | None = None
        self.usage: Usage | None = None

    def text(self, delta: str, logprobs=()) -> None:
        self.parts.append(delta)
        self.logprobs += logprobs

    def finish(self, reason: Finish, usage: Usage) -> None:
        self.reason, self.usage = reason, usage


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def lm(request, tmp_path_factory):
    directory = FAMILIES[request.param](tmp_path_factory.mktemp(request.param))
    model = AutoModelForCausalLM.from_pretrained(directory).eval()
    return model, AutoTokenizer.from_pretrained(directory)


def engine(
    model,
    tokenizer,
    slots: int = 3,
    context: int = 256,
    eos: set[int] | None = None,
    waiting: int = 16,
    chunk: int = 0,
    block_size: int = 16,
    prefix_caching: bool = True,
):
    eos = set() if eos is None else eos
    return Engine(
        model,
        tokenizer.decode,
        eos,
        slots,
        context,
        torch.float32,
        waiting,
        prefill_chunk=chunk,
        block_size=block_size,
        prefix_caching=prefix_caching,
    )


def reference(model, ids: list[int], new: int) -> list[int]:
    out = model.generate(torch.tensor([ids]), max_new_tokens=new, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids) :].tolist()


def run(engine_: Engine, sequences: list, joining: list[tuple[Generation, Recorder]], after_steps: int) -> None:
    """Step the engine; the `joining` requests arrive after `after_steps` steps, mid-generation."""
    for step in range(10_000):
        if step == after_steps:
            sequences += [engine_.submit(g, r) for g, r in joining]
        if not engine_.busy and step > after_steps:
            return
        engine_.step()


@pytest.mark.parametrize("chunk", [0, 16])  # prompts whole, or 16 tokens of them a step (the third: 3 steps)
def test_sequences_joining_mid_generation_each_get_transformers_greedy_answer(lm, chunk):
    model, tokenizer = lm
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    new = 40
    expected = [reference(model, i, new) for i in ids]
    eng = engine(model, tokenizer, slots=3, chunk=chunk)  # four requests, three slots: one waits for a free slot
    first = [(Generation(tuple(i), new), Recorder()) for i in ids[:2]]
    later = [(Generation(tuple(i), new), Recorder()) for i in ids[2:]]
    sequences = [eng.submit(g, r) for g, r in first]
    run(eng, sequences, later, after_steps=5)
    for sequence, want, prompt in zip(sequences, expected, ids, strict=True):
        assert sequence.tokens == want
        assert sequence.sink.reason is Finish.LENGTH and sequence.sink.usage == Usage(len(prompt), new)


def test_an_end_of_sequence_token_ends_the_answer_without_it(lm):
    model, tokenizer = lm
    ids = tokenizer(PROMPTS[0])["input_ids"]
    tokens = reference(model, ids, 8)
    eos = tokens[3]  # the model's fourth greedy token, declared end-of-sequence
    eng = engine(model, tokenizer, eos={eos})
    recorder = Recorder()
    sequence = eng.submit(Generation(tuple(ids), 8), recorder)
    while eng.busy:
        eng.step()
    assert sequence.tokens == tokens[: tokens.index(eos)]
    assert recorder.reason is Finish.STOP


def test_the_context_ends_an_answer_at_its_last_position(lm):
    model, tokenizer = lm
    ids = tokenizer(PROMPTS[0])["input_ids"]
    context = len(ids) + 5
    eng = engine(model, tokenizer, context=context)
    sequence = eng.submit(Generation(tuple(ids), 100), Recorder())
    while eng.busy:
        eng.step()
    assert len(ids) + len(sequence.tokens) == context + 1  # the last one is sent, never fed back
    assert sequence.tokens == reference(model, ids, 6)
    assert sequence.sink.reason is Finish.LENGTH


def test_a_cancelled_sequence_frees_its_slot_for_a_waiting_one(lm):
    model, tokenizer = lm
    ids = tuple(tokenizer(PROMPTS[0])["input_ids"])
    eng = engine(model, tokenizer, slots=1)
    first, second = Recorder(), Recorder()
    running = eng.submit(Generation(ids, 1000), first, key="r1")
    eng.step()
    waiting = eng.submit(Generation(ids, 5), second, key="r2")
    eng.step()
    assert waiting.slot == -1  # no slot while the first generates
    assert eng.cancel("r1") and not eng.cancel("r3")  # by the request's id; one it never had: False
    eng.step()
    assert first.reason is Finish.CANCELLED and len(running.tokens) < 10
    assert waiting.slot == 0 and not eng.cancel("r1")  # ended: nothing left to cancel
    while eng.busy:
        eng.step()
    assert second.reason is Finish.LENGTH and waiting.tokens == reference(eng.model, list(ids), 5)
    assert eng.keyed == {}  # an ended sequence is forgotten


def test_a_sequence_cancelled_while_waiting_ends_without_a_slot(lm):
    model, tokenizer = lm
    ids = tuple(tokenizer(PROMPTS[0])["input_ids"])
    eng = engine(model, tokenizer, slots=1)
    first, second = Recorder(), Recorder()
    eng.submit(Generation(ids, 3), first, key="r1")
    waiting = eng.submit(Generation(ids, 5), second, key="r2")
    eng.step()
    assert eng.cancel("r2")
    while eng.busy:
        eng.step()
    assert second.reason is Finish.CANCELLED and waiting.slot == -1 and not waiting.tokens
    assert first.reason is Finish.LENGTH and eng.keyed == {}


def test_a_full_queue_refuses_with_the_numbers(lm):
    model, tokenizer = lm
    eng = engine(model, tokenizer, slots=1, waiting=2)
    for _ in range(2):
        eng.submit(Generation((1, 2), 4), Recorder())
    with pytest.raises(QueueFull, match="0 sequences are generating and 2 requests wait"):
        eng.submit(Generation((1, 2), 4), Recorder())


def test_a_requests_choices_are_queued_all_or_none_and_cancelled_together(lm):
    model, tokenizer = lm
    ids = tuple(tokenizer(PROMPTS[0])["input_ids"])
    eng = engine(model, tokenizer, slots=2, waiting=3)
    eng.submit(Generation(ids, 4), Recorder())
    with pytest.raises(QueueFull):  # 3 choices do not fit beside the one waiting
        eng.submit_all([(Generation(ids, 4), Recorder()) for _ in range(3)], key="r1")
    assert len(eng.waiting) == 1 and "r1" not in eng.keyed
    recorders = [Recorder(), Recorder()]
    choices = eng.submit_all([(Generation(ids, 1000), r) for r in recorders], key="r2")
    eng.step()
    assert eng.cancel("r2")
    while eng.busy:
        eng.step()
    assert [r.reason for r in recorders] == [Finish.CANCELLED] * 2 and all(len(c.tokens) < 10 for c in choices)
    assert eng.keyed == {}


def test_a_seeded_sample_is_the_same_whatever_runs_beside_it(lm):
    model, tokenizer = lm
    ids = tuple(tokenizer(PROMPTS[0])["input_ids"])
    sampled = Generation(ids, 12, Sampling(temperature=1.0, top_p=0.9, top_k=50, seed=7))
    alone = engine(model, tokenizer)
    solo = alone.submit(sampled, Recorder())
    while alone.busy:
        alone.step()
    crowded = engine(model, tokenizer)
    crowded.submit(
        Generation(tuple(tokenizer(PROMPTS[2])["input_ids"]), 12, Sampling(temperature=1.5, seed=1)), Recorder()
    )
    beside = crowded.submit(sampled, Recorder())
    while crowded.busy:
        crowded.step()
    assert beside.tokens == solo.tokens
    greedy = engine(model, tokenizer)
    plain = greedy.submit(Generation(ids, 12), Recorder())
    while greedy.busy:
        greedy.step()
    assert solo.tokens != plain.tokens  # it did sample (a random model is far from peaked)


def test_ignore_eos_writes_every_token_asked_for(lm):
    model, tokenizer = lm
    ids = tokenizer(PROMPTS[0])["input_ids"]
    tokens = reference(model, ids, 8)
    eng = engine(model, tokenizer, eos={tokens[1]})
    sequence = eng.submit(Generation(tuple(ids), 8, ignore_eos=True), Recorder())
    while eng.busy:
        eng.step()
    assert sequence.tokens == tokens and sequence.sink.reason is Finish.LENGTH


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


def test_a_chunk_is_shared_by_the_prompts_waiting_in_the_order_they_came(lm):
    model, tokenizer = lm
    ids = [tuple(tokenizer(p)["input_ids"]) for p in (PROMPTS[0], PROMPTS[3], PROMPTS[2])]
    assert len(ids[0]) + len(ids[1]) <= 24 and len(ids[2]) > 32
    eng = engine(model, tokenizer, slots=3, chunk=32)
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


def test_only_a_forward_with_a_kind_of_step_not_loaded_whole_compiles_at_its_first_steps(lm, monkeypatch):
    model, tokenizer = lm
    eng = engine(model, tokenizer)
    assert not eng.compiles_at_first_steps  # eager
    kinds = eng.runner.kinds
    assert kinds == ("decode", "mixed")  # both families mix (attention.py)
    monkeypatch.setattr(model, "forward", Forward(model, {}, {"decode": object()}))
    assert eng.compiles_at_first_steps  # a mixed step would be traced at its first call
    monkeypatch.setattr(model, "forward", Forward(model, {}, dict.fromkeys(kinds, object())))
    assert not eng.compiles_at_first_steps
    model.forward.traced = object()  # a step's shapes failed a loaded graph's guards
    assert eng.compiles_at_first_steps


def test_a_model_loaded_with_eager_attention_is_served_with_the_kits_and_answers_as_transformers(lm):
    """transformers' eager attention adds a mask to the scores (it expects 0 / -inf); the engine's
    are boolean, which sdpa reads as attend / not. The engine computes every model's attention
    with its own (attention.py, sdpa's), so the attention a model was loaded with does not matter."""
    reference_model, tokenizer = lm
    model = AutoModelForCausalLM.from_pretrained(tokenizer.name_or_path, attn_implementation="eager").eval()
    eng = engine(model, tokenizer, slots=2)
    assert eng.mixes
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS[:2]]
    first = eng.submit(Generation(tuple(ids[0]), 8), Recorder())
    eng.step()
    second = eng.submit(Generation(tuple(ids[1]), 8), Recorder())
    while eng.busy:
        eng.step()
    assert [first.tokens, second.tokens] == [reference(reference_model, i, 8) for i in ids]


def counted(eng: Engine) -> list[int]:
    """The tokens each forward of `eng` computes (padding included), as it runs."""
    tokens: list[int] = []
    forward = eng.runner._forward

    def counting(ids, *args, **kwargs):
        tokens.append(ids.numel())
        return forward(ids, *args, **kwargs)

    eng.runner._forward = counting
    return tokens


def test_a_shared_prefix_is_computed_once_and_later_answers_are_still_transformers(lm):
    """Prefix caching: a second prompt that begins with the first's 6 full blocks (a system prompt)
    computes only what follows them; the same prompt asked again, all but its last block."""
    model, tokenizer = lm
    system = tokenizer(PROMPTS[2])["input_ids"]
    first, second = system + tokenizer(" Why?")["input_ids"], system + tokenizer(" And then")["input_ids"]
    eng = engine(model, tokenizer, slots=2, block_size=16)
    forwards = counted(eng)
    answers = []
    for ids in (first, second, second):
        sequence = eng.submit(Generation(tuple(ids), 6), Recorder())
        forwards.clear()
        while eng.busy:
            eng.step()
        answers.append((sequence.tokens, forwards[0]))
    assert [tokens for tokens, _ in answers] == [reference(model, i, 6) for i in (first, second, second)]
    shared = len(system) // 16 * 16
    assert answers[0][1] >= len(first)  # computed whole
    # The rest after the shared blocks (padded to 8), with the idle decode rows of a part's step.
    assert answers[1][1] < len(second) - shared + 8 + MIN_ROWS
    assert answers[2][1] <= 16 + MIN_ROWS  # all but its last block found
    assert eng.prefix.stats.hits >= 2 * shared and eng.prefix.stats.queries == len(first) + 2 * len(second)


def test_a_prefix_another_slot_holds_while_generating_is_copied_and_answers_are_transformers(lm):
    """Two requests with one system prompt, the second arriving while the first generates: its
    slot is another, the shared blocks are copied from the first's row, and both answers are the
    ones each would have alone. Blocks of 4 positions: they end inside prompts and answers."""
    model, tokenizer = lm
    system = tokenizer(PROMPTS[2])["input_ids"]
    first, second = system + tokenizer(" Why?")["input_ids"], system + tokenizer(" And then")["input_ids"]
    eng = engine(model, tokenizer, slots=2, block_size=4, chunk=16)
    forwards = counted(eng)
    one = eng.submit(Generation(tuple(first), 30), Recorder())
    while not one.tokens:
        eng.step()
    forwards.clear()
    two = eng.submit(Generation(tuple(second), 30), Recorder())
    eng.step()
    assert two.slot != one.slot and two.computed > len(system) - 4
    assert forwards[0] < 16 + 2  # the rest of the second prompt and the first's decode row: one mixed forward
    while eng.busy:
        eng.step()
    assert [one.tokens, two.tokens] == [reference(model, first, 30), reference(model, second, 30)]


def test_without_prefix_caching_every_prompt_is_computed_whole(lm):
    model, tokenizer = lm
    ids = tokenizer(PROMPTS[2])["input_ids"]
    eng = engine(model, tokenizer, slots=1, prefix_caching=False)
    forwards = counted(eng)
    for _ in range(2):
        forwards.clear()
        sequence = eng.submit(Generation(tuple(ids), 3), Recorder())
        while eng.busy:
            eng.step()
        assert forwards[0] >= len(ids) and sequence.tokens == reference(model, ids, 3)
    assert eng.prefix.stats.hits == 0


def test_a_free_slots_prefix_is_not_overwritten_by_other_slots_steps(lm):
    """A slot with nothing to compute writes at the cache's scratch position: a prompt left in a
    free slot's row is found whole after another sequence generated beside it for many steps."""
    model, tokenizer = lm
    long = tokenizer(PROMPTS[2])["input_ids"]
    eng = engine(model, tokenizer, slots=2)
    beside = eng.submit(Generation(tuple(tokenizer(PROMPTS[0])["input_ids"]), 60), Recorder())
    kept = eng.submit(Generation(tuple(long), 2), Recorder())
    while kept.slot in eng.active:
        eng.step()
    for _ in range(20):
        eng.step()  # the kept row idle in each decode step
    again = eng.submit(Generation(tuple(long), 8), Recorder())
    eng.step()
    assert again.slot == kept.slot == 1 and beside.slot == 0
    assert again.computed >= (len(long) - 1) // 16 * 16  # every full block of its prompt found
    while eng.busy:
        eng.step()
    assert again.tokens == reference(model, long, 8) and beside.tokens == reference(model, beside.generation.prompt, 60)


def test_a_context_as_long_as_the_models_positions_serves_idle_slots_beside_busy_ones(lm):
    """A slot with nothing to compute writes past the context in the cache, but the model is told
    a position it has (GPT-2's learned positions end at its max_position_embeddings)."""
    model, tokenizer = lm
    context = model.config.max_position_embeddings
    eng = engine(model, tokenizer, slots=3, context=context)
    ids = [tokenizer(p)["input_ids"] for p in PROMPTS[:2]]
    eng.submit(Generation(tuple(ids[0]), 1), Recorder())
    sequences = [eng.submit(Generation(tuple(i), 6), Recorder()) for i in ids]
    while eng.busy:
        eng.step()  # slot 0 idle once its one token is out
    assert [s.tokens for s in sequences] == [reference(model, i, 6) for i in ids]


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


def test_a_repetition_penalty_and_a_logit_bias_answer_as_transformers_does(lm):
    """Greedy, each sequence with its own adjustment beside one with none: transformers'
    `repetition_penalty` and `sequence_bias` (OpenAI's logit_bias is a one-token sequence bias)."""
    model, tokenizer = lm
    ids = tokenizer(PROMPTS[2])["input_ids"]  # a repetitive prompt: the penalty changes the answer
    new, banned = 24, reference(model, ids, 1)[0]
    plain = reference(model, ids, new)
    penalised = model.generate(
        torch.tensor([ids]), max_new_tokens=new, do_sample=False, repetition_penalty=1.5, pad_token_id=0
    )[0, len(ids) :].tolist()
    biased = model.generate(
        torch.tensor([ids]), max_new_tokens=new, do_sample=False, sequence_bias={(banned,): -100.0}, pad_token_id=0
    )[0, len(ids) :].tolist()
    assert penalised != plain and biased != plain and banned not in biased
    eng = engine(model, tokenizer, slots=3)
    asked = [Sampling(), Sampling(repetition_penalty=1.5), Sampling(logit_bias=((banned, -100.0),))]
    sequences = [eng.submit(Generation(tuple(ids), new, sampling), Recorder()) for sampling in asked]
    while eng.busy:
        eng.step()
    assert [s.tokens for s in sequences] == [plain, penalised, biased]


def test_logprobs_are_the_models_log_softmax_whatever_the_sampling_did(lm):
    """Each token's entry: transformers' own logits' log-softmax at that step, and the likeliest
    alternatives in order, also where a bias changed the choice."""
    model, tokenizer = lm
    ids = tokenizer(PROMPTS[0])["input_ids"]
    new = 6
    out = model.generate(
        torch.tensor([ids]),
        max_new_tokens=new,
        do_sample=False,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    tokens = out.sequences[0, len(ids) :].tolist()
    scores = [logits[0].float().log_softmax(-1) for logits in out.logits]
    eng = engine(model, tokenizer)
    recorder = Recorder()
    sequence = eng.submit(Generation(tuple(ids), new, logprobs=3), recorder)
    banned = tokens[0]
    biased = eng.submit(Generation(tuple(ids), 1, Sampling(logit_bias=((banned, -100.0),)), logprobs=0), Recorder())
    while eng.busy:
        eng.step()
    assert sequence.tokens == tokens and len(recorder.logprobs) == new
    for entry, token, score in zip(recorder.logprobs, tokens, scores, strict=True):
        assert entry.token == tokenizer.decode([token])
        assert abs(entry.logprob - float(score[token])) < 1e-4
        top = torch.topk(score, 3)
        assert [t for t, _ in entry.top] == [tokenizer.decode([i]) for i in top.indices.tolist()]
        assert max(abs(v - w) for (_, v), w in zip(entry.top, top.values.tolist(), strict=True)) < 1e-4
    (chosen,) = biased.sink.logprobs
    assert biased.tokens != [banned] and abs(chosen.logprob - float(scores[0][biased.tokens[0]])) < 1e-4
    assert chosen.top == ()


def test_constrained_answers_follow_their_schema_and_others_beside_them_are_unchanged(lm):
    """Four sequences on a strict schema of enums and booleans, sampled, beside a greedy one with
    none: each constrained answer parses, validates and ends (stop) well inside max_new_tokens;
    the free one is transformers' answer."""
    import json

    import jsonschema

    from handlers.generation.grammar import Grammars
    from tests.unit.handlers.generation.test_grammar import FORMAT, SCHEMA

    model, tokenizer = lm
    ends = model.generation_config.eos_token_id
    eos = set(ends) if isinstance(ends, list) else {ends}
    constraint = Grammars(tokenizer, model.config.vocab_size, eos).parse(FORMAT)
    ids = tuple(tokenizer(PROMPTS[0])["input_ids"])
    eng = engine(model, tokenizer, slots=5, eos=eos)
    free = eng.submit(Generation(ids, 12, ignore_eos=True), Recorder())
    constrained = [
        eng.submit(Generation(ids, 64, Sampling(temperature=1.0, seed=seed), constraint=constraint), Recorder())
        for seed in range(4)
    ]
    while eng.busy:
        eng.step()
    for sequence in constrained:
        assert sequence.sink.reason is Finish.STOP and len(sequence.tokens) < 64, (
            sequence.tokens,
            "".join(sequence.sink.parts),
            eos,
        )
        jsonschema.validate(json.loads("".join(sequence.sink.parts)), SCHEMA)
    assert free.tokens == reference(model, list(ids), 12)


# A prompt that repeats itself: prompt lookup finds drafts in it (and a random model repeats too).
REPEATING = "the cat sat on the mat and the cat sat on the mat and the cat sat on the"


@pytest.mark.parametrize("chunk", [0, 16])
def test_prompt_lookup_gives_transformers_greedy_answers_and_keeps_drafts(lm, chunk):
    """Drafts from each sequence's own text, checked a sequence a step beside the others' rows (or
    alone where the model does not mix): every answer is transformers' greedy one."""
    model, tokenizer = lm
    prompts = [REPEATING, PROMPTS[0], PROMPTS[2]]
    ids = [tokenizer(p)["input_ids"] for p in prompts]
    new = 24
    expected = [reference(model, i, new) for i in ids]
    eng = Engine(model, tokenizer.decode, set(), 3, 256, torch.float32, prefill_chunk=chunk, lookup=4)
    sequences = [eng.submit(Generation(tuple(i), new), Recorder()) for i in ids]
    while eng.busy:
        eng.step()
    assert [s.tokens for s in sequences] == expected
    assert all(s.sink.reason is Finish.LENGTH and s.sink.usage.completion_tokens == new for s in sequences)
    assert eng.metrics.draft_tokens > 0


def test_kept_drafts_write_several_tokens_a_step(lm):
    """An answer the model writes as its prompt does (a logit bias makes it one token over and
    over): each step keeps the drafted tokens, so the answer takes a few steps, not one a token."""
    model, tokenizer = lm
    ids = tuple(tokenizer(REPEATING)["input_ids"])
    favourite = ids[1]
    eng = Engine(model, tokenizer.decode, set(), 2, 256, torch.float32, lookup=4)
    sequence = eng.submit(Generation(ids, 21, Sampling(logit_bias=((favourite, 100.0),))), Recorder())
    steps = 0
    while eng.busy:
        eng.step()
        steps += 1
    assert sequence.tokens == [favourite] * 21
    # The first drafts come from the prompt (what followed that token there) and are dropped; then
    # the answer's own repeats are kept, up to 5 tokens a step (4 drafted and the next).
    assert eng.metrics.accepted_tokens >= 12 and steps <= 1 + 21 // 2, (eng.metrics.accepted_tokens, steps)
    usage = sequence.sink.usage  # what its answer's usage tells the client
    assert (usage.accepted_drafts, usage.rejected_drafts) == (
        eng.metrics.accepted_tokens,
        eng.metrics.draft_tokens - eng.metrics.accepted_tokens,
    )


def test_refused_drafts_pause_a_sequences_drafts_longer_each_time(lm):
    """Free text repeats nothing: after each wholly refused draft the sequence drafts again only
    2, 4, 8, ... PAUSE_MOST tokens later; a kept draft ends the pause."""
    model, tokenizer = lm
    eng = Engine(model, tokenizer.decode, set(), 2, 256, torch.float32, lookup=4)
    sequence = eng.submit(Generation((1, 2, 3), 200), Recorder())
    pauses = []
    for _ in range(7):
        eng._drafts_kept(sequence, 4, 0)
        pauses.append(sequence.draft_at - len(sequence.tokens))
    assert pauses == [2, 4, 8, 16, 32, 32, 32][: len(pauses)] and PAUSE_MOST == 32
    eng._drafts_kept(sequence, 4, 1)
    assert sequence.refusals == 0 and (sequence.drafted, sequence.kept) == (32, 1)


def test_prompt_lookup_keeps_a_seeded_samples_draws_and_its_logprobs(lm):
    """A sampled sequence draws once per token it keeps, from the logits its kept text gives:
    seeded, its tokens and log-probabilities are plain decoding's."""
    model, tokenizer = lm
    ids = tuple(tokenizer(REPEATING)["input_ids"])
    sampled = Generation(ids, 16, Sampling(temperature=0.5, seed=3), logprobs=2)
    answers = []
    for lookup in (0, 4):
        eng = Engine(model, tokenizer.decode, set(), 2, 256, torch.float32, lookup=lookup)
        recorder = Recorder()
        sequence = eng.submit(sampled, recorder)
        while eng.busy:
            eng.step()
        answers.append((sequence.tokens, [round(e.logprob, 4) for e in recorder.logprobs]))
    assert answers[0] == answers[1]


def test_prompt_lookup_stops_at_an_end_token_inside_a_kept_draft(lm):
    model, tokenizer = lm
    ids = tokenizer(REPEATING)["input_ids"]
    plain = reference(model, ids, 12)
    end = plain[5]  # a token the answer writes: it ends the answer there, drafted or not
    eng = Engine(model, tokenizer.decode, {end}, 2, 256, torch.float32, lookup=4)
    sequence = eng.submit(Generation(tuple(ids), 12), Recorder())
    while eng.busy:
        eng.step()
    assert sequence.tokens == plain[: plain.index(end)] and sequence.sink.reason is Finish.STOP


# -- the KV cache's budget (kv_budget.py) ---------------------------------------------------------
def budgeted(model, tokenizer, positions: int, slots: int = 3, context: int = 256, **options) -> Engine:
    return Engine(model, tokenizer.decode, set(), slots, context, torch.float32, kv_positions=positions, **options)


@pytest.mark.parametrize("options", [{}, {"prefill_chunk": 16}, {"lookup": 4}])
def test_sequences_beyond_the_budget_are_preempted_and_computed_again_to_transformers_answers(lm, options):
    """Three sequences of 100 tokens in a budget of one context (256 positions): they cannot all
    finish in it, so the youngest is put back and computed again from its prompt and tokens;
    every answer is still transformers' greedy one, and its usage the request's."""
    model, tokenizer = lm
    prompts = [REPEATING, PROMPTS[0], PROMPTS[2]]
    ids = [tokenizer(p)["input_ids"] for p in prompts]
    new = 100
    expected = [reference(model, i, new) for i in ids]
    eng = budgeted(model, tokenizer, 256, **options)
    sequences = [eng.submit(Generation(tuple(i), new), Recorder()) for i in ids]
    eng.step()
    assert all(s.slot >= 0 for s in sequences)  # short prompts: all three admitted at once
    peak = 0
    while eng.busy:
        eng.step()
        peak = max(peak, eng.budget.used)
        assert eng.budget.used <= 256
    assert [s.tokens for s in sequences] == expected
    assert [(s.sink.usage.prompt_tokens, s.sink.usage.completion_tokens) for s in sequences] == [
        (len(i), new) for i in ids
    ]
    assert eng.metrics.preemptions >= 1 and sum(s.preemptions for s in sequences) == eng.metrics.preemptions
    assert sum(eng.metrics.queue.counts) == 3  # each request admitted once, whatever it was computed again for
    assert peak > 200


def test_a_sequence_waits_for_room_in_the_budget_and_not_for_a_slot(lm):
    """A prompt longer than what the budget has left beside a sequence in flight waits (a slot is
    free), and is admitted when the first ends; one that fits beside it is admitted at once."""
    model, tokenizer = lm
    long = tokenizer(PROMPTS[2] * 3)["input_ids"]
    short = tokenizer(PROMPTS[0])["input_ids"]
    assert 256 < len(long) < 480
    eng = budgeted(model, tokenizer, 512, slots=3, context=512)  # not two of them
    first = eng.submit(Generation(tuple(long), 20), Recorder())
    eng.step()
    second = eng.submit(Generation(tuple(long), 4), Recorder())
    eng.step()
    assert first.slot >= 0 and second.slot == -1 and len(eng.waiting) == 1
    while first.sink.reason is None:
        eng.step()
    third = eng.submit(Generation(tuple(short), 4), Recorder())
    eng.step()
    assert second.slot >= 0 and third.slot >= 0
    while eng.busy:
        eng.step()
    assert second.tokens == reference(model, long, 4) and eng.metrics.preemptions == 0


def test_a_finished_rows_prefix_stays_until_its_room_is_needed_then_it_is_given_back(lm):
    """Two finished rows hold their prompts while the budget has room (the first is found again
    whole); a prompt that needs their room takes the lowest row, and the other finished row is
    given back: its prefix forgotten, its positions zero, the budget's total within its limit."""
    model, tokenizer = lm
    system = tokenizer(PROMPTS[2])["input_ids"]
    other = tokenizer(PROMPTS[0] * 8)["input_ids"]
    context = 2 * len(system)
    eng = budgeted(model, tokenizer, context + 16, slots=3, context=context)
    pair = [eng.submit(Generation(tuple(ids), 1), Recorder()) for ids in (system, other)]
    while eng.busy:
        eng.step()
    assert [s.slot for s in pair] == [0, 1] and eng.budget.held[1] > 0 and eng.prefix.keys[1]
    again = eng.submit(Generation(tuple(system), 2), Recorder())
    eng.step()
    assert again.slot == 0 and again.computed >= len(system) // 16 * 16  # found: nothing was given back
    while eng.busy:
        eng.step()
    big = tuple(tokenizer(PROMPTS[3] * 60)["input_ids"][: context - 8])
    eng.submit(Generation(big, 2), Recorder())
    while eng.busy:
        eng.step()
        assert eng.budget.used <= context + 16
    assert eng.budget.held[1] == 0 and not eng.prefix.keys[1]  # its pages: test_cache.py


def test_a_prompts_padding_is_counted_with_the_positions_it_writes(lm):
    """A prompt's last part is padded to a multiple of PROMPT_STEP, and the padding is written in
    the cache as the prompt is: the budget counts those positions too (they are resident)."""
    model, tokenizer = lm
    ids = tokenizer(PROMPTS[2])["input_ids"]
    ids = ids[: len(ids) // PROMPT_STEP * PROMPT_STEP - 3]  # 5 positions of padding
    eng = budgeted(model, tokenizer, 256)
    sequence = eng.submit(Generation(tuple(ids), 3), Recorder())
    eng.step()  # the prompt, whole, and its first token chosen
    padded = len(ids) + 3
    written = eng.cache.keys[0, sequence.slot, 0].abs().sum(-1) > 0
    assert written[:padded].all() and not written[padded : eng.cache.scratch].any()  # idle rows write at scratch
    assert eng.budget.held[sequence.slot] == padded
    while eng.busy:
        eng.step()
    assert sequence.tokens == reference(model, ids, 3)


def test_a_budget_below_one_context_is_refused_with_the_numbers(lm):
    model, tokenizer = lm
    with pytest.raises(ValueError, match="100 positions holds less than one context \\(256\\)"):
        budgeted(model, tokenizer, 100)


def shared_prefix_after_finished_rows(model, tokenizer, slots: int, filler: bool):
    """An engine whose rows hold, finished: a short prompt (row 0), a prompt of PROMPTS[2] and
    " Why?" (row 1) and, with `filler`, another short one (row 2); its last row runs a long answer.
    Returns it, the runner, the prompt sharing row 1's blocks and the blocks' positions."""
    system = tokenizer(PROMPTS[2])["input_ids"]
    first, second = system + tokenizer(" Why?")["input_ids"], system + tokenizer(" And then")["input_ids"]
    eng = budgeted(model, tokenizer, 256, slots=slots, context=256, block_size=16)
    short = [tokenizer("fox")["input_ids"], first] + ([tokenizer(PROMPTS[3])["input_ids"]] if filler else [])
    finished = [eng.submit(Generation(tuple(ids), 1), Recorder()) for ids in short]
    runner = eng.submit(Generation(tuple(tokenizer(PROMPTS[0])["input_ids"]), 200), Recorder())
    while not all(s.sink.reason for s in finished):
        eng.step()
    assert [s.slot for s in (*finished, runner)] == list(range(slots))
    return eng, runner, second, len(system) // 16 * 16  # the blocks the two prompts share


@pytest.mark.parametrize("filler", [True, False])
def test_a_prefix_in_a_finished_row_is_copied_when_room_is_made_without_giving_that_row_back(lm, filler):
    """A new sequence takes the lowest free row and its prefix is in another finished row: room
    for the copy is made by giving back other finished rows, never the one copied from (the copy
    would read zeros). With no other to give back, the blocks are computed instead. Either way
    the answer is transformers' and the budget is kept."""
    model, tokenizer = lm
    eng, runner, second, found = shared_prefix_after_finished_rows(model, tokenizer, 4 if filler else 3, filler)
    # The runner grows until placing the second in row 0 needs finished rows given back.
    while eng.budget.used + max(0, found - eng.budget.held[0]) <= 256:
        eng.step()
    assert eng.budget.held[runner.slot] + len(second) <= 256  # it is admitted at once
    hits = eng.prefix.stats.hits
    later = eng.submit(Generation(tuple(second), 8), Recorder())
    eng.step()
    assert later.slot == 0
    assert eng.prefix.stats.hits - hits == (found if filler else 0)  # copied, or computed
    assert eng.budget.held[2] == 0 if filler else eng.budget.held[1] == 0  # the filler given back, else the source
    while eng.busy:
        eng.step()
        assert eng.budget.used <= 256
    assert later.tokens == reference(model, second, 8)
