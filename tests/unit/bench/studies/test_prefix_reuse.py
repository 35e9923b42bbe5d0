"""bench/studies/prefix_reuse.py: the system prompt reaches its length in the model's tokens,
returning conversations are asked in turns, and the table gives each round's ratio and their
median, per model file."""

from __future__ import annotations

from bench.studies.prefix_reuse import Round, conversations, shared_prompt, system_prompt, table


class Words:
    """A tokenizer of a token per word."""

    def __call__(self, text: str) -> dict:
        return {"input_ids": text.split()}


def test_the_system_prompt_has_at_least_its_tokens_and_opens_with_its_round():
    prompt = system_prompt(Words(), 300, "Session 7.")
    assert prompt.startswith("Session 7. ")
    assert 300 <= len(prompt.split()) < 300 + 60  # stopped at the first sentence that reached it


def test_the_table_gives_each_rounds_ratio_and_their_median_per_model():
    rounds = [
        Round("lm", 1000, 2000.0, [100.0, 120.0, 500.0]),
        Round("lm", 1000, 2500.0, [250.0, 240.0, 260.0]),
        Round("lm-store", 1000, 2000.0, [1000.0]),
    ]
    text = table(rounds, "# header")
    assert "| lm | 1 | 1000 | 2000 | 120 | 0.06 |" in text and "| lm | 2 | 1000 | 2500 | 250 | 0.10 |" in text
    assert "| lm-store | 1 | 1000 | 2000 | 1000 | 0.50 |" in text
    assert "lm: later ÷ first, the median of the rounds' ratios: 0.08 (0.06–0.10)." in text
    assert text.rstrip().endswith("lm-store: later ÷ first, the median of the rounds' ratios: 0.50 (0.50–0.50).")


class Asked:
    """An ask that records its prompts and answers with their count so far."""

    def __init__(self):
        self.prompts: list[str] = []

    def __call__(self, prompt: str) -> float:
        self.prompts.append(prompt)
        return float(len(self.prompts))


def test_one_shared_prompt_is_asked_first_then_with_later_questions():
    asked = Asked()
    tokens, times = shared_prompt(asked, Words(), 50, 2, "Session 1.")
    assert times == [1.0, 2.0, 3.0] and tokens >= 50
    openings = {prompt.split("\n\n")[0] for prompt in asked.prompts}
    assert len(openings) == 1 and len({prompt.split("\n\n")[1] for prompt in asked.prompts}) == 3


def test_conversations_return_in_turns_each_with_its_own_text():
    asked = Asked()
    tokens, first, later = conversations(asked, Words(), 50, 2, "Session 1.", 3)
    assert tokens >= 50 and first == [1.0, 2.0, 3.0] and later == [4.0, 5.0, 6.0, 7.0, 8.0, 9.0]
    texts = [prompt.split("\n\n")[0] for prompt in asked.prompts]
    assert texts[:3] == texts[3:6] == texts[6:] and len(set(texts)) == 3  # every conversation, then again
    assert all("Conversation" in text for text in texts)
