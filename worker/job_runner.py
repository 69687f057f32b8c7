"""Runs one job: the loop that ties its parts. A ticket picks the job (common/scheduling/), the
claim fences it (worker/job_claims.py), the engine generates it while its text is relayed to the
token log (worker/text_relay.py; every job's by one thread, worker/relay_loop.py), and its end
becomes status, cache and metrics (worker/job_outcome.py).

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

import logging
from collections.abc import Callable

from common.continuation import NOTHING, CannotContinue, Continuation, read_continuation
from common.jobs import Claimed, JobStore
from common.logs import job_context
from common.result_cache import ResultCache
from common.scheduling.fair_queue import CAPPED
from common.scheduling.free_slots import FreeSlots
from common.scheduling.picker import TicketPicker
from common.schemas import FinishReason, JobStatus
from common.settings import Settings
from worker.cancel_watch import CancelWatch
from worker.engine.loop import EngineLoop
from worker.engine_request import engine_request
from worker.job_claims import JobClaims, Superseded
from worker.job_outcome import JobOutcomes
from worker.lease import Leases
from worker.load_meter import LoadMeter
from worker.metrics import WorkerMetrics
from worker.relay_loop import RelayLoop, RelayPace
from worker.text_relay import TextRelay

log = logging.getLogger(__name__)


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
        self.token_log = store.token_log
        self.metrics = metrics
        self.loop = loop
        self.worker_name = worker_name
        self.settings = settings
        self.claims = JobClaims(store, worker_name, settings, metrics)
        self.outcomes = JobOutcomes(self.claims, cache, metrics, meter)
        self.leases = leases or Leases(store, worker_name, self.claims.lease_ttl_s)
        self.cancels = CancelWatch(store, settings.cancel_poll_s)
        self.relays = RelayLoop(self.token_log, RelayPace(settings.stream_interval_ms / 1000,
                                                          settings.stream_writes_per_s, lambda: loop.active))
        self.picker = TicketPicker(store.fair, worker_name, settings, self.claims.retrying, send_ticket,
                                   free_slots, on_affinity=metrics.affinity_picked if metrics is not None else None)

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
        self.relays.stop()

    def run(self, job_id: str) -> dict:
        if self.claims.expire_if_overdue(job_id):
            log.info("job %s: expired in the queue", job_id, extra={"job_id": job_id})
            return {"job_id": job_id, "status": JobStatus.EXPIRED.value, "finish_reason": FinishReason.TIMEOUT}
        claim = self.claims.claim(job_id)
        outcome, attempt = claim
        log.info("job %s: %s (attempt %d)", job_id, outcome, attempt, extra={"job_id": job_id})
        ended = self.outcomes.not_to_run(job_id, claim)
        if ended is not None:
            return ended
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
            return self.claims.end(job_id, attempt, JobStatus.FAILED, finish_reason=FinishReason.ERROR,
                                   error={"type": "worker_error", "message": str(exc)})
        finally:
            self.leases.release(job_id)

    def _run_attempt(self, job_id: str, attempt: int, record: dict, outcome: Claimed) -> dict:
        """A redelivered job continues from its log where it can; where it cannot, it starts over
        after a `restart` event (common/continuation.py)."""
        if outcome is Claimed.REDELIVERED:
            try:
                return self._generate(job_id, attempt, record, self._continuation(job_id, record))
            except CannotContinue as exc:
                log.info("job %s: starting over: %s", job_id, exc, extra={"job_id": job_id})
                self.claims.restart(job_id, attempt, "the previous attempt lost its worker, and its "
                                    f"answer cannot be continued: {exc}")
        return self._generate(job_id, attempt, record, NOTHING)

    def _continuation(self, job_id: str, record: dict) -> Continuation:
        """Where the lost attempt's answer stands, from the log; `CannotContinue` when the log
        cannot say, or for a carrier (a job whose own client left: its log stopped there, its
        followers' went on)."""
        if record.get("status") != JobStatus.RUNNING:
            raise CannotContinue("its own client left, so its log stopped early")
        entries = self.claims.retrying(lambda: self.token_log.read_entries(job_id))
        so_far = read_continuation(entries, int(record.get("chunks_written") or 0))
        if so_far.chunks:
            log.info("job %s: continuing after %d tokens in %d chunks", job_id, len(so_far.token_ids),
                     so_far.chunks, extra={"job_id": job_id})
        return so_far

    def _generate(self, job_id: str, attempt: int, record: dict, so_far: Continuation) -> dict:
        request = record["request"]
        if so_far.ended:  # the lost attempt generated the whole answer: only its end is missing
            return self.outcomes.generated_before(job_id, attempt, request, so_far)
        stream = self.loop.submit(engine_request(job_id, request, so_far))
        run_timeout = record.get("run_timeout_s") or self.settings.run_timeout_s
        relay = TextRelay(self.token_log, stream, lambda: self.loop.abort(job_id), job_id, attempt, so_far,
                          len(request["prompt_token_ids"]), bool(request["sampling"].get("logprobs")),
                          run_timeout)
        self.cancels.watch(job_id, relay.cancel)  # between writes, the worker's one watcher looks
        if record.get("priority") == "batch":
            self.picker.line_started(job_id, relay.preempt)
        try:
            self.relays.relay(relay)
        finally:
            self.cancels.forget(job_id)
            self.picker.line_ended(job_id)
        if relay.preempted:
            return self._requeue(job_id, attempt)
        self.claims.retrying(relay.write_rest)
        return self.outcomes.generated(job_id, attempt, record, relay, run_timeout)

    def _requeue(self, job_id: str, attempt: int) -> dict:
        """A preempted line goes back to the head of its queue with a spare ticket, so it starts
        over on the next free slot of any worker. A line that ended or moved on meanwhile is left
        as it is."""
        if self.claims.requeue(job_id, attempt):
            self.picker.spare_ticket(None)
            return {"job_id": job_id, "status": "preempted"}
        return {"job_id": job_id, "status": "superseded"}
