"""Where the catalog's models are loaded, in Redis: the lock one worker holds while it loads a cold
model (so a queue that fills up does not make every worker load it at once), and the time each
model's last load took (shown by /v1/models and counted in the ETAs of jobs waiting for it)."""
from __future__ import annotations

import json
import time

import redis

from common.keys import Keys
from common.lua import script


class ModelLoads:
    def __init__(self, client: redis.Redis, keys: Keys):
        self.r = client
        self.keys = keys

    def lock(self, model: str, worker: str, ttl_s: float) -> bool:
        """Take the load lock of `model` for `worker`; False when another worker holds it. It
        expires after `ttl_s` unless `renew`ed, so a worker that dies while loading frees it."""
        return bool(self.r.set(self.keys.model_loading(model), worker, nx=True, px=int(ttl_s * 1000)))

    def renew(self, model: str, worker: str, ttl_s: float) -> bool:
        return bool(script(self.r, "lock_renew")(keys=[self.keys.model_loading(model)],
                                                 args=[worker, int(ttl_s * 1000)]))

    def unlock(self, model: str, worker: str) -> None:
        script(self.r, "lock_release")(keys=[self.keys.model_loading(model)], args=[worker])

    def loading(self, models: list[str]) -> dict[str, str]:
        """model -> the worker loading it now, for those of `models` being loaded."""
        if not models:
            return {}
        holders = self.r.mget([self.keys.model_loading(m) for m in models])
        return {m: holder for m, holder in zip(models, holders) if holder}

    def record(self, model: str, worker: str, seconds: float, memory_mb: float, slots: int) -> None:
        """A finished load: how long it took, the memory it took, the batch slots it serves."""
        self.r.hset(self.keys.model_loads, model, json.dumps(
            {"load_s": round(seconds, 3), "memory_mb": round(memory_mb, 1), "slots": slots,
             "worker": worker, "at": time.time()}))

    def last(self) -> dict[str, dict]:
        """model -> its last load: {load_s, memory_mb, slots, worker, at}."""
        return {model: json.loads(v) for model, v in self.r.hgetall(self.keys.model_loads).items()}
