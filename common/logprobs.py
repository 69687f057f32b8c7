"""Token log probabilities: what each engine can compute, and OpenAI's shapes for them.

A worker logs one entry per generated token, `{"token", "logprob", "bytes", "top_logprobs":
[{"token", "logprob", "bytes"}, ...]}` (chat completions' own shape), in its `chunk` events and,
at the end, in the job record's `logprobs`. The logprobs are those of the model's raw
distribution at each step (a log-softmax of its logits, before temperature, penalties, top-k/p
and JSON grammar masks), as vLLM reports them by default: they describe the model, not the
sampler, so the same answer has the same logprobs whatever the temperature.
"""
from __future__ import annotations

from common.errors import ApiError

MAX_TOP_LOGPROBS = 20  # OpenAI's bound for chat's top_logprobs
MAX_N = 8  # choices one request may ask for: each is a job of its own

# engine -> the most alternatives (top_logprobs) it computes per token; absent: no logprobs at all.
# OpenVINO GenAI computes only the chosen token's logprob (GenerationConfig.logprobs: "only a
# single top logprob can be returned").
ENGINE_TOP_LOGPROBS: dict[str, int] = {"hf": MAX_TOP_LOGPROBS, "vllm": MAX_TOP_LOGPROBS, "openvino": 0}

# JSON Schema of the rule "top_logprobs > 0 needs logprobs: true", for /openapi.json
TOP_NEEDS_LOGPROBS = {"if": {"required": ["top_logprobs"],
                             "properties": {"top_logprobs": {"type": "integer", "minimum": 1}}},
                      "then": {"required": ["logprobs"], "properties": {"logprobs": {"const": True}}}}
# ... and "n > 1 or logprobs, not with tools" (api/n_choices.py)
_TOOLS = {"type": "array", "minItems": 1}
NOT_WITH_TOOLS = [{"not": {"required": ["tools", "n"], "properties": {"tools": _TOOLS, "n": {"type": "integer",
                                                                                           "minimum": 2}}}},
                  {"not": {"required": ["tools", "logprobs"], "properties": {"tools": _TOOLS,
                                                                             "logprobs": {"const": True}}}}]


def engine_refusal(engine: str, top_logprobs: int) -> str | None:
    """Why `engine` cannot give `top_logprobs` alternatives per token (None: it can)."""
    limit = ENGINE_TOP_LOGPROBS.get(engine)
    if limit is None:
        return f"the {engine} engine does not compute logprobs"
    if top_logprobs > limit:
        return (f"the {engine} engine computes at most {limit} top_logprobs per token "
                f"({top_logprobs} asked)" + (": only the chosen token's logprob" if limit == 0 else ""))
    return None


def check_engines(engines: set[str], top_logprobs: int) -> None:
    """A 400 naming the limit when any engine that may run the job cannot give the logprobs."""
    for engine in sorted(engines):
        reason = engine_refusal(engine, top_logprobs)
        if reason is not None:
            raise ApiError(400, "unsupported_parameter", reason, param="top_logprobs")


def chat_logprobs(entries: list[dict] | None) -> dict | None:
    """`choices[].logprobs` of a chat completion (or chunk): the entries as they are."""
    return None if entries is None else {"content": entries, "refusal": None}


def choice_logprobs(chat: bool, entries: list[dict] | None) -> dict | None:
    """A whole answer's `choices[].logprobs` (None: not asked for)."""
    return chat_logprobs(entries) if chat else CompletionLogprobs().shape(entries)


class CompletionLogprobs:
    """`choices[].logprobs` of a (legacy) completion: parallel lists, `text_offset` counting
    characters from the start of the completion across every chunk of a stream."""

    def __init__(self) -> None:
        self.offset = 0

    def shape(self, entries: list[dict] | None) -> dict | None:
        if entries is None:
            return None
        offsets = []
        for entry in entries:
            offsets.append(self.offset)
            self.offset += len(entry["token"])
        return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
                "top_logprobs": [{t["token"]: t["logprob"] for t in e["top_logprobs"]} for e in entries],
                "text_offset": offsets}
