"""Logging set-up shared by API and workers: one line per record, job ids attached.

A job id reaches a record either as `extra={"job_id": ...}` or from `job_context(job_id)`, which the
worker sets around a job, so library and engine log lines written while a job runs carry it too.
With `LLMQ_LOG_JSON` every record is one JSON object, extras included; otherwise a text line that
ends in `[job <id>]` when there is one.
"""
from __future__ import annotations

import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

from common.settings import Settings

_current_job: ContextVar[str | None] = ContextVar("llmq_job_id", default=None)
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}


@contextmanager
def job_context(job_id: str) -> Iterator[None]:
    """Attach `job_id` to every record logged by this thread (or task) inside the block."""
    token = _current_job.set(job_id)
    try:
        yield
    finally:
        _current_job.reset(token)


class _ContextFilter(logging.Filter):
    def __init__(self, service: str):
        super().__init__()
        self.service = service

    def filter(self, record: logging.LogRecord) -> bool:
        record.service = self.service
        if getattr(record, "job_id", None) is None and (job_id := _current_job.get()):
            record.job_id = job_id
        return True


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {"ts": round(record.created, 3), "level": record.levelname, "logger": record.name,
                 "msg": record.getMessage()}
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class _TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        job_id = getattr(record, "job_id", None)
        return f"{line} [job {job_id}]" if job_id else line


def setup_logging(settings: Settings, service: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_json:
        handler.setFormatter(_JsonFormatter())
    else:
        handler.setFormatter(_TextFormatter("%(asctime)s %(levelname)s %(service)s %(name)s: %(message)s"))
    handler.addFilter(_ContextFilter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level.upper())
