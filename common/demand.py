"""How many workers each model needs now: the signal an autoscaler scales workers on.

Counting the broker's queue (what KEDA's Redis list scaler does, `LLEN`) undercounts an llmq fleet:
a worker takes tickets off that list as soon as it has a free thread, and holds many jobs at once,
so a saturated fleet shows an empty list and gets scaled in. What a model needs is its queued jobs
(admitted, not yet picked by any worker: the fair queue, common/scheduling/fair_queue.py) plus the jobs its
workers hold (picked and running), over the slots one worker has (its batch size). `/metrics`
serves the figures per model (api/metrics.py); deploy/kubernetes/ scales workers on them.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from common.stores import Stores


@dataclass(frozen=True)
class ModelDemand:
    model: str
    queued: int  # admitted, not picked by any worker yet
    held: int  # picked by a live worker: starting or running
    workers: int  # live workers serving the model
    slots: int  # their batch slots, together
    slots_per_worker: int  # one worker's batch size (a new worker's, when none is live)
    loading_by: str | None = None  # the worker loading it now, if one is
    last_load: dict | None = None  # its last load: {load_s, memory_mb, worker, at}

    @property
    def state(self) -> str:
        """loaded (a live worker holds it), loading (one is loading it) or cold."""
        return "loaded" if self.workers else "loading" if self.loading_by else "cold"

    @property
    def desired_workers(self) -> int:
        """Workers that would hold every queued and held job at once; 0 when there is no work,
        so a model nobody uses can scale to zero and back."""
        return math.ceil((self.queued + self.held) / max(self.slots_per_worker, 1))


def model_demand(stores: Stores, models: set[str], workers: list[dict], default_slots: int) -> list[ModelDemand]:
    """The demand of `models` and of every model a live worker serves, by model name. `workers`:
    the live workers (`WorkerRegistry.live`); `default_slots`: a worker's batch size when no
    worker of a model is live to say."""
    names = sorted(models | {w["model"] for w in workers if w.get("model")})
    loading = stores.model_loads.loading(names)
    last_loads = stores.model_loads.last()
    demands = []
    for name in names:
        mine = [w for w in workers if w.get("model") == name]
        sizes = [int(w.get("max_batch_size", default_slots)) for w in mine]
        demands.append(ModelDemand(
            model=name, queued=stores.fair.depth(stores.keys.queue(name)),
            held=sum(int(w.get("running", 0)) for w in mine), workers=len(mine), slots=sum(sizes),
            slots_per_worker=max(sizes, default=default_slots), loading_by=loading.get(name),
            last_load=last_loads.get(name)))
    return demands


def model_state(demand: ModelDemand, workers: list[dict]) -> dict:
    """A model's state as the API shows it (/v1/models, /health, the chat page)."""
    last = demand.last_load or {}
    return {"state": demand.state, "workers": sorted(w["name"] for w in workers if w.get("model") == demand.model),
            "loading_by": demand.loading_by, "queued": demand.queued, "running": demand.held,
            "load_s": last.get("load_s"), "memory_mb": last.get("memory_mb")}
