"""Fair share between API keys: per-key FIFO lists, drained by start-time fair queuing (SFQ).

Why not Celery's queue order: its Redis queue is one FIFO per priority, so a key that submits 100
jobs holds every slot until they are done and a second key's single job waits behind all of them.
Here a Celery message is a *ticket* ("run the next job of this model's queue"), not a job: the
worker, when a slot is free, asks Redis which job is next (one Lua script, common/lua/fair_pick.lua,
with the steps of common/lua/fair_lib.lua and affinity_lib.lua):

- strictly by priority level first (high, normal, low);
- within a level, the key ("owner") whose *virtual start tag* is lowest; after each pick the
  owner's tag grows by its cost (1 / weight), and a key that becomes active joins at the current
  virtual clock (the tag of the last pick), never below its own last finish tag, so it cannot bank
  credit while idle. A key with weight 2 gets two jobs for every one of a weight-1 key;
- within a key, first come, first served.

Every job gets exactly one ticket and a pick consumes one, so there are always at least as many
tickets in the Celery queue as jobs in the fair queue; a ticket that finds the queue empty (its job
was cancelled, expired or picked by another ticket) does nothing. The pick records which job the
ticket (Celery task id) took, so a redelivered ticket, after its worker died, resumes *that* job.

Anonymous jobs (auth off) share one owner, so without keys the order is plain FIFO per priority.
Keys are per model queue (`Keys.fair_owners` etc.); the pick script builds an owner's list key from
its level's prefix, so this needs a single Redis instance (not Redis Cluster), like the rest of
llmq. Enqueueing and removal happen inside the job scripts (common/lua/fair_lib.lua).
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import redis

from common.keys import Keys
from common.lua import script
from common.scheduling.prefix_affinity import HOLDER_TTL_S, MAX_HOLDERS, Deferred
from common.schemas import PRIORITY_LEVELS, JobStatus

ANONYMOUS = "~anon"  # '~' is not allowed in key ids, so no key can collide with it
LEVELS = sorted(set(PRIORITY_LEVELS.values()))


class Pick(NamedTuple):
    job_id: str | None
    how: str  # 'picked', 'resumed' (a redelivered ticket's own job), or 'capped'
    priority: str = ""
    affinity: str = ""  # 'hit', 'miss' or 'new' (common/scheduling/prefix_affinity.py); '' when not routed on


CAPPED = Pick(None, "capped")  # only batch jobs wait, and the worker has no room for one more


@dataclass(frozen=True)
class FairPlace:
    """Where a new job goes: which lists, under which owner, at what cost per job."""

    owners: str
    jobs: str
    meta: str
    owner: str
    cost: float


def fair_place(keys: Keys, queue: str, level: int, owner: str | None, weight: float = 1.0) -> FairPlace:
    owner = owner or ANONYMOUS
    return FairPlace(keys.fair_owners(queue, level), keys.fair_jobs(queue, level, owner),
                     keys.fair_meta(queue, level), owner, 1.0 / weight)


class FairQueue:
    """Reads and picks of the per-model fair queues (enqueue happens inside job creation)."""

    def __init__(self, client: redis.Redis, keys: Keys, job_ttl_s: int):
        self.r = client
        self.keys = keys
        self.job_ttl_s = job_ttl_s
        self._pick = script(client, "fair_pick")

    def pick(self, queue: str, ticket: str, worker: str = "", batch_room: int | None = None,
             affinity_wait_s: float = 0.0) -> Pick | Deferred | None:
        """The job this ticket runs: `Pick(job id, 'picked', priority, affinity outcome)` for the
        fairest queued job, 'resumed' when this ticket already took one (a redelivery), None when
        nothing waits. With `batch_room` (how many more batch jobs this worker may take now) at 0,
        batch jobs stay queued: `CAPPED` if some wait. With `affinity_wait_s`, the fairest job
        may be left for the worker that served its prompt's start (`Deferred`, see
        common/scheduling/prefix_affinity.py). In the same step the job is recorded as held by `worker`
        (until `release`), so the API's ETAs see a slot taken at once, not at the next
        heartbeat."""
        levels = [key for level in LEVELS
                  for key in (self.keys.fair_owners(queue, level), self.keys.fair_meta(queue, level))]
        args = {"job_prefix": self.keys.job(""), "ticket_ttl_s": self.job_ttl_s, "worker": worker,
                "level_lists": [self.keys.fair_jobs(queue, level, "") for level in LEVELS],
                "affinity": {"wait_s": affinity_wait_s, "holder_ttl_s": HOLDER_TTL_S,
                             "max_holders": MAX_HOLDERS, "prefix": self.keys.affinity(queue, ""),
                             "free_slots_prefix": self.keys.free_slots("")}}
        if batch_room is not None:
            args["batch_room"] = batch_room
        result = self._pick(keys=[self.keys.ticket(ticket), self.keys.queued, self.keys.held, *levels],
                            args=[json.dumps(args)])
        if not result:
            return None
        if result[1] == "capped":
            return CAPPED
        if result[1] == "deferred":
            return Deferred(result[2], result[3] == "1")
        return Pick(*result)

    def release(self, job_id: str, worker: str) -> None:
        """The worker let go of a job it picked (it ended, or another worker holds it now)."""
        if self.r.hget(self.keys.held, job_id) == worker:
            self.r.hdel(self.keys.held, job_id)

    def held(self) -> dict[str, list[dict]]:
        """The jobs each worker holds now, by worker name: each job's `completion_tokens` so far
        and `max_tokens`. Entries of jobs that have ended are dropped (a worker that died
        without releasing leaves them)."""
        held = self.r.hgetall(self.keys.held)
        if not held:
            return {}
        pipe = self.r.pipeline(transaction=False)
        for job_id in held:
            pipe.hmget(self.keys.job(job_id), "status", "completion_tokens", "max_tokens")
        by_worker: dict[str, list[dict]] = {}
        for (job_id, worker), (status, done, max_tokens) in zip(held.items(), pipe.execute()):
            if status not in (JobStatus.QUEUED, JobStatus.RUNNING):
                self.r.hdel(self.keys.held, job_id)
                continue
            by_worker.setdefault(worker, []).append(
                {"completion_tokens": int(done or 0), "max_tokens": int(max_tokens) if max_tokens else None})
        return by_worker

    def interactive_waiting(self, queue: str) -> int:
        """Interactive jobs queued for this model (every level above batch), in two round trips."""
        pipe = self.r.pipeline(transaction=False)
        for level in LEVELS[:-1]:
            pipe.zrange(self.keys.fair_owners(queue, level), 0, -1)
        lists = [self.keys.fair_jobs(queue, level, owner)
                 for level, owners in zip(LEVELS[:-1], pipe.execute()) for owner in owners]
        if not lists:
            return 0
        for jobs in lists:
            pipe.llen(jobs)
        return sum(pipe.execute())

    def depth(self, queue: str) -> int:
        """Jobs of a model queue not yet picked by any worker, every level. (The Celery queue's own
        length does not say this: workers take tickets ahead of free slots.)"""
        return sum(sum(self._level(queue, level).lengths.values()) for level in LEVELS)

    def position(self, record: dict) -> int | None:
        """Jobs that will be picked before this queued one if nothing else arrives: every job
        of a higher priority level, then, in its level, the jobs of each key whose start tags
        come first, then those ahead of it in its own key's list. None if it is not queued."""
        return self.positions([record]).get(record["id"])

    def positions(self, records: list[dict]) -> dict[str, int]:
        """`position` of many jobs at once (every waiting stream of an API process, each second):
        each fair list and each level's owners are read once, whatever the number of jobs. Jobs
        that are not queued are left out."""
        indexes = self._indexes(records)
        levels: dict[tuple[str, int], _Level] = {}

        def level_of(queue: str, level: int) -> _Level:
            if (queue, level) not in levels:
                levels[queue, level] = self._level(queue, level)
            return levels[queue, level]
        return {record["id"]: _ahead(record, indexes[record["id"]], level_of)
                for record in records if record["id"] in indexes}

    def _indexes(self, records: list[dict]) -> dict[str, int]:
        """Each queued job's index in its key's list. A list with many of the jobs is read whole
        (one LRANGE); a job alone in its list is looked up (LPOS, which stops where it is)."""
        by_list: dict[str, list[str]] = {}
        for record in records:
            if None not in (record.get("queue"), record.get("priority_level"), record.get("fair_list")):
                by_list.setdefault(record["fair_list"], []).append(record["id"])
        pipe = self.r.pipeline(transaction=False)
        for jobs_list, ids in by_list.items():
            if len(ids) > _LOOKUPS_PER_LIST:
                pipe.lrange(jobs_list, 0, -1)
            else:
                for job_id in ids:
                    pipe.lpos(jobs_list, job_id)
        replies = iter(pipe.execute())
        indexes: dict[str, int] = {}
        for ids in by_list.values():
            if len(ids) > _LOOKUPS_PER_LIST:
                wanted = set(ids)
                indexes.update((job_id, i) for i, job_id in enumerate(next(replies)) if job_id in wanted)
            else:
                indexes.update((job_id, i) for job_id, i in zip(ids, replies) if i is not None)
        return indexes

    def _level(self, queue: str, level: int) -> "_Level":
        owners = self.r.zrange(self.keys.fair_owners(queue, level), 0, -1, withscores=True)
        pipe = self.r.pipeline(transaction=False)
        for owner, _ in owners:
            pipe.llen(self.keys.fair_jobs(queue, level, owner))
        pipe.hgetall(self.keys.fair_meta(queue, level))
        *lengths, meta = pipe.execute()
        return _Level(dict(owners), dict(zip((o for o, _ in owners), lengths)), meta)

def _ahead(record: dict, index: int, level_of: Callable[[str, int], "_Level"]) -> int:
    """`FairQueue.position` of a queued job at `index` in its key's list, from the snapshot of
    each level (`level_of(queue, level)`) up to its own."""
    queue, level = record["queue"], int(record["priority_level"])
    ahead = index
    for other_level in LEVELS:
        if other_level > level:
            break
        snapshot = level_of(queue, other_level)
        if other_level < level:
            ahead += sum(snapshot.lengths.values())
            continue
        mine = record.get("fair_owner") or ANONYMOUS
        if mine in snapshot.tags:
            my_tag = snapshot.tags[mine] + index * snapshot.cost(mine)
            ahead += sum(_served_before(my_tag, mine, tag, snapshot.cost(owner), owner, snapshot.lengths[owner])
                         for owner, tag in snapshot.tags.items() if owner != mine)
    return ahead


def position_when_enqueued(record: dict, index: int, levels: list) -> int:
    """`FairQueue.position` of a job just enqueued at `index` in its key's list, from the levels
    its creation read in the same step (common/lua/job_create.lua: `fair_snapshot` of each level
    up to its own, highest first)."""
    snapshots = dict(zip(LEVELS, map(_Level.from_script, levels)))
    return _ahead(record, index, lambda queue, level: snapshots[level])


_LOOKUPS_PER_LIST = 8  # more of a list's jobs than this at once: read the list whole


@dataclass(frozen=True)
class _Level:
    """One priority level of a model queue as read at one moment: each key's start tag, its
    number of queued jobs, and the level's meta hash (costs)."""
    tags: dict[str, float]
    lengths: dict[str, int]
    meta: dict[str, str]

    @classmethod
    def from_script(cls, reply: list) -> "_Level":
        """A level as a Lua script read it (`fair_snapshot` in common/lua/fair_lib.lua)."""
        tags, lengths, meta = reply
        owners = tags[::2]
        return cls(dict(zip(owners, map(float, tags[1::2]))), dict(zip(owners, lengths)),
                   dict(zip(meta[::2], meta[1::2])))

    def cost(self, owner: str) -> float:
        return float(self.meta.get(f"cost:{owner}", 1.0))


def _served_before(my_tag: float, me: str, tag: float, cost: float, owner: str, n: int) -> int:
    """How many of another key's `n` jobs (start tags tag, tag + cost, ...) are picked before a
    job with start tag `my_tag`; ties go to the owner that sorts first (Redis ZRANGE order)."""
    if n == 0 or tag > my_tag:
        return 0
    steps = (my_tag - tag) / cost
    count = math.floor(steps + 1e-9) + 1  # tags <= my_tag
    if abs(steps - round(steps)) < 1e-9 and owner > me:
        count -= 1  # a tie at my tag: the other owner sorts after me
    return min(n, count)
