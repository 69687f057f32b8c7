"""The catalog models one worker process holds, and the placement that loads and unloads them.

A worker has a budget: `worker_max_models` models at once and, optionally, `worker_memory_mb` for
all of them. Every `PLACE_EVERY_S` it gathers what the fleet looks like and asks
common/scheduling/placement.py which model to load here, and which idle one to unload for it; it
loads under a lock in Redis (common/model_loads.py) so that one worker loads a model, not every
worker that sees its queue. An unload stops the model's Celery consumer, waits for every job it
runs to end (a running job is never dropped), then closes the engine; a ticket that reaches the
model after that goes back to the queue for whoever holds it next.

Loading, unloading and consuming are told to Celery through its control commands
(`add_consumer` / `cancel_consumer`), which Flower shows too.
"""
from __future__ import annotations

import gc
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import psutil
import redis

from common.catalog import Catalog, CatalogModel
from common.models import ModelUnavailable
from common.scheduling.placement import Budget, FleetState, Room, decide
from common.settings import Settings
from common.stores import Stores
from worker.runtime import WorkerRuntime, process_name

log = logging.getLogger(__name__)
PLACE_EVERY_S = 1.0
RETRY_FAILED_LOAD_S = 30.0  # a model this worker could not load is not tried again here for this long


class HeldModels:
    def __init__(self, settings: Settings, stores: Stores, catalog: Catalog):
        self.settings = settings
        self.stores = stores
        self.catalog = catalog
        self.process = process_name()
        self._held: dict[str, WorkerRuntime] = {}
        self._tickets: dict[str, int] = {}  # model -> tickets running on it now
        self._busy_at: dict[str, float] = {}  # model -> when it last had a queued or running job
        self._lock = threading.Lock()
        self._wanted: set[str] = set()  # cold models this worker had no room for at the last pass
        self._failed_at: dict[str, float] = {}  # model -> when this worker last failed to load it
        self._stopping = threading.Event()
        self.loads: Counter[str] = Counter()  # by model, for the worker's metrics
        self.unloads: Counter[str] = Counter()
        self.consume: Callable[[str], None] = lambda queue: None  # set once Celery's consumer runs
        self.stop_consuming: Callable[[str], None] = lambda queue: None

    # --- what is held ------------------------------------------------------------------------
    def runtimes(self) -> list[WorkerRuntime]:
        with self._lock:
            return list(self._held.values())

    def runtime_name(self, model: str | None) -> str:
        """A held model's name in the fleet (its heartbeat, leases, free slots, own queue): the
        process's, plus the model's when the catalog has names (a process may hold several)."""
        return f"{self.process}/{model}" if self.catalog.named else self.process

    def ticket(self, model: str) -> WorkerRuntime | None:
        """The runtime a ticket for `model` runs on, counted until `ticket_done`; None when the
        model is not held here (any more): the ticket goes back to the queue."""
        with self._lock:
            if not self.catalog.named and self._held:  # one model, whatever name the API gave it
                model = next(iter(self._held))
            runtime = self._held.get(model)
            if runtime is not None:
                self._tickets[model] = self._tickets.get(model, 0) + 1
            return runtime

    def ticket_done(self, runtime: WorkerRuntime) -> None:
        with self._lock:
            self._tickets[runtime.model.name] -= 1

    # --- loading and unloading ---------------------------------------------------------------
    def load(self, entry: CatalogModel) -> WorkerRuntime:
        """Build the model's runtime and start serving it: heartbeat, then consume its queues."""
        started, before = time.monotonic(), _memory_mb()
        runtime = WorkerRuntime.build(self.settings, entry, self.stores, self.runtime_name(entry.name))
        name = runtime.model.name
        runtime.process_info = self.room
        runtime.start_heartbeat()
        runtime.heartbeat()
        with self._lock:
            self._held[name] = runtime
            self._tickets.setdefault(name, 0)
            self._busy_at[name] = time.monotonic()
        self.consume(runtime.queue)
        self.consume(runtime.own_queue)
        seconds, memory = time.monotonic() - started, max(_memory_mb() - before, 0.0)
        self.stores.model_loads.record(name, runtime.name, seconds, memory, runtime.settings.max_batch_size)
        self.loads[name] += 1
        log.info("model %s loaded in %.1fs (%.0f MiB), serving queue %s", name, seconds, memory, runtime.queue)
        return runtime

    def unload(self, model: str) -> None:
        """Stop taking the model's tickets, let its running jobs end, then free its engine."""
        with self._lock:
            runtime = self._held.pop(model)
        self.stop_consuming(runtime.queue)
        self.stop_consuming(runtime.own_queue)
        waiting_since = time.monotonic()
        while True:  # tickets taken before the consumer stopped still run to their end
            with self._lock:
                if self._tickets.get(model, 0) == 0 and runtime.loop.active == 0:
                    break
            if time.monotonic() - waiting_since > 30:
                log.info("unloading %s: waiting for its last jobs to end", model)
                waiting_since = time.monotonic()
            time.sleep(0.05)
        runtime.sign_off()
        runtime.loop.stop()
        runtime.close()
        del runtime
        gc.collect()
        self.unloads[model] += 1
        log.info("model %s unloaded", model)

    def close(self) -> None:
        """The worker stops (its jobs done or handed back): every model leaves the fleet."""
        self._stopping.set()
        for runtime in self.runtimes():
            runtime.sign_off()
            runtime.close()

    def room(self) -> dict:
        """What this worker could still load, for the others' placement (in each heartbeat):
        models, and memory when it has a budget."""
        held = [m for m, _ in self._held_items()]
        room = {"model_room": self.settings.worker_max_models - len(held)}
        if self.settings.worker_memory_mb and self.catalog.named:
            room["memory_room_mb"] = self.settings.worker_memory_mb - sum(map(self.memory_mb, held))
        return room

    # --- placement ---------------------------------------------------------------------------
    def start_placing(self) -> None:
        if len(self.catalog.models) > 1:  # one model: nothing to place
            threading.Thread(target=self._place_forever, name="placement", daemon=True).start()

    def _place_forever(self) -> None:
        while not self._stopping.wait(PLACE_EVERY_S):
            try:
                self.place()
            except redis.RedisError as exc:
                log.warning("placement skipped: %s", exc)
            except Exception:
                log.exception("placement failed")

    def place(self) -> None:
        """One pass: load at most one cold model with queued jobs, unloading an idle one if needed."""
        state = self._fleet_state()
        self._wanted = set()
        for step in decide(state, self._budget()):
            entry = self.catalog.models[step.load]
            if step.leave_to_others:
                self._wanted.add(step.load)
            elif step.unload is None:
                self._load_under_lock(entry)
                return
            elif self.stores.model_loads.lock(step.load, self.process, self._lock_ttl_s()):
                log.info("unloading %s (idle %.0fs) to load %s (%d queued)", step.unload,
                         state.now - state.held[step.unload], step.load, state.queued[step.load])
                self.unload(step.unload)
                self._load_under_lock(entry, locked=True)
                return

    def _fleet_state(self) -> FleetState:
        """What placement decides on: queued jobs per model, what is held here and how recently
        it was busy, what the other workers hold, load and have room for."""
        names = list(self.catalog.models)
        queued = {m: self.stores.fair.depth(self.stores.keys.queue(m)) for m in names}
        now = time.monotonic()
        for model, runtime in self._held_items():
            if queued[model] or runtime.loop.active or self._tickets.get(model):
                self._busy_at[model] = now
        held = {m: self._busy_at.get(m, now) for m, _ in self._held_items()}
        live = self.stores.registry.live()
        served = frozenset(w.get("model") for w in live)
        loading = frozenset(self.stores.model_loads.loading(names))
        memory = {}
        if self.settings.worker_memory_mb:  # of the models held and those that may be loaded
            last = self.stores.model_loads.last()
            memory = {m: self.memory_mb(m, last) for m in names
                      if m in held or (queued[m] and m not in served and m not in loading)}
        return FleetState(
            now=now, queued=queued, held=held, served=served, loading=loading, failed_at=dict(self._failed_at),
            passed=frozenset(self._wanted), memory_mb=memory, retry_failed_s=RETRY_FAILED_LOAD_S,
            room_elsewhere=tuple(Room(w.get("model_room", 0), w.get("memory_room_mb")) for w in live
                                 if not w["name"].startswith(f"{self.process}/")))

    def _budget(self) -> Budget:
        return Budget(self.settings.worker_max_models, self.settings.worker_memory_mb, self.settings.model_idle_s)

    def _load_under_lock(self, entry: CatalogModel, locked: bool = False) -> None:
        model, ttl = entry.name, self._lock_ttl_s()
        if not locked and not self.stores.model_loads.lock(model, self.process, ttl):
            return  # another worker is loading it
        done = threading.Event()

        def renew() -> None:  # the load may take minutes; the lock lapses only if this worker dies
            while not done.wait(ttl / 3):
                self.stores.model_loads.renew(model, self.process, ttl)
        threading.Thread(target=renew, name="load-lock", daemon=True).start()
        try:
            log.info("loading %s: it has queued jobs and no live worker holds it", model)
            self.load(entry)
        except Exception:  # its jobs stay queued: another worker, or this one later, may load it
            log.exception("could not load %s; not trying again here for %.0fs", model, RETRY_FAILED_LOAD_S)
            self._failed_at[model] = time.monotonic()
        finally:
            done.set()
            self.stores.model_loads.unlock(model, self.process)

    def _lock_ttl_s(self) -> float:
        return self.settings.heartbeat_ttl_s

    def _held_items(self) -> list[tuple[str, WorkerRuntime]]:
        with self._lock:
            return list(self._held.items())

    def memory_mb(self, model: str, last_loads: dict | None = None) -> float:
        """What `model` takes: measured at its last load anywhere (`last_loads`, read if not
        given), else its weights on disk and its KV cache."""
        last = (self.stores.model_loads.last() if last_loads is None else last_loads).get(model)
        if last and last.get("memory_mb"):
            return float(last["memory_mb"])
        entry = self.catalog.models[model]
        settings = entry.settings(self.settings)
        try:
            path = entry.resolve(self.settings).path
            weights = sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file()) / 2**20
        except (ModelUnavailable, OSError):
            weights = 0.0
        return weights + settings.kv_cache_mb


def _memory_mb() -> float:
    """Resident memory of this process and the engine processes it started."""
    me = psutil.Process()
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        try:
            total += child.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20
