"""One attempt's text on its way from the engine to the job's token log, through Redis outages.

New text gathers for `stream_interval_ms`, longer when the worker holds many jobs (`RelayPace`; the
first text goes out at once), and is written as one chunk, fenced by the attempt number (another
attempt that took the job over makes this one stop: `Superseded`). While Redis is down the text
waits here and generation goes on; it is written, as one larger chunk, once Redis answers again. A
write whose reply was lost may have landed: that is settled from the job's count of chunks before
the next write, so no text is logged twice or skipped. The relay also stops the request, once, when
its run deadline passes, when a client asks to cancel (read with each write, and from the worker's
cancel watcher), or when the worker preempts it (a batch line, for interactive work).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from common.continuation import CannotContinue, Continuation
from common.schemas import FinishReason
from common.token_log import ChunkWrite, TokenLog
from worker.engine.loop import RequestStream
from worker.engine.sequence import RequestOutput
from worker.job_claims import Superseded

log = logging.getLogger(__name__)

IDLE_WAKE_S = 1.0  # a job with nothing new still wakes this often (text held back by a Redis outage)
_ANSWERED = (FinishReason.STOP, FinishReason.LENGTH)


class RelayPace:
    """How long a running job's new text gathers before it is relayed: `stream_interval_ms`, or
    longer once the worker holds more jobs than `stream_writes_per_s` allows at that interval, so
    that all its jobs together write about that many times a second (at most every
    `MAX_INTERVAL_S`). Each write is a Redis write, an SSE event per client and a wake-up of a job
    thread; on a small CPU, at tens of jobs, their sum takes a share of the cores from the engine
    (docs/benchmarks.md), while the reader of each of those answers gets a few tokens a second and
    reads a chunk of them as readily."""

    MAX_INTERVAL_S = 1.0

    def __init__(self, interval_s: float, writes_per_s: float, running: Callable[[], int]):
        """`running()`: the jobs the worker's engine holds now (each relays its own text)."""
        self.floor_s, self.writes_per_s, self.running = interval_s, writes_per_s, running

    def interval_s(self) -> float:
        if not self.writes_per_s:
            return self.floor_s
        return max(self.floor_s, min(self.MAX_INTERVAL_S, self.running() / self.writes_per_s))


@dataclass
class _Text:
    """Generated text with the tokens and logprobs entries it came from."""
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.text or self.logprobs)

    def copy(self) -> _Text:
        return _Text(self.text, list(self.token_ids), list(self.logprobs))

    def after(self, head: _Text) -> _Text:
        """What is left once `head`, a copy of this text's start, is taken off."""
        return _Text(self.text[len(head.text):], self.token_ids[len(head.token_ids):],
                     self.logprobs[len(head.logprobs):])


class TextRelay:
    """One attempt's relay: what the log holds, what waits to be written, and why it stops."""

    def __init__(self, token_log: TokenLog, stream: RequestStream, abort: Callable[[], None],
                 job_id: str, attempt: int, so_far: Continuation, prompt_tokens: int,
                 wants_logprobs: bool, pace: RelayPace, run_timeout_s: float):
        """`so_far`: what a lost attempt already wrote (a continued job; else `NOTHING`).
        `abort()` stops the request in the engine. `run_timeout_s`: 0 for no deadline."""
        self.token_log, self.stream, self.abort = token_log, stream, abort
        self.job_id, self.attempt, self.pace = job_id, attempt, pace
        self.deadline = time.monotonic() + run_timeout_s if run_timeout_s else None
        # what the log holds
        self.text, self.chunks = so_far.text, so_far.chunks
        self.logprobs: list | None = list(so_far.logprobs) if wants_logprobs else None
        # what the engine reported
        self.prompt_tokens = prompt_tokens
        self.completion_tokens = self.continued_tokens = len(so_far.token_ids)
        self.batch_size_max = 0
        self.first_token_at: float | None = None
        self.finish: RequestOutput | None = None
        # why it stops early
        self.timed_out = False
        self.cancel_asked = False  # by a client (read from Redis)
        self.preempt_asked = False  # by this worker: a batch line that starts over later
        self._aborted = False
        # not in the log yet
        self._pending = _Text()  # generated, not yet written (Redis slow or down)
        self._unconfirmed: _Text | None = None  # a write whose reply was lost: it may have landed
        self._buffering = False  # Redis was unavailable at the last write

    # --- what the job's thread and the worker's watchers call -----------------------------
    def cancel(self) -> None:
        """A client asked to cancel (the worker's cancel watcher saw it between writes)."""
        self.cancel_asked = True
        self.stream.poke()

    def preempt(self) -> None:
        """The worker wants this slot for interactive work."""
        self.preempt_asked = True
        self.stream.poke()

    def run(self) -> RequestOutput:
        """Relay the request's outputs until it finishes; its last output. The text that Redis
        could not take yet is still pending then: `write_rest`."""
        hold_until = 0.0  # the first text goes out at once; later text gathers for the interval
        while self.finish is None:
            self._take(hold_until)
            if self.write():  # that write read the cancel flag too
                hold_until = time.monotonic() + self.pace.interval_s()
            self._stop_if_due()
        return self.finish

    def write_rest(self) -> None:
        """Write what is still pending; raises Redis errors, for the caller's retry policy."""
        self.write(raise_errors=True)

    # --- what it found --------------------------------------------------------------------
    @property
    def preempted(self) -> bool:
        """It stopped only because the worker preempted it (so it starts over elsewhere)."""
        return self.preempt_asked and self.finish.finish_reason == FinishReason.CANCELLED \
            and not self.cancel_asked and not self.timed_out

    @property
    def finish_reason(self) -> FinishReason:
        """Why it ended: `timeout` for a request this relay stopped at its deadline."""
        if self.finish.finish_reason == FinishReason.CANCELLED and self.timed_out:
            return FinishReason.TIMEOUT
        return self.finish.finish_reason

    @property
    def generated_here(self) -> int:
        """Tokens this attempt generated (a continued job's first ones came from a lost attempt)."""
        return self.completion_tokens - self.continued_tokens

    # --- the steps ---------------------------------------------------------------------
    def _wait_s(self) -> float:
        """How long to wait for the next output: until the run deadline, at most IDLE_WAKE_S
        (a cancel wakes it at once)."""
        if self.deadline is None:
            return IDLE_WAKE_S
        return max(0.0, min(IDLE_WAKE_S, self.deadline - time.monotonic()))

    def _take(self, hold_until: float) -> None:
        """Take the outputs that came, waiting a while for one; before `hold_until` they gather
        in the stream, so that one write relays them all (see `stream_interval_ms`)."""
        for output in self.stream.take(self._wait_s(), hold_until):
            if output.error_type == "continuation_refused":  # the engine cannot take this answer up
                raise CannotContinue(output.error)
            self._pending.text += output.text
            self._pending.token_ids += output.new_token_ids
            if output.logprobs:
                self._pending.logprobs += output.logprobs
            self.completion_tokens = output.completion_tokens
            self.batch_size_max = max(self.batch_size_max, output.batch_size)
            if self.first_token_at is None and output.new_token_ids:
                self.first_token_at = time.time()
            if output.finished:
                self.finish = output
                return

    def _stop_if_due(self) -> None:
        """Abort the request (once) when its deadline passed, a client asked to cancel, or the
        worker preempts it."""
        if self._aborted:
            return
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.timed_out = True
        if self.timed_out or self.cancel_asked or self.preempt_asked:
            self._aborted = True
            self.abort()

    def write(self, raise_errors: bool = False) -> bool:
        """Write the pending text as one chunk; True once written. While Redis is down the text
        stays pending (`raise_errors`: the error is raised instead of logged)."""
        try:
            if self._unconfirmed is not None:
                self._settle_unconfirmed()
            if not self._pending:
                return False
            sent = self._unconfirmed = self._pending.copy()
            chunk = {"index": self.chunks, "text": sent.text}
            if self.logprobs is not None:
                chunk["logprobs"] = sent.logprobs
            ended = self.finish.finish_reason if self.finish is not None \
                and self.finish.finish_reason in _ANSWERED else None
            written = self.token_log.append_chunk(
                self.job_id, self.attempt, chunk, token_ids=sent.token_ids, ended=ended,
                text=self.text + sent.text, completion_tokens=self.completion_tokens,
                batch_size_max=self.batch_size_max)
        except redis.RedisError as exc:
            if raise_errors:
                raise
            if not self._buffering:
                log.warning("job %s: Redis unavailable (%s); buffering its text", self.job_id, exc,
                            extra={"job_id": self.job_id})
            self._buffering = True
            return False
        if written is ChunkWrite.SUPERSEDED:
            self._unconfirmed = None
            raise Superseded(self.job_id)
        if written is ChunkWrite.ALREADY_WRITTEN:  # settled with the next write
            return False
        self._unconfirmed = None
        if self._buffering:
            log.info("job %s: Redis is back; buffered text written", self.job_id,
                     extra={"job_id": self.job_id})
            self._buffering = False
        self._confirm(sent)
        self.cancel_asked = self.cancel_asked or written is ChunkWrite.WRITTEN_CANCEL_ASKED
        return True

    def _settle_unconfirmed(self) -> None:
        """Whether the chunk whose reply was lost landed: the job counts the chunks written."""
        if self.token_log.chunks_written(self.job_id) > self.chunks:
            self._confirm(self._unconfirmed)
        self._unconfirmed = None

    def _confirm(self, written: _Text) -> None:
        self.text += written.text
        self.chunks += 1
        if self.logprobs is not None:
            self.logprobs += written.logprobs
        self._pending = self._pending.after(written)
