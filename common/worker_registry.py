"""Which workers are alive, and what they report: each worker's heartbeat writes its info (model,
engine, CPUs, measured speed...) and a key that expires unless the next heartbeat renews it. The
API's /health, /metrics, /v1/models and ETAs read the live ones."""
from __future__ import annotations

import json
from typing import Any

import redis

from common.keys import Keys
from common.scheduling.fair_queue import FairQueue


class WorkerRegistry:
    def __init__(self, client: redis.Redis, keys: Keys, fair: FairQueue):
        self.r = client
        self.keys = keys
        self.fair = fair

    def heartbeat(self, info: dict[str, Any], ttl_s: int) -> None:
        """Record a worker's heartbeat; it counts as live for `ttl_s` seconds (`live`)."""
        pipe = self.r.pipeline()
        pipe.hset(self.keys.workers, info["name"], json.dumps(info))
        pipe.set(self.keys.worker_alive(info["name"]), "1", ex=ttl_s)
        pipe.execute()

    def forget(self, name: str) -> None:
        """A worker that shuts down cleanly leaves at once."""
        pipe = self.r.pipeline()
        pipe.hdel(self.keys.workers, name)
        pipe.delete(self.keys.worker_alive(name))
        pipe.execute()

    def live(self) -> list[dict[str, Any]]:
        """Heartbeat info of every worker whose heartbeat is still fresh, with the jobs it holds
        now (fresher than the heartbeat's count). Entries of workers whose heartbeat has expired
        are removed, so the hash does not grow with every worker ever run."""
        infos = [json.loads(v) for v in self.r.hvals(self.keys.workers)]
        if not infos:
            return []
        pipe = self.r.pipeline(transaction=False)
        for info in infos:
            pipe.exists(self.keys.worker_alive(info["name"]))
        alive = pipe.execute()
        live = [info for info, up in zip(infos, alive) if up]
        dead = [info["name"] for info, up in zip(infos, alive) if not up]
        if dead:
            self.r.hdel(self.keys.workers, *dead)
        held = self.fair.held()
        for info in live:
            if info["name"] in held:
                info["held_jobs"] = held[info["name"]]
                info["running"] = len(held[info["name"]])
        return live
