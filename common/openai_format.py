"""OpenAI response shapes for a job: whole responses, stream chunks, and error bodies."""
from __future__ import annotations

import json
from dataclasses import dataclass

from common.tool_parser import CallArguments, CallStart, Event, read_calls
from common.tools import ToolCalling


@dataclass(frozen=True)
class Surface:
    """Chat completions or (legacy) completions: ids, object names and the choice's shape."""

    chat: bool

    def id(self, job_id: str) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{job_id}"

    def response(self, record: dict) -> dict:
        text, reason = record.get("text", ""), record.get("finish_reason")
        if self.chat:
            message = {"role": "assistant", "content": text, "refusal": None}
            calling = tool_calling(record)
            if calling:
                content, calls = read_calls(record["id"], calling, text)
                if calls:
                    message.update(content=content, tool_calls=[
                        {"id": c.call_id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                        for c in calls])
                    reason = tool_calls_reason(reason)
                else:
                    message["content"] = content
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        return {**self._head(record, "chat.completion" if self.chat else "text_completion"),
                "choices": [choice], "usage": usage(record)}

    def chunk(self, record: dict, text: str | None = None, finish_reason: str | None = None,
              role: bool = False, tool_call: dict | None = None) -> dict:
        """One `data:` payload of a stream: new text, a piece of a tool call (`tool_call_delta`),
        the opening role (chat), or the end."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
            if tool_call is not None:
                delta["tool_calls"] = [tool_call]
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return {**self._head(record, "chat.completion.chunk" if self.chat else "text_completion"),
                "choices": [choice]}

    def usage_chunk(self, record: dict, usage_: dict) -> dict:
        """The last chunk when `stream_options.include_usage` is set: no choices, the usage."""
        head = self._head(record, "chat.completion.chunk" if self.chat else "text_completion")
        return {**head, "choices": [], "usage": usage_}

    def _head(self, record: dict, object_: str) -> dict:
        return {"id": self.id(record["id"]), "object": object_, "created": int(record["created_at"]),
                "model": record["model"]}


def tool_calling(record: dict) -> ToolCalling | None:
    """How to read the job's text back as tool calls (None: it offered none)."""
    plan = record.get("tool_calling")
    return ToolCalling.model_validate(plan) if plan else None


def tool_calls_reason(reason: str | None) -> str | None:
    """A generation that ended by itself after making calls ended to have them run."""
    return "tool_calls" if reason == "stop" else reason


def tool_call_delta(event: Event) -> dict | None:
    """A stream's `delta.tool_calls[0]` for a tool-call event: the first names the call, the
    next carry pieces of its arguments (OpenAI's shape)."""
    if isinstance(event, CallStart):
        return {"index": event.index, "id": event.call_id, "type": "function",
                "function": {"name": event.name, "arguments": ""}}
    if isinstance(event, CallArguments):
        return {"index": event.index, "function": {"arguments": event.delta}}
    return None


def usage(record: dict) -> dict:
    prompt, completion = record.get("prompt_tokens", 0), record.get("completion_tokens", 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def error_type(status: int) -> str:
    if status == 429:
        return "rate_limit_error"
    return "server_error" if status >= 500 else "invalid_request_error"


def error_body(status: int, message: str, code: str | None = None, param: str | None = None) -> dict:
    """OpenAI's error body."""
    return {"error": {"message": message, "type": error_type(status), "param": param, "code": code}}


def sse_data(payload: dict | str) -> str:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n"
