"""The response bodies of the OpenAI-compatible routes as pydantic models: chat completions and
completions (common/openai_format.py), files (common/files.py) and batches (common/batches.py)
are built from them, and /openapi.json's schemas are generated from them
(api/openapi_openai.py), so no shape is written twice."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from common.schemas import FinishReason


class Usage(BaseModel):
    """A job's token counts, as every answer carries them (OpenAI's, /v1/jobs', webhooks')."""
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int

    @classmethod
    def of(cls, counts: dict) -> "Usage":
        """From a job record, or a `usage` object (a `done` event's)."""
        prompt, completion = counts.get("prompt_tokens", 0), counts.get("completion_tokens", 0)
        return cls(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion)

    @classmethod
    def of_choices(cls, counts: list[dict]) -> "Usage":
        """Sibling jobs answering one prompt (n > 1): the prompt counted once, the completions summed."""
        completion = sum(c.get("completion_tokens", 0) for c in counts)
        return cls.of({"prompt_tokens": counts[0].get("prompt_tokens", 0), "completion_tokens": completion})


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChatLogprobs(BaseModel):
    """A chat choice's `logprobs` when asked for (common/logprobs.py)."""
    content: list[TokenLogprob] | None
    refusal: None


class TextLogprobs(BaseModel):
    """A completion choice's `logprobs` when asked for (common/logprobs.py)."""
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class CalledFunction(BaseModel):
    name: str
    arguments: str


class ToolCall(BaseModel):
    id: str
    type: Literal["function"]
    function: CalledFunction

    @classmethod
    def of(cls, call) -> "ToolCall":
        """A call read from a job's text (common/tool_parser.ToolCall)."""
        return cls(id=call.call_id, type="function", function=CalledFunction(name=call.name, arguments=call.arguments))


class AssistantMessage(BaseModel):
    role: Literal["assistant"]
    content: str | None = Field(description="null when the answer is only tool calls")
    refusal: None
    tool_calls: list[ToolCall] | None = None


# a generation that ended by itself after making tool calls ended to have them run
ChatFinishReason = FinishReason | Literal["tool_calls"]


class ChatChoice(BaseModel):
    index: int
    message: AssistantMessage
    logprobs: ChatLogprobs | None
    finish_reason: ChatFinishReason | None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class TextChoice(BaseModel):
    index: int
    text: str
    logprobs: TextLogprobs | None
    finish_reason: FinishReason | None


class TextCompletion(BaseModel):
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage


class TextCompletionChunk(BaseModel):
    """One `data:` line of a completion stream: a TextCompletion whose `usage` is absent, or null
    with `stream_options.include_usage` (one more chunk before `[DONE]` has no choices and the usage)."""
    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[TextChoice]
    usage: Usage | None = None


class FunctionDelta(BaseModel):
    name: str | None = None
    arguments: str


class ToolCallDelta(BaseModel):
    """A piece of a streamed tool call: the first names it (id, type, name), the next carry
    pieces of its arguments, which join to a JSON text."""
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: FunctionDelta


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None


class ChunkChoice(BaseModel):
    index: int
    delta: ChunkDelta
    logprobs: ChatLogprobs | None
    finish_reason: ChatFinishReason | None


class ChatCompletionChunk(BaseModel):
    """One `data:` line of a chat completion stream (a completion stream's lines are
    TextCompletion objects without `usage`). With `stream_options.include_usage`, every chunk
    has `usage: null` and one more chunk before `[DONE]` has no choices and the usage."""
    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class ModelState(BaseModel):
    """llmq's own field on a model object (OpenAI clients ignore it): where the model is loaded."""
    state: Literal["loaded", "loading", "cold"]
    workers: list[str]
    loading_by: str | None
    queued: int
    running: int
    load_s: float | None
    memory_mb: float | None


class Model(BaseModel):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    llmq: ModelState


class ModelList(BaseModel):
    object: Literal["list"]
    data: list[Model]


class File(BaseModel):
    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    filename: str
    purpose: Literal["batch", "batch_output"]
    expires_at: int | None
    status: Literal["processed"]
    status_details: None


class FileList(BaseModel):
    object: Literal["list"]
    data: list[File]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"]
    deleted: bool


class RequestCounts(BaseModel):
    total: int
    completed: int
    failed: int


class BatchUsage(BaseModel):
    input_tokens: int
    output_tokens: int
    total_tokens: int
    input_tokens_details: dict[str, int]
    output_tokens_details: dict[str, int]


class WebhookState(BaseModel):
    """The batch's webhook: the latest delivery's state ('waiting': the batch has not ended)."""
    url: str
    events: list[str]
    state: Literal["waiting", "pending", "delivered", "failed"]
    attempts: int
    last_status_code: int | None
    last_error: str | None
    deliveries: list[dict[str, Any]]


class Batch(BaseModel):
    id: str
    object: Literal["batch"]
    endpoint: str
    errors: dict[str, Any] | None
    input_file_id: str
    completion_window: str
    status: Literal["validating", "failed", "in_progress", "finalizing", "completed", "expired",
                    "cancelling", "cancelled"]
    output_file_id: str | None
    error_file_id: str | None
    created_at: int
    in_progress_at: int | None
    expires_at: int | None
    finalizing_at: int | None
    completed_at: int | None
    failed_at: int | None
    expired_at: int | None
    cancelling_at: int | None
    cancelled_at: int | None
    request_counts: RequestCounts
    metadata: dict[str, str] | None
    model: str | None
    usage: BatchUsage
    webhook: WebhookState | None


class BatchList(BaseModel):
    object: Literal["list"]
    data: list[Batch]
    first_id: str | None
    last_id: str | None
    has_more: bool


class ErrorDetail(BaseModel):
    """`param` and `code` are always there, except in the answer to a path no route matches."""
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIError(BaseModel):
    error: ErrorDetail


RESPONSES = (ChatCompletion, TextCompletion, ChatCompletionChunk, TextCompletionChunk, ModelList, FileList, FileDeleted,
             BatchList, OpenAIError)
