"""A job's token log: a Redis Stream of its events (`chunk`, `restart`, `done`), replayable from any
entry id (`Last-Event-ID`), and the announcements of its growth on the job's channel. A chunk's
entry also keeps the token ids its text came from, so that an attempt redelivered after its
worker was lost can continue the answer exactly (common/continuation.py).

Announcements: every append PUBLISHes on `Keys.channel(job_id)`. An entry a worker logs (a chunk,
a restart) is announced with its content, "<previous entry id> <entry id> <event> <data>"
(common/lua/token_log_lib.lua writes it, `parse_announcement` reads it), so an SSE relay that has
every entry up to the previous one sends the new one without reading it back. Any other message
(an event name: the `done` event, a cache hit's chunk) only says: read the log.

The `done` event also queues the job's `completed` webhook; a job's start queues its `start`
webhook (`notify`).
"""
from __future__ import annotations

import enum
import json
import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import redis

from common.job_record import decode_record, encode_fields, encode_mapping
from common.keys import Keys
from common.lua import script
from common.openai_models import Usage
from common.schemas import JobStatus

log = logging.getLogger(__name__)


class ChunkWrite(enum.IntEnum):
    """What became of a chunk written with `append_chunk` (false only when superseded)."""
    SUPERSEDED = 0  # another attempt owns the job, or it ended: this attempt must stop
    WRITTEN = 1
    ALREADY_WRITTEN = 2  # a chunk with this index is in the log (a lost reply): nothing written
    WRITTEN_CANCEL_ASKED = 3  # written, and a client has asked to cancel the job


class Announcement(NamedTuple):
    """A log entry as announced on the job's channel; `data` is still JSON text."""
    prev_id: str
    entry_id: str
    event: str
    data: str


class Chunk(NamedTuple):
    """A chunk to write with `append_chunks` (the arguments of `append_chunk`)."""
    job_id: str
    attempt: int
    data: dict[str, Any]
    token_ids: list[int] | None = None
    ended: str | None = None
    record: dict[str, Any] | None = None  # fields of the job's record to set with it


def parse_announcement(message: str) -> Announcement | None:
    """The entry a channel message announces, or None for a message that only wakes."""
    parts = message.split(" ", 3)
    return Announcement(*parts) if len(parts) == 4 else None


def done_payload(record: dict[str, Any]) -> dict[str, Any]:
    """The `done` event body: final status, finish reason, usage, error."""
    return {"status": record.get("status"), "finish_reason": record.get("finish_reason"),
            "usage": Usage.of(record).model_dump(),
            "error": record.get("error"), "cached": record.get("cached", False)}


class TokenLog:
    def __init__(self, client: redis.Redis, keys: Keys, job_ttl_s: int, maxlen: int,
                 on_event: Callable[[str, dict[str, Any]], None] | None = None):
        """`on_event(event, record)` hears 'start' (a worker began the job: once, not on a
        restart) and 'completed' (the job ended, in any status); it is how webhooks are queued
        (common/webhooks.py). Its failures are logged and never stop the job's own writes."""
        self.r = client
        self.keys = keys
        self.job_ttl_s = job_ttl_s
        self.maxlen = maxlen
        self.on_event = on_event
        self._append_chunk = script(client, "token_log_append_chunk")

    def append_event(self, job_id: str, event: str, data: dict[str, Any], **record: Any) -> None:
        """Add one event to the job's log, wake its listeners, and optionally update the record
        (all or nothing: MULTI/EXEC, so a dying writer never leaves the record and log apart)."""
        pipe = self.r.pipeline(transaction=True)
        if record:
            pipe.hset(self.keys.job(job_id), mapping=encode_mapping(record))
        stream = self.keys.events(job_id)
        pipe.xadd(stream, {"event": event, "data": json.dumps(data)}, maxlen=self.maxlen, approximate=True)
        pipe.expire(stream, self.job_ttl_s)
        pipe.publish(self.keys.channel(job_id), event)
        pipe.execute()

    def append_chunk(self, job_id: str, attempt: int, data: dict[str, Any], *,
                     token_ids: list[int] | None = None, ended: str | None = None,
                     **record: Any) -> ChunkWrite:
        """Add a `chunk` of attempt `attempt` (and update the record) atomically, to the job and
        the followers riding on it, only if that attempt still owns the running job. With an
        `index` in `data`, a chunk is written once however often it is sent (see
        `chunks_written`). `token_ids` (the tokens the chunk's text came from) and `ended` (the
        finish reason, on a finished generation's last chunk) are kept in the entry, unannounced,
        for an attempt that continues the job (common/continuation.py)."""
        return self.append_chunks([Chunk(job_id, attempt, data, token_ids, ended, record)])[0]

    def append_chunks(self, chunks: list[Chunk]) -> list[ChunkWrite]:
        """`append_chunk` for several jobs' chunks in one round trip: a worker's relay writes all
        its jobs' new text at once. Each chunk is atomic on its own (its script), the batch is
        not: after a Redis error any of them may have landed (`chunks_written` tells)."""
        pipe = self.r.pipeline(transaction=False)
        for chunk in chunks:
            self._append_chunk(
                keys=[self.keys.job(chunk.job_id)],
                args=[*self.keys.job_layout(), chunk.attempt, "chunk", json.dumps(chunk.data), self.maxlen,
                      self.job_ttl_s, chunk.data.get("index", ""), ",".join(map(str, chunk.token_ids or ())),
                      chunk.ended or "", *encode_fields(chunk.record or {})],
                client=pipe)
        return [ChunkWrite(result) for result in pipe.execute()]

    def chunks_written(self, job_id: str) -> int:
        """Chunks in the job's log since its run began (its last `restart`), for a writer that
        lost a reply and for an attempt that continues the run."""
        return int(self.r.hget(self.keys.job(job_id), "chunks_written") or 0)

    def read_entries(self, job_id: str) -> list[dict[str, str]]:
        """Every entry of the job's log with all its fields (`event`, `data`, and a chunk's
        `ids` and `end`), oldest first."""
        return [fields for _, fields in self.r.xrange(self.keys.events(job_id))]

    def publish_done(self, job_id: str) -> None:
        """Close the job's log with a `done` event built from its (terminal) record."""
        raw = self.r.hgetall(self.keys.job(job_id))
        record = decode_record(raw) if raw else {}
        self.append_event(job_id, "done", done_payload(record))
        if record.get("webhook"):
            self.notify("completed", [job_id], record)

    def read_events(self, job_id: str, after: str = "0") -> list[tuple[str, str, dict[str, Any]]]:
        """Events strictly after stream id `after`, as (id, event, data)."""
        entries = self.r.xrange(self.keys.events(job_id), min=f"({after}" if after != "0" else "-")
        return [(entry_id, f["event"], json.loads(f["data"])) for entry_id, f in entries]

    def notify(self, event: str, job_ids: list[str], record: dict[str, Any] | None = None,
               followers_of: str | None = None) -> None:
        """Tell `on_event` about jobs that asked for a webhook (and about the followers of
        `followers_of`); 'start' only for jobs now running. Never raises: a caller may be a
        write that must not be retried. Jobs without a webhook cost one HMGET each."""
        if self.on_event is None:
            return
        try:
            if followers_of:
                job_ids = [*job_ids, *self.r.smembers(self.keys.followers(followers_of))]
            if record is None:
                pipe = self.r.pipeline(transaction=False)
                for job_id in job_ids:
                    pipe.hmget(self.keys.job(job_id), "webhook", "status")
                job_ids = [job_id for job_id, (url, status) in zip(job_ids, pipe.execute())
                           if url and (event != "start" or status == JobStatus.RUNNING)]
        except redis.RedisError:
            log.warning("could not read jobs %s for their %s webhooks", job_ids, event)
            return
        for job_id in job_ids:
            try:
                job = record
                if job is None:
                    raw = self.r.hgetall(self.keys.job(job_id))
                    job = decode_record(raw) if raw else None
                if job and job.get("webhook"):
                    self.on_event(event, job)
            except Exception:
                log.exception("job %s: could not queue its %s webhook", job_id, event)
