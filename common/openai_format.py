"""OpenAI response shapes for a job: whole responses, stream chunks, and error bodies, each built
from the models /openapi.json describes (common/openai_models.py)."""
from __future__ import annotations

import json
from dataclasses import dataclass

from common.logprobs import choice_logprobs
from common.openai_models import (AssistantMessage, ChatChoice, ChatCompletion, ChatCompletionChunk,
                                  ChunkChoice, ChunkDelta, ErrorDetail, OpenAIError, TextChoice,
                                  TextCompletion, TextCompletionChunk, ToolCall, Usage)
from common.tool_parser import CallArguments, CallStart, Event, read_calls
from common.tools import ToolCalling


@dataclass(frozen=True)
class Surface:
    """Chat completions or (legacy) completions: ids, object names and the choice's shape."""

    chat: bool

    def id(self, job_id: str) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{job_id}"

    def response(self, *records: dict) -> dict:
        """The whole answer, a choice per record in order (n > 1: sibling jobs, the prompt's
        tokens counted once), each with its logprobs when its job asked for them."""
        head = records[0]
        model = ChatCompletion if self.chat else TextCompletion
        return _dump(model(id=self.id(head["id"]), object="chat.completion" if self.chat else "text_completion",
                           created=int(head["created_at"]), model=head["model"],
                           choices=[self._choice(index, record) for index, record in enumerate(records)],
                           usage=Usage.of_choices(list(records))))

    def _choice(self, index: int, record: dict) -> ChatChoice | TextChoice:
        text, reason = record.get("text", ""), record.get("finish_reason")
        logprobs = choice_logprobs(self.chat, record.get("logprobs"))
        if not self.chat:
            return TextChoice(index=index, text=text, logprobs=logprobs, finish_reason=reason)
        message = {"role": "assistant", "content": text, "refusal": None}
        calling = tool_calling(record)
        if calling:
            message["content"], calls = read_calls(record["id"], calling, text)
            if calls:  # left out (not null) without calls
                message["tool_calls"] = [ToolCall.of(call) for call in calls]
                reason = tool_calls_reason(reason)
        return ChatChoice(index=index, message=AssistantMessage(**message), logprobs=logprobs, finish_reason=reason)

    def stream(self, record: dict, include_usage: bool, index: int = 0) -> "StreamChunks":
        """The `data:` payloads of the stream of choice `index` of the job in `record`."""
        return StreamChunks(self, record, include_usage, index)


_TEXT, _LOGPROBS = "\x00text\x00", "\x00logprobs\x00"  # where a text chunk's values go


class StreamChunks:
    """One choice's stream chunks (ChatCompletionChunk, or TextCompletionChunk), with `usage: null`
    on each when `include_usage`. The chunks sent once per token (text, a tool call's arguments)
    are the model serialised once with slots for what changes: validating a model per token would
    cost more CPU than the rest of the relay, and buys nothing for text the worker wrote."""

    def __init__(self, surface: Surface, record: dict, include_usage: bool, index: int = 0):
        self.chat, self.index = surface.chat, index
        self._model = ChatCompletionChunk if surface.chat else TextCompletionChunk
        self._head = {"id": surface.id(record["id"]),
                      "object": "chat.completion.chunk" if surface.chat else "text_completion",
                      "created": int(record["created_at"]), "model": record["model"]}
        self._usage = {"usage": None} if include_usage else {}
        template = self._chunk(text=_TEXT)
        template["choices"][0]["logprobs"] = _LOGPROBS
        self._text_parts = _slots(template, _TEXT, _LOGPROBS)
        self._arguments_parts: dict[int, tuple[str, ...]] = {}  # a tool call's index -> its template

    def text(self, text: str, logprobs: dict | None = None) -> str:
        """New text (with its tokens' logprobs in this surface's shape, when asked for)."""
        before, between, after = self._text_parts
        return f"{before}{json.dumps(text)}{between}{'null' if logprobs is None else json.dumps(logprobs)}{after}"

    def role(self) -> str:
        """A chat stream's opening chunk."""
        return json.dumps(self._chunk(role="assistant", text=""))

    def tool_call(self, event: Event) -> str | None:
        """A tool-call event's chunk (`delta.tool_calls[0]`, OpenAI's shape): the first names the
        call, the next carry pieces of its arguments; None for an event that sends nothing."""
        if isinstance(event, CallStart):
            return json.dumps(self._chunk(tool_calls=[{"index": event.index, "id": event.call_id, "type": "function",
                                                       "function": {"name": event.name, "arguments": ""}}]))
        if not isinstance(event, CallArguments):
            return None
        if event.index not in self._arguments_parts:
            template = self._chunk(tool_calls=[{"index": event.index, "function": {"arguments": _TEXT}}])
            self._arguments_parts[event.index] = _slots(template, _TEXT)
        before, after = self._arguments_parts[event.index]
        return f"{before}{json.dumps(event.delta)}{after}"

    def end(self, finish_reason: str) -> str:
        return json.dumps(self._chunk(finish_reason=finish_reason))

    def usage(self, usage: Usage | dict) -> str:
        """The last chunk when `stream_options.include_usage` is set: no choices, the usage."""
        return json.dumps(_dump(self._model(**self._head, choices=[], usage=usage)))

    def _chunk(self, text: str | None = None, finish_reason: str | None = None, **delta) -> dict:
        if self.chat:
            if text is not None:
                delta["content"] = text
            choice = ChunkChoice(index=self.index, delta=ChunkDelta(**delta), logprobs=None,
                                 finish_reason=finish_reason)
        else:
            choice = TextChoice(index=self.index, text=text or "", logprobs=None, finish_reason=finish_reason)
        return _dump(self._model(**self._head, choices=[choice], **self._usage))


def _slots(template: dict, *slots: str) -> tuple[str, ...]:
    """`template` as JSON text cut where each slot's value is, in order."""
    parts, rest = [], json.dumps(template)
    for slot in slots:
        before, rest = rest.split(json.dumps(slot))
        parts.append(before)
    return (*parts, rest)


def _dump(model) -> dict:
    """A model as JSON data with the fields it was given: an optional field left out (a message's
    `tool_calls`, a chunk's `usage` without `include_usage`) is absent, not null."""
    return model.model_dump(mode="json", exclude_unset=True)


def tool_calling(record: dict) -> ToolCalling | None:
    """How to read the job's text back as tool calls (None: it offered none)."""
    plan = record.get("tool_calling")
    return ToolCalling.model_validate(plan) if plan else None


def tool_calls_reason(reason: str | None) -> str | None:
    """A generation that ended by itself after making calls ended to have them run."""
    return "tool_calls" if reason == "stop" else reason


def error_type(status: int) -> str:
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict:
    """OpenAI's error body."""
    return OpenAIError(error=ErrorDetail(message=message, type=error_type(status), param=param,
                                         code=code)).model_dump()


def sse_data(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"
