"""Runs an engine's `step()` on one background thread; other threads submit and abort requests.

Each submitted request gets a `RequestStream`: a queue of its outputs, ending with a finished one.
All engine calls happen on the loop thread, so the engine itself needs no locks.
"""
from __future__ import annotations

import collections
import logging
import queue
import threading
import time

from common.schemas import FinishReason
from worker.engine.protocol import ContinuationRefused, Engine
from worker.engine.sequence import EngineRequest, RequestOutput

log = logging.getLogger(__name__)


class RequestStream:
    """One request's outputs, from the engine loop to the thread that relays them.

    The reader may take them in bunches (`take`): outputs that come before its `hold_until` wait
    in the stream, unless one ends the request, and are then taken together. Relaying a bunch
    costs one Redis write and one SSE event per client instead of one per decode step, and on
    a CPU those writes take cores from the model."""

    def __init__(self, request_id: str, clock=time.monotonic):
        self.request_id = request_id
        self._clock = clock  # what `hold_until` is a time of (a test moves its own)
        self._outputs: collections.deque[RequestOutput] = collections.deque()
        self._ready = threading.Condition()
        self._wake_from = 0.0  # monotonic time from which a new output wakes the reader
        self._poked = False  # the reader has something to look at besides outputs

    def put(self, output: RequestOutput) -> None:
        with self._ready:
            self._outputs.append(output)
            if output.finished or self._clock() >= self._wake_from:
                self._ready.notify()

    def poke(self) -> None:
        """Wake the reader now, outputs or not: its `take` returns (a cancel to act on)."""
        with self._ready:
            self._poked = True
            self._ready.notify()

    def get(self, timeout: float) -> RequestOutput | None:
        """The next output, or None if none came within `timeout` seconds."""
        end = self._clock() + timeout
        with self._ready:
            while not self._outputs:
                left = end - self._clock()
                if left <= 0:
                    return None
                self._ready.wait(left)
            return self._outputs.popleft()

    def take(self, timeout: float, hold_until: float = 0.0) -> list[RequestOutput]:
        """Every output there, once one is and `hold_until` (a time of the stream's clock) has
        passed, or at once when one of them ends the request; [] if none is due within `timeout`
        seconds or once `poke`d (what came meanwhile stays, for the next call)."""
        end = self._clock() + timeout
        with self._ready:
            self._wake_from = hold_until
            try:
                while not (self._outputs and (self._outputs[-1].finished or self._clock() >= hold_until)):
                    now = self._clock()
                    if now >= end or self._poked:
                        self._poked = False
                        return []
                    self._ready.wait((min(end, hold_until) if hold_until > now else end) - now)
            finally:
                self._wake_from = 0.0
            taken = list(self._outputs)
            self._outputs.clear()
            return taken


class EngineLoop:
    def __init__(self, engine: Engine):
        self.engine = engine
        self._inbox: queue.Queue[tuple[str, object]] = queue.Queue()
        self._streams: dict[str, RequestStream] = {}
        self._wake = threading.Event()
        self._stopped = False
        engine.on_ready(self._wake.set)
        self._thread = threading.Thread(target=self._run, name="engine-loop", daemon=True)
        self._thread.start()

    def submit(self, request: EngineRequest) -> RequestStream:
        stream = RequestStream(request.request_id)
        self._inbox.put(("add", (request, stream)))
        self._wake.set()
        return stream

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))
        self._wake.set()

    def stop(self) -> None:
        """End the loop's thread (a model being unloaded: it has no request left)."""
        self._stopped = True
        self._wake.set()
        self._thread.join(5)

    @property
    def active(self) -> int:
        """Requests in the engine now (read from any thread; for heartbeats and metrics)."""
        return len(self._streams)

    def _run(self) -> None:
        """Step while there is work and the engine is ready; otherwise sleep until a request
        arrives or the engine becomes ready. An engine whose step runs elsewhere (vLLM's engine
        core) is waited for here rather than inside `step`, so a request that arrives meanwhile
        is handed to the engine at once and joins the very next step, as with vLLM's own server.
        The event is cleared before the checks, so a wake-up that comes during them is not lost."""
        while not self._stopped:
            self._wake.clear()
            self._drain_inbox()
            if self.engine.has_unfinished() and self.engine.ready():
                for output in self.engine.step():
                    self._deliver(output)
            else:
                self._wake.wait(timeout=1.0)

    def _drain_inbox(self) -> None:
        while True:
            try:
                kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                request, stream = payload
                self._add(request, stream)
            else:
                self.engine.abort_request(payload)

    def _add(self, request: EngineRequest, stream: RequestStream) -> None:
        try:
            self.engine.add_request(request)
        except ValueError as exc:  # request-level error: only this request fails
            refused = isinstance(exc, ContinuationRefused)  # the job runner starts it over
            stream.put(RequestOutput(request.request_id, "", [], finished=True, finish_reason=FinishReason.ERROR,
                                     prompt_tokens=len(request.prompt_token_ids), error=str(exc),
                                     error_type="continuation_refused" if refused else "invalid_request"))
            return
        self._streams[request.request_id] = stream

    def _deliver(self, output: RequestOutput) -> None:
        stream = self._streams.get(output.request_id)
        if stream is None:
            return
        stream.put(output)
        if output.finished:
            del self._streams[output.request_id]
