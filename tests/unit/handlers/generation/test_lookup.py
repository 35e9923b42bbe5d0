"""handlers/generation/lookup.py: drafts from the latest earlier occurrence of a text's last tokens."""

from __future__ import annotations

import pytest

from handlers.generation.lookup import AcceptanceLog, guess


@pytest.mark.parametrize(
    ("tokens", "size", "want"),
    [
        ([1, 2, 3, 4, 9, 2, 3], 2, (4, 9)),  # "2 3" occurred before: what followed it
        ([1, 2, 3, 7, 2, 3, 8, 2, 3], 3, (8, 2, 3)),  # the latest occurrence with 3 after it
        ([1, 2, 3, 7, 2, 3, 8, 2, 3], 4, (7, 2, 3, 8)),  # the latest with 4 after it
        ([9, 9, 9, 9, 9, 9], 3, (9, 9, 9)),  # a run: not the occurrence just before the end
        ([5, 6, 7, 5, 6, 1, 6], 4, (7, 5, 6, 1)),  # no "1 6" nor "6 1 6" before: "6" alone, 4 after it
        ([1, 2, 3], 4, ()),  # nothing repeats
        ([4, 4], 3, (4,)),  # only what exists follows
        ([1, 2, 1], 0, ()),
    ],
)
def test_a_draft_is_what_followed_the_last_tokens_before(tokens, size, want):
    assert guess(tokens, size) == want


def test_the_acceptance_is_logged_when_it_changed_at_most_once_a_minute():
    said = AcceptanceLog()
    assert said.line(100.0, 8, 6) == "prompt lookup kept 6 of 8 drafted tokens (75%)"
    assert said.line(130.0, 12, 9) is None  # said; not again within the minute
    assert said.line(200.0, 8, 6) is None  # nothing new drafted since
    assert said.line(200.0, 12, 9) == "prompt lookup kept 9 of 12 drafted tokens (75%)"
