"""The API's OpenAPI 3.1 description, served at `/openapi.json` (public, like `/health`): llmq's
own routes here, the OpenAI-compatible ones (completions, models, Files, Batches) in
api/openapi_openai.py. Every route a user calls is in it (tests/api/test_openapi.py checks the app's
routes against it).

Request bodies come from the pydantic models the handlers validate with, so the spec cannot drift
from the validation; a job's SSE events are pydantic models below, and the job itself is the model
its view is built from (api/views.py). Fuzzers (schemathesis, tests) read it.
"""
from __future__ import annotations

from flask import Blueprint, jsonify
from pydantic import BaseModel, Field
from pydantic.json_schema import SkipJsonSchema, models_json_schema

from api import openapi_openai
from common.openai_models import Usage
from api.services import services
from api.views import Job
from common.logprobs import TOP_NEEDS_LOGPROBS
from common.schemas import FinishReason, JobRequest, JobStatus
from common.settings import Settings

bp = Blueprint("openapi", __name__)

_REF = "#/components/schemas/{model}"


def _ref(name: str) -> dict:
    return {"$ref": _REF.format(model=name)}


def _nullable(schema: dict) -> dict:
    return {"anyOf": [schema, {"type": "null"}]}


def _job_request_schema(settings: Settings) -> dict[str, dict]:
    """JobRequest and its parts, with what validators and settings add spelled out."""
    schema = JobRequest.model_json_schema(ref_template=_REF)
    schema["properties"]["max_tokens"]["maximum"] = settings.max_tokens_cap
    defs = schema.pop("$defs", {})
    # `stop` also takes one string, and no stop string may be empty
    stop_string = {"type": "string", "minLength": 1}
    schema["properties"]["stop"] = {"anyOf": [
        stop_string, {"type": "array", "items": stop_string, "maxItems": 8}, {"type": "null"}]}
    # exactly one of `messages` and `prompt`
    schema["oneOf"] = [
        {"required": ["messages"], "properties": {"messages": {"type": "array"}}},
        {"required": ["prompt"], "properties": {"prompt": {"type": "string"}}},
    ]
    # a webhook is an http(s) URL (whether its host is allowed is decided when it is resolved);
    # `webhook_events` only comes with one
    schema["properties"]["webhook"] = _nullable({"type": "string", "pattern": "^https?://[^\\s#]+$",
                                                 "maxLength": 2048,
                                                 "description": schema["properties"]["webhook"]["description"]})
    schema["anyOf"] = [
        {"properties": {"webhook_events": {"type": "null"}}},
        {"required": ["webhook"], "properties": {"webhook": {"type": "string"}}},
    ]
    schema["allOf"] = [TOP_NEEDS_LOGPROBS]
    return {**defs, "JobRequest": schema}


_ERROR = {
    "type": "object", "required": ["error"], "properties": {"error": {
        "type": "object", "required": ["type", "message"],
        "properties": {"type": {"type": "string"}, "message": {"type": "string"}}}},
}

class JobEventChunk(BaseModel):
    """`chunk`: the text generated since the previous chunk."""
    index: int = Field(ge=0, description="counts from 0; goes on across a worker's loss when the job "
                       "is continued, and from 0 again after a `restart`; a chunk whose index you "
                       "already have replaces it and what followed it (after a Redis failover)")
    text: str
    logprobs: list[dict] | SkipJsonSchema[None] = Field(
        None, description="only when the job asked for logprobs: {token, logprob, bytes, top_logprobs} "
                          "per token of this chunk", json_schema_extra=lambda schema: schema.pop("default"))


class JobEventQueued(BaseModel):
    """`queued`: the job's place while it waits in the queue, sent when it changes and every few
    seconds. It has no id: it is not in the job's log, and is not replayed."""
    queue_position: int = Field(ge=1, description="1 = next to start, in the fair-share order "
                                "(priority, then keys by fair share, then arrival)")
    estimated_start: float | SkipJsonSchema[None] = Field(
        None, description="epoch seconds; absent while no live worker serves the model",
        json_schema_extra=lambda schema: schema.pop("default"))  # absent, never null
    estimated_finish: float | SkipJsonSchema[None] = Field(
        None, description="epoch seconds; as above", json_schema_extra=lambda schema: schema.pop("default"))


class JobEventRestart(BaseModel):
    """`restart`: the worker running the job was lost and its answer could not be continued, so
    another starts it over; drop the text received so far (the chunks that follow count from
    index 0 again)."""
    attempt: int
    reason: str


class JobEventDone(BaseModel):
    """`done`: the job ended; the last event of the stream."""
    status: JobStatus
    finish_reason: FinishReason | None
    usage: Usage
    error: dict | None
    cached: bool


_EVENTS = {"chunk": JobEventChunk, "queued": JobEventQueued, "restart": JobEventRestart,
           "done": JobEventDone}


def _event(name: str, model: type[BaseModel]) -> dict:
    return {"type": "object", "required": ["event", "data"], "description": model.__doc__.split("\n")[0],
            "properties": {"event": {"const": name}, "id": {"type": "string"},
                           "data": {"type": "string", "contentMediaType": "application/json",
                                    "contentSchema": _ref(model.__name__)}}}


_SSE_EVENT = {"description": "one event: `event: <name>`, `data: <JSON>`, and an `id:` for the events "
                             "of the job's log (resume after it with `Last-Event-ID`); idle streams "
                             "get `: keep-alive` comments",
              "oneOf": [_event(name, model) for name, model in _EVENTS.items()]}
_SSE_SUMMARY = "Stream a job's events (SSE: queued while it waits, chunk, restart, done)"


def _with_stream(response: dict) -> dict:
    """`stream: true` answers POST /v1/jobs with the job's SSE stream instead of JSON."""
    response["content"]["text/event-stream"] = {"schema": _SSE_EVENT}
    return response


def _json(schema: dict, description: str, headers: dict | None = None) -> dict:
    response = {"description": description, "content": {"application/json": {"schema": schema}}}
    if headers:
        response["headers"] = headers
    return response


_RETRY_AFTER = {"Retry-After": {"schema": {"type": "string"}, "description": "seconds"}}


def _errors(*codes: int) -> dict:
    text = {400: "malformed JSON", 401: "missing or invalid API key (when keys are configured)",
            403: "priority above the key's tier", 404: "unknown job (or another key's), or model",
            405: "method not allowed", 409: "the job has already ended", 413: "body or prompt too large",
            422: "invalid fields", 429: "queue full or rate limited", 503: "Redis unreachable"}
    return {str(c): _json(_ref("Error"), text[c], _RETRY_AFTER if c in (429, 503) else None)
            for c in codes}


_JOB_ID = {"name": "job_id", "in": "path", "required": True, "schema": {"type": "string"}}


def _paths() -> dict:
    job = _json(_ref("Job"), "the job")
    cancel = {"parameters": [_JOB_ID], "responses": {
        "200": _json(_ref("Job"), "cancelled before it ran"),
        "202": _json(_ref("Job"), "running: it stops within a step"),
        **_errors(401, 404, 409, 503)}}
    return {
        "/v1/jobs": {"post": {
            "summary": "Submit a job",
            "requestBody": {"required": True,
                            "content": {"application/json": {"schema": _ref("JobRequest")}}},
            "responses": {"200": _with_stream(_json(_ref("Job"), "answered from the result cache; "
                                                   "with stream: true, the job's event stream")),
                          "202": _json(_ref("Job"), "queued", {"Location": {"schema": {"type": "string"}}}),
                          **_errors(400, 401, 403, 404, 413, 422, 429, 503)}}},
        "/v1/jobs/{job_id}": {
            "get": {"summary": "Read a job", "parameters": [_JOB_ID],
                    "responses": {"200": job, **_errors(401, 404, 503)}},
            "delete": {"summary": "Cancel a job", **cancel}},
        "/v1/jobs/{job_id}/cancel": {"post": {"summary": "Cancel a job", **cancel}},
        "/v1/jobs/{job_id}/events": {"get": {
            "summary": _SSE_SUMMARY, "parameters": [_JOB_ID],
            "responses": {"200": {"description": "Server-Sent Events",
                                  "content": {"text/event-stream": {"schema": _SSE_EVENT}}},
                          **_errors(401, 404, 503)}}},
        "/health": {"get": {"summary": "Health", "security": [], "parameters": [
            {"name": "deep", "in": "query", "required": False, "schema": {"type": "string"},
             "description": "1: also ping the workers through the broker (slower)"}], "responses": {
            "200": _json({"type": "object"}, "up (status 'ok', or 'degraded' with no worker)"),
            "503": _json({"type": "object"}, "Redis unreachable")}}},
        "/openapi.json": {"get": {"summary": "This document", "security": [], "responses": {
            "200": _json({"type": "object"}, "OpenAPI 3.1")}}},
    }


def build_spec(settings: Settings) -> dict:
    job_request = _job_request_schema(settings)
    _, models = models_json_schema([(m, "serialization") for m in (Job, *_EVENTS.values())], ref_template=_REF)
    return {
        "openapi": "3.1.0",
        "info": {"title": "llmq", "version": "1",
                 "description": "A job queue serving small instruct LLMs: submit, read, stream, "
                                "cancel; and OpenAI's chat completions, completions, models, Files "
                                "and Batches."},
        "paths": {**_paths(), **openapi_openai.paths()},
        "components": {
            "schemas": {**job_request, "Error": _ERROR, **models["$defs"],
                        **openapi_openai.components(job_request["JobRequest"])},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}, {}],  # keys are optional: on only when configured
    }


@bp.get("/openapi.json")
def openapi_json():
    return jsonify(build_spec(services().settings))
