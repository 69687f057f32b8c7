"""Runs one job: the loop that ties its parts. A ticket picks the job (below), the claim fences
it (worker/job_claims.py), the engine generates it while its text is relayed to the token log
(worker/text_relay.py), and its end becomes status, cache and metrics (worker/job_outcome.py).

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
import threading
import time
from collections.abc import Callable

import redis

from common.continuation import NOTHING, CannotContinue, Continuation, read_continuation
from common.fair_queue import CAPPED, Pick
from common.jobs import Claimed, JobStore
from common.logs import job_context
from common.prefix_affinity import Deferred
from common.result_cache import ResultCache
from common.schemas import FinishReason, JobStatus
from common.settings import Settings
from worker.batch_yield import BatchYield
from worker.cancel_watch import CancelWatch
from worker.engine.loop import EngineLoop
from worker.engine_request import engine_request
from worker.free_slots import FreeSlots
from worker.job_claims import JobClaims, Superseded
from worker.job_outcome import JobOutcomes
from worker.lease import Leases
from worker.load_meter import LoadMeter
from worker.metrics import WorkerMetrics
from worker.text_relay import TextRelay

log = logging.getLogger(__name__)

CAPPED_WAIT_S = 0.1  # a ticket waiting for batch room looks again at least this often
PREEMPT_POLL_S = 0.2  # how often a worker whose batch lines hold more than their share looks for waiting jobs
DEFERRED_WAIT_S = 0.02  # a ticket that left the next job to its prefix's holder looks again this often


class JobRunner:
    def __init__(self, store: JobStore, loop: EngineLoop, worker_name: str, settings: Settings,
                 leases: Leases | None = None, metrics: WorkerMetrics | None = None,
                 meter: LoadMeter | None = None, cache: ResultCache | None = None,
                 send_ticket: Callable[[str | None], None] | None = None,
                 free_slots: FreeSlots | None = None):
        """`cache`: where succeeded answers to cacheable requests go (None: nowhere).
        `send_ticket(worker)`: sends a spare ticket to that worker's own queue (for a job prefix
        affinity leaves it, common/prefix_affinity.py), or with None to the model's queue (for a
        preempted batch line). `free_slots`: where this worker tells the others how many jobs it
        can start now (worker/free_slots.py)."""
        self.store = store
        self.token_log = store.log
        self.metrics = metrics
        self.loop = loop
        self.worker_name = worker_name
        self.settings = settings
        self.claims = JobClaims(store, worker_name, settings, metrics)
        self.outcomes = JobOutcomes(self.claims, cache, metrics, meter)
        self._retrying = self.claims.retrying  # for picking: Redis outages ridden out (common/redis_retry.py)
        self.leases = leases or Leases(store, worker_name, self.claims.lease_ttl_s)
        self.cancels = CancelWatch(store, settings.cancel_poll_s)
        self.batch_yield = BatchYield(settings.max_batch_size, settings.batch_max_share,
                                      settings.batch_yield_window_s)
        self.send_ticket = send_ticket
        self.free_slots = free_slots
        self._batch_lines: dict[str, tuple[float, Callable[[], None]]] = {}  # running here: start, preempt
        self._batch_lines_lock = threading.Lock()
        self._preempt_watch: threading.Thread | None = None
        self._deferred_line = threading.Lock()  # one deferring ticket looks again at a time
        self._stopping = threading.Event()

    def run_ticket(self, ticket: str, queue: str) -> dict:
        """Run the job a Celery message is a ticket for: the fairest queued job of `queue` when
        a slot is free (common/fair_queue.py), or, for a redelivered message, the job it took
        before. A ticket that finds nothing queued has nothing to do."""
        self._watch_for_preemption(queue)
        picked = self._pick(ticket, queue)
        if picked is None:
            return {"job_id": None, "status": "idle"}
        if picked is CAPPED:  # the worker stops while this ticket waits for batch room
            return {"job_id": None, "status": "requeue"}
        job_id = picked.job_id
        try:
            with job_context(job_id):
                return self.run(job_id)
        finally:
            self.batch_yield.done(picked.priority)
            if self.free_slots is not None:
                self.free_slots.released()
            try:
                self.store.fair.release(job_id, self.worker_name)
            except redis.RedisError:
                log.warning("could not record that job %s was let go", job_id, exc_info=True)

    def _pick(self, ticket: str, queue: str) -> Pick | None:
        """The ticket's job. Two waits keep the slot free without giving the ticket up: while
        only batch lines wait and batch work may take no more of this worker's slots
        (worker/batch_yield.py), until that changes; while the next job is left for the worker
        that caches its prompt's start (common/prefix_affinity.py), until that worker takes it
        or the affinity wait ends. CAPPED only when the worker stops meanwhile."""
        def pick() -> Pick | Deferred | None:
            room, picked = self.batch_yield.before_pick(), None
            try:
                picked = self._retrying(lambda: self.store.fair.pick(
                    queue, ticket, self.worker_name, room, self.settings.prefix_affinity_wait_s))
                return picked
            finally:
                took = isinstance(picked, Pick) and picked.job_id
                self.batch_yield.after_pick(room, picked.priority if took else None)
                if took and self.free_slots is not None:
                    self.free_slots.taken()
                if took and picked.affinity and self.metrics is not None:
                    self.metrics.affinity_picked(picked.affinity)
        picked = pick()
        while picked is CAPPED or isinstance(picked, Deferred):
            if self._stopping.is_set():
                return CAPPED
            if picked is CAPPED:
                with self.batch_yield.waiting_line:
                    self.batch_yield.wait_for_room(CAPPED_WAIT_S)
                    picked = pick()
                continue
            if picked.first:
                self._send_ticket(picked.holder)
            with self._deferred_line:
                self._stopping.wait(DEFERRED_WAIT_S)
                picked = pick()
        return picked

    def _send_ticket(self, worker: str | None) -> None:
        """A spare ticket: on a prefix holder's own queue (it may have a free slot and no ticket
        in hand), or on the model's queue for a preempted line. Never raises: the holder still
        gets its job by any ticket it has, or ours takes it."""
        if self.send_ticket is None:
            return
        try:
            self.send_ticket(worker)
        except Exception:
            log.warning("could not send a ticket (to %s)", worker or "the model's queue", exc_info=True)

    def _watch_for_preemption(self, queue: str) -> None:
        """Started with the first ticket: while batch lines hold more than their share of this
        worker's slots and interactive jobs wait for the model, preempt the lines beyond the
        share (worker/batch_yield.py)."""
        with self._batch_lines_lock:
            if self._preempt_watch is not None or self.batch_yield.uncapped:
                return
            self._preempt_watch = threading.Thread(target=self._preempt_forever, args=(queue,),
                                                   name="batch-preemption", daemon=True)
            self._preempt_watch.start()

    def _preempt_forever(self, queue: str) -> None:
        while not self._stopping.wait(PREEMPT_POLL_S):
            try:
                over = self.batch_yield.batch_over_share()
                if over and (waiting := self.store.fair.interactive_waiting(queue)):
                    self._preempt_batch_lines(min(over, waiting))
            except redis.RedisError:
                pass  # Redis is away: nothing can start meanwhile anyway
            except Exception:  # never let the watcher die: the next look may succeed
                log.exception("batch preemption check failed")

    def _preempt_batch_lines(self, count: int) -> None:
        """Stop the `count` batch lines that started here last; they start over later. A line
        asked again before it has stopped is the same line: asking twice changes nothing."""
        with self._batch_lines_lock:
            youngest = sorted(self._batch_lines.items(), key=lambda item: item[1][0], reverse=True)[:count]
        for job_id, (_, preempt) in youngest:
            log.info("preempting batch line %s for interactive work", job_id, extra={"job_id": job_id})
            preempt()

    def stop_waiting(self) -> None:
        """The worker stops: tickets waiting for batch room or for another worker's pick go back to
        the queue."""
        self._stopping.set()

    def close(self) -> None:
        """Its model is unloaded (no job left): its watcher threads end."""
        self._stopping.set()
        self.cancels.stop()

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
                          self.settings.stream_interval_ms / 1000, run_timeout)
        self.cancels.watch(job_id, relay.cancel)  # between writes, the worker's one watcher looks
        if record.get("priority") == "batch":
            with self._batch_lines_lock:
                self._batch_lines[job_id] = (time.monotonic(), relay.preempt)
        try:
            relay.run()
        finally:
            self.cancels.forget(job_id)
            with self._batch_lines_lock:
                self._batch_lines.pop(job_id, None)
        if relay.preempted:
            return self._requeue(job_id, attempt)
        self.claims.retrying(relay.write_rest)
        return self.outcomes.generated(job_id, attempt, record, relay, run_timeout)

    def _requeue(self, job_id: str, attempt: int) -> dict:
        """A preempted line goes back to the head of its queue with a spare ticket, so it starts
        over on the next free slot of any worker. A line that ended or moved on meanwhile is left
        as it is."""
        if self.claims.requeue(job_id, attempt):
            self._send_ticket(None)
            return {"job_id": job_id, "status": "preempted"}
        return {"job_id": job_id, "status": "superseded"}
