"""Runs one job: claim it in Redis, feed it to the engine, publish its tokens, record the end.

Called from the Celery task; has no Celery in it, so it can be driven directly in tests.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field

from common.jobs import JobStore
from common.schemas import JobStatus
from worker.engine.loop import EngineLoop, RequestStream
from worker.engine.sequence import EngineRequest, RequestOutput, ResponseFormat, Sampling

log = logging.getLogger(__name__)

_STATUS_BY_REASON = {"stop": JobStatus.SUCCEEDED, "length": JobStatus.SUCCEEDED,
                     "cancelled": JobStatus.CANCELLED, "error": JobStatus.FAILED}


@dataclass
class _Progress:
    text: str = ""
    chunks: int = 0
    completion_tokens: int = 0
    prompt_tokens: int = 0
    batch_size_max: int = 0
    finish: RequestOutput | None = None
    pending: list[RequestOutput] = field(default_factory=list)


def engine_sampling(sampling: dict) -> Sampling:
    """The job record's sampling dict (validated by the API) as the engine's `Sampling`."""
    fmt = sampling.get("response_format")
    if fmt is not None:
        spec = fmt.get("json_schema") or {}
        schema = json.dumps(spec["schema"]) if "schema" in spec else None
        fmt = ResponseFormat(fmt["type"], schema)
    return Sampling(**{**sampling, "stop": tuple(sampling.get("stop", ())), "response_format": fmt})


class JobRunner:
    def __init__(self, store: JobStore, loop: EngineLoop, worker_name: str, max_attempts: int,
                 cancel_poll_s: float, cache_ttl_s: int):
        self.store = store
        self.loop = loop
        self.worker_name = worker_name
        self.max_attempts = max_attempts
        self.cancel_poll_s = cancel_poll_s
        self.cache_ttl_s = cache_ttl_s

    def run(self, job_id: str) -> dict:
        outcome, attempts = self.store.start(job_id, self.worker_name, self.max_attempts)
        log.info("job %s: %s (attempt %d)", job_id, outcome, attempts, extra={"job_id": job_id})
        if outcome == "cancel":
            return self._end(job_id, JobStatus.CANCELLED, finish_reason="cancelled")
        if outcome == "poison":
            return self._end(job_id, JobStatus.FAILED, finish_reason="error", error={
                "type": "poison_job", "message": f"job was delivered {attempts} times and each "
                f"attempt lost its worker; giving up (max_attempts={self.max_attempts})"})
        if outcome not in ("start", "restart"):
            return {"job_id": job_id, "status": outcome}  # missing, or already ended: nothing to do
        if outcome == "restart":
            self.store.append_event(job_id, "restart", {"attempt": attempts,
                                                        "reason": "previous worker was lost"})
        record = self.store.get(job_id)
        try:
            return self._generate(job_id, record)
        except Exception as exc:
            log.exception("job %s failed", job_id, extra={"job_id": job_id})
            self.loop.abort(job_id)
            return self._end(job_id, JobStatus.FAILED, finish_reason="error",
                             error={"type": "worker_error", "message": str(exc)})

    def _generate(self, job_id: str, record: dict) -> dict:
        request = record["request"]
        stream = self.loop.submit(EngineRequest(job_id, request["prompt_token_ids"],
                                                engine_sampling(request["sampling"])))
        progress = _Progress(prompt_tokens=len(request["prompt_token_ids"]))
        next_cancel_check = time.monotonic() + self.cancel_poll_s
        while progress.finish is None:
            self._collect(stream, progress)
            self._publish(job_id, progress)
            if time.monotonic() >= next_cancel_check:
                next_cancel_check = time.monotonic() + self.cancel_poll_s
                if self.store.cancel_requested(job_id):
                    self.loop.abort(job_id)
        out = progress.finish
        status = _STATUS_BY_REASON[out.finish_reason]
        error = {"type": out.error_type, "message": out.error} if out.error else None
        result = self._end(job_id, status, finish_reason=out.finish_reason, text=progress.text,
                           prompt_tokens=progress.prompt_tokens,
                           completion_tokens=progress.completion_tokens,
                           batch_size_max=progress.batch_size_max, error=error)
        cache_key = record.get("cache_key")
        if status is JobStatus.SUCCEEDED and cache_key:
            self.store.cache_put(cache_key, {
                "text": progress.text, "finish_reason": out.finish_reason,
                "prompt_tokens": progress.prompt_tokens, "completion_tokens": progress.completion_tokens,
            }, self.cache_ttl_s)
        return result

    def _collect(self, stream: RequestStream, progress: _Progress) -> None:
        """Wait for the next output, then take every other one already there (one Redis trip)."""
        output = stream.get(timeout=self.cancel_poll_s)
        while output is not None:
            progress.pending.append(output)
            progress.completion_tokens = output.completion_tokens
            progress.batch_size_max = max(progress.batch_size_max, output.batch_size)
            if output.finished:
                progress.finish = output
                return
            output = stream.get(timeout=0)

    def _publish(self, job_id: str, progress: _Progress) -> None:
        delta = "".join(o.text for o in progress.pending)
        progress.pending.clear()
        if not delta:
            return
        progress.text += delta
        self.store.append_event(job_id, "chunk", {"index": progress.chunks, "text": delta},
                                text=progress.text, completion_tokens=progress.completion_tokens,
                                batch_size_max=progress.batch_size_max)
        progress.chunks += 1

    def _end(self, job_id: str, status: JobStatus, **fields) -> dict:
        """Terminal record first, then the `done` event, so a client that sees `done` and reads
        the job gets the final state."""
        if self.store.finish(job_id, status, **fields):
            self.store.publish_done(job_id)
        return {"job_id": job_id, "status": status.value, "finish_reason": fields.get("finish_reason")}

