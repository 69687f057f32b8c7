"""A new queued job as `JobStore.create` inserts it: what the caller gives (`NewJob`), the call of
common/lua/job_create.lua that inserts it with its ticket and reads its place (one step), and
what comes back (`Created`). Kept apart from JobStore so one job and a burst of them (a batch's
lines, pipelined) are built the same way."""
from __future__ import annotations

import json
import time
from typing import Any, NamedTuple

from common.scheduling.fair_queue import LEVELS, fair_place, position_when_enqueued
from common.job_record import decode_record, encode_fields
from common.keys import Keys
from common.schemas import PRIORITY_LEVELS
from common.tickets import Ticket


class NewJob(NamedTuple):
    """A job to insert: its fields, its key's fair-share `weight`, the request `digest` that
    names it to identical requests (None: it is not theirs to attach to), its broker `ticket`."""
    job_id: str
    fields: dict[str, Any]
    weight: float = 1.0
    digest: str | None = None
    ticket: Ticket | None = None


class Created(NamedTuple):
    """A job `JobStore.create` inserted: its record as written, and the queued jobs that will
    start before it (when asked for)."""
    record: dict[str, Any]
    ahead: int | None


class CreateCall(NamedTuple):
    keys: list[str]
    args: list[Any]
    encoded: list[str]
    place: bool


def create_call(keys: Keys, ttl_s: int, job: NewJob, queue_limit: int, queued_key: str | None,
                place: bool) -> CreateCall:
    """The script's KEYS and ARGV for `job` (see the header of common/lua/job_create.lua)."""
    fields = job.fields
    level = PRIORITY_LEVELS[fields.get("priority") or "normal"]
    queue = fields.get("queue") or "default"
    where = fair_place(keys, queue, level, fields.get("owner"), job.weight)
    encoded = encode_fields({**fields, "fair_list": where.jobs, "fair_owner": where.owner, "priority_level": level})
    read = [lv for lv in LEVELS if lv <= level] if place else []
    ticket = job.ticket
    return CreateCall(
        keys=[keys.job(job.job_id), queued_key or keys.queued, where.owners, where.jobs, where.meta,
              keys.inflight(job.digest or ""), keys.deadlines, ticket.list_key if ticket else "",
              *(key for lv in read for key in (keys.fair_owners(queue, lv), keys.fair_meta(queue, lv)))],
        args=[queue_limit, fields.get("created_at", time.time()), job.job_id, ttl_s, where.owner, where.cost,
              "1" if job.digest else "0", fields.get("queue_deadline") or "", ticket.message if ticket else "",
              len(read), *(keys.fair_jobs(queue, lv, "") for lv in read), json.dumps(encoded)],
        encoded=encoded, place=place)


def created(call: CreateCall, reply: list) -> Created | None:
    """The script's reply: the job as written (no read back) and its place; None when the queue
    was full. A job that already exists is a ValueError."""
    if reply[0] == -1:
        raise ValueError(f"job {call.args[2]} exists")
    if reply[0] == 0:
        return None
    record = decode_record(dict(zip(call.encoded[::2], call.encoded[1::2])))
    return Created(record, position_when_enqueued(record, reply[1], reply[2:]) if call.place else None)
