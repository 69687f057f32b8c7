"""Job records as clients see them: the `Job` model /openapi.json describes, built from a record."""
from __future__ import annotations

from typing import Any, Literal

from flask import url_for
from pydantic import BaseModel, Field
from pydantic.json_schema import SkipJsonSchema

from common.openai_format import tool_calling
from common.openai_models import ToolCall, Usage, WebhookState
from common.schemas import FinishReason, JobStatus
from common.tool_parser import read_calls


def _absent(description: str) -> Any:
    """An optional field that is left out, never null, when it does not apply."""
    return Field(None, description=description, json_schema_extra=lambda schema: schema.pop("default"))


class JobWebhook(WebhookState):
    """The job's webhook: the latest delivery's state ('waiting': no event yet), every delivery below."""
    events: list[Literal["start", "completed"]]


class Job(BaseModel):
    id: str
    object: Literal["job"]
    status: JobStatus
    model: str | None
    created_at: float | None
    started_at: float | None
    finished_at: float | None
    text: str
    finish_reason: FinishReason | None
    error: dict | None
    usage: Usage
    cached: bool
    cancel_requested: bool
    attempts: int
    batch_size_max: int | None
    priority: Literal["high", "normal", "low"]
    owner: str | None
    queue_deadline: float | None
    run_timeout_s: float | None
    coalesced: bool = Field(description="this identical request shares another job's generation (coalescing)")
    logprobs: list[dict] | SkipJsonSchema[None] = _absent(
        "only for a job that asked for logprobs, once it has ended: {token, logprob, bytes, top_logprobs} per token")
    links: dict[str, str]
    tool_calls: list[ToolCall] | SkipJsonSchema[None] = _absent(
        "once a job that offered tools has ended: the calls read from its text (`text` is still the whole text)")
    webhook: JobWebhook | SkipJsonSchema[None] = _absent("only for a job that named a webhook")
    queue_position: int | SkipJsonSchema[None] = _absent(
        "while queued: 1 = next to start, in the fair-share order (priority, then keys by fair share, then arrival)")
    estimated_start: float | SkipJsonSchema[None] = _absent("while queued: epoch seconds")
    estimated_finish: float | SkipJsonSchema[None] = _absent("while queued: epoch seconds")


def job_view(record: dict, webhook: dict | None = None, place: dict | None = None) -> dict:
    """The job as JSON: with its `webhook` state and, while it waits, its `place` in line
    (common/eta.place_fields) when given."""
    job_id = record["id"]
    optional: dict[str, Any] = {}
    if "logprobs" in record:  # asked for, once ended
        optional["logprobs"] = record["logprobs"]
    calling = tool_calling(record)
    if calling and JobStatus(record["status"]).terminal:
        optional["tool_calls"] = [ToolCall.of(call) for call in read_calls(job_id, calling, record.get("text", ""))[1]]
    if webhook is not None:
        optional["webhook"] = webhook
    job = Job(
        id=job_id, object="job", status=record["status"], model=record.get("model"),
        created_at=record.get("created_at"), started_at=record.get("started_at"),
        finished_at=record.get("finished_at"), text=record.get("text", ""),
        finish_reason=record.get("finish_reason"), error=record.get("error"), usage=Usage.of(record),
        cached=record.get("cached", False), cancel_requested=record.get("cancel_requested", False),
        attempts=record.get("attempts", 0), batch_size_max=record.get("batch_size_max"),
        priority=record.get("priority", "normal"), owner=record.get("owner"),
        queue_deadline=record.get("queue_deadline"), run_timeout_s=record.get("run_timeout_s"),
        # whether it rides on an identical job's generation; that job's id is not shown, since
        # with auth off a job id is enough to cancel a job
        coalesced=bool(record.get("coalesced_into")),
        links={"self": url_for("jobs.get_job", job_id=job_id),
               "events": url_for("jobs.stream_job_events", job_id=job_id),
               "cancel": url_for("jobs.cancel_job", job_id=job_id)},
        **optional, **(place or {}))
    return job.model_dump(mode="json", exclude_unset=True)
