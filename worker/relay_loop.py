"""One thread relays the text of all the jobs a worker's engine runs, in one Redis round trip a tick.

A job's thread hands its `TextRelay` (worker/text_relay.py) to the loop and sleeps until the request
has ended; the loop wakes once a tick (`RelayPace`), takes every job's new outputs, and writes all
their new text together, one chunk a job, in one pipeline. A request's first text and its end do
not wait for the tick: they wake the loop at once (time to first token, and a finished job's slot).
So a worker running tens of jobs wakes about ten times a second, not once per job and write: on a
small CPU each wake-up of a thread beside the engine preempts one of the engine's compute threads,
and its whole step waits for it (docs/benchmarks.md).
"""
from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

import redis

from common.token_log import TokenLog
from worker.engine.sequence import RequestOutput
from worker.text_relay import TextRelay

log = logging.getLogger(__name__)

IDLE_WAKE_S = 1.0  # the loop looks at its jobs at least this often (text held back by a Redis outage)
_LIVENESS_S = 30.0  # a job's thread, asleep while its text is relayed, checks the loop lives this often


class RelayPace:
    """How long a running job's new text gathers before it is relayed: `stream_interval_ms`, or
    longer once the worker holds more jobs than `stream_writes_per_s` allows at that interval, so
    that all its jobs together write about that many times a second (at most every
    `MAX_INTERVAL_S`). Each write is a Redis write and an SSE event per client; on a small CPU, at
    tens of jobs, their sum takes a share of the cores from the engine (docs/benchmarks.md), while
    the reader of each of those answers gets a few tokens a second and reads a chunk of them as
    readily."""

    MAX_INTERVAL_S = 1.0

    def __init__(self, interval_s: float, writes_per_s: float, running: Callable[[], int]):
        """`running()`: the jobs the worker's engine holds now (each relays its own text)."""
        self.floor_s, self.writes_per_s, self.running = interval_s, writes_per_s, running

    @property
    def every_step(self) -> bool:
        """No pacing at all: each decode step's text is relayed as it comes."""
        return not self.floor_s and not self.writes_per_s

    def interval_s(self) -> float:
        if not self.writes_per_s:
            return self.floor_s
        return max(self.floor_s, min(self.MAX_INTERVAL_S, self.running() / self.writes_per_s))


class _Relaying:
    """A relay in the loop, and how its job's thread learns that it has ended."""

    def __init__(self, relay: TextRelay):
        self.relay = relay
        self.ended = threading.Event()
        self.error: BaseException | None = None  # raised in the job's thread


class RelayLoop:
    def __init__(self, token_log: TokenLog, pace: RelayPace, clock: Callable[[], float] = time.monotonic):
        self.token_log, self.pace, self.clock = token_log, pace, clock
        self._relaying: list[_Relaying] = []
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = False
        self._thread: threading.Thread | None = None

    def relay(self, relay: TextRelay) -> RequestOutput:
        """Relay the request's text until it ends (on the calling job's thread, which sleeps
        meanwhile); its last output. What Redis could not take yet is still pending then
        (`TextRelay.write_rest`). Raises what stopped the relay (`Superseded`, `CannotContinue`)."""
        relaying = _Relaying(relay)
        relay.stream.listen(self._wake.set)
        with self._lock:
            if self._stopped:
                raise RuntimeError("the worker's relay loop has stopped")
            self._relaying.append(relaying)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="text-relay", daemon=True)
                self._thread.start()
        self._wake.set()
        while not relaying.ended.wait(_LIVENESS_S):
            if not self._thread.is_alive():
                raise RuntimeError("the worker's relay loop died")
        if relaying.error is not None:
            raise relaying.error
        return relay.finish

    def stop(self) -> None:
        """The model is unloaded (no job left): the loop's thread ends."""
        with self._lock:
            self._stopped = True
        self._wake.set()

    # --- the loop's thread ------------------------------------------------------------------
    def _run(self) -> None:
        next_tick = 0.0
        while True:
            with self._lock:
                waiting = list(self._relaying)
            self._wake.wait(self._wait_s(waiting, next_tick))
            self._wake.clear()  # before the look: a wake-up that comes during it is kept
            with self._lock:
                stopped, relaying = self._stopped, list(self._relaying)
            if stopped:
                for relaying_one in relaying:
                    self._end(relaying_one, RuntimeError("the worker's relay loop stopped"))
                return
            now = self.clock()
            tick = now >= next_tick or self.pace.every_step
            if tick:
                next_tick = now + (self.pace.interval_s() or IDLE_WAKE_S)
            try:
                self._relay_once(relaying, tick, now)
            except Exception as exc:  # a fault of this loop: fail these jobs, keep serving others
                log.exception("the relay loop failed")
                for relaying_one in relaying:
                    self._end(relaying_one, exc)

    def _wait_s(self, relaying: list[_Relaying], next_tick: float) -> float:
        """Until the next tick (while jobs run) or the nearest run deadline, at most IDLE_WAKE_S."""
        if not relaying:
            return IDLE_WAKE_S
        until = min([next_tick, *(r.relay.deadline for r in relaying
                                  if r.relay.deadline is not None and not r.relay.timed_out)])
        return max(0.0, min(IDLE_WAKE_S, until - self.clock()))

    def _relay_once(self, relaying: list[_Relaying], tick: bool, now: float) -> None:
        """Take every job's outputs; write the text of those due in one round trip (all of them
        on a tick; otherwise those with their first text or their end, unless Redis is down);
        stop the requests whose time is up; end the relays whose request finished."""
        due: list[_Relaying] = []
        for relaying_one in relaying:
            relay = relaying_one.relay
            try:
                relay.take_outputs()
            except Exception as exc:  # CannotContinue, for the job's thread to start over
                self._end(relaying_one, exc)
                continue
            urgent = relay.finish is not None or not (relay.wrote_here or relay.buffering)
            if relay.has_pending and (tick or urgent):
                due.append(relaying_one)
        self._write(due)
        for relaying_one in relaying:
            if relaying_one.ended.is_set():
                continue
            relay = relaying_one.relay
            relay.stop_if_due(now)
            if relay.finish is not None:
                self._end(relaying_one, None)

    def _write(self, due: list[_Relaying]) -> None:
        """One chunk per due job, in one round trip."""
        sending = []
        for relaying in due:
            try:
                chunk = relaying.relay.next_chunk()
            except redis.RedisError as exc:
                relaying.relay.not_written(exc)
                continue
            if chunk is not None:
                sending.append((relaying, chunk))
        if not sending:
            return
        try:
            results = self.token_log.append_chunks([chunk for _, chunk in sending])
        except redis.RedisError as exc:
            for relaying, _ in sending:
                relaying.relay.not_written(exc)
            return
        for (relaying, _), result in zip(sending, results):
            relay, first = relaying.relay, not relaying.relay.wrote_here
            try:
                if relay.written(result) and first and not self.pace.every_step:
                    relay.stream.hold(math.inf)  # its first text is out: the rest waits for the ticks
            except Exception as exc:  # Superseded: another attempt owns the job
                self._end(relaying, exc)

    def _end(self, relaying: _Relaying, error: BaseException | None) -> None:
        if relaying.ended.is_set():
            return
        relaying.error = error
        with self._lock:
            if relaying in self._relaying:
                self._relaying.remove(relaying)
        relaying.ended.set()
