"""Test doubles for the engine: a scripted model runner and a character tokenizer (no torch model)."""
from __future__ import annotations

import torch

VOCAB = 128
EOS = 0


class CharTokenizer:
    """Token id n <-> chr(n); id 0 is EOS and decodes to nothing."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids if i != EOS)

    def encode(self, text):
        return [ord(c) for c in text]


class ScriptedRunner:
    """Each request's greedy output is its `script` (by request id); records every call."""

    eos_token_ids = {EOS}

    def __init__(self, scripts: dict[str, str | list[int]]):
        self.scripts = {rid: [ord(c) for c in s] if isinstance(s, str) else s for rid, s in scripts.items()}
        self.rows: list[str] = []
        self.produced: dict[str, int] = {}
        self.calls: list[tuple[str, list[str]]] = []
        self.prompts: dict[str, list[int]] = {}  # the prompt each request was prefilled with

    def _logits(self, ids: list[str]) -> torch.Tensor:
        logits = torch.zeros(len(ids), VOCAB)
        for row, rid in enumerate(ids):
            script = self.scripts[rid]
            n = self.produced.get(rid, 0)
            logits[row, script[n] if n < len(script) else EOS] = 10.0
            self.produced[rid] = n + 1
        return logits

    def prefill(self, request_ids, prompts):
        self.calls.append(("prefill", list(request_ids)))
        self.prompts.update(zip(request_ids, map(list, prompts)))
        self.rows += request_ids
        return self._logits(request_ids)

    def decode(self, last_tokens):
        assert set(last_tokens) == set(self.rows)
        self.calls.append(("decode", list(self.rows)))
        return self._logits(self.rows)

    def release(self, request_ids):
        self.rows = [r for r in self.rows if r not in set(request_ids)]


def run_to_end(engine, max_steps=200, on_step=None):
    """Step an engine until nothing is unfinished: (text per request, final output per request)."""
    texts, finals = {}, {}
    for step in range(max_steps):
        if not engine.has_unfinished():
            break
        if on_step:
            on_step(step)
        for out in engine.step():
            texts[out.request_id] = texts.get(out.request_id, "") + out.text
            if out.finished:
                finals[out.request_id] = out
    return texts, finals
