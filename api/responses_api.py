"""OpenAI's Responses API over llmq's jobs: `/v1/responses`.

A response is a job with a few more fields in its record (common/responses_request.py): created
through the same admission, queue and workers, durable in Redis, cancelled like any job, and its
stream replayed from the job's log (api/responses_stream.py) by whichever API process is asked.
A background response is just a job that nobody waits on: `GET` polls it, `GET ?stream=true&
starting_after=N` resumes its events. A streaming client that leaves a background response does
not cancel it; one that leaves a foreground stream does (`cancel_on_disconnect`), as on chat.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

from flask import Blueprint, Response, jsonify, request

from api.auth import current_key, may_access
from api.jobs import json_body
from api.logprob_engines import check_logprobs
from api.job_answers import job_error, log_events, openai_error, wait_for_end
from api.responses_stream import ResponseStream, job_id_of, response_object
from api.services import Services, services
from api.sse import streaming_response
from api.stream_limits import StreamSlot
from api.submit import Followed, submit_followed, submit_job
from common.errors import ApiError
from common.responses_models import DeletedResponse, InputItemList
from common.responses_request import ResponseCreate, ResponseRecord, items_as_messages
from common.schemas import JobStatus

bp = Blueprint("responses", __name__, url_prefix="/v1/responses")
_ITEM_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco"}
CANCEL_WAIT_S = 5.0  # a running job's worker stops it within a step or two: the answer says cancelled


@bp.post("")
def create_response():
    svc = services()
    body = ResponseCreate.model_validate(json_body())
    body.check()
    conversation = _history(svc, body.previous_response_id) + items_as_messages(body.input_items())
    job = body.job_request(conversation)
    check_logprobs(svc, job)  # a 400 naming the engine's limit
    extra = {"response": ResponseRecord.of(body, conversation).model_dump()}
    if body.background and not body.stream:
        record = submit_job(svc, job, extra).record
        return _json(response_object(record))
    with svc.streams.acquire(current_key()).guard() as slot:
        followed = submit_followed(svc, job, slot, extra)
        record = followed.record
        if body.stream:
            return _event_response(svc, record, -1, slot, cancel_on_leave=not body.background, followed=followed)
    try:
        record = wait_for_end(svc, record, followed=followed)
    finally:
        slot.release()
    if record["status"] in (JobStatus.FAILED, JobStatus.EXPIRED):
        raise job_error(record)
    return _json(response_object(record))


@bp.get("/<response_id>")
def get_response(response_id: str):
    svc = services()
    record = _record_or_404(svc, response_id)
    if _choice("stream", ("true", "false"), "false") == "false":
        return _json(response_object(record))
    after = request.args.get("starting_after") or "-1"
    try:
        starting_after = int(after)
    except ValueError:
        raise ApiError(400, "invalid_value", f"starting_after={after!r} is not a sequence number",
                       param="starting_after") from None
    with svc.streams.acquire(current_key()).guard() as slot:
        return _event_response(svc, record, starting_after, slot, cancel_on_leave=False)


@bp.post("/<response_id>/cancel")
def cancel_response(response_id: str):
    svc = services()
    record = _record_or_404(svc, response_id)
    if not (record.get("response") or {}).get("background"):
        raise ApiError(400, "invalid_request", "only background responses can be cancelled")
    if JobStatus(record["status"]).terminal:
        if record["status"] != JobStatus.CANCELLED:
            raise ApiError(409, "conflict", f"response {response_id} has already ended ({response_object(record).status})")
        return _json(response_object(record))
    svc.jobs.cancel(record["id"])
    return _json(response_object(wait_for_end(svc, record, timeout=CANCEL_WAIT_S)))


@bp.delete("/<response_id>")
def delete_response(response_id: str):
    svc = services()
    record = _record_or_404(svc, response_id)
    if not JobStatus(record["status"]).terminal:
        svc.jobs.cancel(record["id"])
        wait_for_end(svc, record, timeout=CANCEL_WAIT_S)
    svc.jobs.delete(record["id"])
    return _json(DeletedResponse(id=response_id))


@bp.get("/<response_id>/input_items")
def list_input_items(response_id: str):
    record = _record_or_404(services(), response_id)
    items = [{**item, "id": item.get("id") or f"{_ITEM_PREFIX[item['type']]}_{record['id'][:24]}_{i}"}
             for i, item in enumerate(record["response"]["input_items"])]
    if _choice("order", ("asc", "desc"), "desc") == "desc":
        items.reverse()
    after = request.args.get("after")
    if after:
        ids = [item["id"] for item in items]
        items = items[ids.index(after) + 1:] if after in ids else []
    limit = _limit(request.args.get("limit", "20"))
    page = items[:limit]
    return _json(InputItemList(data=page, first_id=page[0]["id"] if page else None,
                               last_id=page[-1]["id"] if page else None, has_more=len(items) > limit))


def _history(svc: Services, previous: str | None) -> list[dict]:
    """The conversation a chained response continues: the previous one's, then its output."""
    if previous is None:
        return []
    record = _record_or_404(svc, previous, param="previous_response_id")
    if not JobStatus(record["status"]).terminal:
        raise ApiError(400, "invalid_value", f"response {previous} has not finished yet",
                       param="previous_response_id")
    output = [item.model_dump() for item in response_object(record).output]
    return record["response"]["conversation"] + items_as_messages(output)


def _record_or_404(svc: Services, rid: str, param: str | None = None) -> dict:
    """The response as its owner may see it: another key's, a plain job's, an unstored one's
    or an unknown one's id are all 404."""
    job_id = job_id_of(rid)
    record = svc.jobs.get(job_id) if job_id else None
    if (record is None or not may_access(record) or not record.get("response")
            or not record["response"].get("store", True)):
        raise ApiError(404, "not_found", f"no response {rid!r} (unknown, not stored, or expired)", param=param)
    return record


def _choice(name: str, allowed: tuple[str, ...], default: str) -> str:
    value = request.args.get(name, default)
    if value not in allowed:
        raise ApiError(400, "invalid_value", f"{name}={value!r}: one of {', '.join(allowed)}", param=name)
    return value


def _limit(raw: str) -> int:
    try:
        limit = int(raw)
    except ValueError:
        limit = 0
    if not 1 <= limit <= 100:
        raise ApiError(400, "invalid_value", f"limit={raw!r}: a whole number from 1 to 100", param="limit")
    return limit


def _event_response(svc: Services, record: dict, starting_after: int, slot: StreamSlot,
                    cancel_on_leave: bool, followed: Followed | None = None) -> Response:
    return streaming_response(_events(svc, record, starting_after, cancel_on_leave, followed), slot,
                              {"Connection": "keep-alive", "X-LLMQ-Job-Id": record["id"]})


def _events(svc: Services, record: dict, starting_after: int, cancel_on_leave: bool,
            followed: Followed | None = None) -> Iterator[str]:
    """The response's events after `starting_after`, numbered from the whole log (see
    api/responses_stream.py); its place in line as comments while it waits."""
    stream = ResponseStream(record)
    finished = False

    def send(events) -> Iterator[str]:
        for event in events:
            if event.sequence_number > starting_after:
                # no `id:` lines: the openai client would then read each comment as an empty event
                yield f"event: {event.type}\ndata: {event.model_dump_json()}\n\n"
    try:
        yield from send(stream.opening())
        yield ": open\n\n"  # the first bytes go out at once, even on a resume past everything so far
        with contextlib.closing(log_events(svc, record["id"], every_attempt=True, followed=followed)) as log:
            for event, data in log:
                if event == "comment":
                    yield data
                    continue
                if event == "chunk":
                    events = stream.on_chunk(data["text"], data.get("logprobs"))
                elif event == "restart":
                    events = stream.on_restart()
                else:  # done
                    final = svc.jobs.get(record["id"]) or {**record, **data, "status": JobStatus.EXPIRED}
                    events = stream.on_done(final)
                if stream.diverged:  # numbered events already sent cannot be taken back
                    yield _error_event("the worker running this response was lost and its new attempt "
                                       "answers differently; retrieve the response for its output")
                    return
                yield from send(events)
                if event == "done":
                    finished = True
                    return
    finally:
        if not finished and cancel_on_leave and svc.settings.cancel_on_disconnect:
            with contextlib.suppress(Exception):
                svc.jobs.cancel(record["id"])


def _error_event(message: str) -> str:
    return f"event: error\ndata: {json.dumps({'type': 'error', 'code': 'worker_lost', 'message': message})}\n\n"


def _json(model) -> Response:
    return jsonify(model.model_dump(mode="json"))


@bp.errorhandler(Exception)
def _openai_error(exc: Exception):
    return openai_error(exc)
