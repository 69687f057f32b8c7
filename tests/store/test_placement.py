"""Which catalog models a worker loads and unloads (worker/held_models.py), pass by pass, against
real Redis: loading and unloading themselves are recorded instead of done."""
import time
from types import SimpleNamespace

import pytest

from common.catalog import Catalog, CatalogModel
from common.stores import Stores
from tests.support.settings import fresh_namespace
from worker.held_models import HeldModels


class Recorded(HeldModels):
    def __init__(self, settings, stores, holding=()):
        super().__init__(settings, stores, Catalog([CatalogModel(m, "embedded") for m in "abc"]))
        self.events = []
        for model in holding:
            self._hold(model)

    def _hold(self, model):
        self._held[model] = SimpleNamespace(loop=SimpleNamespace(active=0), model=SimpleNamespace(name=model))
        self._tickets[model] = 0
        self._busy_at[model] = time.monotonic()

    def load(self, entry):
        self.events.append(("load", entry.name, self.stores.model_loads.loading([entry.name]).get(entry.name)))
        self._hold(entry.name)

    def unload(self, model):
        self.events.append(("unload", model))
        del self._held[model]

    def idle_for(self, model, seconds):
        self._busy_at[model] = time.monotonic() - seconds


@pytest.fixture
def stores():
    with fresh_namespace(model_idle_s=10.0) as settings:
        stores = Stores(settings)
        stores.queued = {}  # model -> queued jobs, as the fair queue would count them
        stores.fair.depth = lambda queue: next((n for m, n in stores.queued.items()
                                                if stores.keys.queue(m) == queue), 0)
        yield stores


def worker(stores, holding=(), **overrides):
    return Recorded(stores.settings.model_copy(update=overrides), stores, holding)


def test_a_worker_with_room_loads_a_cold_model_with_queued_jobs_under_the_lock(stores):
    w = worker(stores, holding="a", worker_max_models=2)
    w.place()
    assert w.events == []  # nothing waits
    stores.queued["b"] = 3
    w.place()
    assert w.events == [("load", "b", w.process)]  # it held the load lock while loading
    assert stores.model_loads.loading(["b"]) == {}  # and let go after


def test_a_model_another_worker_loads_or_holds_is_left_to_it(stores):
    w = worker(stores, worker_max_models=3)
    stores.queued.update(b=1, c=1)
    assert stores.model_loads.lock("b", "elsewhere:1", ttl_s=30)
    stores.registry.heartbeat({"name": "elsewhere:2", "model": "c"}, ttl_s=30)
    w.place()
    assert w.events == []


def test_without_room_an_idle_model_is_unloaded_and_a_busy_one_never(stores):
    w = worker(stores, holding="a", worker_max_models=1)
    stores.queued["b"] = 1
    w.place()
    assert w.events == []  # "a" has not been idle for model_idle_s yet
    w.idle_for("a", 11)
    w.place()
    assert w.events == [("unload", "a"), ("load", "b", w.process)]

    w.events.clear()
    w.idle_for("b", 11)
    stores.queued["c"] = 1
    w._held["b"].loop.active = 1  # running a job: never unloaded, whatever it measured before
    w.place()
    w.place()
    assert w.events == []


def test_a_worker_with_room_elsewhere_gets_a_pass_to_load_it_first(stores):
    w = worker(stores, holding="a", worker_max_models=1)
    w.idle_for("a", 11)
    stores.registry.heartbeat({"name": "other:1/c", "model": "c", "model_room": 1}, ttl_s=30)
    stores.queued["b"] = 1
    w.place()
    assert w.events == []  # the other worker can load it without unloading anything
    w.place()
    assert w.events == [("unload", "a"), ("load", "b", w.process)]  # it did not: this one does


def test_the_memory_budget_counts_what_each_model_took_at_its_last_load(stores):
    stores.model_loads.record("a", "w", 1.0, memory_mb=700, slots=4)
    stores.model_loads.record("b", "w", 1.0, memory_mb=500, slots=4)
    w = worker(stores, holding="a", worker_max_models=2, worker_memory_mb=1000)
    stores.queued["b"] = 1
    w.place()
    assert w.events == []  # 700 + 500 > 1000, and "a" is not idle
    # another worker has a model slot free but not the memory "b" took: no reason to wait for it
    stores.registry.heartbeat({"name": "other:1/c", "model": "c", "model_room": 1, "memory_room_mb": 100}, ttl_s=30)
    w.idle_for("a", 11)
    w.place()
    assert w.events == [("unload", "a"), ("load", "b", w.process)]


def test_a_model_that_fails_to_load_is_not_tried_again_at_once_and_its_lock_is_freed(stores):
    w = worker(stores, worker_max_models=2)
    stores.queued["b"] = 1
    failures = []

    def fail(entry):
        failures.append(entry.name)
        raise RuntimeError("engine exploded")
    w.load = fail
    w.place()
    w.place()
    assert failures == ["b"]  # once, not every pass
    assert stores.model_loads.loading(["b"]) == {}  # another worker may load it meanwhile
