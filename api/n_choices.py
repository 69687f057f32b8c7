"""OpenAI requests with `n` > 1 or `logprobs`: `n` sibling jobs, merged into one answer.

Each choice is a job of its own, admitted together so they decode in the same continuous batch.
Siblings must not share one sampled answer: without a seed a sampled request is never cached or
coalesced, so each sibling draws its own tokens; with a seed, sibling i gets seed + i (its own
reproducible answer); greedy siblings (temperature 0) are identical and ride on one generation.
A whole answer lists the choices in order, with the prompt's tokens counted once and the
completion tokens summed. A stream relays each choice in turn from its job's log (the jobs run
together; a later choice's log is replayed from its start), each chunk with its `index`; leaving
it early cancels every sibling. The same relay adds `logprobs` to choices and chunks
(common/logprobs.py). The single-job path without either stays in api/openai_api.py.
"""
from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator

import redis
from flask import Response, jsonify

from api.auth import current_key
from api.logprob_engines import check_logprobs
from api.job_answers import cancel_after_disconnect, job_error, wait_for_end, worker_lost_chunk
from api.services import Services, services
from api.sse import job_event_stream, streaming_response
from api.submit import submit_job
from common.errors import ApiError
from common.attempts import AttemptJoin
from common.logprobs import CompletionLogprobs, chat_logprobs
from common.openai_format import StreamChunks, Surface, error_body, sse_data
from common.openai_models import Usage
from common.schemas import JobRequest, JobStatus

log = logging.getLogger(__name__)


def wants_choices(body) -> bool:
    """Whether this module answers the request (else the single-job path does)."""
    return body.choices > 1 or bool(body.logprob_fields())


def sibling(req: JobRequest, index: int) -> JobRequest:
    """The request of choice `index`: its own seed when the request has one."""
    if index == 0 or req.seed is None:
        return req
    return req.model_copy(update={"seed": (req.seed + index) % 2**63})


def complete_choices(surface: Surface, body) -> Response:
    if getattr(body, "tools", None):  # tool calls are parsed from one job's stream (api/openai_api.py)
        param = "n" if body.choices > 1 else "logprobs"
        raise ApiError(400, "unsupported_parameter", f"{param} is not supported with tools", param=param)
    svc = services()
    req = body.job_request()
    check_logprobs(svc, req)
    with svc.streams.acquire(current_key()).guard() as slot:
        records = _submit_all(svc, req, body.choices)
        if body.stream:
            return streaming_response(_chunks(svc, surface, records, body.include_usage), slot,
                                      {"Connection": "keep-alive", **_job_headers(records)})
    try:
        records = [wait_for_end(svc, record) for record in records]
    finally:
        slot.release()
    failed = next((r for r in records if r["status"] != JobStatus.SUCCEEDED), None)
    if failed is not None:
        _cancel_all(svc, records)
        raise job_error(failed)
    response = jsonify(surface.response(*records))
    response.headers.update(_job_headers(records))
    return response


def _job_headers(records: list[dict]) -> dict:
    """The first choice's job (as on a single-job answer) and every choice's, in order."""
    return {"X-LLMQ-Job-Id": records[0]["id"], "X-LLMQ-Job-Ids": ",".join(r["id"] for r in records)}


def _submit_all(svc: Services, req: JobRequest, n: int) -> list[dict]:
    """The n sibling jobs; when one is refused (a full queue, a rate limit), those admitted go."""
    records: list[dict] = []
    try:
        for index in range(n):
            records.append(submit_job(svc, sibling(req, index)).record)
    except Exception:
        _cancel_all(svc, records)
        raise
    return records


def _cancel_all(svc: Services, records: list[dict]) -> None:
    """The siblings of a choice that failed or was refused: nobody will read their answers."""
    for record in records:
        try:
            svc.jobs.cancel(record["id"])  # an ended one stays as it is
        except redis.RedisError as exc:
            log.warning("job %s: could not cancel it with its sibling: %s", record["id"], exc)


def shape_logprobs(surface: Surface, entries: list[dict] | None, offsets: CompletionLogprobs) -> dict | None:
    return chat_logprobs(entries) if surface.chat else offsets.shape(entries)


def _chunks(svc: Services, surface: Surface, records: list[dict], include_usage: bool) -> Iterator[str]:
    """Every choice's events as OpenAI chunks, one choice after the other, then the usage (when
    asked) and `[DONE]`; a job that fails ends the stream with its error."""
    choices = [surface.stream(records[0], include_usage, index) for index in range(len(records))]
    finished = False
    try:
        if surface.chat:  # the first bytes go out at once: each choice's opening role
            for chunks in choices:
                yield sse_data(chunks.role())
        else:
            yield ": open\n\n"
        usages = []
        for index, record in enumerate(records):
            done = yield from _relay(svc, surface, choices[index], record["id"])
            if done is None or done["status"] != JobStatus.SUCCEEDED:
                if done is not None:
                    error = job_error({**record, **done})
                    yield sse_data(error_body(error.status, error.message, error.type))
                    yield sse_data("[DONE]")
                    finished = True
                return
            usages.append(done["usage"])
        finished = True
        if include_usage:
            yield sse_data(choices[0].usage(Usage.of_choices(usages)))
        yield sse_data("[DONE]")
    finally:
        if not finished and svc.settings.cancel_on_disconnect:
            for record in records:
                cancel_after_disconnect(svc, record["id"])


def _relay(svc: Services, surface: Surface, chunks: StreamChunks, job_id: str):
    """One choice's chunks; returns its `done` event's data (None: the stream ended without one,
    or the job started over after its worker was lost and said otherwise than the chunks already
    sent, which cannot be undone: common/attempts.py)."""
    offsets = CompletionLogprobs()
    attempts, shown = AttemptJoin(), False
    with contextlib.closing(job_event_stream(svc, job_id, None)) as events:
        for _, event, data in events:
            if event == "heartbeat":
                yield ": keep-alive\n\n"
            elif event == "queued":
                yield f": queued {json.dumps(data)}\n\n"
            elif event == "chunk":
                new = attempts.take(data["text"], data.get("logprobs"))
                if attempts.diverged:
                    break
                if new is not None:
                    shown = True
                    yield sse_data(chunks.text(new[0], shape_logprobs(surface, new[1], offsets)))
            elif event == "restart":
                attempts.restart(shown)
            elif event == "done":
                attempts.end()
                if attempts.diverged:
                    break
                if data["status"] == JobStatus.SUCCEEDED:
                    yield sse_data(chunks.end(data["finish_reason"]))
                return data
    if attempts.diverged:
        yield worker_lost_chunk()
    return None
