"""OpenAI's Responses objects and stream events as llmq builds them: the handlers build these models,
and /openapi.json describes the same models, so no shape is written twice.

A response is a job (api/responses_api.py): these models are views of a job record and of its log
(api/responses_events.py), never a second store.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from common.openai_models import Usage
from common.schemas import JobStatus

ResponseStatus = Literal["queued", "in_progress", "completed", "incomplete", "failed", "cancelled"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list[Any] = Field(default_factory=list)
    logprobs: list[Any] = Field(default_factory=list)


class OutputMessage(BaseModel):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    status: ItemStatus
    content: list[OutputText]


class FunctionCallItem(BaseModel):
    id: str
    type: Literal["function_call"] = "function_call"
    call_id: str
    name: str
    arguments: str
    status: ItemStatus


OutputItem = OutputMessage | FunctionCallItem


class InputTokensDetails(BaseModel):
    cached_tokens: int = 0
    cache_write_tokens: int = 0


class OutputTokensDetails(BaseModel):
    reasoning_tokens: int = 0


class ResponseUsage(BaseModel):
    input_tokens: int
    input_tokens_details: InputTokensDetails = Field(default_factory=InputTokensDetails)
    output_tokens: int
    output_tokens_details: OutputTokensDetails = Field(default_factory=OutputTokensDetails)
    total_tokens: int

    @classmethod
    def of(cls, record: dict) -> "ResponseUsage":
        usage = Usage.of(record)
        return cls(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
                   total_tokens=usage.total_tokens)


class ResponseError(BaseModel):
    code: str
    message: str


class IncompleteDetails(BaseModel):
    reason: Literal["max_output_tokens"]


class ResponseObject(BaseModel):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    completed_at: int | None = None
    status: ResponseStatus
    background: bool
    store: bool
    model: str
    instructions: str | None = None
    input: None = None  # OpenAI leaves it out too: GET .../input_items lists it
    output: list[OutputItem] = Field(default_factory=list)
    error: ResponseError | None = None
    incomplete_details: IncompleteDetails | None = None
    max_output_tokens: int | None = None
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    text: dict = Field(default_factory=lambda: {"format": {"type": "text"}})
    tool_choice: Any = "auto"
    tools: list[dict] = Field(default_factory=list)
    top_logprobs: int | None = None
    truncation: Literal["disabled", "auto"] = "disabled"
    metadata: dict[str, str] = Field(default_factory=dict)
    usage: ResponseUsage | None = None


class DeletedResponse(BaseModel):
    id: str
    object: Literal["response"] = "response"
    deleted: Literal[True] = True


class InputItemList(BaseModel):
    object: Literal["list"] = "list"
    data: list[dict]
    first_id: str | None
    last_id: str | None
    has_more: bool


# --- stream events ---------------------------------------------------------------------------
class _Event(BaseModel):
    sequence_number: int


class ResponseEvent(_Event):
    """The response as a whole: created, queued, in progress, and its last event."""
    type: Literal["response.created", "response.queued", "response.in_progress", "response.completed",
                  "response.incomplete", "response.failed"]
    response: ResponseObject


class OutputItemEvent(_Event):
    type: Literal["response.output_item.added", "response.output_item.done"]
    output_index: int
    item: OutputItem


class ContentPartEvent(_Event):
    type: Literal["response.content_part.added", "response.content_part.done"]
    item_id: str
    output_index: int
    content_index: int = 0
    part: OutputText


class OutputTextDelta(_Event):
    type: Literal["response.output_text.delta"] = "response.output_text.delta"
    item_id: str
    output_index: int
    content_index: int = 0
    delta: str
    logprobs: list[Any] = Field(default_factory=list)


class OutputTextDone(_Event):
    type: Literal["response.output_text.done"] = "response.output_text.done"
    item_id: str
    output_index: int
    content_index: int = 0
    text: str
    logprobs: list[Any] = Field(default_factory=list)


class ArgumentsDelta(_Event):
    type: Literal["response.function_call_arguments.delta"] = "response.function_call_arguments.delta"
    item_id: str
    output_index: int
    delta: str


class ArgumentsDone(_Event):
    type: Literal["response.function_call_arguments.done"] = "response.function_call_arguments.done"
    item_id: str
    output_index: int
    name: str
    arguments: str


StreamEvent = (ResponseEvent | OutputItemEvent | ContentPartEvent | OutputTextDelta | OutputTextDone
               | ArgumentsDelta | ArgumentsDone)
# the models /openapi.json describes (api/openapi_openai.py)
MODELS = (ResponseObject, DeletedResponse, InputItemList, ResponseEvent, OutputItemEvent, ContentPartEvent,
          OutputTextDelta, OutputTextDone, ArgumentsDelta, ArgumentsDone)


def response_status(record: dict) -> ResponseStatus:
    """The response's status for its job's."""
    status = JobStatus(record["status"])
    if status is JobStatus.SUCCEEDED:
        return "incomplete" if record.get("finish_reason") == "length" else "completed"
    return {JobStatus.QUEUED: "queued", JobStatus.RUNNING: "in_progress", JobStatus.CANCELLED: "cancelled",
            JobStatus.FAILED: "failed", JobStatus.EXPIRED: "failed"}[status]
