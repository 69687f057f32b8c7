"""The body of `POST /v1/responses`, and how it becomes a job: its input items as chat messages,
its tools and text format as the job's (common/tools.py, response_format).

Unknown fields are refused with a 400 naming them, as on the other OpenAI routes; fields that
change nothing here are accepted; fields llmq cannot honour are refused unless they mean "not
used". What a response keeps in its job record (`ResponseRecord`) is what a later request chained
on it (`previous_response_id`) and `GET .../input_items` need.
"""
from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from common.errors import ApiError
from common.schemas import JobRequest

# parameter -> the values that mean "not used"; anything else is refused
UNSUPPORTED: dict[str, tuple] = {
    "conversation": (None,), "prompt": (None,), "top_logprobs": (None, 0),
    "context_management": (None, []), "background_options": (None,),
}


def _invalid(message: str, param: str) -> ApiError:
    return ApiError(400, "invalid_value", message, param=param)


class ResponseCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    input: str | list[dict] = Field(description="a user message, or input items")
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: dict | None = None
    tools: list[dict] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    background: bool | None = None
    stream: bool | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = Field(None, max_length=16)
    # accepted: they change nothing here
    include: list[str] | None = None
    reasoning: dict | None = None
    truncation: Literal["auto", "disabled"] | None = None
    user: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Any = None
    stream_options: dict | None = None
    max_tool_calls: int | None = None
    # refused unless "not used" (UNSUPPORTED)
    conversation: Any = None
    prompt: Any = None
    top_logprobs: int | None = None
    context_management: Any = None
    background_options: Any = None
    # llmq extensions (the openai client's `extra_body`)
    top_k: int | None = None
    seed: int | None = None
    cache: bool | None = None

    def check(self) -> None:
        for name, unused in UNSUPPORTED.items():
            if getattr(self, name) not in unused:
                raise ApiError(400, "unsupported_parameter",
                               f"{name}={getattr(self, name)!r} is not supported by this server", param=name)
        if self.background and self.store is False:
            raise _invalid("background responses must be stored (store: true)", "store")

    def input_items(self) -> list[dict]:
        """The input as items with ids, as `GET .../input_items` lists them."""
        raw = [{"role": "user", "content": self.input}] if isinstance(self.input, str) else self.input
        return [_item(item, i) for i, item in enumerate(raw)]

    def job_request(self, conversation: list[dict]) -> JobRequest:
        """The job for this request, given the conversation so far (chained responses, then this
        request's input, as chat messages)."""
        messages = ([{"role": "system", "content": self.instructions}] if self.instructions else []) + conversation
        fields: dict = {"model": self.model, "messages": messages, "stream": False}
        for name in ("temperature", "top_p", "top_k", "seed", "cache", "parallel_tool_calls"):
            if getattr(self, name) is not None:
                fields[name] = getattr(self, name)
        if self.max_output_tokens is not None:
            fields["max_tokens"] = self.max_output_tokens
        if self.tools:
            fields["tools"] = [_chat_tool(t) for t in self.tools]
        if self.tool_choice is not None:
            fields["tool_choice"] = _chat_tool_choice(self.tool_choice)
        if self.text and self.text.get("format"):
            fields["response_format"] = _response_format(self.text["format"])
        return JobRequest.model_validate(fields)


def _item(item: Any, index: int) -> dict:
    """One input item, checked, with its `type` (its `id`, if the client gave none, is given when
    it is listed: see api/responses_api.py)."""
    if not isinstance(item, dict):
        raise _invalid(f"input[{index}] is not an object", "input")
    kind = item.get("type", "message")
    if kind == "message":
        if item.get("role") not in ("user", "system", "developer", "assistant"):
            raise _invalid(f"input[{index}].role must be user, system, developer or assistant", "input")
        content = item.get("content")
        if isinstance(content, str):
            content = [{"type": "output_text" if item["role"] == "assistant" else "input_text", "text": content}]
        if not isinstance(content, list) or not all(
                isinstance(p, dict) and p.get("type") in ("input_text", "output_text") and isinstance(p.get("text"), str)
                for p in content):
            raise _invalid(f"input[{index}].content: only text parts (input_text, output_text) are supported", "input")
        return {"type": "message", "role": item["role"], "content": content, "id": item.get("id"),
                "status": "completed"}
    if kind == "function_call":
        if not all(isinstance(item.get(k), str) for k in ("call_id", "name", "arguments")):
            raise _invalid(f"input[{index}]: a function_call needs call_id, name and arguments", "input")
        return {"type": kind, "call_id": item["call_id"], "name": item["name"], "arguments": item["arguments"],
                "id": item.get("id"), "status": "completed"}
    if kind == "function_call_output":
        output = item.get("output")
        if isinstance(output, list):
            output = "".join(p.get("text", "") for p in output if isinstance(p, dict))
        if not isinstance(item.get("call_id"), str) or not isinstance(output, str):
            raise _invalid(f"input[{index}]: a function_call_output needs call_id and a text output", "input")
        return {"type": kind, "call_id": item["call_id"], "output": output,
                "id": item.get("id"), "status": "completed"}
    raise _invalid(f"input[{index}]: items of type {kind!r} are not supported (message, function_call, "
                   "function_call_output are)", "input")


def items_as_messages(items: list[dict]) -> list[dict]:
    """Input or output items as chat messages: consecutive calls join the assistant message
    before them, a call's output becomes a `tool` message."""
    messages: list[dict] = []
    for item in items:
        if item["type"] == "message":
            text = "".join(p["text"] for p in item["content"])
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": text})
        elif item["type"] == "function_call":
            call = {"id": item["call_id"], "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]}}
            last = messages[-1] if messages else None
            if last and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        else:
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item["output"]})
    return messages


def _chat_tool(tool: dict) -> dict:
    if tool.get("type") != "function":
        raise _invalid(f"tools: only function tools are supported (got {tool.get('type')!r})", "tools")
    unknown = set(tool) - {"type", "name", "description", "parameters", "strict"}
    if unknown:
        raise _invalid(f"tools: unknown field(s) {sorted(unknown)}", "tools")
    return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type" and v is not None}}


def _chat_tool_choice(choice: Any) -> Any:
    if choice in ("none", "auto", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _invalid(f"tool_choice {json.dumps(choice)} is not supported (none, auto, required, or "
                   "{'type': 'function', 'name': ...})", "tool_choice")


def _response_format(fmt: dict) -> dict:
    kind = fmt.get("type")
    if kind in ("text", "json_object"):
        return {"type": kind}
    if kind == "json_schema":
        spec = {k: fmt[k] for k in ("name", "schema", "strict", "description") if k in fmt}
        return {"type": "json_schema", "json_schema": spec}
    raise _invalid(f"text.format.type {kind!r} is not supported (text, json_object, json_schema)", "text")


class ResponseRecord(BaseModel):
    """What the job record keeps of a response beyond the job itself (the `response` field)."""

    background: bool = False
    store: bool = True
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: dict | None = None
    tools: list[dict] = Field(default_factory=list)
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    metadata: dict[str, str] = Field(default_factory=dict)
    input_items: list[dict] = Field(default_factory=list)
    conversation: list[dict] = Field(default_factory=list)  # the chat messages before this response's output

    @classmethod
    def of(cls, body: ResponseCreate, conversation: list[dict]) -> "ResponseRecord":
        return cls(background=bool(body.background), store=body.store is not False, instructions=body.instructions,
                   previous_response_id=body.previous_response_id, max_output_tokens=body.max_output_tokens,
                   temperature=body.temperature, top_p=body.top_p, text=body.text, tools=body.tools or [],
                   tool_choice=body.tool_choice or "auto", parallel_tool_calls=body.parallel_tool_calls is not False,
                   metadata=body.metadata or {}, input_items=body.input_items(), conversation=conversation)
