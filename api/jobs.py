"""The jobs API: submit, read, stream, cancel."""
from __future__ import annotations

import json

from flask import Blueprint, jsonify, request, url_for

from api.auth import current_key, may_access
from common.errors import ApiError
from api.eta import queue_eta
from api.services import services
from api.sse import job_event_stream, sse_response, stream_id
from api.logprob_engines import check_logprobs
from api.submit import submit_followed, submit_job
from api.views import job_view
from common.job_record import is_overdue
from common.jobs import CancelOutcome
from common.schemas import JobRequest, JobStatus
from common.webhooks import webhook_events_of

bp = Blueprint("jobs", __name__, url_prefix="/v1/jobs")


def json_body() -> object:
    """The request body as JSON, or a 400 that says why not."""
    raw = request.get_data(cache=True)
    if not raw:
        raise ApiError(400, "invalid_request_error", "request body is empty; send a JSON object")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid_request_error", f"request body is not valid JSON: {exc}")


def _record_or_404(job_id: str) -> dict:
    """The job as its owner may see it: another key's job is 404, like an unknown one. A queued
    job past its deadline is expired here, so it shows as such even when no worker runs."""
    store = services().jobs
    record = store.get(job_id)
    if record is not None and is_overdue(record) and store.expire_if_overdue(job_id):
        record = store.get(job_id)
    if record is None or not may_access(record):
        raise ApiError(404, "not_found", f"no job {job_id!r} (unknown, or expired)")
    return record


@bp.post("")
def create_job():
    req = JobRequest.model_validate(json_body())
    check_logprobs(services(), req)
    if req.stream:  # answer with the job's event stream right away (same events as .../events)
        with services().streams.acquire(current_key()).guard() as slot:
            followed = submit_followed(services(), req, slot)
            record = followed.record
            response = sse_response(job_event_stream(services(), record["id"], None, followed=followed), slot)
        response.headers["X-Job-Id"] = record["id"]
    else:
        status, record, ahead = submit_job(services(), req, place=True)
        response = jsonify(_full_view(record, ahead))
        response.status_code = status
    response.headers["Location"] = url_for("jobs.get_job", job_id=record["id"])
    return response


@bp.get("/<job_id>")
def get_job(job_id: str):
    record = _record_or_404(job_id)
    return jsonify(_full_view(record))


def _full_view(record: dict, ahead: int | None = None) -> dict:
    """The job, with its webhook deliveries when it asked for a webhook, and its place in line
    while it waits (`ahead`: the jobs ahead of it, when its admission read them already)."""
    svc = services()
    webhook = (svc.webhooks.view(record["id"], record["webhook"], webhook_events_of(record))
               if record.get("webhook") else None)
    return job_view(record, webhook, queue_eta(svc, record, ahead))


@bp.get("/<job_id>/events")
def stream_job_events(job_id: str):
    _record_or_404(job_id)
    last_event_id = request.headers.get("Last-Event-ID") or request.args.get("last_event_id")
    if last_event_id:
        try:
            stream_id(last_event_id)
        except ValueError:
            raise ApiError(400, "invalid_last_event_id", f"Last-Event-ID {last_event_id!r} is not an "
                           "event id of this stream (they look like 1733356800000-0)") from None
    with services().streams.acquire(current_key()).guard() as slot:
        return sse_response(job_event_stream(services(), job_id, last_event_id), slot)


@bp.delete("/<job_id>")
@bp.post("/<job_id>/cancel")
def cancel_job(job_id: str):
    svc = services()
    _record_or_404(job_id)
    outcome = svc.jobs.cancel(job_id)
    if outcome is CancelOutcome.MISSING:
        raise ApiError(404, "not_found", f"no job {job_id!r} (unknown, or expired)")
    if isinstance(outcome, JobStatus):
        raise ApiError(409, "conflict", f"job {job_id} has already ended ({outcome}); nothing to cancel")
    response = jsonify(job_view(svc.jobs.get(job_id)))
    response.status_code = 200 if outcome is CancelOutcome.CANCELLED else 202
    return response
