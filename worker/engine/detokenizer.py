"""Token ids to text deltas, safe for multi-byte characters, with stop strings.

Text is released only when it is final: an incomplete UTF-8 sequence (decoded as U+FFFD) waits for
its next token, and a tail that could still grow into a stop string is held back until it cannot.
"""
from __future__ import annotations

from pathlib import Path
from typing import Protocol


class Decoder(Protocol):
    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


def load_tokenizer(model_dir) -> Decoder:
    """The model folder's Hugging Face tokenizer: the one every engine detokenizes with.

    A folder with a `tokenizer.json` loads it as the `tokenizers`-backed class directly, which is
    what `AutoTokenizer` returns for such a folder too: `AutoTokenizer` itself imports the
    model classes and torch, seconds of a worker's start that an OpenVINO worker otherwise
    never needs."""
    if (Path(model_dir) / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(model_dir))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_dir))


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Decoder, stop: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stop = stop
        self.ids: list[int] = []
        self.text = ""  # all decoded text so far (stop string excluded once found)
        self.emitted = 0  # chars of `text` already handed out
        self._prefix_offset = 0
        self._read_offset = 0
        self.stopped = False

    def add(self, token_id: int) -> str:
        """Feed one token; return the text that became final. Sets `stopped` on a stop string."""
        self.ids.append(token_id)
        prefix = self.tokenizer.decode(self.ids[self._prefix_offset:self._read_offset], skip_special_tokens=True)
        full = self.tokenizer.decode(self.ids[self._prefix_offset:], skip_special_tokens=True)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self.text += full[len(prefix):]
            self._prefix_offset, self._read_offset = self._read_offset, len(self.ids)
        self._apply_stop()
        return self._release(final=self.stopped)

    def resume(self, ids: list[int] | tuple[int, ...], emitted_text: str) -> bool:
        """Take up an answer whose `ids` were generated and whose `emitted_text` was handed out
        already (by another detokenizer, before a crash): the next tokens decode in the context
        of those ids, so a character split across the boundary comes out whole, and text that
        was held back then (a possible stop string, an incomplete character) comes out now.
        False when the ids do not decode to that text."""
        for token in ids:
            self.add(token)
        if self.stopped or not self.text.startswith(emitted_text):
            return False
        self.emitted = len(emitted_text)
        return True

    def flush(self) -> str:
        """At the end of generation: release whatever was held back."""
        return self._release(final=True)

    def _apply_stop(self) -> None:
        if not self.stop:
            return
        window_start = max(0, self.emitted - max(map(len, self.stop)))
        hits = [pos for s in self.stop if (pos := self.text.find(s, window_start)) >= 0]
        if hits:
            self.text = self.text[:min(hits)]
            self.stopped = True

    def _release(self, final: bool) -> str:
        end = len(self.text) if final else len(self.text) - self._held_back()
        delta = self.text[self.emitted:end] if end > self.emitted else ""
        self.emitted = max(self.emitted, end)
        return delta

    def _held_back(self) -> int:
        """Length of the longest tail of the text that is a proper prefix of some stop string."""
        longest = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self.text)), longest, -1):
                if self.text.endswith(s[:n]):
                    longest = n
                    break
        return longest
