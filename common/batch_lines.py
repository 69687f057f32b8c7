"""The lines of a batch: checking an input file, and writing each line's result as OpenAI does.

Each input line is `{"custom_id", "method": "POST", "url", "body"}`; its body goes through the same
request schemas (common/openai_schemas.py) and admission checks (common/admission.py: model, template,
context) as a request to that endpoint, so a line is valid in a batch exactly when the same body
would be accepted by `/v1/chat/completions` or `/v1/completions`. A file with any bad line fails
the whole batch with every problem listed (`errors.data[]`: code, line, message, param), before
any job is queued. Results: `{"id", "custom_id", "response": {"status_code", "request_id",
"body"}, "error"}`, the body being what the endpoint would have answered (common/openai_format.py).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import ValidationError

from common.admission import Admission
from common.errors import ApiError, describe_validation
from common.openai_format import Surface, error_body
from common.openai_schemas import ChatCompletionRequest, CompletionRequest
from common.schemas import JobStatus

ENDPOINTS = {"/v1/chat/completions": (ChatCompletionRequest, Surface(chat=True)),
             "/v1/completions": (CompletionRequest, Surface(chat=False))}
MAX_REPORTED_ERRORS = 1000
CUSTOM_ID_MAX = 512


@dataclass
class PreparedLine:
    line: int  # 1-based line number in the input file
    custom_id: str
    fields: dict  # the job record's fields (`Admission.prepare`)
    digest: str | None

    def dumps(self) -> str:
        return json.dumps({"custom_id": self.custom_id, "fields": self.fields, "digest": self.digest})

    @classmethod
    def loads(cls, line: int, text: str) -> "PreparedLine":
        return cls(line=line, **json.loads(text))


class LineError(Exception):
    def __init__(self, code: str, message: str, param: str | None = None):
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


def check_file(admission: Admission, content: str, endpoint: str, owner: str | None,
               progress=lambda: None) -> tuple[list[PreparedLine], list[dict]]:
    """Every non-blank line of `content` prepared as a job, or the errors (OpenAI's
    `errors.data[]` entries, at most MAX_REPORTED_ERRORS). `progress` is called now and then."""
    prepared: list[PreparedLine] = []
    errors: list[dict] = []
    seen: set[str] = set()
    for number, text in enumerate(content.splitlines(), start=1):
        if not text.strip():
            continue
        if number % 200 == 0:
            progress()
        try:
            line = _prepare(admission, number, text, endpoint, owner)
            if line.custom_id in seen:
                raise LineError("duplicate_custom_id",
                                f"custom_id {line.custom_id!r} is used by an earlier line; each must be unique",
                                "custom_id")
            seen.add(line.custom_id)
            prepared.append(line)
        except LineError as exc:
            if len(errors) < MAX_REPORTED_ERRORS:
                errors.append({"code": exc.code, "line": number, "message": exc.message, "param": exc.param})
    if not prepared and not errors:
        errors.append({"code": "empty_file", "line": None, "message": "the input file has no requests",
                       "param": None})
    limit = admission.settings.file_max_lines
    if len(prepared) > limit:
        errors.append({"code": "too_many_requests", "line": None, "param": None,
                       "message": f"the input file has {len(prepared)} requests; at most "
                                  f"{limit} are allowed per batch"})
    return prepared, errors


def _prepare(admission: Admission, number: int, text: str, endpoint: str, owner: str | None) -> PreparedLine:
    try:
        request = json.loads(text)
    except ValueError as exc:
        raise LineError("invalid_json_line", f"line {number} is not valid JSON: {exc}")
    if not isinstance(request, dict):
        raise LineError("invalid_json_line", f"line {number} is not a JSON object")
    unknown = set(request) - {"custom_id", "method", "url", "body"}
    if unknown:
        raise LineError("invalid_request", f"unknown field(s) {sorted(unknown)}", sorted(unknown)[0])
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > CUSTOM_ID_MAX:
        raise LineError("invalid_custom_id", f"custom_id must be a non-empty string of at most "
                                             f"{CUSTOM_ID_MAX} characters", "custom_id")
    if request.get("method") != "POST":
        raise LineError("invalid_method", "method must be 'POST'", "method")
    url = request.get("url")
    if url not in ENDPOINTS:
        raise LineError("invalid_url", f"url {url!r} is not supported; use one of {sorted(ENDPOINTS)}", "url")
    if url != endpoint:
        raise LineError("mismatched_url", f"url {url!r} differs from the batch's endpoint {endpoint!r}", "url")
    body = request.get("body")
    if not isinstance(body, dict):
        raise LineError("invalid_request", "body must be a JSON object", "body")
    if body.get("stream"):
        raise LineError("invalid_request", "stream: true is not allowed in a batch", "body.stream")
    if body.get("n") not in (None, 1):  # a line is one job; n choices would be n lines' worth
        raise LineError("unsupported_parameter", "n > 1 is not supported in a batch; send one line per choice",
                        "body.n")
    schema, _ = ENDPOINTS[url]
    try:
        job_request = schema.model_validate(body).job_request()
        fields, digest = admission.prepare(job_request, owner, "batch")
    except ValidationError as exc:
        message, details = describe_validation(exc)
        raise LineError("invalid_request", message, f"body.{details[0]['field']}" if details else "body")
    except ApiError as exc:
        param = exc.extra.get("param")
        raise LineError(exc.type, exc.message, f"body.{param}" if param else None)
    return PreparedLine(number, custom_id, fields, digest)


def result_of(surface: Surface, custom_id: str, record: dict, ending: str | None) -> tuple[bool, dict]:
    """A finished job as the line's result: (succeeded, result line). `ending` ('batch_cancelled'
    or 'batch_expired') names why a job that was stopped before its end did not finish."""
    job_id, status = record["id"], record.get("status")
    if status == JobStatus.SUCCEEDED:
        return True, _line(job_id, custom_id, 200, surface.response(record))
    error = record.get("error") or {}
    if status in (JobStatus.CANCELLED, JobStatus.EXPIRED) and ending and error.get("type") != "run_timeout":
        return False, stopped(job_id, custom_id, ending)
    if status == JobStatus.EXPIRED and error.get("type") == "queue_timeout":  # its deadline is the window's
        return False, stopped(job_id, custom_id, "batch_expired")
    if status == JobStatus.CANCELLED:
        return False, _line(job_id, custom_id, 409, error_body(409, f"job {job_id} was cancelled", "job_cancelled"))
    if error.get("type") == "invalid_request":
        return False, _line(job_id, custom_id, 400, error_body(400, error.get("message", "invalid request"),
                                                               "invalid_request"))
    message = error.get("message") or f"the request ended as {status}"
    return False, _line(job_id, custom_id, 500, error_body(500, message, error.get("type") or "job_failed"))


def stopped(job_id: str, custom_id: str, code: str) -> dict:
    """The error line of a request the batch stopped (cancelled, or past its window)."""
    message = {"batch_cancelled": "the batch was cancelled before this request finished",
               "batch_expired": "the batch's completion window passed before this request finished"}[code]
    return {"id": f"batch_req_{job_id}", "custom_id": custom_id, "response": None,
            "error": {"code": code, "message": message}}


def _line(job_id: str, custom_id: str, status_code: int, body: dict) -> dict:
    return {"id": f"batch_req_{job_id}", "custom_id": custom_id,
            "response": {"status_code": status_code, "request_id": job_id, "body": body}, "error": None}
