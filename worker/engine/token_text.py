"""Token ids as the text and bytes a logprobs entry shows (common/logprobs.py).

A token alone may be part of a UTF-8 character (byte-level BPE splits emoji and many scripts):
its `bytes` are then the exact bytes, read through the tokenizer's byte-to-character map, and
its `token` the text decoded with U+FFFD for the incomplete sequence, as OpenAI's `bytes` field
exists to let clients join such tokens back.
"""
from __future__ import annotations

import functools

from worker.engine.detokenizer import Decoder
from worker.engine.sequence import TokenLogprobs

FLOOR = -9999.0  # a logprob of -inf as OpenAI writes it (JSON has no infinity)


@functools.lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet: each of the 256 bytes as one printable character."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = list(printable), 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


class TokenTexts:
    """Per-engine cache of each token id's (text, bytes); special tokens (EOS...) get no entry."""

    def __init__(self, tokenizer: Decoder):
        self.tokenizer = tokenizer
        self.special = frozenset(getattr(tokenizer, "all_special_ids", ()) or ())
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def text(self, token_id: int) -> tuple[str, list[int]]:
        if token_id not in self._cache:
            text = self.tokenizer.decode([token_id])
            raw = self._raw(token_id) if "\ufffd" in text else None
            self._cache[token_id] = (text, list(raw if raw is not None else text.encode()))
        return self._cache[token_id]

    def _raw(self, token_id: int) -> bytes | None:
        """The token's bytes under byte-level BPE (None: not such a token)."""
        convert = getattr(self.tokenizer, "convert_ids_to_tokens", None)
        piece = convert(token_id) if convert else None
        table = _byte_decoder()
        if not isinstance(piece, str) or not all(ch in table for ch in piece):
            return None
        return bytes(table[ch] for ch in piece)

    def entry(self, token_id: int, computed: TokenLogprobs) -> dict | None:
        """The logprobs entry of one generated token (None for a special token)."""
        if token_id in self.special:
            return None
        return {**self._one(token_id, computed.logprob),
                "top_logprobs": [self._one(tid, lp) for tid, lp in computed.top]}

    def _one(self, token_id: int, logprob: float) -> dict:
        text, raw = self.text(token_id)
        return {"token": text, "logprob": max(float(logprob), FLOOR), "bytes": raw}
