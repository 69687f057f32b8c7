"""Structured output: JSON that always parses (and validates), by constrained decoding with xgrammar.

Each constrained sequence has a `GrammarMatcher`. Before sampling, the matcher fills its row of a
token bitmask and every token that cannot continue valid JSON gets -inf; after sampling, the matcher
accepts the token. Once the JSON is complete only the stop tokens are allowed, so the request ends
with a normal `stop`. Grammars are compiled once per schema (the compiler caches them).

Whitespace between tokens is fixed (`", "` and `": "`, no newlines): a small model left free to
choose whitespace can emit it forever, and then the JSON never ends.
"""
from __future__ import annotations

import json
import re

import torch
import xgrammar as xgr

from worker.engine.sequence import ResponseFormat

ANY_OBJECT = json.dumps({"type": "object"})


def json_grammar(fmt: ResponseFormat) -> xgr.Grammar:
    """The grammar of the JSON a request asks for, the same for every engine (the OpenVINO engine
    hands it over as EBNF text); ValueError if the schema cannot become a grammar."""
    try:
        if fmt.kind == "json_object":
            return xgr.Grammar.from_json_schema(ANY_OBJECT, any_whitespace=False, strict_mode=False)
        if fmt.kind == "json_schema" and fmt.schema:
            return xgr.Grammar.from_json_schema(fmt.schema, any_whitespace=False)
    except Exception as exc:  # xgrammar raises RuntimeError/ValueError subclasses for bad schemas
        raise ValueError(f"response_format: this schema cannot be enforced: {exc}") from exc
    raise ValueError(f"response_format: unknown kind {fmt.kind!r}")


_UNBOUNDED = re.compile(r"\{(\d+), -1\}")


def json_grammar_ebnf(fmt: ResponseFormat) -> str:
    """`json_grammar` as EBNF text, for an engine with an xgrammar of its own (OpenVINO's).

    xgrammar 0.2 prints an unbounded repetition as `x{1, -1}`, which the parser of the xgrammar
    inside openvino-genai 2026.4 refuses; `x{1,}` means the same to both. Only the grammar's
    operators are rewritten: string literals and character classes are copied as they are."""
    text = str(json_grammar(fmt))
    out, i = [], 0
    while i < len(text):
        if text[i] in "\"[":  # a literal or a class: copy it whole, escapes included
            close = '"' if text[i] == '"' else "]"
            j = i + 1
            while text[j] != close:
                j += 2 if text[j] == "\\" else 1
            out.append(text[i:j + 1])
            i = j + 1
            continue
        match = _UNBOUNDED.match(text, i)
        if match:
            out.append(f"{{{match.group(1)},}}")
            i = match.end()
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


class StructuredOutput:
    """Grammar compiler and bitmask for one model's vocabulary (one per engine)."""

    def __init__(self, tokenizer_info: xgr.TokenizerInfo, max_threads: int = 2):
        self.vocab_size = tokenizer_info.vocab_size
        self.compiler = xgr.GrammarCompiler(tokenizer_info, max_threads=max_threads, cache_enabled=True)

    @classmethod
    def from_tokenizer(cls, tokenizer, vocab_size: int, stop_token_ids: set[int]) -> "StructuredOutput":
        """`vocab_size` is the model's (its logits' width), which may exceed the tokenizer's."""
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size,
                                                  stop_token_ids=sorted(stop_token_ids))
        return cls(info)

    def matcher(self, fmt: ResponseFormat) -> xgr.GrammarMatcher:
        """A fresh matcher for one sequence; ValueError if the schema cannot become a grammar."""
        return xgr.GrammarMatcher(self.compile(fmt))

    def compile(self, fmt: ResponseFormat) -> xgr.CompiledGrammar:
        return self.compiler.compile_grammar(json_grammar(fmt))

    def mask(self, logits: torch.Tensor, matchers: list[xgr.GrammarMatcher | None]) -> None:
        """Set to -inf, in place, every token the row's matcher forbids (rows without one: as is)."""
        rows = [row for row, m in enumerate(matchers) if m is not None]
        if not rows:
            return
        bitmask = xgr.allocate_token_bitmask(len(matchers), self.vocab_size)
        for row in rows:
            matchers[row].fill_next_token_bitmask(bitmask, row)
        xgr.apply_token_bitmask_inplace(logits, bitmask, vocab_size=self.vocab_size, indices=rows)
