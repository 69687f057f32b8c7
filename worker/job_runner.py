"""Runs one job: claim it in Redis, feed it to the engine, publish its tokens, record the end.

Called from the Celery task; has no Celery in it, so it can be driven directly in tests.

Faults: a job redelivered after its worker was lost continues from the tokens in its log (the
engine gets the prompt and the tokens generated so far, and the chunks carry on their numbering:
common/continuation.py), or, where it cannot, starts over after a `restart` event; a copy
delivered while another live worker holds the job waits until that one ends or dies; every write
is fenced by the attempt number, so an attempt that was given up on stops instead of
interleaving with its successor; Redis outages up to `redis_retry_s` are ridden out (text is
buffered and written once Redis answers again); a job running past its deadline is aborted and
ends with finish reason `timeout`.
"""
from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import redis

from common.continuation import NOTHING, CannotContinue, Continuation, read_continuation
from common.jobs import Claim, Claimed, JobStore
from common.logs import job_context
from common.result_cache import ResultCache
from common.scheduling.fair_queue import CAPPED
from common.scheduling.free_slots import FreeSlots
from common.scheduling.picker import TicketPicker
from common.schemas import FinishReason, JobStatus
from common.settings import Settings
from common.token_log import ChunkWrite
from worker.cancel_watch import CancelWatch
from worker.engine.loop import EngineLoop, RequestStream
from worker.engine.sequence import Continued, EngineRequest, RequestOutput, ResponseFormat, Sampling
from worker.lease import Leases, lease_ttl
from worker.load_meter import LoadMeter
from worker.metrics import WorkerMetrics

log = logging.getLogger(__name__)
T = TypeVar("T")

_STATUS_BY_REASON = {FinishReason.STOP: JobStatus.SUCCEEDED, FinishReason.LENGTH: JobStatus.SUCCEEDED,
                     FinishReason.CANCELLED: JobStatus.CANCELLED, FinishReason.ERROR: JobStatus.FAILED,
                     FinishReason.TIMEOUT: JobStatus.EXPIRED}


class Superseded(Exception):
    """Another attempt has taken the job over; this one must stop writing."""


@dataclass
class _Progress:
    text: str = ""  # written to Redis
    pending: str = ""  # generated, not yet written (Redis slow or down)
    pending_ids: list[int] = field(default_factory=list)  # the tokens `pending` came from
    chunks: int = 0
    completion_tokens: int = 0
    continued_tokens: int = 0  # of which a lost attempt generated (a continued job)
    prompt_tokens: int = 0
    batch_size_max: int = 0
    first_token_at: float | None = None
    finish: RequestOutput | None = None
    abort_reason: FinishReason | None = None  # TIMEOUT when we stopped it; None for a client cancel
    cancel_asked: bool = False  # a client asked to cancel (read from Redis)
    preempt_asked: bool = False  # a batch line stopped for interactive work (starts over later)
    aborted: bool = False  # the engine was told to stop this request
    buffering: bool = False  # Redis was unavailable at the last write
    unconfirmed: str | None = None  # text of a write whose reply was lost: it may have landed
    unconfirmed_ids: int = 0  # its tokens
    logprobs: list | None = None  # entries written (common/logprobs.py); None: not asked for
    pending_logprobs: list = field(default_factory=list)  # generated, not yet written
    unconfirmed_logprobs: int = 0  # entries in the write whose reply was lost


def engine_sampling(sampling: dict, job_id: str | None = None) -> Sampling:
    """The job record's sampling dict (validated by the API) as the engine's `Sampling`. A
    sampled job without a seed of its own is seeded from its id: each attempt of the job then
    samples alike, so one that must start over after its worker was lost says again what its
    streams were sent (api/ and common/attempts.py join the two), while other jobs differ."""
    fmt = sampling.get("response_format")
    if fmt is not None:
        spec = fmt.get("json_schema") or {}
        schema = json.dumps(spec["schema"]) if "schema" in spec else None
        fmt = ResponseFormat(fmt["type"], schema)
    seed = sampling.get("seed")
    if seed is None and job_id is not None and sampling.get("temperature", 0) > 0:
        seed = int.from_bytes(hashlib.blake2b(job_id.encode(), digest_size=4).digest()) >> 1
    return Sampling(**{**sampling, "stop": tuple(sampling.get("stop", ())), "response_format": fmt, "seed": seed})


IDLE_WAKE_S = 1.0  # a job with nothing new still wakes this often (text held back by a Redis outage)


def _wait_s(deadline: float | None) -> float:
    """How long a job thread may wait for its next output: until its run deadline, at most
    IDLE_WAKE_S (a cancel wakes it at once)."""
    return IDLE_WAKE_S if deadline is None else max(0.0, min(IDLE_WAKE_S, deadline - time.monotonic()))


class JobRunner:
    def __init__(self, store: JobStore, loop: EngineLoop, worker_name: str, settings: Settings,
                 leases: Leases | None = None, metrics: WorkerMetrics | None = None,
                 meter: LoadMeter | None = None, cache: ResultCache | None = None,
                 send_ticket: Callable[[str | None], None] | None = None,
                 free_slots: FreeSlots | None = None):
        """`cache`: where succeeded answers to cacheable requests go (None: nowhere).
        `send_ticket(worker)`: sends a spare ticket to that worker's own queue (for a job prefix
        affinity leaves it, common/scheduling/prefix_affinity.py), or with None to the model's queue (for a
        preempted batch line). `free_slots`: where this worker tells the others how many jobs it
        can start now (common/scheduling/free_slots.py)."""
        self.store = store
        self.log = store.log
        self.cache = cache
        self.metrics = metrics
        self.meter = meter
        self.loop = loop
        self.worker_name = worker_name
        self.settings = settings
        self.lease_ttl_s = lease_ttl(settings)
        self.leases = leases or Leases(store, worker_name, self.lease_ttl_s)
        self.cancels = CancelWatch(store, settings.cancel_poll_s)
        self.picker = TicketPicker(store.fair, worker_name, settings, self._retrying, send_ticket, free_slots,
                                   on_affinity=metrics.affinity_picked if metrics is not None else None)

    def run_ticket(self, ticket: str, queue: str) -> dict:
        """Run the job a Celery message is a ticket for: the fairest queued job of `queue` when
        a slot is free (common/scheduling/fair_queue.py), or, for a redelivered message, the job it took
        before. A ticket that finds nothing queued has nothing to do."""
        picked = self.picker.pick(ticket, queue)
        if picked is None:
            return {"job_id": None, "status": "idle"}
        if picked is CAPPED:  # the worker stops while this ticket waits for batch room
            return {"job_id": None, "status": "requeue"}
        try:
            with job_context(picked.job_id):
                return self.run(picked.job_id)
        finally:
            self.picker.done(picked)

    def stop_waiting(self) -> None:
        """The worker stops: tickets waiting for batch room or for another worker's pick go back to
        the queue."""
        self.picker.stop()

    def close(self) -> None:
        """Its model is unloaded (no job left): its watcher threads end."""
        self.picker.stop()
        self.cancels.stop()

    def run(self, job_id: str) -> dict:
        if self._retrying(lambda: self.store.expire_if_overdue(job_id)):
            log.info("job %s: expired in the queue", job_id, extra={"job_id": job_id})
            return {"job_id": job_id, "status": JobStatus.EXPIRED.value, "finish_reason": FinishReason.TIMEOUT}
        outcome, attempt = self._claim(job_id)
        log.info("job %s: %s (attempt %d)", job_id, outcome, attempt, extra={"job_id": job_id})
        if outcome is Claimed.CANCEL:
            return self._end(job_id, None, JobStatus.CANCELLED, finish_reason=FinishReason.CANCELLED)
        if outcome is Claimed.POISON:
            return self._end(job_id, None, JobStatus.FAILED, finish_reason=FinishReason.ERROR, error={
                "type": "poison_job", "message": f"job was delivered {attempt} times and each "
                f"attempt lost its worker; giving up (max_attempts={self.settings.max_attempts})"})
        if outcome is Claimed.MISSING or isinstance(outcome, JobStatus):  # it is gone, or has ended
            return {"job_id": job_id, "status": str(outcome)}
        self.leases.hold(job_id, attempt)
        record = self.store.get(job_id)
        if self.metrics and outcome is Claimed.START:  # a redelivered job keeps its first start
            self.metrics.job_started(record["created_at"], record["started_at"])
        try:
            return self._run_attempt(job_id, attempt, record, outcome)
        except Superseded:
            log.warning("job %s: attempt %d was superseded; stopping it", job_id, attempt,
                        extra={"job_id": job_id})
            self.loop.abort(job_id)
            return {"job_id": job_id, "status": "superseded"}
        except Exception as exc:
            log.exception("job %s failed", job_id, extra={"job_id": job_id})
            self.loop.abort(job_id)
            return self._end(job_id, attempt, JobStatus.FAILED, finish_reason=FinishReason.ERROR,
                             error={"type": "worker_error", "message": str(exc)})
        finally:
            self.leases.release(job_id)

    def _claim(self, job_id: str) -> Claim:
        """Start the job. A duplicate delivery (another live worker holds the job) waits for that
        worker to finish it, or to die and let its lease lapse, in which case this one restarts it."""
        while True:
            claim = self._retrying(lambda: self.store.start(
                job_id, self.worker_name, self.settings.max_attempts, self.lease_ttl_s))
            if claim.outcome is not Claimed.DUPLICATE:
                return claim
            time.sleep(self.settings.heartbeat_s)

    def _run_attempt(self, job_id: str, attempt: int, record: dict, outcome: Claimed) -> dict:
        """A redelivered job continues from its log where it can; where it cannot, it starts over
        after a `restart` event (common/continuation.py)."""
        if outcome is Claimed.REDELIVERED:
            try:
                return self._generate(job_id, attempt, record, self._continuation(job_id, record))
            except CannotContinue as exc:
                log.info("job %s: starting over: %s", job_id, exc, extra={"job_id": job_id})
                reason = f"the previous attempt lost its worker, and its answer cannot be continued: {exc}"
                if not self._retrying(lambda: self.store.restart(job_id, attempt, reason)):
                    raise Superseded(job_id) from exc
        return self._generate(job_id, attempt, record, NOTHING)

    def _continuation(self, job_id: str, record: dict) -> Continuation:
        """Where the lost attempt's answer stands, from the log; `CannotContinue` when the log
        cannot say, or for a carrier (a job whose own client left: its log stopped there, its
        followers' went on)."""
        if record.get("status") != JobStatus.RUNNING:
            raise CannotContinue("its own client left, so its log stopped early")
        entries = self._retrying(lambda: self.log.read_entries(job_id))
        so_far = read_continuation(entries, int(record.get("chunks_written") or 0))
        if so_far.chunks:
            log.info("job %s: continuing after %d tokens in %d chunks", job_id, len(so_far.token_ids),
                     so_far.chunks, extra={"job_id": job_id})
        return so_far

    def _generate(self, job_id: str, attempt: int, record: dict, so_far: Continuation) -> dict:
        request = record["request"]
        if so_far.ended:  # the lost attempt generated the whole answer: only its end is missing
            return self._end(job_id, attempt, _STATUS_BY_REASON[FinishReason(so_far.ended)],
                             finish_reason=so_far.ended, text=so_far.text,
                             prompt_tokens=len(request["prompt_token_ids"]),
                             completion_tokens=len(so_far.token_ids),
                             logprobs=list(so_far.logprobs) if request["sampling"].get("logprobs") else None)
        continued = Continued(so_far.token_ids, so_far.text) if so_far.chunks else None
        stream = self.loop.submit(EngineRequest(job_id, request["prompt_token_ids"],
                                                engine_sampling(request["sampling"], job_id), continued))
        progress = _Progress(text=so_far.text, chunks=so_far.chunks, completion_tokens=len(so_far.token_ids),
                             continued_tokens=len(so_far.token_ids),
                             prompt_tokens=len(request["prompt_token_ids"]),
                             logprobs=list(so_far.logprobs) if request["sampling"].get("logprobs") else None)
        run_timeout = record.get("run_timeout_s") or self.settings.run_timeout_s
        deadline = time.monotonic() + run_timeout if run_timeout else None
        hold_until = 0.0  # the first text goes out at once; later text gathers for the interval

        def on_cancel() -> None:  # between writes, the worker's one watcher looks (cancel_watch)
            progress.cancel_asked = True
            stream.poke()

        def on_preempt() -> None:
            progress.preempt_asked = True
            stream.poke()
        self.cancels.watch(job_id, on_cancel)
        if record.get("priority") == "batch":
            self.picker.line_started(job_id, on_preempt)
        try:
            while progress.finish is None:
                self._collect(stream, progress, hold_until, _wait_s(deadline))
                if self._publish(job_id, attempt, progress):  # that write read the cancel flag too
                    hold_until = time.monotonic() + self.settings.stream_interval_ms / 1000
                self._stop_if_due(job_id, progress, deadline)
        finally:
            self.cancels.forget(job_id)
            self.picker.line_ended(job_id)
        out = progress.finish
        if progress.preempt_asked and out.finish_reason == FinishReason.CANCELLED \
                and not progress.cancel_asked and progress.abort_reason is None:
            return self._requeue(job_id, attempt)
        self._retrying(lambda: self._publish(job_id, attempt, progress, raise_errors=True))
        generated_here = progress.completion_tokens - progress.continued_tokens
        if self.meter and out.finish_reason in (FinishReason.STOP, FinishReason.LENGTH):
            self.meter.record_job(generated_here)
        if self.metrics:
            self.metrics.job_generated(record["created_at"], progress.first_token_at, time.time(),
                                       generated_here)
        reason = progress.abort_reason if out.finish_reason == FinishReason.CANCELLED and progress.abort_reason \
            else out.finish_reason
        status = _STATUS_BY_REASON[reason]
        error = {"type": out.error_type, "message": out.error} if out.error else None
        if reason == FinishReason.TIMEOUT:
            error = {"type": "run_timeout", "message": f"generation ran past its {run_timeout:g} s "
                                                       "limit and was stopped; the text so far is kept"}
        result = self._end(job_id, attempt, status, finish_reason=reason, text=progress.text,
                           prompt_tokens=progress.prompt_tokens,
                           completion_tokens=progress.completion_tokens,
                           batch_size_max=progress.batch_size_max, error=error, logprobs=progress.logprobs)
        cache_key = record.get("cache_key")
        if self.cache is not None and status is JobStatus.SUCCEEDED and cache_key \
                and result["status"] == status.value:
            self.cache.put(cache_key, {
                "text": progress.text, "finish_reason": out.finish_reason,
                "prompt_tokens": progress.prompt_tokens, "completion_tokens": progress.completion_tokens,
                **({"logprobs": progress.logprobs} if progress.logprobs is not None else {}),
            })
        return result

    def _requeue(self, job_id: str, attempt: int) -> dict:
        """A preempted line goes back to the head of its queue with a spare ticket, so it starts
        over on the next free slot of any worker (its text so far is dropped: the next attempt
        writes its own, after a `restart` event; a preempted line is not continued, as a lost
        worker's job is). A line that ended or moved on meanwhile is left as it is."""
        if self._retrying(lambda: self.store.requeue(job_id, attempt, self.worker_name)):
            self.picker.spare_ticket(None)
            return {"job_id": job_id, "status": "preempted"}
        return {"job_id": job_id, "status": "superseded"}

    def _stop_if_due(self, job_id: str, progress: _Progress, deadline: float | None) -> None:
        """Abort the request (once) when its run deadline passed, when a client asked to cancel,
        or when the worker preempts it (a batch line, for interactive work)."""
        if progress.aborted:
            return
        if deadline is not None and time.monotonic() >= deadline:
            progress.abort_reason = FinishReason.TIMEOUT
        if progress.abort_reason or progress.cancel_asked or progress.preempt_asked:
            progress.aborted = True
            self.loop.abort(job_id)

    def _collect(self, stream: RequestStream, progress: _Progress, hold_until: float, wait_s: float) -> None:
        """Take the outputs that came, waiting up to `wait_s` for one; before `hold_until` they
        gather in the stream, so that one write relays them all (see `stream_interval_ms`)."""
        for output in stream.take(wait_s, hold_until):
            if output.error_type == "continuation_refused":  # the engine cannot take this answer up
                raise CannotContinue(output.error)
            progress.pending += output.text
            progress.pending_ids += output.new_token_ids
            if output.logprobs:
                progress.pending_logprobs += output.logprobs
            progress.completion_tokens = output.completion_tokens
            progress.batch_size_max = max(progress.batch_size_max, output.batch_size)
            if progress.first_token_at is None and output.new_token_ids:
                progress.first_token_at = time.time()
            if output.finished:
                progress.finish = output
                return

    def _publish(self, job_id: str, attempt: int, progress: _Progress, raise_errors: bool = False) -> bool:
        """Write the pending text as one chunk; True once written (the write also reported whether
        a cancel was asked for). While Redis is down the text stays pending (and generation goes
        on); it is written, as one larger chunk, once Redis answers again. A write whose reply
        was lost may have landed: that is settled first, so no text is logged twice or skipped."""
        try:
            if progress.unconfirmed is not None:
                self._settle_unconfirmed(job_id, progress)
            if not progress.pending and not progress.pending_logprobs:
                return False
            delta = progress.unconfirmed = progress.pending
            ids = list(progress.pending_ids)
            progress.unconfirmed_ids = len(ids)
            ended = progress.finish.finish_reason if progress.finish is not None \
                and progress.finish.finish_reason in (FinishReason.STOP, FinishReason.LENGTH) else None
            chunk = {"index": progress.chunks, "text": delta}
            if progress.logprobs is not None:
                chunk["logprobs"] = progress.pending_logprobs[:]
            progress.unconfirmed_logprobs = len(progress.pending_logprobs)
            written = self.log.append_chunk(
                job_id, attempt, chunk, token_ids=ids, ended=ended,
                text=progress.text + delta, completion_tokens=progress.completion_tokens,
                batch_size_max=progress.batch_size_max)
        except redis.RedisError as exc:
            if raise_errors:
                raise
            if not progress.buffering:
                log.warning("job %s: Redis unavailable (%s); buffering its text", job_id, exc,
                            extra={"job_id": job_id})
            progress.buffering = True
            return False
        progress.unconfirmed = None
        if written is ChunkWrite.SUPERSEDED:
            raise Superseded(job_id)
        if written is ChunkWrite.ALREADY_WRITTEN:  # settle it on the next write
            progress.unconfirmed = delta
            return False
        if progress.buffering:
            log.info("job %s: Redis is back; buffered text written", job_id, extra={"job_id": job_id})
            progress.buffering = False
        self._confirm(progress, delta, len(ids))
        progress.cancel_asked = progress.cancel_asked or written is ChunkWrite.WRITTEN_CANCEL_ASKED
        return True

    def _settle_unconfirmed(self, job_id: str, progress: _Progress) -> None:
        """Whether the chunk whose reply was lost landed: the job counts the chunks written."""
        if self.log.chunks_written(job_id) > progress.chunks:
            self._confirm(progress, progress.unconfirmed, progress.unconfirmed_ids)
        progress.unconfirmed = None

    @staticmethod
    def _confirm(progress: _Progress, delta: str, token_count: int) -> None:
        progress.text += delta
        progress.pending = progress.pending[len(delta):]
        progress.pending_ids = progress.pending_ids[token_count:]
        progress.chunks += 1
        written, progress.pending_logprobs = (progress.pending_logprobs[:progress.unconfirmed_logprobs],
                                              progress.pending_logprobs[progress.unconfirmed_logprobs:])
        if progress.logprobs is not None:
            progress.logprobs += written

    def _end(self, job_id: str, attempt: int | None, status: JobStatus, **fields) -> dict:
        """Terminal record first, then the `done` event, so a client that sees `done` and reads
        the job gets the final state; coalesced followers end with it. Fenced by `attempt` (None:
        whatever attempt holds it)."""
        ended = self._retrying(lambda: self.store.finish(job_id, status, attempt=attempt, **fields))
        if ended is not None:
            for ended_id in ended:
                self._retrying(lambda: self.log.publish_done(ended_id))
            if self.metrics:
                self.metrics.job_finished(status.value)
            log.info("job %s %s (%s)", job_id, status.value, fields.get("finish_reason"),
                     extra={"job_id": job_id, "status": status.value,
                            "completion_tokens": fields.get("completion_tokens")})
        elif attempt is not None and self.store.status(job_id) is JobStatus.RUNNING:
            return {"job_id": job_id, "status": "superseded"}
        return {"job_id": job_id, "status": status.value, "finish_reason": fields.get("finish_reason")}

    def _retrying(self, write: Callable[[], T]) -> T:
        """Run a Redis write, retrying through an outage of up to `redis_retry_s` seconds."""
        give_up = time.monotonic() + self.settings.redis_retry_s
        delay = 0.2
        while True:
            try:
                return write()
            except redis.RedisError as exc:
                if time.monotonic() + delay > give_up:
                    raise
                log.warning("Redis unavailable (%s); retrying in %.1f s", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
