"""handlers/payload.py: the status phrase TorchServe frames."""

from __future__ import annotations


def test_status_phrase_escapes_and_bounds_text():
    from handlers.payload import PHRASE_LIMIT, status_phrase

    assert status_phrase("got keys ['tëxt']") == "got keys ['t\\xebxt']"
    assert status_phrase("line\nbreak\x00") == "line break "
    assert len(status_phrase("é" * 1000)) == PHRASE_LIMIT
