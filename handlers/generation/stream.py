"""Token ids -> the text they add, as they come; stop strings end the text and are never sent.

    stream = TextStream(tokenizer.decode, stop=("\\n\\n",))
    delta = stream.push(token)     # "" while a character is incomplete or could begin a stop string
    rest = stream.finish()         # what was held back, when the sequence ends another way

A token's text depends on its neighbours (a leading space, a multi-byte character split over
tokens), so each push decodes a short window ending at the new token and sends what grew
(TGI's and vLLM's recipe): one decode of a few tokens per step, not of the whole answer.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

INCOMPLETE = "\ufffd"  # what a decoder shows for bytes that do not yet make a character


class TextStream:
    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = ()):
        self.decode, self.stop = decode, tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.prefix_offset = self.read_offset = 0
        self.text = ""  # decoded so far, cut at a stop string once one appears
        self.sent = 0  # characters of text already handed out
        self.stopped = False  # a stop string appeared: the sequence is over

    def push(self, token: int) -> str:
        self.ids.append(token)
        before = self.decode(self.ids[self.prefix_offset : self.read_offset])
        after = self.decode(self.ids[self.prefix_offset :])
        if len(after) > len(before) and not after.endswith(INCOMPLETE):
            self.text += after[len(before) :]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return self._release()

    def finish(self) -> str:
        """The text not yet handed out (held back for a stop string that did not come)."""
        delta, self.sent = self.text[self.sent :], len(self.text)
        return delta

    def _release(self) -> str:
        if not self.stop:
            return self.finish()
        longest = max(len(s) for s in self.stop)
        start = max(0, self.sent - longest + 1)
        found = [index for s in self.stop if (index := self.text.find(s, start)) >= 0]
        if found:
            self.text, self.stopped = self.text[: min(found)], True
            return self.finish()
        held = max((k for s in self.stop for k in range(1, len(s)) if self.text.endswith(s[:k])), default=0)
        end = max(self.sent, len(self.text) - held)
        delta, self.sent = self.text[self.sent : end], end
        return delta
