"""The body of `POST /v1/responses`, and how it becomes a job: its input items as chat messages,
its tools and text format as the job's (common/tools.py, response_format).

Unknown fields are refused with a 400 naming them, as on the other OpenAI routes; fields that
change nothing here are accepted; fields llmq cannot honour are refused unless they mean "not
used". What a response keeps in its job record (`ResponseRecord`) is what a later request chained
on it (`previous_response_id`) and `GET .../input_items` need.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import (BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter, ValidationError,
                      field_validator)
from typing_extensions import Annotated

from common.errors import ApiError
from common.schemas import JobRequest
from common.tools import FunctionSpec

# parameter -> the values that mean "not used"; anything else is refused
UNSUPPORTED: dict[str, tuple] = {
    "conversation": (None,), "prompt": (None,),
    "context_management": (None, []), "background_options": (None,),
}


LOGPROBS_INCLUDE = "message.output_text.logprobs"


def _invalid(message: str, param: str) -> ApiError:
    return ApiError(400, "invalid_value", message, param=param)


class TextPart(BaseModel):
    model_config = ConfigDict(extra="ignore")  # an echoed output_text carries annotations, logprobs

    type: Literal["input_text", "output_text"]
    text: str = Field(min_length=1)


class MessageItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: Annotated[str, Field(min_length=1)] | Annotated[list[TextPart], Field(min_length=1)]
    id: str | None = None


class FunctionCallInput(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = Field(min_length=1)
    arguments: str
    id: str | None = None


class FunctionCallOutput(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[TextPart]
    id: str | None = None


def _item_type(item: Any) -> str | None:
    """An item's `type` (a message may leave it out); None for what is no item at all."""
    if isinstance(item, dict):
        return item.get("type", "message")
    return getattr(item, "type", None) if isinstance(item, BaseModel) else None


InputItem = Annotated[Annotated[MessageItem, Tag("message")] | Annotated[FunctionCallInput, Tag("function_call")]
                      | Annotated[FunctionCallOutput, Tag("function_call_output")],
                      Discriminator(_item_type)]
_ITEMS = TypeAdapter(list[InputItem])


class FunctionTool(FunctionSpec):
    """A function tool as the Responses API takes it: flat, `{"type": "function", "name", ...}`."""

    type: Literal["function"]


class FunctionChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["function"]
    name: str


class PlainFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object"]


class SchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    type: Literal["json_schema"]
    name: str | None = None
    schema_: dict = Field(alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    format: PlainFormat | SchemaFormat | None = None
    verbosity: str | None = None  # accepted; changes nothing here


class ResponseCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    input: Annotated[str, Field(min_length=1)] | Annotated[list[InputItem], Field(min_length=1)] = Field(
        description="a user message, or input items")
    instructions: str | None = None
    previous_response_id: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: TextConfig | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | FunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    background: bool | None = None
    stream: bool | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = Field(None, max_length=16)
    top_logprobs: int | None = Field(None, ge=0, le=20, description="the most likely alternatives to each "
                                                                   "token of the output text, with its logprob")
    # "message.output_text.logprobs" returns the output text's logprobs; the rest change nothing here
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
    context_management: Any = None
    background_options: Any = None
    # llmq extensions (the openai client's `extra_body`)
    top_k: int | None = None
    seed: int | None = None
    cache: bool | None = None
    prompt_lookup: bool | None = None

    @field_validator("input", mode="before")
    @classmethod
    def _items(cls, value):
        """A list is read as items here, so a bad one is named plainly (not once per union arm)."""
        if not isinstance(value, list):
            return value
        try:
            return _ITEMS.validate_python(value)
        except ValidationError as exc:
            error = exc.errors()[0]
            where = ".".join(str(part) for i, part in enumerate(error["loc"]) if i != 1)  # 1: the item's type
            raise ValueError(f"item {where}: {error['msg']}") from None

    def check(self) -> None:
        for name, unused in UNSUPPORTED.items():
            if getattr(self, name) not in unused:
                raise ApiError(400, "unsupported_parameter",
                               f"{name}={getattr(self, name)!r} is not supported by this server", param=name)
        if self.background and self.store is False:
            raise _invalid("background responses must be stored (store: true)", "store")
        if self.wants_logprobs and self.tools:  # calls are read from the text: its tokens map to no part
            raise ApiError(400, "unsupported_parameter", "logprobs with tools are not supported",
                           param="top_logprobs" if self.top_logprobs else "include")

    @property
    def wants_logprobs(self) -> bool:
        return bool(self.top_logprobs) or LOGPROBS_INCLUDE in (self.include or [])

    def input_items(self) -> list[dict]:
        """The input as items (each with `status`, and the `id` the client gave, if any), as
        `GET .../input_items` lists them."""
        items = [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        return [_listed(item) for item in items]

    def job_request(self, conversation: list[dict]) -> JobRequest:
        """The job for this request, given the conversation so far (chained responses, then this
        request's input, as chat messages)."""
        messages = ([{"role": "system", "content": self.instructions}] if self.instructions else []) + conversation
        fields: dict = {"model": self.model, "messages": messages, "stream": False}
        for name in ("temperature", "top_p", "top_k", "seed", "cache", "parallel_tool_calls", "prompt_lookup"):
            if getattr(self, name) is not None:
                fields[name] = getattr(self, name)
        if self.max_output_tokens is not None:
            fields["max_tokens"] = self.max_output_tokens
        if self.wants_logprobs:
            fields.update(logprobs=True, top_logprobs=self.top_logprobs or 0)
        if self.tools:
            fields["tools"] = [{"type": "function", "function": t.model_dump(exclude={"type"}, exclude_none=True)}
                               for t in self.tools]
        if isinstance(self.tool_choice, FunctionChoice):
            fields["tool_choice"] = {"type": "function", "function": {"name": self.tool_choice.name}}
        elif self.tool_choice is not None:
            fields["tool_choice"] = self.tool_choice
        fmt = self.text.format if self.text else None
        if isinstance(fmt, SchemaFormat):
            spec = {"name": fmt.name, "schema": fmt.schema_, "strict": fmt.strict, "description": fmt.description}
            fields["response_format"] = {"type": "json_schema",
                                         "json_schema": {k: v for k, v in spec.items() if v is not None}}
        elif fmt is not None:
            fields["response_format"] = {"type": fmt.type}
        return JobRequest.model_validate(fields)


def _text(parts: str | list[TextPart]) -> str:
    return parts if isinstance(parts, str) else "".join(p.text for p in parts)


def _listed(item: InputItem) -> dict:
    """An input item as it is kept and listed: text parts typed by role, status completed."""
    if isinstance(item, MessageItem):
        kind = "output_text" if item.role == "assistant" else "input_text"
        content = [{"type": kind, "text": item.content}] if isinstance(item.content, str) else \
            [p.model_dump() for p in item.content]
        return {"type": "message", "id": item.id, "role": item.role, "content": content, "status": "completed"}
    if isinstance(item, FunctionCallInput):
        return {**item.model_dump(), "status": "completed"}
    return {**item.model_dump(), "output": _text(item.output), "status": "completed"}


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
    top_logprobs: int | None = None
    logprobs: bool = False  # the output text's logprobs were asked for
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    metadata: dict[str, str] = Field(default_factory=dict)
    input_items: list[dict] = Field(default_factory=list)
    conversation: list[dict] = Field(default_factory=list)  # the chat messages before this response's output

    @classmethod
    def of(cls, body: ResponseCreate, conversation: list[dict]) -> "ResponseRecord":
        return cls(background=bool(body.background), store=body.store is not False, instructions=body.instructions,
                   previous_response_id=body.previous_response_id, max_output_tokens=body.max_output_tokens,
                   temperature=body.temperature, top_p=body.top_p,
                   text=body.text.model_dump(exclude_none=True, by_alias=True) if body.text else None,
                   tools=[t.model_dump(exclude_none=True) for t in body.tools or []],
                   top_logprobs=body.top_logprobs, logprobs=body.wants_logprobs,
                   tool_choice=(body.tool_choice.model_dump() if isinstance(body.tool_choice, FunctionChoice)
                                else body.tool_choice or "auto"), parallel_tool_calls=body.parallel_tool_calls is not False,
                   metadata=body.metadata or {}, input_items=body.input_items(), conversation=conversation)
