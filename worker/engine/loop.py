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
from collections.abc import Callable

from common.schemas import FinishReason
from worker.engine.protocol import ContinuationRefused, Engine
from worker.engine.sequence import EngineRequest, RequestOutput

log = logging.getLogger(__name__)


class RequestStream:
    """One request's outputs, from the engine loop to the worker's relay (or to a reader of `get`).

    The relay does not wait on each stream: it `listen`s, and is woken only when an output is due
    (the first ones, until it `hold`s the stream; the one that ends the request; a `poke`); the
    rest wait here and are `drain`ed together at its next tick. Relaying a bunch costs one Redis
    write and one SSE event per client instead of one per decode step, and on a CPU every wake-up
    and write takes a core from the model."""

    def __init__(self, request_id: str, clock=time.monotonic):
        self.request_id = request_id
        self._clock = clock  # what `hold`'s time is a time of (a test moves its own)
        self._outputs: collections.deque[RequestOutput] = collections.deque()
        self._ready = threading.Condition()
        self._wake: Callable[[], None] | None = None  # the listener
        self._wake_from = 0.0  # time from which a new output wakes the listener

    def put(self, output: RequestOutput) -> None:
        with self._ready:
            self._outputs.append(output)
            self._ready.notify()
            wake = self._wake if output.finished or self._clock() >= self._wake_from else None
        if wake is not None:
            wake()

    def listen(self, wake: Callable[[], None]) -> None:
        """Call `wake()` (on the engine loop's thread: it must be quick) when an output is due."""
        with self._ready:
            self._wake = wake

    def hold(self, until: float) -> None:
        """Outputs before `until` (a time of the stream's clock; `math.inf`: ever) wait without
        waking the listener, except the one that ends the request."""
        with self._ready:
            self._wake_from = until

    def poke(self) -> None:
        """Wake the listener now, outputs or not (a cancel to act on)."""
        with self._ready:
            wake = self._wake
        if wake is not None:
            wake()

    def drain(self) -> list[RequestOutput]:
        """Every output there now (none: [])."""
        with self._ready:
            taken = list(self._outputs)
            self._outputs.clear()
            return taken

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
