"""handlers/generation/engine.py against transformers' own greedy `generate`, on tiny random models
of two families (conftest.py). Chunked prefill, prefix caching, prompt lookup and the KV budget
through the engine: test_engine_chunked_prefill.py, test_prefix.py, test_lookup.py,
test_kv_budget.py."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from handlers.generation.precompiled import Forward
from handlers.generation.sampling import Sampling
from handlers.generation.sequences import Finish, Generation, QueueFull, Usage
from tests.unit.handlers.generation.engines import (
    PROMPTS,
    Recorder,
    engine,
    reference,
    run,
)


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
