"""One attempt's text on its way from the engine to the job's token log, through Redis outages.

The worker's relay loop (worker/relay_loop.py) drives every running job's `TextRelay` from one
thread: it takes the outputs that came, writes the new text of all due jobs as one chunk each, in
one round trip, and stops a request when its time is up. Each chunk is fenced by the attempt number
(another attempt that took the job over makes this one stop: `Superseded`). While Redis is down the
text waits here and generation goes on; it is written, as one larger chunk, once Redis answers
again. A write whose reply was lost may have landed: that is settled from the job's count of chunks
before the next write, so no text is logged twice or skipped. The relay also stops the request,
once, when its run deadline passes, when a client asks to cancel (read with each write, and from
the worker's cancel watcher), or when the worker preempts it (a batch line, for interactive work).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from common.continuation import CannotContinue, Continuation
from common.schemas import FinishReason
from common.token_log import Chunk, ChunkWrite, TokenLog
from worker.engine.loop import RequestStream
from worker.engine.sequence import RequestOutput
from worker.job_claims import Superseded

log = logging.getLogger(__name__)

_ANSWERED = (FinishReason.STOP, FinishReason.LENGTH)


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
                 wants_logprobs: bool, run_timeout_s: float):
        """`so_far`: what a lost attempt already wrote (a continued job; else `NOTHING`).
        `abort()` stops the request in the engine. `run_timeout_s`: 0 for no deadline."""
        self.token_log, self.stream, self.abort = token_log, stream, abort
        self.job_id, self.attempt = job_id, attempt
        self.deadline = time.monotonic() + run_timeout_s if run_timeout_s else None
        # what the log holds
        self.text, self.chunks = so_far.text, so_far.chunks
        self.logprobs: list | None = list(so_far.logprobs) if wants_logprobs else None
        self.wrote_here = False  # this attempt has written a chunk (its first text went out)
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
        self.buffering = False  # Redis was unavailable at the last write

    # --- what the worker's watchers call ----------------------------------------------------
    def cancel(self) -> None:
        """A client asked to cancel (the worker's cancel watcher saw it between writes)."""
        self.cancel_asked = True
        self.stream.poke()

    def preempt(self) -> None:
        """The worker wants this slot for interactive work."""
        self.preempt_asked = True
        self.stream.poke()

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

    @property
    def has_pending(self) -> bool:
        """Text is waiting to be written (or a lost reply to be settled)."""
        return bool(self._pending) or self._unconfirmed is not None

    # --- the steps the relay loop takes -------------------------------------------------------
    def take_outputs(self) -> None:
        """Take the outputs that came; `CannotContinue` when the engine cannot take up this answer."""
        for output in self.stream.drain():
            if output.error_type == "continuation_refused":
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

    def stop_if_due(self, now: float) -> None:
        """Abort the request (once) when its deadline passed, a client asked to cancel, or the
        worker preempts it."""
        if self._aborted:
            return
        if self.deadline is not None and now >= self.deadline:
            self.timed_out = True
        if self.timed_out or self.cancel_asked or self.preempt_asked:
            self._aborted = True
            self.abort()

    def next_chunk(self) -> Chunk | None:
        """The pending text as the next chunk (None: nothing to write). Settles a lost reply
        first, so raises Redis errors; the chunk's fate goes to `written` or `not_written`."""
        if self._unconfirmed is not None:
            self._settle_unconfirmed()
        if not self._pending:
            return None
        sent = self._unconfirmed = self._pending.copy()
        data = {"index": self.chunks, "text": sent.text}
        if self.logprobs is not None:
            data["logprobs"] = sent.logprobs
        ended = self.finish.finish_reason if self.finish is not None \
            and self.finish.finish_reason in _ANSWERED else None
        return Chunk(self.job_id, self.attempt, data, sent.token_ids, ended,
                     {"text": self.text + sent.text, "completion_tokens": self.completion_tokens,
                      "batch_size_max": self.batch_size_max})

    def written(self, result: ChunkWrite) -> bool:
        """The chunk's write came back; True once it is in the log. `Superseded` when another
        attempt owns the job."""
        sent, self._unconfirmed = self._unconfirmed, None
        if result is ChunkWrite.SUPERSEDED:
            raise Superseded(self.job_id)
        if result is ChunkWrite.ALREADY_WRITTEN:  # the lost reply's chunk: settled at the next write
            self._unconfirmed = sent
            return False
        if self.buffering:
            log.info("job %s: Redis is back; buffered text written", self.job_id, extra={"job_id": self.job_id})
            self.buffering = False
        self._confirm(sent)
        self.wrote_here = True
        self.cancel_asked = self.cancel_asked or result is ChunkWrite.WRITTEN_CANCEL_ASKED
        return True

    def not_written(self, exc: redis.RedisError) -> None:
        """Redis failed the write, or its reply was lost: the text stays pending (and the chunk
        sent, if any, is settled before the next write)."""
        if not self.buffering:
            log.warning("job %s: Redis unavailable (%s); buffering its text", self.job_id, exc,
                        extra={"job_id": self.job_id})
        self.buffering = True

    def write_rest(self) -> None:
        """Write what is still pending, on its own; raises Redis errors, for the caller's retry
        policy."""
        chunk = self.next_chunk()
        if chunk is not None:
            (result,) = self.token_log.append_chunks([chunk])
            if not self.written(result) and self._unconfirmed is not None:
                self.write_rest()  # the lost reply's chunk is settled, and the rest written

    # --- helpers --------------------------------------------------------------------------
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
