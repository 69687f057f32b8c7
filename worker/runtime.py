"""One model as a worker serves it: its engine loop, its heartbeat, its leases and free slots.

A worker process holds one of these per model it has loaded (worker/held_models.py): the first
built before the Celery consumer starts, so no job is taken before the model is loaded and no
model exists before a fork (the worker uses Celery's threads pool: one thread per batch slot);
others loaded and unloaded as the catalog's demand moves.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable

import redis

from common.catalog import CatalogModel
from common.models import ModelRef
from common.scheduling.free_slots import FreeSlots
from common.scheduling.stranded import StrandedJobs
from common.settings import Settings
from common.stores import Stores
from common.tickets import Tickets, tickets_waiting
from worker.engine.loop import EngineLoop
from worker.engine.registry import build_engine
from worker.tuning import resolve as resolve_engine
from worker.job_runner import JobRunner
from worker.metrics import WorkerMetrics
from worker import orphan_tickets
from worker.lease import Leases, lease_ttl
from worker.load_meter import LoadMeter

log = logging.getLogger(__name__)
REDIS_CONNECTIONS = 16  # a worker's sockets to Redis for its jobs (Celery's broker has its own)


class WorkerRuntime:
    def __init__(self, settings: Settings, model: ModelRef, loop: EngineLoop, engine_kind: str,
                 engine_info: dict | None = None, stores: Stores | None = None, name: str | None = None):
        self.settings = settings
        self.engine_info = engine_info or {}  # dtype, KV capacity: shown by /health's workers_detail
        self.model = model
        self.loop = loop
        self.engine_kind = engine_kind
        self.name = name or process_name()
        # webhooks are only queued here (for `python -m worker.control`): generation never waits.
        # Every held job writes through one pool of a few sockets: its commands are short, and a
        # socket per job would cost Redis a client per held job across the whole fleet
        self.stores = stores or worker_stores(settings)
        self.keys, self.redis, self.jobs = self.stores.keys, self.stores.redis, self.stores.jobs
        self.metrics = WorkerMetrics(lambda: self.loop.engine.stats, lambda: self.loop.active, {
            "model": model.name, "engine": engine_kind, "queue": self.queue, "worker": self.name})
        self.leases = Leases(self.jobs, self.name, lease_ttl(settings))
        self.free_slots: FreeSlots | None = None  # only prefix affinity reads it: off, no write per job
        if settings.prefix_affinity_wait_s:
            self.free_slots = FreeSlots(self.redis, self.keys.free_slots(self.name), settings.max_batch_size,
                                        ttl_s=settings.heartbeat_ttl_s)
        self.meter = LoadMeter()
        self.stranded = StrandedJobs()
        self.process_info: Callable[[], dict] = dict  # what the worker process adds (its room for models)
        self.runner: JobRunner | None = None  # built by the Celery glue with the first ticket
        self._stopping = threading.Event()

    @classmethod
    def build(cls, settings: Settings, entry: CatalogModel, stores: Stores | None = None,
              name: str | None = None) -> "WorkerRuntime":
        """Prepare (download, convert or export, once) and load the catalog model `entry`."""
        settings = entry.settings(settings)
        model = entry.resolve(settings, prepare=True)
        settings, choice = resolve_engine(settings, model.name)  # measured where `python -m worker.tune` ran
        log.info("loading model %s from %s (%s), engine=%s, weights=%s: %s", model.name, model.path, model.source,
                 settings.engine, settings.weights, choice["why"])
        engine, info = build_engine(settings, model)
        return cls(settings, model, EngineLoop(engine), info["engine"], {**info, "engine_choice": choice},
                   stores, name)

    @property
    def queue(self) -> str:
        return self.keys.queue(self.model.name)

    @property
    def own_queue(self) -> str:
        """The queue only this worker consumes: tickets other workers send it (prefix affinity)."""
        return self.keys.worker_queue(self.queue, self.name)

    def start_heartbeat(self) -> None:
        threading.Thread(target=self._heartbeat_forever, name="heartbeat", daemon=True).start()

    def sign_off(self) -> None:
        """On a clean shutdown: stop beating and leave the live workers at once (a killed worker
        leaves when its heartbeat goes stale)."""
        self._stopping.set()
        if self.free_slots is not None:
            self.free_slots.forget()
        try:
            self.stores.registry.forget(self.name)
        except redis.RedisError as exc:
            log.warning("could not sign off: %s", exc)

    def close(self) -> None:
        """After the last job: the job runner's watcher threads end, and the engine lets go of what
        it holds outside this process."""
        if self.runner is not None:
            self.runner.close()
        self.loop.engine.close()

    def _heartbeat_forever(self) -> None:
        while not self._stopping.is_set():
            try:
                self.heartbeat()
            except redis.RedisError as exc:
                log.warning("heartbeat failed: %s", exc)
            except Exception:  # never let the thread die: leases depend on it
                log.exception("heartbeat failed")
            self._stopping.wait(self.settings.heartbeat_s)

    def heartbeat(self) -> None:
        stats = self.loop.engine.stats
        info = {
            "name": self.name, "model": self.model.name, "queue": self.queue, "pid": os.getpid(),
            "engine": self.engine_kind, "max_batch_size": self.settings.max_batch_size,
            "cpus": sorted(os.sched_getaffinity(0)),
            "steps": stats.steps, "tokens_generated": stats.tokens_generated,
            "max_batch_seen": stats.max_batch_size, "updated_at": time.time(),
            "running": self.loop.active, "metrics_port": self.settings.metrics_port,
            **self.engine_info,
        }
        self.meter.observe(stats.tokens_generated, busy=self.loop.active > 0, steps_total=stats.steps)
        info.update(self.meter.snapshot())
        info.update(self.process_info())
        prefix = getattr(getattr(self.loop.engine, "runner", None), "prefix", None)
        if prefix is not None:
            info["prefix_cache"] = {"hit_rate": round(prefix.stats.hit_rate, 4), "blocks": len(prefix),
                                    "hit_tokens": prefix.stats.hit_tokens,
                                    "queried_tokens": prefix.stats.queried_tokens}
        self.stores.registry.heartbeat(info, ttl_s=self.settings.heartbeat_ttl_s)
        if self.free_slots is not None:
            self.free_slots.publish()
        self.leases.renew()  # keep the jobs (and broker messages) this worker holds
        self.jobs.sweep_expired()  # queued jobs past their deadline, even while no one asks
        if moved := orphan_tickets.rescue(self.redis, self.keys, self.queue):
            log.info("moved %d ticket(s) from dead workers' own queues to %s", moved, self.queue)
        self._rescue_stranded_jobs()

    def send_spare_ticket(self, worker: str | None = None) -> None:
        """A spare ticket on another worker's own queue (for the job prefix affinity leaves it), or on
        the model's queue (a preempted batch line, a job whose ticket was lost). A ticket that finds
        nothing to run does nothing."""
        queue = self.queue if worker is None else self.keys.worker_queue(self.queue, worker)
        Tickets(self.settings, self.keys, self.stores.celery).send_spare(self.redis, "", self.model.name, queue)

    def _rescue_stranded_jobs(self) -> None:
        """Spare tickets for queued jobs whose own ticket was lost (common/scheduling/stranded.py)."""
        free = self.settings.max_batch_size - self.loop.active
        if free <= 0:  # a full worker could not run them: no need to read the queue
            spares = self.stranded.spare_tickets(0, 0, 0)
        else:
            spares = self.stranded.spare_tickets(self.jobs.fair.interactive_waiting(self.queue),
                                                 tickets_waiting(self.redis, self.keys, self.queue), free)
        for _ in range(spares):
            self.send_spare_ticket()
        if spares:
            log.warning("%d job(s) of %s waited with no ticket to run them (one was lost): sent spare tickets",
                        spares, self.queue)


def process_name() -> str:
    """This worker process as the fleet names it: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def worker_stores(settings: Settings) -> Stores:
    """The process's one set of stores, shared by every model it holds."""
    return Stores(settings, wait_for_connection_s=5, max_connections=REDIS_CONNECTIONS)
