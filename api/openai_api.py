"""OpenAI-compatible endpoints: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.

Requests become ordinary jobs (same admission, cache, queue and workers as `/v1/jobs`); the answer
is read from the job's event log: waited for whole, or relayed as `chat.completion.chunk`s ending in
`data: [DONE]`. A streaming client that disconnects cancels its job (`cancel_on_disconnect`).
Errors on this blueprint use OpenAI's body, `{"error": {"message", "type", "param", "code"}}`.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from flask import Blueprint, Response, jsonify

from api.n_choices import complete_choices, wants_choices
from api.auth import current_key
from api.job_answers import (cancel_after_disconnect, job_error, log_events, openai_error,
                             wait_for_end, worker_lost_chunk)
from common.errors import ApiError
from api.jobs import json_body
from common.demand import model_state
from common.openai_format import (StreamChunks, Surface, error_body, sse_data, tool_calling,
                                  tool_calls_reason)
from common.attempts import AttemptJoin
from common.tool_parser import TextPiece, ToolCallStream
from common.openai_models import Model, ModelList
from common.openai_schemas import ChatCompletionRequest, CompletionRequest
from api.services import Services, services
from api.sse import streaming_response
from api.stream_limits import StreamSlot
from api.submit import Followed, submit_followed
from common.schemas import JobStatus

bp = Blueprint("openai", __name__, url_prefix="/v1")

CHAT, COMPLETION = Surface(chat=True), Surface(chat=False)


@bp.post("/chat/completions")
def chat_completions():
    return _complete(CHAT, ChatCompletionRequest.model_validate(json_body()))


@bp.post("/completions")
def completions():
    return _complete(COMPLETION, CompletionRequest.model_validate(json_body()))


@bp.get("/models")
def list_models():
    return jsonify(ModelList(object="list", data=_model_cards(services())).model_dump())


@bp.get("/models/<path:model>")
def get_model(model: str):
    card = next((c for c in _model_cards(services()) if c.id == model), None)
    if card is None:
        raise ApiError(404, "model_not_found", f"model {model!r} is not served here", param="model")
    return jsonify(card.model_dump())


def _complete(surface: Surface, body: ChatCompletionRequest | CompletionRequest) -> Response:
    """A stream, or a request waiting for its whole answer, holds a stream slot (api/stream_limits.py)."""
    if wants_choices(body):  # n > 1 or logprobs
        return complete_choices(surface, body)
    svc = services()
    with svc.streams.acquire(current_key()).guard() as slot:
        followed = submit_followed(svc, body.job_request(), slot)
        if body.stream:
            return _stream_response(svc, surface, followed, body.include_usage, slot)
    try:
        record = wait_for_end(svc, followed.record, followed=followed)
    finally:
        slot.release()
    if record["status"] != JobStatus.SUCCEEDED:
        raise job_error(record)
    response = jsonify(surface.response(record))
    response.headers["X-LLMQ-Job-Id"] = record["id"]
    return response


def _stream_response(svc: Services, surface: Surface, followed: Followed, include_usage: bool,
                     slot: StreamSlot) -> Response:
    return streaming_response(_openai_chunks(svc, surface, followed, include_usage), slot,
                              {"Connection": "keep-alive", "X-LLMQ-Job-Id": followed.record["id"]})


def _openai_chunks(svc: Services, surface: Surface, followed: Followed, include_usage: bool) -> Iterator[str]:
    """The job's events as OpenAI chunks; while it waits in the queue, its place as an SSE
    comment (`: queued {"queue_position": 3, ...}`), which OpenAI clients skip. Leaving before
    the end (the client disconnected: Flask closes this generator) cancels the job when
    `cancel_on_disconnect` is set. A job that had to start over after its worker was lost goes on
    unseen where it can (common/attempts.py), else ends with a `worker_lost` error chunk."""
    record = followed.record
    chunks = surface.stream(record, include_usage)
    calling = tool_calling(record) if surface.chat else None
    calls = ToolCallStream(record["id"], calling) if calling else None
    attempts, shown, finished = AttemptJoin(), False, False
    try:
        # the first bytes go out at once, so the client knows its stream is open however long it waits
        yield sse_data(chunks.role()) if surface.chat else ": open\n\n"
        with contextlib.closing(log_events(svc, record["id"], followed=followed)) as events:
            for event, data in events:
                if event == "comment":
                    yield data
                elif event == "chunk":
                    new = attempts.take(data["text"])
                    if attempts.diverged:
                        yield worker_lost_chunk()
                        return
                    if new is None:
                        continue
                    pieces = calls.feed(new[0]) if calls else [TextPiece(new[0])]
                    for chunk in _content_chunks(chunks, pieces):
                        shown = True
                        yield chunk
                elif event == "restart":  # the job started over (its log says why)
                    attempts.restart(shown)
                    if calls and not shown:
                        calls = ToolCallStream(record["id"], calling)
                elif event == "done":
                    attempts.end()
                    if attempts.diverged:
                        yield worker_lost_chunk()
                        return
                    finished = True
                    if calls:
                        yield from _content_chunks(chunks, calls.finish())
                        data = {**data, "finish_reason": tool_calls_reason(data["finish_reason"])
                                if calls.calls else data["finish_reason"]}
                    yield from _stream_end(chunks, record, data, include_usage)
                    return
    finally:
        if not finished and svc.settings.cancel_on_disconnect:
            cancel_after_disconnect(svc, record["id"])


def _content_chunks(chunks: StreamChunks, events: list) -> Iterator[str]:
    """The chunks of a job's stream: its text as content, its calls (where it offers tools) as
    `tool_calls` deltas (common/tool_parser.py)."""
    for event in events:
        if isinstance(event, TextPiece):
            yield sse_data(chunks.text(event.text))
        elif (chunk := chunks.tool_call(event)) is not None:
            yield sse_data(chunk)


def _stream_end(chunks: StreamChunks, record: dict, done: dict, include_usage: bool):
    if done["status"] == JobStatus.SUCCEEDED:
        yield sse_data(chunks.end(done["finish_reason"]))
        if include_usage:
            yield sse_data(chunks.usage(done["usage"]))
    else:
        error = job_error({**record, **done})
        yield sse_data(error_body(error.status, error.message, error.type))
    yield sse_data("[DONE]")


def _model_cards(svc: Services) -> list[Model]:
    """OpenAI's model objects for every catalog model (and any a live worker serves), each with
    an `llmq` field OpenAI clients ignore: whether it is loaded, who holds it, its jobs."""
    workers = svc.registry.live()
    return [Model(id=d.model, object="model", created=0, owned_by="llmq", llmq=model_state(d, workers))
            for d in svc.model_demands(workers)]


@bp.errorhandler(Exception)
def _openai_error(exc: Exception):
    """Every failure on this blueprint in OpenAI's error shape; /v1/jobs keeps its own."""
    return openai_error(exc)
