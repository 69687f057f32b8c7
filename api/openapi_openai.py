"""The OpenAPI description of the OpenAI-compatible routes: chat completions, completions, models,
Files and Batches (part of `/openapi.json`, see api/openapi.py).

Request bodies are generated from the pydantic models the handlers validate with
(common/openai_schemas.py, api/batches_api.BatchCreate); what the handlers check beyond the models
is spelled out here: the sampling fields take JobRequest's limits (they become one), and a
parameter llmq cannot honour is accepted only with the value that means "not used". Response
bodies are generated from the models the handlers build them with (common/openai_models.py).
"""
from __future__ import annotations

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from api.batches_api import BatchCreate
from common.openai_models import RESPONSES
from common.batch_lines import ENDPOINTS
from common.logprobs import NOT_WITH_TOOLS, TOP_NEEDS_LOGPROBS
from common.responses_models import MODELS as RESPONSE_MODELS
from common.responses_request import UNSUPPORTED as RESPONSE_UNSUPPORTED
from common.responses_request import ResponseCreate
from common.openai_schemas import (SAMPLING_FIELDS, TOOL_FIELDS, UNSUPPORTED, ChatCompletionRequest,
                                   CompletionRequest)

_REF = "#/components/schemas/{model}"


# --- request bodies --------------------------------------------------------------------------
def _or_null(schema: dict) -> dict:
    schema = {k: v for k, v in schema.items() if k != "default"}  # here, null is the default
    if {"type": "null"} in schema.get("anyOf", []):
        return schema
    description = schema.pop("description", None)
    return {"anyOf": [schema, {"type": "null"}], **({"description": description} if description else {})}


def _openai_request(model: type[BaseModel], job_request: dict) -> tuple[dict, dict]:
    """(the request's schema, the schemas it refers to)."""
    schema = model.model_json_schema(ref_template=_REF)
    defs, props = schema.pop("$defs", {}), schema["properties"]
    for name in (*SAMPLING_FIELDS, *TOOL_FIELDS, "max_tokens", "max_completion_tokens"):
        if name in props:  # these become the job's: JobRequest's limits apply
            props[name] = _or_null(job_request["properties"]["max_tokens" if name.startswith("max_")
                                                              else name])
    for name, unused in UNSUPPORTED.items():
        if name in props:
            props[name] = {"enum": list(unused), "description": "not supported: only a value that "
                                                                "means 'not used' is accepted"}
    schema["anyOf"] = job_request["anyOf"]  # `webhook_events` only with a `webhook`
    if "max_completion_tokens" in props:  # one of the two (both only if equal, which no schema says)
        schema["not"] = {"required": ["max_tokens", "max_completion_tokens"], "properties": {
            "max_tokens": {"type": "integer"}, "max_completion_tokens": {"type": "integer"}}}
    return schema, defs


def _text_parts(min_length: int) -> dict:
    part = {"type": "object", "required": ["type", "text"],
            "properties": {"type": {"const": "text"}, "text": {"type": "string", "minLength": 1}}}
    return {"anyOf": [{"type": "string", "minLength": min_length},
                      {"type": "array", "items": part, "minItems": 1, "description": "text parts only"}]}


def _chat_message(schema: dict) -> dict:
    """Which fields each role takes: text (or text parts) for most; an assistant's tool calls
    with or without content; a tool's result naming its call."""
    call = {"type": "object", "required": ["id", "type", "function"], "additionalProperties": False, "properties": {
        "id": {"type": "string", "minLength": 1}, "type": {"const": "function"}, "index": {"type": "integer"},
        "function": {"type": "object", "required": ["name", "arguments"], "additionalProperties": False,
                     "properties": {"name": {"type": "string", "minLength": 1}, "arguments": {"type": "string"}}}}}
    calls = {"type": "array", "items": call, "minItems": 1}

    def branch(roles: list[str], required: list[str], **fields) -> dict:
        return {"required": ["role", *required], "properties": {"role": {"enum": roles}, **fields}}
    no_calls = {"tool_calls": {"type": "null"}, "tool_call_id": {"type": "null"}}
    schema["anyOf"] = [
        branch(["system", "developer", "user", "assistant"], ["content"], content=_text_parts(1), **no_calls),
        branch(["assistant"], ["tool_calls"], content={"anyOf": [_text_parts(0), {"type": "null"}]},
               tool_calls=calls, tool_call_id={"type": "null"}),
        branch(["tool"], ["tool_call_id", "content"], content=_text_parts(0),
               tool_call_id={"type": "string", "minLength": 1}, tool_calls={"type": "null"}),
    ]
    return schema


def _batch_create(job_request: dict) -> dict:
    schema = BatchCreate.model_json_schema(ref_template=_REF)
    props = schema["properties"]
    props["endpoint"] = {"enum": sorted(ENDPOINTS)}
    props["completion_window"] = {"const": "24h"}
    props["metadata"] = _or_null({"type": "object", "maxProperties": 16,
                                  "propertyNames": {"maxLength": 64},
                                  "additionalProperties": {"type": "string", "maxLength": 512}})
    props["webhook"] = {**job_request["properties"]["webhook"],
                        "description": props["webhook"]["description"]}
    return schema


def components(job_request: dict) -> dict[str, dict]:
    """The component schemas these routes refer to. `job_request`: JobRequest's schema as
    /openapi.json gives it (settings and validators applied)."""
    chat, chat_defs = _openai_request(ChatCompletionRequest, job_request)
    completion, completion_defs = _openai_request(CompletionRequest, job_request)
    chat_defs["ChatMessage"] = _chat_message(chat_defs["ChatMessage"])
    chat["allOf"] = [TOP_NEEDS_LOGPROBS, *NOT_WITH_TOOLS]
    completion["properties"]["prompt"] = {"anyOf": [
        {"type": "string", "minLength": 1},
        {"type": "array", "items": {"type": "string", "minLength": 1}, "minItems": 1, "maxItems": 1}]}
    _, responses = models_json_schema([(m, "serialization") for m in (*RESPONSES, *RESPONSE_MODELS)],
                                      ref_template=_REF)
    create, create_defs = _response_create(job_request)
    return {**chat_defs, **completion_defs, **create_defs, **responses["$defs"], "ChatCompletionRequest": chat,
            "CompletionRequest": completion, "ResponseCreate": create, "BatchCreate": _batch_create(job_request)}


def _response_create(job_request: dict) -> tuple[dict, dict]:
    """`POST /v1/responses`'s body: its sampling fields take JobRequest's limits (they become
    the job's), and what llmq cannot honour is accepted only when it means "not used"."""
    schema = ResponseCreate.model_json_schema(ref_template=_REF, by_alias=True)
    defs, props = schema.pop("$defs", {}), schema["properties"]
    for name, job_name in (("temperature", "temperature"), ("top_p", "top_p"), ("top_k", "top_k"),
                           ("seed", "seed"), ("max_output_tokens", "max_tokens")):
        props[name] = _or_null(job_request["properties"][job_name])
    for name, unused in RESPONSE_UNSUPPORTED.items():
        props[name] = {"enum": list(unused), "description": "not supported: only a value that means 'not used'"}
    # a background response is a stored one
    schema["not"] = {"required": ["background", "store"],
                     "properties": {"background": {"const": True}, "store": {"const": False}}}
    return schema, defs


# --- paths -----------------------------------------------------------------------------------
def _ref(name: str) -> dict:
    return {"$ref": _REF.format(model=name)}


def _json(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_WHY = {400: "invalid request (OpenAI answers 400 where llmq's own API says 413 or 422)",
        401: "missing or invalid API key (when keys are configured)", 403: "priority above the key's tier",
        404: "no such model, file or batch (another key's is not found either)",
        409: "cancelled before it finished; or a batch that cannot be cancelled",
        413: "body or file too large", 429: "queue full or rate limited",
        500: "the job failed", 503: "Redis unreachable, or the job's deadline passed before it could finish "
                                    "(Retry-After)"}


def _errors(*codes: int) -> dict:
    retry = {"Retry-After": {"schema": {"type": "string"}, "description": "seconds"}}
    out = {}
    for code in codes:
        out[str(code)] = _json(_ref("OpenAIError"), _WHY[code])
        if code in (429, 503):
            out[str(code)]["headers"] = retry
    return out


def _param(name: str, where: str, schema: dict, description: str | None = None) -> dict:
    return {"name": name, "in": where, "required": where == "path", "schema": schema,
            **({"description": description} if description else {})}


_STREAM = ("with `stream: true`, Server-Sent Events: `data: <chunk JSON>` lines ending with "
           "`data: [DONE]`; while the job waits in the queue, comments `: queued {\"queue_position\": "
           "3, \"estimated_start\": ..., \"estimated_finish\": ...}` (the `queued` event's data, see "
           "/v1/jobs/{job_id}/events), which OpenAI clients skip; an error after the stream began "
           "comes as `data: {\"error\": ...}`")


def _completion(summary: str, request: str, response: str, chunk: str) -> dict:
    return {"post": {
        "summary": summary,
        "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(request)}}},
        "responses": {"200": {"description": f"the whole answer; {_STREAM}", "content": {
            "application/json": {"schema": _ref(response)},
            "text/event-stream": {"schema": {"type": "string", "description": f"chunks: {chunk}"}}}},
            **_errors(400, 401, 403, 404, 409, 413, 429, 500, 503)}}}


_FILE_ID = _param("file_id", "path", {"type": "string"})
_RESPONSE_ID = _param("response_id", "path", {"type": "string"})
_EVENTS = ("with `stream: true`, Server-Sent Events `event: <type>` / `data: <event JSON>`, each "
           "with a `sequence_number` that every API process gives the same event (resume with "
           "`GET /v1/responses/{response_id}?stream=true&starting_after=N`); while the job waits in "
           "the queue, comments `: queued {...}` with its place")


def _responses_paths() -> dict:
    response = _json(_ref("ResponseObject"), "the response")
    return {
        "/v1/responses": {"post": {
            "summary": "Create a response (a job): answered whole, streamed, or in the background",
            "requestBody": {"required": True, "content": {"application/json": {"schema": _ref("ResponseCreate")}}},
            "responses": {"200": {"description": f"the response (queued, with `background`); {_EVENTS}", "content": {
                "application/json": {"schema": _ref("ResponseObject")},
                "text/event-stream": {"schema": {"type": "string", "description": "events: ResponseEvent, "
                                                 "OutputItemEvent, ContentPartEvent, OutputTextDelta, ..."}}}},
                **_errors(400, 401, 403, 404, 409, 413, 429, 500, 503)}}},
        "/v1/responses/{response_id}": {
            "get": {"summary": "A response; with stream=true, its events after starting_after",
                    "parameters": [_RESPONSE_ID, _param("stream", "query", {"enum": ["true", "false"]}),
                                   _param("starting_after", "query", {"type": "integer"},
                                          "the sequence number of the last event the client has")],
                    "responses": {"200": {**response, "content": {**response["content"], "text/event-stream": {
                        "schema": {"type": "string"}}}}, **_errors(400, 401, 404, 503)}},
            "delete": {"summary": "Delete a response (a running one is cancelled first)", "parameters": [_RESPONSE_ID],
                       "responses": {"200": _json(_ref("DeletedResponse"), "deleted"), **_errors(401, 404, 503)}}},
        "/v1/responses/{response_id}/cancel": {"post": {
            "summary": "Cancel a background response", "parameters": [_RESPONSE_ID],
            "responses": {"200": _json(_ref("ResponseObject"), "the response, cancelled (or still stopping)"),
                          **_errors(400, 401, 404, 409, 503)}}},
        "/v1/responses/{response_id}/input_items": {"get": {
            "summary": "A response's input items", "parameters": [
                _RESPONSE_ID, _AFTER, _param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 100}),
                _param("order", "query", {"enum": ["asc", "desc"]}, "default desc")],
            "responses": {"200": _json(_ref("InputItemList"), "a page of input items"), **_errors(400, 401, 404, 503)}}},
    }
_BATCH_ID = _param("batch_id", "path", {"type": "string"})
_AFTER = _param("after", "query", {"type": "string"}, "the id of the last object of the previous page")


def paths() -> dict:
    upload = {"type": "object", "required": ["file", "purpose"], "properties": {
        "file": {"type": "string", "contentMediaType": "application/octet-stream",
                 "description": "batch input: UTF-8 JSONL, one request per line"},
        "purpose": {"const": "batch"}}}
    return {
        "/v1/chat/completions": _completion("OpenAI chat completion", "ChatCompletionRequest",
                                            "ChatCompletion", "ChatCompletionChunk"),
        "/v1/completions": _completion("OpenAI (legacy) completion", "CompletionRequest",
                                       "TextCompletion", "TextCompletion without usage"),
        "/v1/models": {"get": {"summary": "Models served by a live worker", "responses": {
            "200": _json(_ref("ModelList"), "the models"), **_errors(401, 503)}}},
        "/v1/models/{model}": {"get": {
            "summary": "A model served by a live worker",
            "parameters": [_param("model", "path", {"type": "string"})],
            "responses": {"200": _json(_ref("Model"), "the model"), **_errors(401, 404, 503)}}},
        "/v1/files": {
            "post": {"summary": "Upload a batch input file",
                     "requestBody": {"required": True, "content": {"multipart/form-data": {
                         "schema": upload}}},
                     "responses": {"200": _json(_ref("File"), "the file"), **_errors(400, 401, 413, 503)}},
            "get": {"summary": "List your files", "parameters": [
                _param("purpose", "query", {"type": "string"}), _AFTER,
                _param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 10000}),
                _param("order", "query", {"enum": ["asc", "desc"]}, "by creation time; default desc")],
                    "responses": {"200": _json(_ref("FileList"), "a page of files"),
                                  **_errors(400, 401, 503)}}},
        "/v1/files/{file_id}": {
            "get": {"summary": "A file", "parameters": [_FILE_ID],
                    "responses": {"200": _json(_ref("File"), "the file"), **_errors(401, 404, 503)}},
            "delete": {"summary": "Delete a file", "parameters": [_FILE_ID],
                       "responses": {"200": _json(_ref("FileDeleted"), "deleted"),
                                     **_errors(401, 404, 503)}}},
        "/v1/files/{file_id}/content": {"get": {
            "summary": "A file's content", "parameters": [_FILE_ID],
            "responses": {"200": {"description": "the content (JSONL)",
                                  "content": {"application/jsonl": {"schema": {"type": "string"}}}},
                          **_errors(401, 404, 503)}}},
        "/v1/batches": {
            "post": {"summary": "Create a batch",
                     "requestBody": {"required": True,
                                     "content": {"application/json": {"schema": _ref("BatchCreate")}}},
                     "responses": {"200": _json(_ref("Batch"), "the batch, validating"),
                                   **_errors(400, 401, 404, 413, 503)}},
            "get": {"summary": "List your batches", "parameters": [
                _AFTER, _param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 100})],
                    "responses": {"200": _json(_ref("BatchList"), "a page of batches, newest first"),
                                  **_errors(400, 401, 503)}}},
        "/v1/batches/{batch_id}": {"get": {
            "summary": "A batch", "parameters": [_BATCH_ID],
            "responses": {"200": _json(_ref("Batch"), "the batch"), **_errors(401, 404, 503)}}},
        **_responses_paths(),
        "/v1/batches/{batch_id}/cancel": {"post": {
            "summary": "Cancel a batch", "parameters": [_BATCH_ID],
            "responses": {"200": _json(_ref("Batch"), "the batch, cancelling (or already cancelled)"),
                          **_errors(401, 404, 409, 503)}}},
    }
