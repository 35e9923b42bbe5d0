"""bench/studies/prefix_reuse.py: the system prompt reaches its length in the model's tokens, and
the table gives each round's ratio and their median."""

from __future__ import annotations

from bench.studies.prefix_reuse import Round, system_prompt, table


class Words:
    """A tokenizer of a token per word."""

    def __call__(self, text: str) -> dict:
        return {"input_ids": text.split()}


def test_the_system_prompt_has_at_least_its_tokens_and_opens_with_its_round():
    prompt = system_prompt(Words(), 300, "Session 7.")
    assert prompt.startswith("Session 7. ")
    assert 300 <= len(prompt.split()) < 300 + 60  # stopped at the first sentence that reached it


def test_the_table_gives_each_rounds_ratio_and_their_median():
    rounds = [Round(1000, 2000.0, [100.0, 120.0, 500.0]), Round(1000, 2500.0, [250.0, 240.0, 260.0])]
    text = table(rounds, "# header")
    assert "| 1 | 1000 | 2000 | 120 | 0.06 |" in text and "| 2 | 1000 | 2500 | 250 | 0.10 |" in text
    assert text.rstrip().endswith("the median of the rounds' ratios: 0.08 (0.06–0.10).")
