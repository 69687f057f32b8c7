"""The fleet as the API's answers see it: the live workers and the models' last loads, read once
per `fresh_s` by a process, so a burst of admissions answering their places in line shares one
read instead of making it each (an ETA is a guess from heartbeats anyway; this one is at most
`fresh_s` older than the workers' own reports)."""
from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from common.eta import WorkerLoad, fleet_loads
from common.model_loads import ModelLoads
from common.worker_registry import WorkerRegistry


class FleetView:
    def __init__(self, registry: WorkerRegistry, model_loads: ModelLoads, fresh_s: float = 0.1):
        self._registry = registry
        self._model_loads = model_loads
        self._fresh_s = fresh_s
        self._lock = threading.Lock()
        self._read_at: dict[str, float] = {}
        self._values: dict[str, Any] = {}

    def loads(self, model: str | None) -> list[WorkerLoad]:
        """The loads of the live workers that serve `model`; none live: its last load's, if it
        was ever loaded (so a cold model's ETA counts the load)."""
        live = self._fresh("live", self._registry.live)
        cold = not any(w.get("model") == model for w in live)
        return fleet_loads(live, self._fresh("last_loads", self._model_loads.last) if cold else {}).get(model, [])

    def _fresh(self, name: str, read: Callable[[], Any]) -> Any:
        """`read()`'s value, read again when older than `fresh_s`; callers that arrive while it is
        being read wait for that read."""
        with self._lock:
            if time.monotonic() - self._read_at.get(name, -1e9) >= self._fresh_s:
                self._values[name] = read()
                self._read_at[name] = time.monotonic()
            return self._values[name]
