"""Request and job schemas shared by the API (validation) and the worker (reading job records)."""
from __future__ import annotations

import enum
from typing import Literal

import jsonschema
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from common.tools import ToolCalling, ToolChoice, ToolSpec


class JobStatus(str, enum.Enum):
    """A job's status. A str, so Redis fields, JSON and comparisons with "queued" see the word."""

    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    EXPIRED = "expired"

    def __str__(self) -> str:  # "queued", not "JobStatus.QUEUED", wherever it is formatted or written
        return self.value

    @property
    def terminal(self) -> bool:
        return self not in (JobStatus.QUEUED, JobStatus.RUNNING)


class FinishReason(str, enum.Enum):
    """Why a generation ended. A str, so JSON, Redis fields and comparisons with "stop" see the word."""

    STOP = "stop"
    LENGTH = "length"
    CANCELLED = "cancelled"
    ERROR = "error"
    TIMEOUT = "timeout"

    def __str__(self) -> str:  # "stop", not "FinishReason.STOP", wherever it is formatted or written
        return self.value


# Events a job's webhook may be sent for (common/webhooks.py)
WebhookEvent = Literal["start", "completed"]

# Job priorities -> fair-queue levels (and Celery message priorities; on Redis, 0 is served first).
# "batch" is for the lines of a batch (common/batches.py) and cannot be asked for: below every
# interactive level, so a batch fills idle slots and interactive jobs always start first.
Priority = Literal["high", "normal", "low"]
PRIORITY_LEVELS: dict[str, int] = {"high": 0, "normal": 3, "low": 6, "batch": 9}


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    arguments: str = Field(description="the arguments as a JSON text")


class MessageToolCall(BaseModel):
    """A call an assistant message made, sent back in a conversation."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


def _message_schema(schema: dict) -> None:
    """Publish which fields each role takes (checked by the validators below) in the JSON Schema,
    so OpenAPI clients and fuzzers know which messages are valid."""
    props = schema["properties"]
    calls = next(s for s in props["tool_calls"]["anyOf"] if s.get("type") == "array")
    text, any_text = {"type": "string", "minLength": 1}, {"type": "string"}

    def branch(roles: list[str], required: list[str], **fields) -> dict:
        return {"type": "object", "additionalProperties": False, "required": ["role", *required],
                "properties": {"role": {"enum": roles}, **fields}}
    schema["anyOf"] = [
        branch(["system", "user", "assistant"], ["content"], content=text),
        branch(["assistant"], ["tool_calls"], content={"anyOf": [any_text, {"type": "null"}]}, tool_calls=calls),
        branch(["tool"], ["tool_call_id", "content"], content=any_text,
               tool_call_id={"type": "string", "minLength": 1}),
    ]


class Message(BaseModel):
    """A chat message. An assistant message that made tool calls may have no content; a `tool`
    message is a call's result, naming the call it answers."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=lambda schema: _message_schema(schema))

    role: Literal["system", "user", "assistant", "tool"]
    tool_calls: list[MessageToolCall] | None = Field(None, min_length=1)
    tool_call_id: str | None = Field(None, min_length=1, validate_default=True)
    content: str | None = Field(None, validate_default=True)

    @field_validator("tool_calls")
    @classmethod
    def _calls_are_the_assistants(cls, value, info):
        if value is not None and info.data.get("role") != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return value

    @field_validator("tool_call_id")
    @classmethod
    def _results_are_the_tools(cls, value, info):
        if (value is not None) != (info.data.get("role") == "tool"):
            raise ValueError("a tool message, and only a tool message, names the call it answers")
        return value

    @field_validator("content")
    @classmethod
    def _content_fits_role(cls, value, info):
        role = info.data.get("role")
        if role == "tool":
            if value is None:
                raise ValueError("a tool message needs content (the call's result)")
        elif not value and not (role == "assistant" and info.data.get("tool_calls")):
            raise ValueError("needs non-empty content" + (" or tool_calls" if role == "assistant" else ""))
        return value


def _response_format_schema(schema: dict) -> None:
    """Publish the type/json_schema pairing (checked by the validator below) in the JSON Schema,
    so OpenAPI clients and fuzzers know which combinations are valid."""
    spec = {"type": "object", "required": ["schema"], "additionalProperties": False,
            "properties": {"name": {"type": "string"}, "schema": {"type": "object"},
                           "strict": {"type": ["boolean", "null"]}, "description": {"type": "string"}}}
    schema.clear()
    schema.update({"title": "ResponseFormat", "oneOf": [
        {"type": "object", "additionalProperties": False, "required": ["type"],
         "properties": {"type": {"enum": ["text", "json_object"]}}},
        {"type": "object", "additionalProperties": False, "required": ["type", "json_schema"],
         "properties": {"type": {"const": "json_schema"}, "json_schema": spec}},
    ]})


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`: free text, any JSON object, or JSON matching a schema.

    `json_schema` keeps OpenAI's shape, `{"name", "schema", "strict", "description"}`; the schema is
    checked against its JSON Schema metaschema here, so a bad one is refused before it is queued.
    """

    model_config = ConfigDict(extra="forbid", json_schema_extra=lambda schema: _response_format_schema(schema))

    type: Literal["text", "json_object", "json_schema"]
    json_schema: dict | None = None

    @model_validator(mode="after")
    def _schema_fits_type(self) -> "ResponseFormat":
        if self.type != "json_schema":
            if self.json_schema is not None:
                raise ValueError("json_schema is only allowed with type 'json_schema'")
            return self
        spec = self.json_schema
        if spec is None or not isinstance(spec.get("schema"), dict):
            raise ValueError("type 'json_schema' needs json_schema.schema, a JSON Schema object")
        unknown = set(spec) - {"name", "schema", "strict", "description"}
        if unknown:
            raise ValueError(f"json_schema: unknown field(s) {sorted(unknown)}")
        for field, types in (("name", str), ("description", str), ("strict", (bool, type(None)))):
            if field in spec and not isinstance(spec[field], types):
                raise ValueError(f"json_schema.{field} has the wrong type")
        try:
            jsonschema.validators.validator_for(spec["schema"]).check_schema(spec["schema"])
        except jsonschema.SchemaError as exc:
            raise ValueError(f"json_schema.schema is not a valid JSON Schema: {exc.message}")
        return self


class SamplingParams(BaseModel):
    """Per-request decoding parameters; the engine honours each one per sequence."""

    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(256, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0, description="0 disables top-k")
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: list[str] = Field(default_factory=list, max_length=8)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    response_format: ResponseFormat | None = None
    logprobs: bool = Field(False, description="return each generated token's logprob (README: logprobs)")
    top_logprobs: int = Field(0, ge=0, le=20, description="with logprobs: the most likely alternatives "
                                                          "to return per token")

    @model_validator(mode="after")
    def _top_logprobs_need_logprobs(self) -> "SamplingParams":
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        return self

    @field_validator("response_format")
    @classmethod
    def _text_is_unconstrained(cls, value: ResponseFormat | None) -> ResponseFormat | None:
        return None if value is not None and value.type == "text" else value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value):
        if isinstance(value, str):
            return [value]
        return value if value is not None else []

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, value: list[str]) -> list[str]:
        if any(not s for s in value):
            raise ValueError("stop strings must be non-empty")
        return value

    @property
    def deterministic(self) -> bool:
        """Same request, same answer: greedy decoding or a fixed seed."""
        return self.temperature == 0 or self.seed is not None


class JobRequest(SamplingParams):
    """Body of POST /v1/jobs: either chat `messages` or a raw `prompt`."""

    # JSON types as /openapi.json (JSON Schema) documents them: "true" is not true, "5" is not 5
    model_config = ConfigDict(strict=True)

    messages: list[Message] | None = Field(None, min_length=1)
    prompt: str | None = Field(None, min_length=1)
    model: str | None = None
    stream: bool = False
    cache: bool = True
    priority: Priority | None = Field(None, description="default: the API key's tier, else normal")
    queue_timeout: float | None = Field(None, gt=0, le=7 * 86400,
                                        description="seconds the job may wait in the queue")
    run_timeout: float | None = Field(None, gt=0, le=7 * 86400,
                                      description="seconds the generation may run")
    webhook: str | None = Field(None, min_length=1, max_length=2048,
                                description="http(s) URL that gets signed POSTs about this job "
                                            "(see README, Webhooks)")
    webhook_events: list[WebhookEvent] | None = Field(
        None, min_length=1, description="which events to send: 'start' (a worker began the job), "
                                        "'completed' (it ended, in any status); default ['completed']")
    tools: list[ToolSpec] | None = Field(None, max_length=128, description="functions the model may call")
    tool_choice: ToolChoice | None = Field(None, description="none, auto (the default with tools), "
                                                             "required, or {'type': 'function', "
                                                             "'function': {'name': ...}}")
    parallel_tool_calls: bool | None = Field(None, description="with required: more than one call "
                                                               "allowed (default true)")
    prompt_lookup: bool | None = Field(
        None, description="prompt-lookup speculative decoding: default the model's setting "
                          "(LLMQ_PROMPT_LOOKUP or its catalog entry); any other value is refused "
                          "(400), as the engines set it per model")

    @model_validator(mode="before")
    @classmethod
    def _integral_numbers_are_integers(cls, data):
        """JSON Schema counts 5.0 as an integer; strict pydantic would not."""
        if not isinstance(data, dict):
            return data
        return {k: int(v) if k in ("max_tokens", "top_k", "seed", "top_logprobs") and isinstance(v, float)
                and v.is_integer() else v for k, v in data.items()}

    @model_validator(mode="after")
    def _one_input(self) -> "JobRequest":
        if (self.messages is None) == (self.prompt is None):
            raise ValueError("give exactly one of 'messages' or 'prompt'")
        if self.webhook_events is not None and self.webhook is None:
            raise ValueError("webhook_events needs a webhook URL")
        return self

    @field_validator("tool_choice")
    @classmethod
    def _choice_fits_tools(cls, choice, info):
        calling = ToolCalling.plan(info.data.get("tools"), choice)  # ValueError for a choice the tools cannot meet
        if calling and calling.mode != "auto" and info.data.get("response_format") is not None:
            raise ValueError("a forced tool call and response_format cannot both shape the output")
        return choice

    @field_validator("tools")
    @classmethod
    def _tools_have_one_name_each(cls, tools):
        ToolCalling.plan(tools, None)
        return tools

    def tool_calling(self) -> ToolCalling | None:
        return ToolCalling.plan(self.tools, self.tool_choice)

    def sampling(self) -> SamplingParams:
        return SamplingParams(**self.model_dump(include=set(SamplingParams.model_fields)))
