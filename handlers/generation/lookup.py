"""Prompt lookup: a sequence's next tokens guessed from its own text, for one forward to check.

    draft = guess(known_tokens, size=4)     # () when its last tokens occur nowhere earlier

On a CPU a decode step costs mostly the read of the weights: checking several tokens in one
forward costs little more than computing one. Summaries, edits, extraction and code repeat their
prompt; the tokens that followed the latest earlier occurrence of the text's last n tokens (n
from LONGEST down to SHORTEST) are a draft that is often right, with no second model (vLLM's
`ngram` proposer, transformers' `prompt_lookup_num_tokens`). engine.py feeds the draft after the
sequence's last token and keeps each drafted token only while it is the token the sequence
chooses anyway (greedy, or drawn from the same distribution with the same generator), so the
answer is the one plain decoding gives. A sequence whose drafts are refused drafts less often
(engine.py), and its answer's usage counts the drafted tokens kept and refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

LONGEST, SHORTEST = 3, 1  # n-gram lengths looked up, longest first
WINDOW = 4096  # tokens searched back from the end: a step's lookup stays well under a millisecond
# After a wholly refused draft a sequence pauses its drafts 2, 4, ... tokens, at most this many: on
# text that repeats nothing a draft is tried about every PAUSE_MOST tokens (a few % more compute).
PAUSE_MOST = 32
SAY_EVERY_S = 60  # the worker logs the acceptance at most this often, while it changes


@dataclasses.dataclass
class AcceptanceLog:
    """When the worker last said what prompt lookup kept (the counts are the engine's metrics)."""

    said_at: float = 0.0  # time.monotonic()
    said: int = 0  # tokens drafted then

    def line(self, now: float, drafted: int, kept: int) -> str | None:
        """What to log now: None unless more was drafted and SAY_EVERY_S passed since the last line."""
        if drafted == self.said or now - self.said_at < SAY_EVERY_S:
            return None
        self.said_at, self.said = now, drafted
        return f"prompt lookup kept {kept} of {drafted} drafted tokens ({kept / drafted:.0%})"


def guess(tokens: Sequence[int], size: int, longest: int = LONGEST, shortest: int = SHORTEST) -> tuple[int, ...]:
    """Up to `size` tokens that followed an earlier occurrence of `tokens`' last n: the latest
    with `size` tokens after it, else the one with the most (an occurrence just before the end,
    as in a run of one token, has few)."""
    if size <= 0:
        return ()
    recent = list(tokens[-WINDOW:])
    for n in range(min(longest, len(recent) - 1), shortest - 1, -1):
        tail, best = recent[-n:], ()
        for start in range(len(recent) - n - 1, -1, -1):  # the latest occurrence first
            if recent[start : start + n] == tail:
                follow = tuple(recent[start + n : start + n + size])
                if len(follow) == size:
                    return follow
                best = max(best, follow, key=len)
        if best:
            return best
    return ()
