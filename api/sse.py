"""Server-Sent Events relay of a job's token log.

The Redis Stream is the source of truth; pub/sub wakes the relay (through the process's one
listener, `api/wakeups.py`) and carries each chunk a worker logs, with the id of the entry before
it, so a relay that has every entry up to that one sends the chunk as heard and reads the stream
only for what it did not hear. The relay watches the job first, then reads the stream after the
client's last id, so a chunk written between the two is still read: late subscribers and
reconnecting clients (`Last-Event-ID`) lose nothing.

A job redelivered after its worker was lost continues from its log: the new attempt's chunks
follow the lost one's with the next indices, so the relay has nothing to do. Only a job that
cannot be continued (docs/reliability.md) starts over: its log then holds the abandoned run's
chunks, a `restart` event, and the new run's chunks (indices from 0 again). Chunks followed by a
`restart` in what the relay reads at once are not sent (a replay shows only the last run); a
client that already received chunks must drop its text when `restart` comes.
If Redis goes away mid-stream the stream ends; the client reconnects with `Last-Event-ID`.

While the job waits in the queue the relay also sends `queued` events (no id: they are not in the
log) with the job's `queue_position` and ETAs, when they change and every few seconds
(`api/queue_places.py`).
"""
from __future__ import annotations

import contextlib
import json
import logging
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

import redis
from flask import Response, stream_with_context

from api.services import Services
from api.stream_limits import StreamSlot
from api.wakeups import JobWatcher
from common.job_record import is_overdue
from common.schemas import JobStatus
from common.token_log import done_payload

if TYPE_CHECKING:
    from api.submit import Followed

log = logging.getLogger(__name__)
_STREAM_ID = re.compile(r"\d+(-\d+)?")


def format_event(event_id: str | None, event: str, data: dict) -> str:
    head = f"id: {event_id}\n" if event_id else ""
    return f"{head}event: {event}\ndata: {json.dumps(data)}\n\n"


def job_event_stream(svc: Services, job_id: str, last_event_id: str | None, places: bool = True,
                     every_attempt: bool = False, followed: Followed | None = None) -> Iterator[tuple[str | None, str, dict]]:
    """(id, event, data) of the job's log from after `last_event_id` until `done`; (None,
    'heartbeat', {}) while idle; with `places`, (None, 'queued', place) while it waits. Yields a
    `done` built from the record if the log lacks one. With `every_attempt`, the chunks of an
    attempt a `restart` abandoned are kept too, so every reader sees the log alike. `followed`:
    the job as the caller created it, with its watch (api/submit.py, `submit_followed`)."""
    last = last_event_id or "0"
    watch = contextlib.nullcontext(followed.woken) if followed else svc.wakeups.watch(job_id)
    created = followed.record if followed else None
    try:
        with watch as woken, (svc.places.watch(job_id, woken, created) if places else contextlib.nullcontext()):
            yield from _events_until_done(svc, job_id, last, woken, every_attempt)
    except redis.RedisError as exc:
        log.warning("SSE relay for job %s ends: Redis unavailable (%s)", job_id, exc)


def _events_until_done(svc: Services, job_id: str, last: str, woken: JobWatcher,
                       every_attempt: bool = False) -> Iterator[tuple[str | None, str, dict]]:
    """The log's events as they come, a heartbeat while none does, the place in line while the
    job waits; a `done` from the record when the log will not have one."""
    while True:
        woken.clear()  # before the read: a chunk logged after it sets it again
        place = woken.take_place()
        if place is not None:
            yield None, "queued", place
        for entry_id, event, data in _new_entries(svc, job_id, last, woken, every_attempt):
            last = entry_id
            yield entry_id, event, data
            if event == "done":
                return
        if woken.wait(timeout=svc.settings.sse_heartbeat_s):
            continue
        record = svc.jobs.get(job_id)
        if record is not None and is_overdue(record):
            svc.jobs.expire_if_overdue(job_id)  # logs `done`, read on the next pass
            continue
        if record is None or _ended_without_done(svc, job_id, record, last):
            if record and last == "0" and record.get("text"):  # log expired: replay the record
                yield None, "chunk", {"index": 0, "text": record["text"]}
            yield None, "done", done_payload(record or {"status": JobStatus.EXPIRED})
            return
        yield None, "heartbeat", {}


def _new_entries(svc: Services, job_id: str, last: str, woken: JobWatcher,
                 every_attempt: bool = False) -> list[tuple[str, str, dict]]:
    """The log's entries after `last`: the ones heard with their content as they are, each one
    that follows the entry before it; the stream is read for the rest (see `JobWatcher`)."""
    read_log, heard = woken.take()
    entries = svc.token_log.read_events(job_id, last) if read_log else []
    for entry in heard:
        last = entries[-1][0] if entries else last
        if entry.prev_id == last:
            entries.append((entry.entry_id, entry.event, json.loads(entry.data)))
        elif is_later(entry.entry_id, last):  # one before it was not heard: the stream has both
            entries += svc.token_log.read_events(job_id, last)
        # otherwise it was read already
    return entries if every_attempt else _last_attempt(entries)


def stream_id(text: str) -> tuple[int, int]:
    """A Redis Stream id ("1700000000000-3", or a bare time) as a comparable pair; ValueError if
    it is none."""
    if not _STREAM_ID.fullmatch(text):
        raise ValueError(f"not a stream id: {text!r}")
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)


def is_later(entry_id: str, last: str) -> bool:
    return stream_id(entry_id) > stream_id(last)


def _last_attempt(events: list[tuple[str, str, dict]]) -> list[tuple[str, str, dict]]:
    """Drop chunks that a later `restart` in the same batch has abandoned."""
    restarts = [i for i, (_, event, _) in enumerate(events) if event == "restart"]
    if not restarts:
        return events
    return [e for i, e in enumerate(events) if i >= restarts[-1] or e[1] != "chunk"]


def _ended_without_done(svc: Services, job_id: str, record: dict, last: str) -> bool:
    """A terminal job whose log has no `done` (log expired, or writer lost in between)."""
    return JobStatus(record["status"]).terminal and not svc.token_log.read_events(job_id, last)


def sse_response(events: Iterator[tuple[str | None, str, dict]], slot: StreamSlot) -> Response:
    """The events as an SSE response, holding `slot` until it closes. Its first bytes go out at
    once, so a client hears within milliseconds that its stream is open, however long it waits."""
    def body():
        yield "retry: 2000\n\n"
        for event_id, event, data in events:
            yield ": keep-alive\n\n" if event == "heartbeat" else format_event(event_id, event, data)

    return streaming_response(body(), slot)


def streaming_response(body: Iterator[str], slot: StreamSlot, headers: dict | None = None) -> Response:
    """`body` as a text/event-stream response (llmq's SSE or OpenAI's) that holds `slot` until the
    response closes, renewing its lease as the body yields."""
    response = Response(stream_with_context(slot.held(body)), mimetype="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no", **(headers or {})})
    response.call_on_close(slot.release)
    return response
