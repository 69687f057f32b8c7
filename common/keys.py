"""Every Redis key and channel name llmq uses, in one place, all under the namespace.

Lua scripts get their keys as KEYS; a script that finds jobs as it runs (a primary's followers, an
heir) gets the job key layout instead (`job_layout`), so no layout is spelled anywhere else."""
from __future__ import annotations

import re
from dataclasses import dataclass

# A job's own keys: its record's key plus one of these
_EVENTS, _WAKE, _LEASE, _FOLLOWERS = ":events", ":wake", ":lease", ":followers"


def model_slug(model: str) -> str:
    """A queue-safe short form of a model name or path ('Qwen/Qwen2.5-0.5B' -> 'qwen2.5-0.5b')."""
    base = model.rstrip("/").split("/")[-1]
    return re.sub(r"[^a-zA-Z0-9._-]+", "-", base).lower()


@dataclass(frozen=True)
class Keys:
    """Key builder. TTL policy: job, events and cancel keys get `job_ttl_s` once the job ends;
    cache entries get `cache_ttl_s`; worker heartbeats and job leases expire after 3 heartbeats;
    per-key rate windows after a minute, per-key active sets after `job_ttl_s`."""

    ns: str

    def job(self, job_id: str) -> str:
        return f"{self.ns}:job:{job_id}"

    def events(self, job_id: str) -> str:
        """Redis Stream: the replayable token log of one job."""
        return self.job(job_id) + _EVENTS

    def channel(self, job_id: str) -> str:
        """Pub/sub channel announcing that the job's log grew (what a message says:
        common/token_log.py)."""
        return self.job(job_id) + _WAKE

    def job_layout(self) -> list[str]:
        """How a script builds the keys of jobs it finds as it runs: the job key prefix, the
        suffixes of a job's log, channel and followers set, and the inflight prefix. The first
        five ARGV of every job script (common/lua/job_keys.lua)."""
        return [self.job(""), _EVENTS, _WAKE, _FOLLOWERS, self.inflight("")]

    def cache(self, digest: str) -> str:
        return f"{self.ns}:cache:{digest}"

    @property
    def queued(self) -> str:
        """Sorted set of queued job ids (score: enqueue time); its size is the admission bound."""
        return f"{self.ns}:queued"

    @property
    def workers(self) -> str:
        """Hash worker name -> JSON info (model, pid, batch stats), refreshed by heartbeats."""
        return f"{self.ns}:workers"

    def worker_alive(self, name: str) -> str:
        return f"{self.ns}:worker:{name}:alive"

    def queue(self, model: str) -> str:
        """Celery queue name for a model."""
        return f"{self.ns}.{model_slug(model)}"

    def model_loading(self, model: str) -> str:
        """The lock a worker holds while it loads `model` (value: its name; expires unless renewed),
        so one worker loads a cold model, not every worker that sees its queue."""
        return f"{self.ns}:loading:{model_slug(model)}"

    @property
    def model_loads(self) -> str:
        """Hash model -> JSON of its last load (seconds, worker, when): for /v1/models and the ETAs
        of jobs waiting for a cold model."""
        return f"{self.ns}:model_loads"

    # --- metrics -------------------------------------------------------------------------
    @property
    def stats(self) -> str:
        """Hash of cluster-wide counters (jobs finished by status, cache hits and misses)."""
        return f"{self.ns}:stats"

    def broker_lists(self, queue: str) -> list[str]:
        """The Redis lists holding a Celery queue's messages: kombu keeps one per priority step
        (under the broker's key prefix), so a queue's depth is the sum of their lengths."""
        from kombu.transport.redis import Channel

        from common.schemas import PRIORITY_LEVELS  # the priority steps the broker is configured with

        steps = sorted(set(PRIORITY_LEVELS.values()))
        return [f"{self.broker_prefix}{queue}{Channel.sep}{p}" if p else f"{self.broker_prefix}{queue}"
                for p in steps]

    # --- leases, deadlines, API keys --------------------------------------------------------
    def lease(self, job_id: str) -> str:
        """Which worker runs the job now; expires unless that worker's heartbeat renews it."""
        return self.job(job_id) + _LEASE

    @property
    def deadlines(self) -> str:
        """Sorted set of queued job ids by queue deadline (epoch s), swept for expiry."""
        return f"{self.ns}:deadlines"

    def rate(self, key_id: str) -> str:
        """Sorted set: one member per job submission of an API key in the last minute."""
        return f"{self.ns}:key:{key_id}:rate"

    def active(self, key_id: str) -> str:
        """Sorted set of an API key's job ids (score: admission time) that may still be queued
        or running; ended ones are dropped lazily, when the set looks full."""
        return f"{self.ns}:key:{key_id}:active"

    def stream_leases(self, key_id: str) -> str:
        """Sorted set: one lease per open stream of an API key (score: when it lapses)."""
        return f"{self.ns}:key:{key_id}:streams"

    @property
    def broker_prefix(self) -> str:
        """Prefix kombu puts before every broker key (queues, unacked messages)."""
        return f"{self.ns}:broker:"

    @property
    def control_exchange(self) -> str:
        """Celery's broadcast exchange (worker pings, Flower's inspect); kombu keeps its bindings
        in Redis under this name."""
        return f"{self.ns}.control"

    @property
    def event_exchange(self) -> str:
        """Celery's task-event exchange (Flower listens on it)."""
        return f"{self.ns}.events"

    @property
    def broker_unacked_index(self) -> str:
        """kombu's sorted set of delivered, unacked messages (delivery tag -> delivery time)."""
        return f"{self.broker_prefix}unacked_index"

    # --- fair share between keys, coalescing -----------------------------------------------
    def fair_prefix(self, queue: str) -> str:
        """Prefix of a model queue's fair-queue keys (see common/scheduling/fair_queue.py)."""
        return f"{self.ns}:fair:{queue}:"

    def fair_owners(self, queue: str, level: int) -> str:
        """Sorted set: keys with queued jobs at a priority level -> their virtual start tag."""
        return f"{self.fair_prefix(queue)}{level}:owners"

    def fair_jobs(self, queue: str, level: int, owner: str) -> str:
        """List: one key's queued job ids at a priority level, oldest first. With owner "": the
        prefix of the level's lists, for the pick script (common/lua/fair_pick.lua)."""
        return f"{self.fair_prefix(queue)}{level}:jobs:{owner}"

    def fair_meta(self, queue: str, level: int) -> str:
        """Hash: the level's virtual clock, and each key's cost per job and last finish tag."""
        return f"{self.fair_prefix(queue)}{level}:meta"

    def worker_queue(self, queue: str, worker: str) -> str:
        """Celery queue that only one worker of a model queue consumes: the tickets another worker
        sends it, to run a job whose prompt prefix it caches (common/scheduling/prefix_affinity.py)."""
        return f"{queue}.worker.{worker}"

    def affinity(self, queue: str, block: str) -> str:
        """Hash: the workers that started a job whose prompt began with this block chain (a hash
        of it) -> when they last did; with block "": the prefix, for the pick script."""
        return f"{self.fair_prefix(queue)}affinity:{block}"

    def free_slots(self, worker: str) -> str:
        """String: how many more jobs a worker can start now (with worker "": the prefix)."""
        return f"{self.ns}:free:{worker}"

    def ticket(self, task_id: str) -> str:
        """Which job a Celery message (a ticket) took, so its redelivery resumes that job."""
        return f"{self.ns}:ticket:{task_id}"

    @property
    def held(self) -> str:
        """Hash job id -> the worker holding it (picked, not yet let go), for fresh ETAs."""
        return f"{self.ns}:held"

    def inflight(self, digest: str) -> str:
        """The queued or running job generating the answer to a request digest (coalescing)."""
        return f"{self.ns}:inflight:{digest}"

    def followers(self, job_id: str) -> str:
        """Set of the jobs attached to this job's generation (identical requests, coalesced)."""
        return self.job(job_id) + _FOLLOWERS

    # --- webhooks ---------------------------------------------------------------------------
    def webhook(self, delivery_id: str) -> str:
        """Hash: one webhook delivery (url, signed body, attempts, last outcome); TTL job_ttl_s."""
        return f"{self.ns}:webhook:{delivery_id}"

    def webhooks_of(self, subject_id: str) -> str:
        """Hash: a subject's (job's, batch's) event type -> its delivery id; TTL job_ttl_s."""
        return f"{self.ns}:webhooks:{subject_id}"

    def control_queue(self, name: str) -> str:
        """Celery queue of model-less work (webhook deliveries...). The ':' keeps it apart from
        model queues, whose slugs cannot contain one."""
        return f"{self.ns}.control:{name}"

    # --- files and batches ------------------------------------------------------------------
    def file(self, file_id: str) -> str:
        """Hash: a file's metadata (the OpenAI file object's fields, owner, chunk count)."""
        return f"{self.ns}:file:{file_id}"

    def file_data(self, file_id: str) -> str:
        """List: a file's content in chunks of at most a few MB, in order."""
        return f"{self.ns}:file:{file_id}:data"

    def files_of(self, owner: str) -> str:
        """Sorted set: an owner's file ids by creation time (for listing)."""
        return f"{self.ns}:files:{owner}"

    def batch(self, batch_id: str) -> str:
        """Hash: a batch's record (status, timestamps, counts, usage, owner)."""
        return f"{self.ns}:batch:{batch_id}"

    def batch_part(self, batch_id: str, part: str) -> str:
        """A batch's working keys: 'requests' (hash line -> prepared job), 'pending' (set of lines
        not yet accounted for), 'results' (hash line -> output or error line), 'queued' (its jobs'
        queued set, kept apart from the interactive admission bound), 'lock', 'tick'."""
        return f"{self.ns}:batch:{batch_id}:{part}"

    def batches_of(self, owner: str) -> str:
        """Sorted set: an owner's batch ids by creation time (for listing)."""
        return f"{self.ns}:batches:{owner}"

    @property
    def batches_active(self) -> str:
        """Set of batches that have not ended: what the control worker's watchdog looks after."""
        return f"{self.ns}:batches:active"

    @property
    def batch_queue(self) -> str:
        """Celery queue of the model-less batch tasks (validation, progress, output files)."""
        return f"{self.ns}.batches"
