"""OpenAI response shapes for a job: whole responses, stream chunks, and error bodies."""
from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Surface:
    """Chat completions or (legacy) completions: ids, object names and the choice's shape."""

    chat: bool

    def id(self, job_id: str) -> str:
        return f"{'chatcmpl' if self.chat else 'cmpl'}-{job_id}"

    def response(self, record: dict) -> dict:
        text, reason = record.get("text", ""), record.get("finish_reason")
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text, "refusal": None},
                      "logprobs": None, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
        return {**self._head(record, "chat.completion" if self.chat else "text_completion"),
                "choices": [choice], "usage": usage(record)}

    def chunk(self, record: dict, text: str | None = None, finish_reason: str | None = None,
              role: bool = False) -> dict:
        """One `data:` payload of a stream: new text, the opening role (chat), or the end."""
        if self.chat:
            delta = {"role": "assistant", "content": ""} if role else {}
            if text is not None:
                delta["content"] = text
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
