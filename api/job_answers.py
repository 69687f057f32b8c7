"""What the OpenAI routes share about a job's answer: waiting for it, reading its log as an
OpenAI stream reads it, cancelling it when its client leaves, and the errors it ends in, in
OpenAI's shape. Chat and completions (api/openai_api.py), several choices (api/n_choices.py) and
responses (api/responses_api.py) all answer from a job this way."""
from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Iterator

import redis
from flask import jsonify
from kombu.exceptions import OperationalError
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException

from api.services import Services
from api.sse import job_event_stream
from api.submit import Followed
from common.errors import ApiError, describe_validation
from common.openai_format import error_body, sse_data
from common.schemas import JobStatus

log = logging.getLogger(__name__)
_PARAM_BY_CODE = {"model_not_found": "model"}  # llmq errors that are about one parameter


def wait_for_end(svc: Services, record: dict, timeout: float | None = None,
                 followed: Followed | None = None) -> dict:
    """The job's record once it has ended (or as it is after `timeout` seconds); `followed`: as
    in `job_event_stream`."""
    if JobStatus(record["status"]).terminal:
        return record
    deadline = None if timeout is None else time.monotonic() + timeout
    with contextlib.closing(job_event_stream(svc, record["id"], None, places=False, followed=followed)) as events:
        for _, event, _ in events:
            if event == "done" or (deadline is not None and time.monotonic() > deadline):
                break
    return svc.jobs.get(record["id"]) or {**record, "status": JobStatus.EXPIRED}


def log_events(svc: Services, job_id: str, every_attempt: bool = False,
               followed: Followed | None = None) -> Iterator[tuple[str, dict | str]]:
    """The job's log for an OpenAI stream, from its start: (event, data), where a heartbeat or
    the job's place in line while it waits is ("comment", an SSE comment), which clients skip.
    `followed`: as in `job_event_stream`."""
    with contextlib.closing(job_event_stream(svc, job_id, None, every_attempt=every_attempt,
                                             followed=followed)) as events:
        for _, event, data in events:
            if event == "heartbeat":
                yield "comment", ": keep-alive\n\n"
            elif event == "queued":
                yield "comment", f": queued {json.dumps(data)}\n\n"
            else:
                yield event, data


WORKER_LOST = ("the worker running this job was lost and its new attempt answers differently than "
               "what was sent; retry the request")


def worker_lost_chunk() -> str:
    """The last chunk of a chat or completion stream that cannot go on (common/attempts.py)."""
    return sse_data(error_body(500, WORKER_LOST, "worker_lost"))


def cancel_after_disconnect(svc: Services, job_id: str) -> None:
    try:
        outcome = svc.jobs.cancel(job_id)
        log.info("job %s: client left its stream; cancel -> %s", job_id, outcome, extra={"job_id": job_id})
    except redis.RedisError as exc:
        log.warning("job %s: could not cancel after the client left: %s", job_id, exc)


def job_error(record: dict) -> ApiError:
    """Why a job has no answer, as an error of this surface."""
    status, error = record.get("status"), record.get("error") or {}
    if status == JobStatus.CANCELLED:
        return ApiError(409, "job_cancelled", f"job {record['id']} was cancelled before it finished")
    if error.get("type") == "invalid_request":  # the engine refused it, e.g. an unenforceable schema
        return ApiError(400, "invalid_request", error.get("message", "invalid request"))
    if status == JobStatus.EXPIRED:  # its deadline passed: the service is too busy now, not broken
        return ApiError(503, error.get("type") or "expired",
                        error.get("message") or f"job {record['id']} did not finish in time", {"Retry-After": "5"})
    return ApiError(500, error.get("type") or "job_failed",
                    error.get("message") or f"job {record['id']} ended as {status}")


def openai_error(exc: Exception, keep: tuple[int, ...] = ()):
    """`exc` as an OpenAI error response. OpenAI answers 400 for invalid values and prompts
    beyond the context, where llmq's own API says 413 or 422; statuses in `keep` stay as they
    are (an upload over the size limit is a 413 at OpenAI too)."""
    headers: dict = {}
    if isinstance(exc, ApiError):
        status = 400 if exc.status in (413, 422) and exc.status not in keep else exc.status
        message, code, headers = exc.message, exc.type, exc.headers
        param = exc.extra.get("param") or _PARAM_BY_CODE.get(code)
    elif isinstance(exc, ValidationError):
        message, details = describe_validation(exc)
        status, code, param = 400, "invalid_value", details[0]["field"] if details else None
    elif isinstance(exc, HTTPException):
        status, message, code, param = exc.code or 400, exc.description or exc.name, None, None
    elif isinstance(exc, (redis.RedisError, OperationalError)):
        log.warning("backend unavailable: %s", exc)
        status, code, param, headers = 503, "service_unavailable", None, {"Retry-After": "5"}
        message = "the job store (Redis) is unreachable; try again shortly"
    else:
        log.exception("unhandled error")
        status, message, code, param = 500, "internal error; it has been logged", "internal_error", None
    response = jsonify(error_body(status, message, code, param))
    response.status_code = status
    response.headers.update(headers)
    return response
