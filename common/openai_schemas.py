"""OpenAI request bodies (chat completions, completions), mapped onto llmq's `JobRequest`.

Unknown fields are refused, as OpenAI does; fields llmq has no use for but that change nothing
(`user`, `metadata`, ...) are accepted; fields that would change the answer in a way llmq cannot
honour (`logit_bias`, `functions`, ...) get a 400 naming the parameter, never silence.
Tools become the job's own (common/tools.py). `n` choices are `n` jobs (api/n_choices.py);
logprobs are the engine's (common/logprobs.py).
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from common.errors import ApiError
from common.logprobs import MAX_N, MAX_TOP_LOGPROBS
from common.schemas import JobRequest

# parameter -> the values that mean "not used"; anything else is refused
UNSUPPORTED: dict[str, tuple] = {
    "best_of": (None, 1), "logit_bias": (None, {}), "echo": (None, False), "suffix": (None, ""),
    "functions": (None, []),
    "function_call": (None, "none"), "audio": (None,), "modalities": (None, ["text"]),
    "prediction": (None,), "web_search_options": (None,),
}
# the request fields that pass on to the job as they are (the API's description reads them too)
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "seed", "stop", "presence_penalty",
                   "frequency_penalty", "response_format", "cache", "webhook", "webhook_events", "prompt_lookup")
TOOL_FIELDS = ("tools", "tool_choice", "parallel_tool_calls")  # chat's, also passed on as they are


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False
    include_obfuscation: bool | None = None  # accepted; llmq never pads its chunks


class _OpenAIRequest(BaseModel):
    """What chat completions and completions share."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    response_format: dict | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    # accepted and ignored: they do not change the answer
    user: str | None = None
    metadata: dict | None = None
    store: bool | None = None
    service_tier: str | None = None
    safety_identifier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: Any = None
    prompt_cache_options: Any = None
    verbosity: str | None = None
    n: int | None = Field(None, ge=1, le=MAX_N)  # choices: one job each (api/n_choices.py)
    # refused unless "not used" (see UNSUPPORTED)
    logit_bias: dict | None = None
    # llmq extensions (send them with the openai client's `extra_body`)
    top_k: int | None = None
    cache: bool | None = None
    webhook: str | None = None  # signed callbacks about the job behind this request (README)
    webhook_events: list[str] | None = None
    prompt_lookup: bool | None = None  # the model's own setting only (JobRequest.prompt_lookup)

    def refuse_unsupported(self) -> None:
        for name, unused in UNSUPPORTED.items():
            value = getattr(self, name, None)
            if value not in unused:
                raise ApiError(400, "unsupported_parameter",
                               f"{name}={value!r} is not supported by this server", param=name)

    def _job_fields(self) -> dict:
        self.refuse_unsupported()
        fields = {k: v for k in SAMPLING_FIELDS if (v := getattr(self, k)) is not None}
        fields.update(self.logprob_fields())
        if self.max_tokens is not None:
            fields["max_tokens"] = self.max_tokens
        return {**fields, "model": self.model, "stream": bool(self.stream)}

    def logprob_fields(self) -> dict:
        """The job's `logprobs`/`top_logprobs` (each surface asks for them its own way)."""
        return {}

    @property
    def choices(self) -> int:
        return self.n or 1

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatMessage(BaseModel):
    """Text messages, an assistant's tool calls (content may be null) and tool results. Content
    parts other than text, and the legacy `function` role, are refused."""

    model_config = ConfigDict(extra="ignore")  # e.g. refusal/annotations echoed back from a reply

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict] | None = None
    name: str | None = None
    tool_calls: list[dict] | None = None
    tool_call_id: str | None = None

    @field_validator("content")
    @classmethod
    def _text_only(cls, content):
        if content is None or isinstance(content, str):
            return content
        if any(part.get("type") != "text" or not isinstance(part.get("text"), str) for part in content):
            raise ValueError("only text content parts ({'type': 'text', 'text': ...}) are supported")
        return "".join(part["text"] for part in content)

    def as_message(self) -> dict:
        message = {"role": "system" if self.role == "developer" else self.role, "content": self.content}
        if self.tool_calls:  # OpenAI's echo may carry extra keys (index): the job's schema checks the rest
            message["tool_calls"] = [{k: v for k, v in call.items() if k != "index"} for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class ChatCompletionRequest(_OpenAIRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[dict] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list | None = None
    function_call: Any = None
    audio: Any = None
    modalities: list[str] | None = None
    prediction: Any = None
    web_search_options: Any = None
    reasoning_effort: str | None = None  # accepted; no reasoning models here

    def job_request(self) -> JobRequest:
        fields = self._job_fields()
        if self.max_completion_tokens is not None:
            if self.max_tokens not in (None, self.max_completion_tokens):
                raise ApiError(400, "invalid_value", "max_tokens and max_completion_tokens differ; "
                               "send one of them", param="max_completion_tokens")
            fields["max_tokens"] = self.max_completion_tokens
        fields["messages"] = [m.as_message() for m in self.messages]
        fields.update({k: v for k in TOOL_FIELDS if (v := getattr(self, k)) is not None})
        return JobRequest.model_validate(fields)

    def logprob_fields(self) -> dict:
        if self.top_logprobs and not self.logprobs:
            raise ApiError(400, "invalid_value", "top_logprobs needs logprobs: true", param="top_logprobs")
        return {"logprobs": True, "top_logprobs": self.top_logprobs or 0} if self.logprobs else {}


class CompletionRequest(_OpenAIRequest):
    prompt: str | list[str]
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)  # the alternatives per token
    best_of: int | None = None
    echo: bool | None = None
    suffix: str | None = None

    @field_validator("prompt")
    @classmethod
    def _one_prompt(cls, prompt):
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise ValueError("send one prompt per request (a string, or a list of one string)")
            return prompt[0]
        return prompt

    def job_request(self) -> JobRequest:
        return JobRequest.model_validate({**self._job_fields(), "prompt": self.prompt})

    def logprob_fields(self) -> dict:
        return {} if self.logprobs is None else {"logprobs": True, "top_logprobs": self.logprobs}
