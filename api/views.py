"""Job records as clients see them."""
from __future__ import annotations

from flask import url_for

from common.openai_format import tool_calling
from common.schemas import JobStatus
from common.tool_parser import read_calls


def job_view(record: dict) -> dict:
    view = _view(record)
    calling = tool_calling(record)
    if calling and JobStatus(record["status"]).terminal:
        view["tool_calls"] = [{"id": c.call_id, "type": "function",
                               "function": {"name": c.name, "arguments": c.arguments}}
                              for c in read_calls(record["id"], calling, record.get("text", ""))[1]]
    return view


def _view(record: dict) -> dict:
    job_id = record["id"]
    prompt, completion = record.get("prompt_tokens", 0), record.get("completion_tokens", 0)
    return {
        "id": job_id,
        "object": "job",
        "status": record["status"],
        "model": record.get("model"),
        "created_at": record.get("created_at"),
        "started_at": record.get("started_at"),
        "finished_at": record.get("finished_at"),
        "text": record.get("text", ""),
        "finish_reason": record.get("finish_reason"),
        "error": record.get("error"),
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion},
        "cached": record.get("cached", False),
        "cancel_requested": record.get("cancel_requested", False),
        "attempts": record.get("attempts", 0),
        "batch_size_max": record.get("batch_size_max"),
        "priority": record.get("priority", "normal"),
        "owner": record.get("owner"),
        "queue_deadline": record.get("queue_deadline"),
        "run_timeout_s": record.get("run_timeout_s"),
        # whether it rides on an identical job's generation; that job's id is not shown, since
        # with auth off a job id is enough to cancel a job
        "coalesced": bool(record.get("coalesced_into")),
        **({"logprobs": record["logprobs"]} if "logprobs" in record else {}),  # asked for, once ended
        "links": {
            "self": url_for("jobs.get_job", job_id=job_id),
            "events": url_for("jobs.stream_job_events", job_id=job_id),
            "cancel": url_for("jobs.cancel_job", job_id=job_id),
        },
    }
