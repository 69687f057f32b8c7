"""What a finished attempt leaves behind: the job's terminal status and error, a deterministic
answer in the result cache, and the worker's rates (for the ETAs) and metrics."""
from __future__ import annotations

import time

from common.continuation import Continuation
from common.jobs import Claim, Claimed
from common.result_cache import ResultCache
from common.schemas import FinishReason, JobStatus
from worker.job_claims import JobClaims
from worker.load_meter import LoadMeter
from worker.metrics import WorkerMetrics
from worker.text_relay import TextRelay

STATUS_BY_REASON = {FinishReason.STOP: JobStatus.SUCCEEDED, FinishReason.LENGTH: JobStatus.SUCCEEDED,
                    FinishReason.CANCELLED: JobStatus.CANCELLED, FinishReason.ERROR: JobStatus.FAILED,
                    FinishReason.TIMEOUT: JobStatus.EXPIRED}


class JobOutcomes:
    def __init__(self, claims: JobClaims, cache: ResultCache | None = None,
                 metrics: WorkerMetrics | None = None, meter: LoadMeter | None = None):
        """`cache`: where succeeded answers to cacheable requests go (None: nowhere)."""
        self.claims = claims
        self.cache = cache
        self.metrics = metrics
        self.meter = meter

    def generated(self, job_id: str, attempt: int, record: dict, relay: TextRelay, run_timeout_s: float) -> dict:
        """End the job as its generation ended (its text all written by `relay`)."""
        answered = relay.finish.finish_reason in (FinishReason.STOP, FinishReason.LENGTH)
        if self.meter and answered:
            self.meter.record_job(relay.generated_here)
        if self.metrics:
            self.metrics.job_generated(record["created_at"], relay.first_token_at, time.time(),
                                       relay.generated_here)
        reason = relay.finish_reason
        status = STATUS_BY_REASON[reason]
        error = {"type": relay.finish.error_type, "message": relay.finish.error} if relay.finish.error else None
        if reason == FinishReason.TIMEOUT:
            error = {"type": "run_timeout", "message": f"generation ran past its {run_timeout_s:g} s "
                                                       "limit and was stopped; the text so far is kept"}
        result = self.claims.end(job_id, attempt, status, finish_reason=reason, text=relay.text,
                                 prompt_tokens=relay.prompt_tokens, completion_tokens=relay.completion_tokens,
                                 batch_size_max=relay.batch_size_max, error=error, logprobs=relay.logprobs)
        cache_key = record.get("cache_key")
        if self.cache is not None and status is JobStatus.SUCCEEDED and cache_key \
                and result["status"] == status.value:
            self.cache.put(cache_key, {
                "text": relay.text, "finish_reason": relay.finish.finish_reason,
                "prompt_tokens": relay.prompt_tokens, "completion_tokens": relay.completion_tokens,
                **({"logprobs": relay.logprobs} if relay.logprobs is not None else {}),
            })
        return result

    def generated_before(self, job_id: str, attempt: int, request: dict, so_far: Continuation) -> dict:
        """End a job whose lost attempt generated the whole answer: only its end was missing."""
        return self.claims.end(job_id, attempt, STATUS_BY_REASON[FinishReason(so_far.ended)],
                               finish_reason=so_far.ended, text=so_far.text,
                               prompt_tokens=len(request["prompt_token_ids"]),
                               completion_tokens=len(so_far.token_ids),
                               logprobs=list(so_far.logprobs) if request["sampling"].get("logprobs") else None)

    def not_to_run(self, job_id: str, claim: Claim) -> dict | None:
        """The end of a job its claim says not to run: cancelled before it ran, poisoned (every
        attempt so far lost its worker), gone, or ended already; None: run it."""
        outcome, attempt = claim
        if outcome is Claimed.CANCEL:
            return self.claims.end(job_id, None, JobStatus.CANCELLED, finish_reason=FinishReason.CANCELLED)
        if outcome is Claimed.POISON:
            return self.claims.end(job_id, None, JobStatus.FAILED, finish_reason=FinishReason.ERROR, error={
                "type": "poison_job", "message": f"job was delivered {attempt} times and each attempt "
                f"lost its worker; giving up (max_attempts={self.claims.settings.max_attempts})"})
        if outcome is Claimed.MISSING or isinstance(outcome, JobStatus):
            return {"job_id": job_id, "status": str(outcome)}
        return None
