"""handlers/generation/agreement.py: a language model at reduced precision judged against its
float original on held-out prompts, teacher-forced on the float model's greedy continuation."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from handlers.accuracy import AccuracyError
from handlers.backends import DType, cpu_refusal
from handlers.calibration import SENTENCES
from handlers.generation import agreement
from handlers.generation import cache as cache_module
from handlers.generation.agreement import Agreement, AgreementLimits, Reference, measure, require
from handlers.generation.packed_linear import can_pack, pack_linears
from handlers.generation.quantized import int8_weights
from handlers.generation.settings import GenerationSettings, KvCache
from handlers.settings import Weights
from tests.hf_models import gpt2_lm, qwen2_lm

MAKERS = {"qwen2": qwen2_lm, "gpt2": gpt2_lm}
TOKENS = 16


@pytest.fixture(scope="module", params=sorted(MAKERS))
def family(request, tmp_path_factory):
    directory = MAKERS[request.param](tmp_path_factory.mktemp(request.param))
    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    prompts = [tokenizer(text)["input_ids"] for text in SENTENCES[:6]]
    return model, Reference.of(model, prompts, TOKENS)


def test_the_float_model_continues_each_prompt_by_as_many_tokens_whatever_it_writes(family):
    _, reference = family
    assert reference.positions == len(reference.prompts) * TOKENS
    for judged in reference.prompts:
        assert judged.ids.shape[1] == judged.start + 1 + TOKENS
        assert torch.allclose(judged.probabilities.sum(-1), torch.ones(TOKENS), atol=1e-4)


def test_the_float_model_agrees_with_itself_entirely(family):
    model, reference = family
    agreed = measure(model, reference)
    assert (agreed.match_rate, agreed.equal, agreed.distance_mean, agreed.distance_max) == (
        1.0,
        reference.positions,
        0,
        0,
    )
    require(agreed, agreement.limits_of(DType.BFLOAT16), "float32")


@pytest.mark.skipif(bool(cpu_refusal(DType.BFLOAT16)) or not can_pack(), reason="this CPU does not compute bf16")
def test_bf16_as_served_passes_the_default_limits_and_differs_somewhere(family):
    model, reference = family
    served = copy.deepcopy(model).to(torch.bfloat16)
    pack_linears(served)
    agreed = measure(served, reference)
    require(agreed, agreement.limits_of(DType.BFLOAT16), "bfloat16")
    assert agreed.distance_max > 0  # it was judged, not the float model again


def test_int8_weights_as_served_pass_their_default_limits_and_differ_somewhere(family):
    model, reference = family
    served = copy.deepcopy(model)
    assert int8_weights(served) > 0
    agreed = measure(served, reference)
    require(agreed, agreement.limits(GenerationSettings(weights=Weights.INT8)), "float32 on int8 weights")
    assert agreed.distance_max > 0


def test_an_int8_kv_cache_is_judged_through_the_cache_and_passes_its_default_limits(family):
    model, reference = family
    served = copy.deepcopy(model)
    agreed = measure(served, reference, KvCache.INT8)
    settings = GenerationSettings(kv_cache=KvCache.INT8)
    require(agreed, agreement.limits(settings), settings.precision)
    assert agreed.distance_max > 0  # the cache's int8 was read: not the float model's numbers


def test_an_int8_kv_cache_that_keeps_too_few_levels_is_refused_by_name(family, monkeypatch):
    """A cache rounding to 1/15 of each vector's largest (a broken one) is too far: refused."""
    model, reference = family

    def coarse(states):
        scale = states.abs().amax(-1, keepdim=True).float() / 7
        return torch.where(scale > 0, states.float() / scale, 0.0).round().to(torch.int8), scale

    monkeypatch.setattr(cache_module, "quantized", coarse)
    settings = GenerationSettings(kv_cache=KvCache.INT8)
    with pytest.raises(AccuracyError, match="float32 with an int8 KV cache answers too far from the float model"):
        require(measure(copy.deepcopy(model), reference, KvCache.INT8), agreement.limits(settings), settings.precision)


def test_the_archives_answers_judge_as_the_float_models_own(family, tmp_path):
    """make archive ships the float model's answers (model_store/lm_reference.py); a worker reads
    them instead of running the float model: the same greedy tokens, the distances within the
    storage's 2.4e-4."""
    model, reference = family
    reference.save(tmp_path)
    prompts = [j.made_for[0] for j in reference.prompts]
    shipped = Reference.shipped(tmp_path, prompts, TOKENS)
    assert shipped is not None
    served = copy.deepcopy(model)
    int8_weights(served)
    ours, theirs = measure(served, reference), measure(served, shipped)
    assert (theirs.prompts, theirs.positions, theirs.equal) == (ours.prompts, ours.positions, ours.equal)
    assert theirs.distance_mean == pytest.approx(ours.distance_mean, abs=2.4e-4)
    assert theirs.distance_max == pytest.approx(ours.distance_max, abs=2.4e-4)


def test_answers_made_for_other_prompts_or_tokens_or_none_are_not_used(family, tmp_path):
    _, reference = family
    prompts = [j.made_for[0] for j in reference.prompts]
    assert Reference.shipped(tmp_path, prompts, TOKENS) is None  # none shipped
    reference.save(tmp_path)
    assert Reference.shipped(tmp_path, prompts[:-1], TOKENS) is None  # the settings' accuracy_prompts changed
    assert Reference.shipped(tmp_path, prompts, TOKENS + 1) is None  # accuracy_tokens changed
    assert Reference.shipped(tmp_path, [prompts[1], prompts[0], *prompts[2:]], TOKENS) is None  # the samples
    assert Reference.shipped(tmp_path, prompts, TOKENS) is not None


def test_a_large_vocabularys_flat_and_peaked_distributions_keep_their_distances_when_stored(tmp_path):
    """Qwen's 151,936 tokens: a random model's near-flat distribution (each probability below
    float16's normal range unless scaled) and a trained model's peaked one are stored within 2.4e-4
    of total variation, and the greedy tokens exactly, whatever the ties float16 would make."""
    torch.manual_seed(0)
    vocabulary = 151_936
    logits = torch.cat([torch.randn(4, vocabulary) * 0.05, torch.randn(4, vocabulary) * 4.0])
    probabilities = logits.softmax(-1)
    ids = torch.arange(12).unsqueeze(0)  # a 4-token prompt continued by 8
    Reference((agreement.Judged(ids, 3, probabilities, probabilities.argmax(-1)),)).save(tmp_path)
    (stored,) = Reference.shipped(tmp_path, [list(range(4))], 8).prompts
    distance = 0.5 * (stored.probabilities - probabilities).abs().sum(-1)
    assert float(distance.max()) <= 2.4e-4
    assert torch.equal(stored.greedy, probabilities.argmax(-1))


@pytest.mark.parametrize("reduced", [DType.BFLOAT16, Weights.INT8])
def test_a_layer_off_by_half_its_spread_is_refused_by_name(family, reduced):
    model, reference = family
    broken = copy.deepcopy(model)
    linears = [
        m for m in broken.modules() if isinstance(m, torch.nn.Linear) and m.weight.shape[0] != model.config.vocab_size
    ]
    if not linears:  # GPT-2's layers are Conv1D: the same product, another class
        linears = [m for name, m in broken.named_modules() if name.endswith("mlp.c_fc")]
    torch.manual_seed(0)
    with torch.no_grad():
        weight = linears[0].weight
        weight.add_(torch.randn_like(weight) * weight.std() * 0.5)
    with pytest.raises(AccuracyError, match="too far from the float model on held-out prompts") as refused:
        require(measure(broken, reference), agreement.limits_of(reduced), reduced.value)
    assert f"{reduced.value} answers" in str(refused.value) and "greedy tokens" in str(refused.value)


def test_each_limit_fails_on_its_own_and_nan_fails():
    limits = AgreementLimits(min_match_rate=0.9, max_distance_mean=0.1)
    assert limits.failures(Agreement(2, 10, 9, 0.1, 0.3)) == []
    assert limits.failures(Agreement(2, 10, 8, 0.05, 0.3)) == ["greedy tokens equal 80.0% < 90.0%"]
    assert limits.failures(Agreement(2, 10, 10, 0.2, 0.3)) == ["next-token distance mean 0.2 > 0.1"]
    assert len(limits.failures(Agreement(2, 10, 10, float("nan"), float("nan")))) == 1


def test_float32_is_not_judged_and_a_model_files_limits_replace_the_dtypes():
    assert agreement.limits(GenerationSettings()) is None
    assert agreement.limits(GenerationSettings(dtype=DType.BFLOAT16)) == agreement.limits_of(DType.BFLOAT16)
    settings = GenerationSettings(dtype=DType.BFLOAT16, accuracy_min_match_rate=0.99, accuracy_tolerance=0.01)
    assert agreement.limits(settings) == AgreementLimits(0.99, 0.01)
    assert agreement.limits(GenerationSettings(weights=Weights.INT8)) == agreement.limits_of(Weights.INT8)
    assert agreement.limits(GenerationSettings(kv_cache=KvCache.INT8)) == agreement.limits_of(KvCache.INT8)


def test_bf16_on_int8_weights_meets_the_looser_of_the_two():
    bf16, int8 = agreement.limits_of(DType.BFLOAT16), agreement.limits_of(Weights.INT8)
    both = agreement.limits(GenerationSettings(dtype=DType.BFLOAT16, weights=Weights.INT8))
    assert both == AgreementLimits(
        min(bf16.min_match_rate, int8.min_match_rate), max(bf16.max_distance_mean, int8.max_distance_mean)
    )


def test_a_checkpoint_saved_in_bf16_is_judged_against_float32(tmp_path):
    """Real checkpoints are saved in bf16, which transformers 5 loads as bf16: the guard's
    reference would then be the bf16 model judging itself. The loader gives float32."""
    from handlers.loaders import load_model

    directory = qwen2_lm(tmp_path / "lm")
    AutoModelForCausalLM.from_pretrained(directory).to(torch.bfloat16).save_pretrained(directory)
    assert AutoModelForCausalLM.from_pretrained(directory).dtype == torch.bfloat16  # the default this guards against
    model = load_model(GenerationSettings(), directory)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
