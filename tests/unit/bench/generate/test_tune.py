"""bench/generate/tune.py: a language model's candidates, the choice among them and the preset it writes."""

from __future__ import annotations

import pytest
import yaml

from bench import tune
from bench.generate import tune as tune_lm
from bench.generate.streams import Spread, StreamStats
from bench.generate.tune import Candidate, Measured, Tuning, choose, choose_lookup, sequence_choices, write_lm_preset
from kit import serve_config
from kit.layout import Sequences
from kit.serve_config import ServeConfig


def measured(variant: str, sequences: int, tokens_per_s: list[float], itl_ms: float = 50.0, errors: int = 0):
    runs = [
        StreamStats(16, 10.0, 20, round(10 * t), Spread(200.0, 900.0), Spread(itl_ms, 3 * itl_ms), errors)
        for t in tokens_per_s
    ]
    return Measured(Candidate(variant, sequences), "lm", served=sequences, runs=runs)


@pytest.mark.parametrize(
    ("streams", "choices"), [(16, [4, 8, 16]), (12, [4, 8, 12]), (4, [1, 2, 4]), (1, [1]), (64, [16, 32, 64])]
)
def test_sequences_range_from_a_quarter_of_the_streams_to_all_of_them(streams, choices):
    assert sequence_choices(streams) == choices


def test_the_most_tokens_per_second_wins_by_its_median_over_rounds():
    rows = [measured("inductor", 8, [20.0, 21.0, 19.0]), measured("inductor-bf16", 8, [40.0, 10.0, 41.0])]
    winner, why = choose(rows, itl_ms=0)
    assert (winner.candidate, winner.tokens_per_s) == (Candidate("inductor-bf16", 8), 40.0)
    assert why == "the most tokens/s"


def test_a_near_tie_goes_to_fewer_sequences():
    rows = [
        measured("inductor-bf16", 16, [40.0]),
        measured("inductor-bf16", 8, [39.2]),
        measured("inductor", 4, [30.0]),
    ]
    winner, why = choose(rows, itl_ms=0)
    assert winner.served == 8 and "within 3% of the best, with fewer sequences" in why


def test_an_itl_limit_leaves_out_the_slower_steps_or_takes_the_fastest_step():
    rows = [measured("inductor-bf16", 16, [40.0], itl_ms=180.0), measured("inductor-bf16", 8, [32.0], itl_ms=95.0)]
    winner, why = choose(rows, itl_ms=100)
    assert winner.served == 8 and why == "the most tokens/s with ITL p50 <= 100 ms"
    winner, why = choose(rows, itl_ms=50)
    assert winner.served == 8 and why.startswith("no candidate met ITL p50 <= 50 ms: the lowest ITL (95 ms)")


def test_candidates_with_errors_or_that_did_not_start_cannot_win_and_none_left_is_an_error():
    failed = Measured(Candidate("inductor-bf16", 8), "lm", failure="did not start: accuracy guard")
    rows = [measured("inductor", 16, [50.0], errors=2), failed, measured("inductor", 8, [20.0])]
    assert choose(rows, itl_ms=0)[0].served == 8
    with pytest.raises(ValueError, match=r"inductor x16: out \(requests failed\); inductor-bf16 x8: out \(did not"):
        choose(rows[:2], itl_ms=0)


@pytest.mark.parametrize("fields", [{"streams": 0}, {"rounds": 0}, {"seconds": 0}, {"itl_ms": -1}, {"lookup": -1}])
def test_tuning_refuses_what_cannot_be_measured(fields):
    with pytest.raises(ValueError, match="need streams >= 1, rounds >= 1, seconds > 0, itl_ms >= 0 and lookup >= 0"):
        Tuning(**fields)


@pytest.fixture
def presets(tmp_path, monkeypatch):
    """Presets written under tmp_path; "lm" a language model whose archive holds 8 sequences."""
    for preset in serve_config.PRESETS.glob("*.yaml"):
        (tmp_path / preset.name).write_text(preset.read_text())
    for module in (tune, tune_lm, serve_config):
        monkeypatch.setattr(module, "PRESETS", tmp_path)
    monkeypatch.setattr(tune, "CONFIG", tmp_path)
    monkeypatch.setattr(tune, "link_store", lambda archives, store: None)
    lm = Sequences(per_sequence=2**20, most=8)
    monkeypatch.setattr(serve_config, "served_sequences", lambda model, archive: lm if model == "lm" else None)
    return tmp_path


def test_a_language_model_alone_is_served_as_optimized_with_its_variant_and_sequences(presets):
    winner = measured("inductor-bf16", 16, [40.0])
    path = write_lm_preset("tuned", [(winner, "the most tokens/s")], base=None)
    assert path.read_text().startswith(
        "# Written by `make tune` for lm: inductor-bf16 x16 sequences: 40.0 tokens/s, ITL p50 50 ms, TTFT p50 200 ms;"
    )
    config = ServeConfig.from_preset(str(path))
    optimized = ServeConfig.from_preset("optimized")
    assert config.models == ("lm",) and config.variant.name == "inductor-bf16" and config.model_sequences == {"lm": 16}
    assert (config.placement, config.allocator) == (optimized.placement, optimized.allocator)
    assert config.demand("lm").sequences.most == 16  # the plan starts from the tuned number, not the archive's 8


def test_a_language_model_joins_the_preset_tuned_for_the_others_in_the_same_run(presets):
    (presets / "tuned.yaml").write_text("# Written by `make tune` from a measured run: bert ...\n")
    base = {"models": ["bert"], "variant": "inductor-mkl", "placement": "plan", "allocator": "jemalloc"}
    path = write_lm_preset("tuned", [(measured("inductor", 4, [12.0]), "the most tokens/s")], base=base)
    lines = path.read_text().splitlines()
    assert lines[0] == "# Written by `make tune` from a measured run: bert ..." and lines[1].startswith("# Written by")
    config = ServeConfig.from_preset(str(path))
    assert config.models == ("bert", "lm") and config.variant.name == "inductor-mkl"
    assert config.model_variants["lm"].name == "inductor" and "bert" not in config.model_variants
    assert yaml.safe_load(path.read_text())["model_sequences"] == {"lm": 4}


def test_a_candidate_the_memory_plan_refuses_is_skipped_with_its_reason(monkeypatch):
    from types import SimpleNamespace

    from kit.layout import PlanError

    def config_of(model, candidate):
        planned = SimpleNamespace(models={"lm": SimpleNamespace(sequences=candidate.sequences)})
        return SimpleNamespace(layout=lambda topology: planned)

    monkeypatch.setattr(tune_lm, "config_of", config_of)
    model = SimpleNamespace(name="lm")
    assert tune_lm.skip_reason(model, Measured(Candidate("inductor", 16), "lm")) == ""

    def refusing(model, candidate):
        def layout(topology):
            raise PlanError("1.0 GiB of memory holds no worker")

        return SimpleNamespace(layout=layout)

    monkeypatch.setattr(tune_lm, "config_of", refusing)
    refused = tune_lm.skip_reason(model, measured("inductor", 8, [10.0]))
    assert refused == "the memory plan refuses it: 1.0 GiB of memory holds no worker"


def test_prompt_lookup_is_served_only_where_it_wrote_more_tokens_within_the_itl_limit():
    plain = measured("inductor", 8, [20.0, 21.0])
    drafting = Measured(
        Candidate("inductor", 8, lookup=4), "lm", served=8, runs=measured("inductor", 8, [24.0, 25.0]).runs
    )
    winner, why = choose_lookup(plain, drafting, itl_ms=0)
    assert winner is drafting and why == "prompt lookup served: +20% tokens/s"
    assert choose_lookup(plain, drafting, itl_ms=40)[1] == "prompt lookup not served: ITL p50 50 ms > 40 ms"
    level = Measured(drafting.candidate, "lm", served=8, runs=measured("inductor", 8, [20.5]).runs)
    winner, why = choose_lookup(plain, level, itl_ms=0)
    assert winner is plain and why == "prompt lookup not served: +0% tokens/s (it pays above +3%)"
    failed = Measured(drafting.candidate, "lm", failure="did not start")
    assert choose_lookup(plain, failed, itl_ms=0)[0] is plain


def test_a_preset_serves_prompt_lookup_where_it_paid(presets):
    drafting = Measured(Candidate("inductor", 8, lookup=4), "lm", served=8, runs=measured("inductor", 8, [20.0]).runs)
    path = write_lm_preset("tuned", [(drafting, "prompt lookup served: +19% tokens/s")], None)
    assert yaml.safe_load(path.read_text())["model_settings"] == {"lm": {"prompt_lookup": 4}}
    assert "prompt lookup 4" in path.read_text().splitlines()[0]
    assert ServeConfig.from_preset(str(path)).model_settings == {"lm": {"prompt_lookup": 4}}
    plain = write_lm_preset("plain", [(measured("inductor", 8, [20.0]), "the most tokens/s")], None)
    assert "model_settings" not in yaml.safe_load(plain.read_text())


def test_tuning_measures_a_workload_the_bench_has():
    assert Tuning(workload="copy").workload == "copy"
    with pytest.raises(ValueError, match="no workload 'chat'; choose one of text, json_schema, copy"):
        Tuning(workload="chat")
