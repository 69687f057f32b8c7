"""OpenAI-compatible endpoints: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.

Requests become ordinary jobs (same admission, cache, queue and workers as `/v1/jobs`); the answer
is read from the job's event log: waited for whole, or relayed as `chat.completion.chunk`s ending in
`data: [DONE]`. A streaming client that disconnects cancels its job (`cancel_on_disconnect`).
Errors on this blueprint use OpenAI's body, `{"error": {"message", "type", "param", "code"}}`.
"""
from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator

import redis
from flask import Blueprint, Response, jsonify
from kombu.exceptions import OperationalError
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException

from api.auth import current_key
from common.errors import ApiError, describe_validation
from api.jobs import json_body
from common.demand import model_state
from common.openai_format import (Surface, error_body, sse_data, tool_call_delta, tool_calling,
                                  tool_calls_reason)
from common.tool_parser import TextPiece, ToolCallStream
from common.openai_schemas import ChatCompletionRequest, CompletionRequest
from api.services import Services, services
from api.sse import job_event_stream, streaming_response
from api.stream_limits import StreamSlot
from api.submit import submit_job
from common.schemas import JobStatus

log = logging.getLogger(__name__)
bp = Blueprint("openai", __name__, url_prefix="/v1")

CHAT, COMPLETION = Surface(chat=True), Surface(chat=False)
_PARAM_BY_CODE = {"model_not_found": "model"}  # llmq errors that are about one parameter


@bp.post("/chat/completions")
def chat_completions():
    return _complete(CHAT, ChatCompletionRequest.model_validate(json_body()))


@bp.post("/completions")
def completions():
    return _complete(COMPLETION, CompletionRequest.model_validate(json_body()))


@bp.get("/models")
def list_models():
    return jsonify({"object": "list", "data": _model_cards(services())})


@bp.get("/models/<path:model>")
def get_model(model: str):
    card = next((c for c in _model_cards(services()) if c["id"] == model), None)
    if card is None:
        raise ApiError(404, "model_not_found", f"model {model!r} is not served here", param="model")
    return jsonify(card)


def _complete(surface: Surface, body: ChatCompletionRequest | CompletionRequest) -> Response:
    """A stream, or a request waiting for its whole answer, holds a stream slot (api/stream_limits.py)."""
    from api import n_choices  # it imports this module

    if n_choices.wants_choices(body):  # n > 1 or logprobs
        return n_choices.complete_choices(surface, body)
    svc = services()
    with svc.streams.acquire(current_key()).guard() as slot:
        _, record = submit_job(svc, body.job_request())
        if body.stream:
            return _stream_response(svc, surface, record, body.include_usage, slot)
    try:
        record = wait_for_end(svc, record)
    finally:
        slot.release()
    if record["status"] != JobStatus.SUCCEEDED:
        raise job_error(record)
    response = jsonify(surface.response(record))
    response.headers["X-LLMQ-Job-Id"] = record["id"]
    return response


def wait_for_end(svc: Services, record: dict) -> dict:
    """The job's record once it has ended."""
    if JobStatus(record["status"]).terminal:
        return record
    with contextlib.closing(job_event_stream(svc, record["id"], None, places=False)) as events:
        for _, event, _ in events:
            if event == "done":
                break
    return svc.store.get(record["id"]) or {**record, "status": JobStatus.EXPIRED}


def _stream_response(svc: Services, surface: Surface, record: dict, include_usage: bool,
                     slot: StreamSlot) -> Response:
    return streaming_response(_openai_chunks(svc, surface, record, include_usage), slot,
                              {"Connection": "keep-alive", "X-LLMQ-Job-Id": record["id"]})


def _openai_chunks(svc: Services, surface: Surface, record: dict, include_usage: bool) -> Iterator[str]:
    """The job's events as OpenAI chunks; while it waits in the queue, its place as an SSE
    comment (`: queued {"queue_position": 3, ...}`), which OpenAI clients skip. Leaving before
    the end (the client disconnected: Flask closes this generator) cancels the job when
    `cancel_on_disconnect` is set."""
    extra = {"usage": None} if include_usage else {}
    calling = tool_calling(record) if surface.chat else None
    calls = ToolCallStream(record["id"], calling) if calling else None
    finished = False
    try:
        # the first bytes go out at once, so the client knows its stream is open however long it waits
        yield sse_data({**surface.chunk(record, role=True), **extra}) if surface.chat else ": open\n\n"
        with contextlib.closing(log_events(svc, record["id"])) as events:
            for event, data in events:
                if event == "comment":
                    yield data
                elif event == "chunk" and calls:
                    yield from _tool_chunks(surface, record, calls.feed(data["text"]), extra)
                elif event == "chunk":
                    yield sse_data({**surface.chunk(record, text=data["text"]), **extra})
                elif event == "restart":  # a lost worker's job not continued: sent chunks stay sent
                    yield sse_data(error_body(500, "the worker running this job was lost; "
                                                   "retry the request", "worker_lost"))
                    return
                elif event == "done":
                    finished = True
                    if calls:
                        yield from _tool_chunks(surface, record, calls.finish(), extra)
                        data = {**data, "finish_reason": tool_calls_reason(data["finish_reason"])
                                if calls.calls else data["finish_reason"]}
                    yield from _stream_end(surface, record, data, include_usage, extra)
                    return
    finally:
        if not finished and svc.settings.cancel_on_disconnect:
            _cancel_after_disconnect(svc, record["id"])


def log_events(svc: Services, job_id: str) -> Iterator[tuple[str, dict | str]]:
    """The job's log for an OpenAI stream, from its start: (event, data), where a heartbeat or
    the job's place in line while it waits is ("comment", an SSE comment), which clients skip."""
    with contextlib.closing(job_event_stream(svc, job_id, None)) as events:
        for _, event, data in events:
            if event == "heartbeat":
                yield "comment", ": keep-alive\n\n"
            elif event == "queued":
                yield "comment", f": queued {json.dumps(data)}\n\n"
            else:
                yield event, data


def _tool_chunks(surface: Surface, record: dict, events: list, extra: dict) -> Iterator[str]:
    """The chunks of a tool-offering job's stream: its text as content, its calls as
    `tool_calls` deltas (common/tool_parser.py)."""
    for event in events:
        if isinstance(event, TextPiece):
            yield sse_data({**surface.chunk(record, text=event.text), **extra})
        elif (delta := tool_call_delta(event)) is not None:
            yield sse_data({**surface.chunk(record, tool_call=delta), **extra})


def _stream_end(surface: Surface, record: dict, done: dict, include_usage: bool, extra: dict):
    if done["status"] == JobStatus.SUCCEEDED:
        yield sse_data({**surface.chunk(record, finish_reason=done["finish_reason"]), **extra})
        if include_usage:
            yield sse_data(surface.usage_chunk(record, done["usage"]))
    else:
        error = job_error({**record, **done})
        yield sse_data(error_body(error.status, error.message, error.type))
    yield sse_data("[DONE]")


def _cancel_after_disconnect(svc: Services, job_id: str) -> None:
    try:
        outcome = svc.store.cancel(job_id)
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


def _model_cards(svc: Services) -> list[dict]:
    """OpenAI's model objects for every catalog model (and any a live worker serves), each with
    an `llmq` field OpenAI clients ignore: whether it is loaded, who holds it, its jobs."""
    workers = svc.registry.live()
    return [{"id": d.model, "object": "model", "created": 0, "owned_by": "llmq", "llmq": model_state(d, workers)}
            for d in svc.model_demands(workers)]


@bp.errorhandler(Exception)
def _openai_error(exc: Exception):
    """Every failure on this blueprint in OpenAI's error shape; /v1/jobs keeps its own."""
    return openai_error(exc)


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
