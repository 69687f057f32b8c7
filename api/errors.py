"""One error shape for every failure: `{"error": {"type", "message"}}` with the right status."""
from __future__ import annotations

import logging

import redis
from flask import Flask, jsonify
from kombu.exceptions import OperationalError
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException

from common.errors import ApiError, describe_validation

log = logging.getLogger(__name__)


def error_response(status: int, type_: str, message: str, headers: dict | None = None, **extra):
    response = jsonify({"error": {"type": type_, "message": message, **extra}})
    response.status_code = status
    response.headers.update(headers or {})
    return response


def register_error_handlers(app: Flask) -> None:
    @app.errorhandler(ApiError)
    def _api_error(exc: ApiError):
        return error_response(exc.status, exc.type, exc.message, exc.headers, **exc.extra)

    @app.errorhandler(ValidationError)
    def _validation(exc: ValidationError):
        message, details = describe_validation(exc)
        return error_response(422, "validation_error", message, details=details)

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException):
        kind = {413: "payload_too_large", 404: "not_found", 405: "method_not_allowed"}.get(
            exc.code, "invalid_request_error")
        headers = {k: v for k, v in exc.get_headers() if k.lower() != "content-type"}  # e.g. Allow
        return error_response(exc.code or 400, kind, exc.description or exc.name, headers)

    @app.errorhandler(redis.RedisError)
    @app.errorhandler(OperationalError)
    def _backend_down(exc: Exception):
        log.warning("backend unavailable: %s", exc)
        return error_response(503, "service_unavailable",
                              "the job store (Redis) is unreachable; try again shortly",
                              {"Retry-After": "5"})

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception):
        log.exception("unhandled error")
        return error_response(500, "internal_error", "internal error; it has been logged")
